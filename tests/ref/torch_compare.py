#!/usr/bin/python3
"""distlab against PyTorch, which nobody here wrote: loss and every gradient of one step.

usage: torch_compare.py --model INIT.st --grads GRADS.st [--tokens GRADS.st.tokens]
                        (--loss X | --json STEP.jsonl) [--tol R] [--quiet]

Builds the model of peers/torch_gpt.py in PyTorch (nn.Embedding tok/pos; Blocks with
nn.LayerNorm ln1/ln2, nn.Linear qkv/proj/fc1/fc2, exact erf GeLU, causal softmax attention;
final LayerNorm lnf; head nn.Linear without bias, or the token embedding when the file has no
lm_head.weight), sized from the checkpoint's shapes, and loads the parameters from a distlab
`--save`d file (safetensors layout, parsed here with struct/json: 8-byte little-endian header
length, JSON header, raw little-endian data; the `safetensors` package is not needed).

It then runs ONE forward/backward on the batch of `distlab-train --dump-grads FILE`, read from
FILE.tokens (int32 little-endian: G*T inputs, then G*T targets, sequence-major), with
loss = mean cross-entropy over all G*T positions, and compares
  - the loss with distlab's step-1 loss (--loss, or the "step" record with "step":1 of --json):
    |a - b| / |b|;
  - EVERY gradient tensor with the same-named tensor of the --dump-grads file, per tensor
    max|a - b| / max|b|, a = distlab, b = PyTorch.
Both must be within --tol (default 1e-5 for F32 files, 1e-12 for F64; the file's dtype is the
precision PyTorch computes in), the loss read from --json within max(tol, 5e-10), since the JSON
prints it with 10 significant digits. The names map as
  wte.weight -> tok.weight              wpe.weight -> pos.weight
  h.L.ln_1.*  -> blocks.L.ln1.*          h.L.attn.c_attn.* -> blocks.L.qkv.*  (rows Q, K, V)
  h.L.attn.c_proj.* -> blocks.L.proj.*   h.L.ln_2.* -> blocks.L.ln2.*
  h.L.mlp.c_fc.* -> blocks.L.fc1.*       h.L.mlp.c_proj.* -> blocks.L.fc2.*
  ln_f.* -> lnf.*                        lm_head.weight -> head.weight
distlab's weights already use nn.Linear's (out, in) layout, and c_attn's rows are Q then K then V,
exactly what torch_gpt.py's qkv(...).view(b, t, 3, H, C/H) expects.

The K bias: softmax is invariant to adding the same number to every score of a row, and q.b_k is
such a number, so the gradient of the K part of c_attn.bias is exactly zero. distlab writes exact
zeros (lib/model/gpt_impl.h); PyTorch computes it and gets rounding noise. The per-tensor metric
covers the whole c_attn.bias (Q, K and V parts), so that noise counts against max|b| of the
tensor; the script also prints the largest |K-bias gradient| on each side.

Also printed, for information only: the same comparison against PyTorch run in float64 from the
same (f32) parameters, which measures distlab's own rounding rather than the sum of both.

Exit status: 0 all within tolerance, 1 a difference too large or a bad file, 77 PyTorch is not
installed (automake's SKIP).
"""
import json
import math
import os
import struct
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def die(msg):
    print("torch_compare: " + msg, file=sys.stderr)
    sys.exit(1)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch_compare: SKIPPED: python3-torch is not installed (apt-get install python3-torch)")
    sys.exit(77)

torch.set_num_threads(1)

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8)}


def read_safetensors(path):
    """name -> tensor (in file order), dtype name, metadata dict."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die("cannot read '%s': %s" % (path, e))
    if len(raw) < 8:
        die("'%s': shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        die("'%s': header length %d exceeds the file (%d bytes)" % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        die("'%s': header is not JSON: %s" % (path, e))
    meta = header.pop("__metadata__", {})
    data = bytearray(raw[8 + n:])
    out, dtname = {}, None
    for name, h in header.items():
        if h["dtype"] not in DTYPES:
            die("'%s': tensor %s has dtype %s (want F32 or F64)" % (path, name, h["dtype"]))
        dt, size = DTYPES[h["dtype"]]
        if dtname is None:
            dtname = h["dtype"]
        elif dtname != h["dtype"]:
            die("'%s': mixed dtypes (%s, %s)" % (path, dtname, h["dtype"]))
        b, e = h["data_offsets"]
        shape = h["shape"]
        numel = 1
        for s in shape:
            numel *= s
        if e - b != numel * size or e > len(data):
            die("'%s': tensor %s: data_offsets %s do not fit shape %s" % (path, name, [b, e], shape))
        t = torch.frombuffer(data, dtype=dt, count=numel, offset=b).clone()
        if sys.byteorder != "little":
            t = torch.from_numpy(t.numpy().byteswap())
        out[name] = t.reshape(shape)
    return out, dtname, meta


def read_tokens(path, G, T):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die("cannot read '%s': %s" % (path, e))
    want = 2 * G * T * 4
    if len(raw) != want:
        die("'%s': %d bytes, want 2 x G %d x T %d x 4 = %d" % (path, len(raw), G, T, want))
    v = struct.unpack("<%di" % (2 * G * T), raw)
    x = torch.tensor(v[:G * T], dtype=torch.long).reshape(G, T)
    y = torch.tensor(v[G * T:], dtype=torch.long).reshape(G, T)
    if x.min() < 0 or x.max() > 255 or y.min() < 0 or y.max() > 255:
        die("'%s': tokens outside 0..255" % path)
    return x, y


# ---- the model: torch_gpt.py's modules, sized by the checkpoint ----
class Block(nn.Module):
    def __init__(s, D, H, T):
        super().__init__()
        s.D, s.H = D, H
        s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        s.qkv, s.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.fc1, s.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        s.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def forward(s, x):
        b, t, _ = x.shape
        D, H = s.D, s.H
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
        a = a.masked_fill(~s.mask[:t, :t], float("-inf")).softmax(-1)
        x = x + s.proj((a @ v).transpose(1, 2).reshape(b, t, D))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s, V, T, L, D, H, tie):
        super().__init__()
        s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.Sequential(*[Block(D, H, T) for _ in range(L)])
        s.lnf, s.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)
        if tie:
            s.head.weight = s.tok.weight

    def forward(s, idx):
        x = s.tok(idx) + s.pos(torch.arange(idx.shape[1]))
        return s.head(s.lnf(s.blocks(x)))


def torch_name(name):
    """distlab's GPT-2-like name -> the torch module parameter name."""
    simple = {"wte.weight": "tok.weight", "wpe.weight": "pos.weight",
              "ln_f.weight": "lnf.weight", "ln_f.bias": "lnf.bias",
              "lm_head.weight": "head.weight"}
    if name in simple:
        return simple[name]
    parts = name.split(".")
    if len(parts) < 4 or parts[0] != "h":
        die("unknown tensor name '%s'" % name)
    sub = {"ln_1": "ln1", "ln_2": "ln2", "attn.c_attn": "qkv", "attn.c_proj": "proj",
           "mlp.c_fc": "fc1", "mlp.c_proj": "fc2"}.get(".".join(parts[2:-1]))
    if sub is None:
        die("unknown tensor name '%s'" % name)
    return "blocks.%s.%s.%s" % (parts[1], sub, parts[-1])


def config_of(meta, params):
    """(V, T, L, D, H, tie) from the metadata "config" string; heads are not in the shapes."""
    cfg = {}
    for kv in str(meta.get("config", "")).split(","):
        if "=" in kv:
            k, v = kv.split("=", 1)
            cfg[k.strip()] = int(v)
    V, D = params["wte.weight"].shape
    T = params["wpe.weight"].shape[0]
    L = len([n for n in params if n.endswith(".ln_1.weight")])
    if "heads" not in cfg:
        die("the checkpoint's __metadata__ has no config with heads=")
    tie = "lm_head.weight" not in params
    for k, v in (("vocab", V), ("d_model", D), ("seq", T), ("layers", L), ("tie", int(tie))):
        if k in cfg and cfg[k] != v:
            die("metadata config %s=%d disagrees with the tensors (%d)" % (k, cfg[k], v))
    return V, T, L, D, cfg["heads"], tie


def forward_backward(params, cfg, x, y, dtype):
    V, T, L, D, H, tie = cfg
    torch.manual_seed(0)
    model = GPT(V, T, L, D, H, tie).to(dtype)
    named = dict(model.named_parameters())  # the tied head appears once, as tok.weight
    seen = set()
    with torch.no_grad():
        for name, t in params.items():
            tn = torch_name(name)
            if tn not in named:
                die("tensor %s (-> %s) has no PyTorch parameter" % (name, tn))
            if tuple(named[tn].shape) != tuple(t.shape):
                die("tensor %s: shape %s, PyTorch %s has %s" % (name, list(t.shape), tn,
                                                               list(named[tn].shape)))
            named[tn].copy_(t.to(dtype))
            seen.add(tn)
    missing = sorted(set(named) - seen)
    if missing:
        die("PyTorch parameters not in the checkpoint: %s" % ", ".join(missing))
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))  # mean over all G*T positions
    loss.backward()
    return loss.item(), {n: named[torch_name(n)].grad.detach() for n in params}


def rel(a, b):
    """per tensor max|a - b| / max|b| (max|a - b| itself when b is all zero)."""
    a, b = a.double(), b.double()
    md = (a - b).abs().max().item()
    mb = b.abs().max().item()
    return md / mb if mb > 0 else md


def step1_loss(path):
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                if r.get("type") == "step" and r.get("step") == 1:
                    return float(r["loss"])
    except (OSError, ValueError) as e:
        die("cannot read the step-1 loss from '%s': %s" % (path, e))
    die("'%s' has no {\"type\":\"step\",\"step\":1} record" % path)


def main(argv):
    args = {"--model": None, "--grads": None, "--tokens": None, "--loss": None, "--json": None,
            "--tol": None}
    quiet = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--quiet":
            quiet = True
            i += 1
            continue
        if a in ("-h", "--help"):
            print(__doc__)
            return 0
        if a not in args or i + 1 >= len(argv):
            die("bad argument '%s' (see --help)" % a)
        args[a] = argv[i + 1]
        i += 2
    if not args["--model"] or not args["--grads"]:
        die("--model and --grads are required (see --help)")
    if (args["--loss"] is None) == (args["--json"] is None):
        die("give exactly one of --loss and --json")
    tokens = args["--tokens"] or args["--grads"] + ".tokens"
    want_loss = float(args["--loss"]) if args["--loss"] is not None else step1_loss(args["--json"])

    params, pdt, meta = read_safetensors(args["--model"])
    grads, gdt, _ = read_safetensors(args["--grads"])
    if list(params) != list(grads):
        die("the model and gradient files hold different tensors")
    for n in params:
        if params[n].shape != grads[n].shape:
            die("%s: model shape %s, gradient shape %s" % (n, list(params[n].shape),
                                                          list(grads[n].shape)))
    cfg = config_of(meta, params)
    V, T, L, D, H, tie = cfg
    ntok = os.path.getsize(tokens) if os.path.exists(tokens) else 0
    if ntok % (8 * T):
        die("'%s': %d bytes is not 2 x G x T %d x 4" % (tokens, ntok, T))
    G = ntok // (8 * T)
    if G < 1:
        die("'%s' is missing or empty" % tokens)
    x, y = read_tokens(tokens, G, T)
    dtype = DTYPES[gdt][0]
    tol = float(args["--tol"]) if args["--tol"] else (1e-5 if gdt == "F32" else 1e-12)

    loss, tg = forward_backward(params, cfg, x, y, dtype)
    loss64, tg64 = forward_backward(params, cfg, x, y, torch.float64)

    print("torch %s: model L=%d C=%d H=%d T=%d V=%d%s, %d tensors, %d parameters, batch G=%d x T=%d,"
          " %s" % (torch.__version__, L, D, H, T, V, " tied" if tie else "", len(params),
                   sum(t.numel() for t in params.values()), G, T, gdt))
    lrel = abs(want_loss - loss) / abs(loss)
    # the JSON prints the loss with 10 significant digits ("%.10g"): up to 5e-10 relative
    ltol = max(tol, 5e-10) if args["--json"] is not None else tol
    ok = lrel <= ltol
    print("loss: distlab %.10g  torch %.10g  relative difference %.3g (torch f64 %.10g: %.3g)%s"
          % (want_loss, loss, lrel, loss64, abs(want_loss - loss64) / abs(loss64),
             "" if lrel <= ltol else "  FAIL"))
    worst, worst_name = -1.0, None
    if not quiet:
        print("%-28s %12s %12s %12s" % ("gradient", "max|torch|", "rel diff", "vs torch f64"))
    for n in params:
        r = rel(grads[n], tg[n])
        r64 = rel(grads[n], tg64[n])
        bad = not (r <= tol)
        if r > worst:
            worst, worst_name = r, n
        if not quiet or bad:
            print("%-28s %12.4g %12.3g %12.3g%s" % (n, tg[n].abs().max().item(), r, r64,
                                                   "  FAIL" if bad else ""))
        ok = ok and not bad
    # the K-bias: exactly zero in distlab by design, rounding noise in PyTorch
    kd = max(grads["h.%d.attn.c_attn.bias" % l][D:2 * D].abs().max().item() for l in range(L))
    kt = max(tg["h.%d.attn.c_attn.bias" % l][D:2 * D].abs().max().item() for l in range(L))
    kq = min(tg["h.%d.attn.c_attn.bias" % l].abs().max().item() for l in range(L))
    print("K-bias gradient (exactly 0 in exact arithmetic): distlab max %.3g, torch max %.3g "
          "(rounding noise; smallest max|c_attn.bias grad| %.3g)" % (kd, kt, kq))
    if kd != 0:
        print("note: distlab's K-bias gradient is not exactly zero")
    print("worst gradient: %s, relative difference %.3g (tolerance %g): %s"
          % (worst_name, worst, tol, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
