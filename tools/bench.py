"""make bench: the course's speed figures, printed and written to bench/results.md.

- headless execution time of each solution notebook (nbclient, like nbconvert --execute);
- autograding one full submission (every notebook, solution filled in) with the grading command;
- grading the named fixture class of tests/ (9 submissions of 01_attention, zipped);
- the notebook-specific benchmarks in tools/bench_*.py (multi-head attention speed, training
  accuracy of 07, KV-cache speed-up of 08, peak memory of 10's blockwise attention), when
  present;
- the browser tests' run time (tests/browser), when Chromium is available.

    python tools/bench.py [--skip-notebooks] [--skip-grading] [--skip-extra] [--skip-browser]
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def bench_notebooks(rows):
    from nbtools import SOLUTIONS
    from test_notebooks import execute
    from tfsgrade import manifest
    for a in manifest.load().names():
        env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}
        nb, secs = execute(SOLUTIONS / f"{a}.ipynb", env)
        errs = sum(o.output_type == "error" for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
        figs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
        rows.append((f"execute solutions/{a}.ipynb headless", f"{secs:.1f} s",
                     f"{figs} figures, {errs} errors"))
        print(rows[-1], flush=True)


def bench_grading(rows):
    from nbtools import make_fixture_class, solution_sources, student_notebook, write
    from tfsgrade import manifest
    from tfsgrade.grade import grade
    course = manifest.load()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for a in course.names():
            write(student_notebook(a, solution_sources(a)), tmp / "one" / "student" / f"{a}.ipynb")
        t0 = time.perf_counter()
        items = grade(tmp / "one", tmp / "out1", names=course.names(), log=lambda *x: None)
        secs = time.perf_counter() - t0
        score = sum(i.score for i in items)
        full = sum(nb.points for nb in course)  # what the sources promise, not the gradebook
        rows.append((f"grade one full submission ({len(items)} notebooks)", f"{secs:.1f} s",
                     f"score {score:g}/{full:g}"))
        print(rows[-1], flush=True)
        zpath, _ = make_fixture_class(tmp)
        t0 = time.perf_counter()
        items = grade(zpath, tmp / "out2", names=["01_attention"], timeout=20, log=lambda *x: None)
        secs = time.perf_counter() - t0
        flagged = sum(i.status == "flagged" for i in items)
        rows.append(("grade the fixture class (9 submissions of 01, zip)", f"{secs:.1f} s",
                     f"{len(items) - flagged} graded, {flagged} flagged"))
        print(rows[-1], flush=True)


def bench_extra(rows):
    for script in sorted((REPO / "tools").glob("bench_*.py")):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           cwd=REPO, timeout=900)
        secs = time.perf_counter() - t0
        out = (r.stdout.strip().splitlines() or ["(no output)"])
        summary = " / ".join(ln.strip() for ln in out[-4:])
        if r.returncode:
            summary = f"FAILED ({r.returncode}): {summary} {r.stderr.strip().splitlines()[-1:]}"
        rows.append((script.name, f"{secs:.1f} s", summary))
        print(rows[-1], flush=True)


def bench_browser(rows):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/browser"], cwd=REPO,
                       capture_output=True, text=True)
    secs = time.perf_counter() - t0
    last = (r.stdout.strip().splitlines() or [""])[-1]
    rows.append(("browser tests (tests/browser)", f"{secs:.1f} s", last))
    print(rows[-1], flush=True)


def main():
    ap = argparse.ArgumentParser()
    for part in ("notebooks", "grading", "extra", "browser"):
        ap.add_argument(f"--skip-{part}", action="store_true")
    a = ap.parse_args()
    rows = []
    t0 = time.perf_counter()
    if not a.skip_notebooks:
        bench_notebooks(rows)
    if not a.skip_grading:
        bench_grading(rows)
    if not a.skip_extra:
        bench_extra(rows)
    if not a.skip_browser and (REPO / "tests" / "browser").exists():
        bench_browser(rows)
    import torch
    lines = ["# Benchmark results", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python "
             f"{platform.python_version()}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} torch threads. Total {time.perf_counter() - t0:.0f} s.", "",
             "| what | time | result |", "|---|---|---|"]
    lines += [f"| {w} | {t} | {r} |" for w, t, r in rows]
    out = REPO / "bench" / "results.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
