"""Benchmark of notebook 10: peak tensor memory and time of naive attention against the
reference blockwise (FlashAttention-style) attention on CPU, causal, one sequence of 4 heads,
d = 64, blocks of 128 keys, as the notebook's section 4 measures them.

    .venv/bin/python tools/bench_efficient_attention.py [--lengths 1024 4096] [--threads 1]

Goal: the same output (atol 1e-5), and at the longest length a blockwise peak at most a quarter
of the naive one (memory O(L) against O(L^2)). Time is reported, not judged: on a CPU both do
the same arithmetic. Exit status 0 when the goal is met, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys
import timeit

import torch

from tfscratch.memtrack import peak_memory
from tfscratch.reference import flash_attention, naive_attention


def best_time(fn, repeats=3):
    return min(timeit.repeat(fn, number=1, repeat=repeats))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ok = True
    with torch.no_grad():
        for L in args.lengths:
            q, k, v = torch.randn(3, 1, 4, L, 64).unbind(0)
            naive = lambda: naive_attention(q, k, v, causal=True)  # noqa: E731
            block = lambda: flash_attention(q, k, v, block_size=args.block, causal=True)  # noqa: E731
            out_n, peak_n = peak_memory(naive)
            out_b, peak_b = peak_memory(block)
            same = torch.allclose(out_n, out_b, atol=1e-5)
            t_n, t_b = best_time(naive), best_time(block)
            print(f"L={L}: peak {peak_n / 2**20:.1f} MiB naive vs {peak_b / 2**20:.1f} MiB blockwise "
                  f"({peak_n / peak_b:.1f}x less); time {1000 * t_n:.0f} ms vs {1000 * t_b:.0f} ms; "
                  f"same output: {same}")
            ok = ok and same
    ok = ok and peak_b * 4 <= peak_n
    print(f"goal (same output; blockwise peak <= naive / 4 at L={args.lengths[-1]}): "
          f"{'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
