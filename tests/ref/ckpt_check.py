#!/usr/bin/env python3
"""Independent check of a distlab checkpoint (safetensors layout), standard library only.

usage: ckpt_check.py FILE [--config layers=L,d_model=C,heads=H,seq=T,vocab=V,tie=0|1]

Checks: the 8-byte little-endian header length, the header is strict JSON (Python's parser),
every tensor's dtype (F32/F64), shape and data_offsets (contiguous, tiling the data section
exactly), the __metadata__ fields (format distlab-gpt, version 1, string values), the FNV-1a 64
checksum of the data section, and, with --config, the GPT-2-like names and shapes in the order of
include/distlab/model.h. If the `safetensors` module (with numpy) is installed, it also loads the
file with safetensors.numpy.load_file and compares the shapes. Exit status 0: good, 1: bad.
"""
import json
import struct
import sys


def expected_tensors(cfg):
    L, C, T, V, tie = cfg["layers"], cfg["d_model"], cfg["seq"], cfg["vocab"], cfg["tie"]
    out = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for i in range(L):
        h = "h.%d." % i
        out += [(h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]),
                (h + "attn.c_attn.weight", [3 * C, C]), (h + "attn.c_attn.bias", [3 * C]),
                (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
                (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]),
                (h + "mlp.c_fc.weight", [4 * C, C]), (h + "mlp.c_fc.bias", [4 * C]),
                (h + "mlp.c_proj.weight", [C, 4 * C]), (h + "mlp.c_proj.bias", [C])]
    out += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    if not tie:
        out.append(("lm_head.weight", [V, C]))
    return out


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def fail(msg):
    print("ckpt_check: " + msg, file=sys.stderr)
    sys.exit(1)


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path, cfg = argv[1], None
    if len(argv) >= 4 and argv[2] == "--config":
        cfg = {k: int(v) for k, v in (kv.split("=") for kv in argv[3].split(","))}
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8 or 8 + n > len(blob):
        fail("header length %d (file %d bytes)" % (n, len(blob)))
    raw = blob[8:8 + n]
    if raw.rstrip(b" ") != raw.rstrip(b" \t\r\n") or not raw.rstrip(b" ").endswith(b"}"):
        fail("header is not padded with spaces")
    hdr = json.loads(raw.decode("utf-8"), object_pairs_hook=lambda kv: dict(kv))
    meta = hdr.pop("__metadata__", None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        fail("__metadata__ missing or not str -> str")
    if meta.get("format") != "distlab-gpt" or meta.get("version") != "1":
        fail("metadata %r" % meta)
    data = blob[8 + n:]
    names = list(hdr.keys())  # JSON object order = file order
    pos = 0
    for name in names:
        e = hdr[name]
        if set(e) != {"dtype", "shape", "data_offsets"}:
            fail("%s: keys %r" % (name, sorted(e)))
        size = {"F32": 4, "F64": 8}.get(e["dtype"])
        if size is None:
            fail("%s: dtype %s" % (name, e["dtype"]))
        numel = 1
        for d in e["shape"]:
            numel *= d
        b, en = e["data_offsets"]
        if b != pos or en - b != numel * size:
            fail("%s: data_offsets %r, expected [%d, %d]" % (name, e["data_offsets"], pos, pos + numel * size))
        pos = en
    if pos != len(data):
        fail("tensors end at %d, data section holds %d" % (pos, len(data)))
    if "%016x" % fnv1a64(data) != meta.get("checksum"):
        fail("checksum %s, computed %016x" % (meta.get("checksum"), fnv1a64(data)))
    if cfg is not None:
        want = expected_tensors(cfg)
        got = [(k, hdr[k]["shape"]) for k in names]
        if got != want:
            fail("names/shapes differ from the config: first difference %r" %
                 next((g, w) for g, w in zip(got + [None] * len(want), want + [None] * len(got)) if g != w))
    try:
        from safetensors.numpy import load_file  # optional
    except ImportError:
        load_file = None
    if load_file is not None:
        t = load_file(path)
        for k in names:
            if list(t[k].shape) != hdr[k]["shape"]:
                fail("safetensors: %s has shape %r" % (k, t[k].shape))
    print("ckpt_check: %s: %d tensors, %d data bytes, checksum %s: ok" % (path, len(names), len(data), meta["checksum"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
