#!/usr/bin/env python3
"""The public API's contract checks (tests/apps/test_api.sh runs them, with negative controls).

  api_check.py HEADERS_DIR [--makefile-am F] [--symbols NM_OUTPUT] [--sym-list F] [--api API.md]
  api_check.py HEADERS_DIR --print-exports   (the export list: `... > lib/distlab.sym`)

HEADERS_DIR holds distlab.h and distlab/*.h as `make install` installs them. Checks, each
failing with one line per offender:
  (c) every function an installed header declares has a comment directly above it (a comment
      ending on the line before, or on the declaration's own lines; declarations written one
      after another without a blank line share the comment above the first): the header is
      the contract;
  (d) --makefile-am: the headers Makefile.am installs are exactly those in HEADERS_DIR;
  (a) --symbols (`nm -D --defined-only` of libdistlab.so): the library exports exactly the
      functions and variables the headers declare (static inline ones excepted), and
      --sym-list (lib/distlab.sym, the export list) names exactly those too;
  (b) --api: every dl_ identifier docs/API.md names in code (`inline` or fenced) is declared
      by an installed header.
Exit status 0 when all hold, 1 when one fails, 2 on bad usage.
"""
import os
import re
import sys

IDENT = re.compile(r'\b(?:dl|DL)_\w+\b')


def strip_comments(text):
    """Comments blanked (newlines kept, so line numbers stay) and a list of (first, last) line
    numbers (1-based) of each comment."""
    out, spans, i, n = [], [], 0, len(text)
    line = 1
    while i < n:
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            body = text[i:j]
            spans.append((line, line + body.count('\n')))
            line += body.count('\n')
            out.append(re.sub(r'[^\n]', ' ', body))
            i = j
        elif text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            spans.append((line, line))
            out.append(' ' * (j - i))
            i = j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            if text[i] == '\n':
                line += 1
            out.append(text[i])
            i += 1
    return ''.join(out), spans


def statements(code):
    """Top-level statements of comment-free header code: (text, first line, last line). Preprocessor
    lines and `extern "C" {` / `}` are skipped; a static inline function is one statement."""
    lines = code.split('\n')
    kept = []
    cont = False
    for ln in lines:
        s = ln.strip()
        if cont or s.startswith('#'):
            cont = s.endswith('\\')
            kept.append('')
        elif s.startswith('extern "C"') or (s == '}' and not kept_depth(kept)):
            kept.append('')
        else:
            kept.append(ln)
    res, buf, first, depth = [], [], None, 0
    for no, ln in enumerate(kept, 1):
        for ch in ln:
            if ch in '{(':
                depth += 1
            elif ch in '})':
                depth -= 1
        if ln.strip():
            if first is None:
                first = no
            buf.append(ln)
        s = ln.strip()
        if first is not None and depth == 0 and (s.endswith(';') or s.endswith('}')):
            res.append((' '.join(buf), first, no))
            buf, first = [], None
    return res


def kept_depth(kept):
    """Brace depth of the lines kept so far (a lone `}` at depth 0 closes extern "C")."""
    d = 0
    for ln in kept:
        d += ln.count('{') - ln.count('}')
    return d > 0


def declarations(path):
    """Functions and variables a header declares: dict name -> (kind, first line, last line),
    kind 'func', 'inline' or 'var'; and the comment spans."""
    text = open(path, encoding='utf-8').read()
    code, spans = strip_comments(text)
    decls = {}
    for st, a, b in statements(code):
        s = st.strip()
        if s.startswith('typedef') or re.match(r'(struct|enum|union)\s+\w+\s*\{', s) \
                or re.match(r'(struct|enum|union)\s+\w+\s*;', s):
            continue
        m = re.match(r'([^(=]*?)\b(dl_\w+)\s*\(', s)
        if m:
            kind = 'inline' if re.search(r'\binline\b', m.group(1)) else 'func'
            decls[m.group(2)] = (kind, a, b)
            continue
        m = re.match(r'extern\s+[^;(]*?\b(dl_\w+)\s*(\[[^\]]*\])?\s*;', s)
        if m:
            decls[m.group(1)] = ('var', a, b)
    return decls, spans


def header_files(root):
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith('.h'):
                out.append(os.path.join(dirpath, f))
    return sorted(out)


def check_comments(root, headers):
    bad = []
    for h in headers:
        decls, spans = declarations(h)
        ends = {e for _, e in spans}
        on_lines = lambda a, b: any(s <= b and e >= a for s, e in spans)
        order = sorted(decls.items(), key=lambda kv: kv[1][1])
        documented_end = set()  # last lines of documented declarations (for groups)
        for name, (_, a, b) in order:
            ok = (a - 1) in ends or on_lines(a, b) or (a - 1) in documented_end
            if ok:
                documented_end.add(b)
            else:
                bad.append('%s:%d: %s has no comment above its declaration'
                           % (os.path.relpath(h, root), a, name))
    return bad


def public_names(headers):
    names = set()
    for h in headers:
        code, _ = strip_comments(open(h, encoding='utf-8').read())
        names |= set(IDENT.findall(code))
    return names


def makefile_headers(path):
    text = open(path, encoding='utf-8').read().replace('\\\n', ' ')
    out = set()
    for var in ('include_HEADERS', 'distlabinclude_HEADERS'):
        m = re.search(r'^%s\s*=(.*)$' % var, text, re.M)
        if m:
            out |= set(m.group(1).split())
    return {re.sub(r'^include/', '', p) for p in out}


def api_names(path):
    text = open(path, encoding='utf-8').read()
    names = set()
    for m in re.finditer(r'^```[^\n]*\n(.*?)^```', text, re.S | re.M):
        names |= set(re.findall(r'\bdl_\w+', m.group(1)))
    rest = re.sub(r'^```[^\n]*\n.*?^```', '', text, flags=re.S | re.M)
    for m in re.finditer(r'`([^`\n]+)`', rest):
        names |= set(re.findall(r'\bdl_\w+', m.group(1)))
    return names


def main(argv):
    args, opts = [], {}
    it = iter(argv)
    for a in it:
        if a == '--print-exports':
            opts[a] = True
        elif a in ('--makefile-am', '--symbols', '--sym-list', '--api'):
            opts[a] = next(it, None)
            if opts[a] is None:
                print('api_check: %s needs a file' % a, file=sys.stderr)
                return 2
        else:
            args.append(a)
    if len(args) != 1 or not os.path.isfile(os.path.join(args[0], 'distlab.h')):
        print('usage: api_check.py HEADERS_DIR (holding distlab.h) [--makefile-am F] '
              '[--symbols NM_OUTPUT] [--sym-list F] [--api API.md]', file=sys.stderr)
        return 2
    root = args[0]
    headers = header_files(root)
    decls = {}
    for h in headers:
        decls.update(declarations(h)[0])
    exported = {n for n, (k, _, _) in decls.items() if k != 'inline'}
    if '--print-exports' in opts:
        print('\n'.join(sorted(exported)))
        return 0
    bad = check_comments(root, headers)
    if '--makefile-am' in opts:
        listed = makefile_headers(opts['--makefile-am'])
        present = {os.path.relpath(h, root) for h in headers}
        bad += ['Makefile.am installs %s, not in %s' % (p, root) for p in sorted(listed - present)]
        bad += ['%s/%s is not installed by Makefile.am' % (root, p) for p in sorted(present - listed)]
    if '--symbols' in opts:
        syms = set()
        for ln in open(opts['--symbols'], encoding='utf-8'):
            f = ln.split()
            if len(f) >= 2 and f[-2] not in ('U', 'w', 'v'):
                syms.add(f[-1].split('@')[0])
        bad += ['libdistlab.so exports %s, which no installed header declares' % s
                for s in sorted(syms - exported)]
        bad += ['%s is declared in an installed header but not exported by libdistlab.so' % s
                for s in sorted(exported - syms)]
    if '--sym-list' in opts:
        listed = {ln.strip() for ln in open(opts['--sym-list'], encoding='utf-8') if ln.strip()}
        bad += ['%s lists %s, which no installed header declares' % (opts['--sym-list'], s)
                for s in sorted(listed - exported)]
        bad += ['%s is declared in an installed header but missing from %s' % (s, opts['--sym-list'])
                for s in sorted(exported - listed)]
    if '--api' in opts:
        public = public_names(headers)
        bad += ['%s names %s, which no installed header declares' % (opts['--api'], s)
                for s in sorted(api_names(opts['--api']) - public)]
    for b in bad:
        print('api_check: ' + b)
    print('api_check: %d headers, %d functions and variables (%d exported), %d problems'
          % (len(headers), len(decls), len(exported), len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
