#!/usr/bin/python3
"""torch_gpt: training throughput of distlab-train's GPT in PyTorch, the peer of docs/peers-train.sh.

The model is distlab's (docs/API.md, section 15): learned token and position embeddings, pre-LayerNorm
blocks (causal multi-head attention with biased Q/K/V and output projections, an MLP of width 4C
with the exact erf GeLU), residuals, a final LayerNorm and an LM head without bias; AdamW.
Only the speed is measured: the data are random bytes.

usage: torch_gpt.py [--procs N] [--threads T] [--steps S] [--warmup W]
                    [--layers L] [--d-model C] [--heads H] [--seq T] [--batch B]
  --procs 1 trains in this process; N >= 2 runs DistributedDataParallel over gloo on N processes
  (B sequences each), as distlab-train --dp N does. Prints one line ending in "tokens/s=X": the
  median step's global tokens per second over the S steps after W warm-up steps.
"""
import argparse
import math
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description="PyTorch peer of distlab-train (throughput)")
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="threads per process")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per process and step")
    a = p.parse_args()
    if min(a.procs, a.threads, a.steps, a.layers, a.heads, a.seq, a.batch) < 1 or a.warmup < 0 \
            or a.d_model % a.heads:
        p.error("counts must be >= 1 and --heads must divide --d-model")
    return a


args = parse()
# Debian's torch calls the system OpenBLAS, which reads its thread count when it loads and ignores
# torch.set_num_threads: set it before the import (DDP's children inherit the environment).
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, c, h, t):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        # a plain attribute, not a buffer: DDP would broadcast it, and gloo has no bool type
        self.causal = torch.ones(t, t).tril().bool()

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(c // self.h)
        s = s.masked_fill(~self.causal[:t, :t], float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, a.d_model), nn.Embedding(a.seq, a.d_model)
        self.blocks = nn.Sequential(*[Block(a.d_model, a.heads, a.seq) for _ in range(a.layers)])
        self.lnf = nn.LayerNorm(a.d_model)
        self.head = nn.Linear(a.d_model, 256, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.lnf(self.blocks(x)))


def train(rank, a, port):
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = GPT(a)
    dist = None
    if a.procs > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=a.procs)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for i in range(a.warmup + a.steps):
        batch = torch.randint(0, 256, (a.batch, a.seq + 1), generator=gen)
        t0 = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dist:
            dist.barrier()  # the step ends when every process has finished it
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = statistics.median(times) * 1e3
        tokens = a.procs * a.batch * a.seq
        params = sum(p.numel() for p in model.parameters())
        print(f"torch {torch.__version__}: {a.procs} process(es) x {a.threads} thread(s), "
              f"{params} parameters, {tokens} tokens/step, median step {ms:.1f} ms over "
              f"{a.steps} steps, loss {loss.item():.3f}, tokens/s={tokens / ms * 1e3:.0f}",
              flush=True)
    if dist:
        dist.destroy_process_group()


if __name__ == "__main__":
    port = 29500 + os.getpid() % 2000
    if args.procs == 1:
        train(0, args, port)
    else:
        import torch.multiprocessing as mp
        mp.spawn(train, args=(args, port), nprocs=args.procs)
    sys.exit(0)
