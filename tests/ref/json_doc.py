#!/usr/bin/env python3
"""Compare docs/JSON.md's field tables with real JSON Lines records, key by key.

usage: json_doc.py JSON.md KIND=FILE.jsonl ...   (KIND: train, eval, lecture; repeatable)

For each record table of JSON.md listed in TABLES below, the documented keys are the backticked
names in the first cell of each row ("`dp`, `tp`, `pp`"); a row whose first cell starts with
"&nbsp;" documents keys of the object (or array of objects) named by the row above it that is
not nested ("&nbsp;&nbsp;`.stage`"). The records of that table are those of the FILE kinds and
"type" named in TABLES. Two rules, both reported per key:
  - every key a record carries is documented (the doc cannot miss a field);
  - every documented key occurs in at least one record (the doc cannot keep a removed field).
Nested keys are compared only under parents that have nested rows. Exit 0 when both hold.
"""
import json
import re
import sys

# (heading that starts the table's section, first header cell or None, record kinds, "type")
TABLES = [
    ("### `config`", None, ("train", "eval"), "config"),
    ("### `step`", None, ("train",), "step"),
    ("### `summary` (last line", None, ("train",), "summary"),
    ("### `summary` of `--eval-only`", None, ("eval",), "summary"),
    ("## distlab-lecture", "field (figure)", ("lecture",), "figure"),
    ("## distlab-lecture", "field (summary)", ("lecture",), "summary"),
]


def tables_after(lines, heading):
    """The tables (lists of row cells) between `heading` and the next heading of its level."""
    level = heading.split()[0]
    start = next((i for i, l in enumerate(lines) if l.startswith(heading)), None)
    if start is None:
        return []
    out, cur = [], None
    for l in lines[start + 1:]:
        if l.startswith("#") and len(l.split()[0]) <= len(level):
            break
        if l.startswith("|"):
            cells = [c.strip() for c in l.strip().strip("|").split("|")]
            if cur is None:
                cur = []
                out.append(cur)
            if not set("".join(cells)) <= set("-: "):
                cur.append(cells)
        else:
            cur = None
    return out


def documented(md_lines, heading, header):
    """{key: set of nested keys} of one record table (the header row skipped)."""
    for table in tables_after(md_lines, heading):
        if not table or (header is not None and table[0][0] != header):
            continue
        keys, parent = {}, None
        for cells in table[1:]:
            names = re.findall(r"`\.?([A-Za-z_][A-Za-z0-9_]*)`", cells[0])
            if cells[0].startswith("&nbsp;"):
                if parent is None:
                    raise SystemExit(f"JSON.md: nested row {cells[0]} without a parent ({heading})")
                keys[parent].update(names)
            else:
                for n in names:
                    keys[n] = set()
                parent = names[0] if len(names) == 1 else None
        return keys
    raise SystemExit(f"JSON.md: no table under '{heading}'" + (f" headed '{header}'" if header else ""))


def nested_keys(value):
    if isinstance(value, dict):
        return set(value)
    if isinstance(value, list):
        return set().union(*[set(v) for v in value if isinstance(v, dict)])
    return set()


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    md = open(sys.argv[1], encoding="utf-8").read().splitlines()
    records = {}
    for arg in sys.argv[2:]:
        kind, path = arg.split("=", 1)
        with open(path, encoding="utf-8") as f:
            records.setdefault(kind, []).extend(json.loads(l) for l in f if l.strip())
    bad = 0
    for heading, header, kinds, rtype in TABLES:
        doc = documented(md, heading, header)
        recs = [r for k in kinds for r in records.get(k, []) if r.get("type") == rtype]
        name = f"{'/'.join(kinds)} {rtype}"
        if not recs:
            print(f"FAIL {name}: no records to compare with")
            bad += 1
            continue
        seen, seen_nested = set(), {}
        for r in recs:
            seen.update(r)
            for k, sub in doc.items():
                if sub and k in r:
                    seen_nested.setdefault(k, set()).update(nested_keys(r[k]))
        for k in sorted(seen - set(doc)):
            print(f"FAIL {name}: key '{k}' is written but not documented in JSON.md")
            bad += 1
        for k in sorted(set(doc) - seen):
            print(f"FAIL {name}: key '{k}' is documented but no record has it")
            bad += 1
        for k, sub in doc.items():
            if not sub or k not in seen_nested:
                continue
            for n in sorted(seen_nested[k] - sub):
                print(f"FAIL {name}: key '{k}.{n}' is written but not documented")
                bad += 1
            for n in sorted(sub - seen_nested[k]):
                print(f"FAIL {name}: key '{k}.{n}' is documented but no record has it")
                bad += 1
        print(f"{name}: {len(doc)} documented keys, {len(recs)} records compared")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
