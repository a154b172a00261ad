"""Benchmark for notebook 03_multihead: our MultiHeadAttention against nn.MultiheadAttention.

Forward + backward at B=32, L=128, d_model=256, 8 heads, float32 on the CPU (issue 4: the
course's implementation must stay within 1.5x of PyTorch's). Timed: the reference module
(tfscratch.reference.MultiHeadAttention) and the solution notebook's own class, read from
solutions/src/03_multihead.py, each against nn.MultiheadAttention called the usual way
(need_weights=True, as ours always keeps its weights) and, for information, with
need_weights=False (PyTorch's fused attention kernel).

Runs are interleaved (ours, PyTorch's, ours, ...) so that load from other processes hits both
alike; the figure reported is the ratio of medians (the ratio of the best runs is shown too).

    .venv/bin/python tools/bench_multihead.py [--repeats 15] [--threads N] [--no-solution]
Exit status 1 when a ratio exceeds --limit (default 1.5).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "helpers"))

from tfscratch.checks.core import copy_mha_to_torch  # noqa: E402
from tfscratch.reference import MultiHeadAttention as RefMHA  # noqa: E402


def solution_class():
    """Execute the setup and solution cells of the 03 source; return its MultiHeadAttention."""
    sys.path.insert(0, str(REPO / "autograder"))
    from tfsgrade.build import parse
    src = REPO / "solutions" / "src" / "03_multihead.py"
    ns: dict = {"__name__": "bench"}
    for kind, gid, _, text in parse(src.read_text(), str(src)):
        if kind in ("setup", "solution"):
            code = "\n".join(ln for ln in text.splitlines()
                             if not ln.lstrip().startswith(("%", "!")))
            exec(compile(code, f"<03:{gid}>", "exec"), ns)
        if gid == "MultiHeadAttention":
            break
    return ns["MultiHeadAttention"]


def step(fn, x):
    out = fn(x)
    out.sum().backward()


def bench(ours, theirs, x, repeats, warmup=3):
    for _ in range(warmup):
        step(ours, x)
        step(theirs, x)
    t_ours, t_theirs = [], []
    for _ in range(repeats):
        for fn, times in ((ours, t_ours), (theirs, t_theirs)):
            t0 = time.perf_counter()
            step(fn, x)
            times.append(time.perf_counter() - t0)
    return (statistics.median(t_ours), statistics.median(t_theirs), min(t_ours), min(t_theirs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--limit", type=float, default=1.5)
    ap.add_argument("--no-solution", action="store_true", help="time the reference only")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, L, D, H = args.batch, args.length, args.d_model, args.heads
    x = torch.randn(B, L, D, requires_grad=True)
    torch_mha = nn.MultiheadAttention(D, H, batch_first=True)

    classes = [("reference", RefMHA)]
    if not args.no_solution:
        classes.append(("solution", solution_class()))
    print(f"MultiHeadAttention forward+backward, B={B} L={L} d_model={D} heads={H}, "
          f"float32 CPU, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"median of {args.repeats}")
    worst = 0.0
    for name, cls in classes:
        ours = cls(D, H)
        copy_mha_to_torch(ours, torch_mha)
        with torch.no_grad():  # same numbers from both before timing anything
            diff = (ours(x, x, x) - torch_mha(x, x, x)[0]).abs().max().item()
        for need_weights in (True, False):
            theirs = lambda t, nw=need_weights: torch_mha(t, t, t, need_weights=nw)[0]  # noqa: E731
            a, b, a_min, b_min = bench(lambda t: ours(t, t, t), theirs, x, args.repeats)
            ratio = a / b
            tag = "need_weights=True " if need_weights else "need_weights=False"
            print(f"  {name:9s} {a * 1e3:8.1f} ms   nn.MultiheadAttention({tag}) "
                  f"{b * 1e3:8.1f} ms   ratio {ratio:.2f}x (best runs: {a_min / b_min:.2f}x)"
                  + (f"   max |diff| {diff:.1e}" if need_weights else ""))
            if need_weights:
                worst = max(worst, ratio)
    verdict = "OK" if worst <= args.limit else "TOO SLOW"
    print(f"worst ratio against nn.MultiheadAttention (need_weights=True): {worst:.2f}x "
          f"(limit {args.limit}x): {verdict}")
    return 0 if worst <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
