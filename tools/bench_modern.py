"""Benchmark of notebook 09: train the reference ModernDecoderLM and notebook 08's DecoderOnlyLM
of the same width on the notebook's copy task (8 random tokens, a separator, the same 8
again; loss on the copied half), exactly as section 5 of the notebook does, and report
parameters, training time and final loss.

    .venv/bin/python tools/bench_modern.py [--steps 150] [--threads 1]

Target (issue 17): the modern model trains in well under a minute on CPU. Exit status 0 when
its training takes < 60 s and its final loss is below 0.1, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys

import torch

from notebook_code import notebook_defs
from tfscratch.reference import DecoderOnlyLM, ModernDecoderLM

# the notebook's own copy task and training loop (section 5 of 09), not a copy of them
NB = notebook_defs("09_modern_decoder", "V_COPY", "HALF", "copy_batch", "copy_loss", "train_copy")
V_COPY, train_copy = NB["V_COPY"], NB["train_copy"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gpt = DecoderOnlyLM(V_COPY + 1, 64, 4, 2, 256, max_len=64)
    torch.manual_seed(0)
    modern = ModernDecoderLM(V_COPY + 1, 64, 2, 4, 2, 172, max_len=64)
    res = {}
    for name, m in (("08 DecoderOnlyLM", gpt), ("09 ModernDecoderLM", modern)):
        losses, secs = train_copy(m, args.steps)
        n = sum(p.numel() for p in m.parameters())
        res[name] = (losses, secs)
        print(f"{name}: {n:,} parameters, {args.steps} steps in {secs:.1f} s, final loss "
              f"{losses[-1]:.4f}")
    losses, secs = res["09 ModernDecoderLM"]
    ok = secs < 60 and losses[-1] < 0.1
    print(f"target: 09 trains in < 60 s to a loss < 0.1: {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
