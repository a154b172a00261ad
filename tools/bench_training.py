"""Benchmark of notebook 12 (issue 30): its training demonstration, run as written (the solution
notebook, headless, full length (`TFS_FULL_RUN=1`), not the grading fast path) on each real corpus, and the figures
it prints: tokens per second on this CPU (evaluation included), the best validation perplexity
within the demo's budget (1,200 steps) against the bigram and unigram baselines.

    .venv/bin/python tools/bench_training.py [--corpus shakespeare tang300]

The corpora come from `make corpora` (.corpora/); where one is missing the notebook trains on
the shipped excerpt and the row says so. One source of truth: the loop is the notebook's.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

FIGURES = {
    "source": re.compile(r"documents, ([\d,]+) bytes, from (.*)"),
    "tokens": re.compile(r"([\d,]+) training and ([\d,]+) validation tokens"),
    "speed": re.compile(r"(\d+) steps \(([\d.]+) passes.*in ([\d.]+) s: ([\d,]+) tokens/s"),
    "best": re.compile(r"best validation loss ([\d.]+) \(perplexity ([\d.]+)\) at step (\d+); "
                       r"bigram ([\d.]+), unigram ([\d.]+)"),
    "end": re.compile(r"at the end: training loss ([\d.]+), validation loss ([\d.]+)"),
}


def run(name: str) -> dict:
    from nbtools import SOLUTIONS
    from test_notebooks import execute
    env = {k: v for k, v in os.environ.items()
           if k not in ("NBGRADER_EXECUTION", "TFS_QUICK_TRAINING")}
    env["TFS_CORPUS"] = name
    env["TFS_FULL_RUN"] = "1"   # the notebook's full run (FULL_RUN = True), not its short default
    nb, secs = execute(SOLUTIONS / "12_training.ipynb", env)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    got = {k: rx.search(text) for k, rx in FIGURES.items()}
    if errors or not all(got.values()):
        missing = [k for k, m in got.items() if not m]
        raise SystemExit(f"{name}: the notebook did not print its figures ({missing}); "
                         f"errors: {[e.ename for e in errors]}")
    return {"seconds": secs, **{k: m.groups() for k, m in got.items()}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", nargs="+", default=["shakespeare", "tang300"])
    a = ap.parse_args()
    for name in a.corpus:
        r = run(name)
        size, source = r["source"]
        steps, passes, secs, tps = r["speed"]
        loss, ppl, at, bigram, unigram = r["best"]
        excerpt = " (the shipped excerpt: run `make corpora`)" if "excerpt" in source else ""
        print(f"{name}{excerpt}: {size} bytes, {r['tokens'][0]} training tokens; {steps} steps "
              f"({passes} passes) in {secs} s, {tps} tokens/s; best validation perplexity {ppl} "
              f"at step {at} (bigram {bigram}, unigram {unigram}); at the end training loss "
              f"{r['end'][0]}, validation {r['end'][1]}; notebook {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
