"""Benchmark of notebook 07: train the reference Transformer on the date-rewriting task exactly
as the notebook does (label smoothing 0.1 included), then report the held-out exact-match accuracy and the times.

    .venv/bin/python tools/bench_transformer.py [--seed 0] [--steps N] [--threads 1]

Target (issue 8): >= 99% held-out exact match after <= 60 s of training on a 2-core CPU.
Exit status 0 when the target is met, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from tfscratch import seq2seq as s2s
from tfscratch.reference import Transformer, greedy_decode, smoothed_teacher_forcing_loss


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=s2s.TRAIN_CONFIG["steps"])
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 is fastest for a model this small)")
    ap.add_argument("--smoothing", type=float, default=s2s.LABEL_SMOOTHING,
                    help="label smoothing of the training loss (the notebook's: 0.1)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="stop training after this many seconds")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    train_set, test_set = s2s.make_task(seed=0)
    t_data = time.perf_counter() - t0

    torch.manual_seed(args.seed)
    model = Transformer(**s2s.MODEL_CONFIG)
    n_params = sum(p.numel() for p in model.parameters())
    cfg = {**s2s.TRAIN_CONFIG, "steps": args.steps}
    def loss_fn(model, src, tgt):
        return smoothed_teacher_forcing_loss(model, src, tgt, smoothing=args.smoothing)

    res = s2s.train(model, train_set, loss_fn, progress=False, seed=args.seed,
                    time_limit=args.time_limit, **cfg)

    t1 = time.perf_counter()
    acc, _ = s2s.exact_match(model, test_set, greedy_decode)
    t_eval = time.perf_counter() - t1

    ok = acc >= 0.99 and res.seconds <= 60
    print(f"model: {n_params:,} parameters {s2s.MODEL_CONFIG}")
    print(f"data: {len(train_set)} train / {len(test_set)} held-out examples ({t_data:.1f} s)")
    print(f"training: {res.steps} steps of {cfg['batch_size']} in {res.seconds:.1f} s "
          f"({1000 * res.seconds / max(res.steps, 1):.0f} ms/step), final loss "
          f"{sum(res.losses[-20:]) / len(res.losses[-20:]):.4f}")
    print(f"held-out exact match (greedy): {acc:.2%} ({t_eval:.1f} s to decode)")
    print(f"target >= 99% within <= 60 s of training: {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
