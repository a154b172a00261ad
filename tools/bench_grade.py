"""make bench-grade: the same synthetic class graded by plain sequential nbgrader autograde
(its own course directory, nbgrader's own Execute) and by `tfs-grade grade` (sandboxed,
on a LocalCluster) with 1 and 2 workers; prints a markdown table and writes it to
bench/grade.md. Mixed class of 01_attention: full marks, partial, a catalogued mistake,
untouched, an infinite loop (timeout).

    python tools/bench_grade.py [--students N] [--timeout S]
    python tools/bench_grade.py --realistic [--students N]   # 01 and 02: full, partial,
        wrong, untouched (no endless loops); writes bench/grade-realistic.md

The task's fixed cost is read from the tasks themselves: the sandbox and kernel (the runner's
`total_s` less the checks), and the check's process (`checks`: what was left of the check
server's warm-up when the notebook had run, and each exercise's fork, cells and plan).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def make_class(subs: Path, n: int):
    from catalogue import modules
    from nbtools import A01, solution_sources, student_notebook, write
    sols = solution_sources(A01)
    mod = next(m for m in modules() if m.ASSIGNMENT == A01)
    kinds = [sols, {"softmax": sols["softmax"]}, dict(sols, scaled_dot_product_attention=mod.MISTAKES[0].code),
             {}, dict(sols, scaled_dot_product_attention="def scaled_dot_product_attention(q, k, v):\n"
                                                          "    while True:\n        pass\n")]
    for i in range(n):
        fill = kinds[i % len(kinds)] if i != n - 1 or n < len(kinds) else kinds[4]
        write(student_notebook(A01, fill), subs / f"s{i:03d}" / f"{A01}.ipynb")


REALISTIC = ("01_attention", "02_masks")


def make_realistic(subs: Path, n: int):
    """n students, each handing in 01 and 02: full marks, one exercise done, a catalogued
    mistake in one exercise, or untouched, in turn."""
    from catalogue import modules
    from nbtools import solution_sources, student_notebook, write
    for a in REALISTIC:
        sols = solution_sources(a)
        mod = next(m for m in modules() if m.ASSIGNMENT == a)
        first = next(iter(sols))
        wrong = next(m for m in mod.MISTAKES if m.exercise == first)
        kinds = [sols, {first: sols[first]}, dict(sols, **{first: wrong.code}), {}]
        for i in range(n):
            write(student_notebook(a, kinds[i % len(kinds)]), subs / f"s{i:03d}" / f"{a}.ipynb")


def plain_nbgrader(subs: Path, work: Path, timeout: int, names=("01_attention",)) -> float:
    from tfsgrade import course
    root = course.make_course(work / "plain", list(names), timeout=timeout)
    course.generate(root, list(names))
    for a in names:
        for d in subs.iterdir():
            dst = root / "submitted" / d.name / a
            dst.mkdir(parents=True)
            shutil.copyfile(d / f"{a}.ipynb", dst / f"{a}.ipynb")
    t = time.perf_counter()
    for a in names:
        r = course.run_nbgrader(root, ["autograde", a, "--force"])
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:])
    return time.perf_counter() - t


def ours(subs: Path, out: Path, workers: int, timeout: int, names=("01_attention",)):
    from tfsgrade.grade import grade
    lines = []
    t = time.perf_counter()
    items = grade(subs, out, names=list(names), timeout=timeout, workers=workers,
                  log=lambda *a: lines.append(" ".join(map(str, a))))
    total = time.perf_counter() - t
    tasks = [it.result["timings"] for it in items if it.result and "timings" in it.result]
    stages = "; ".join(ln.strip() for ln in lines if ln.strip().split(":")[0] in ("normalise", "run", "merge"))
    return total, tasks, stages


def fixed_costs(tasks: list) -> tuple:
    """Medians over the tasks: (whole task, the checks, waiting for the check server's warm-up,
    one exercise's check)."""
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    checks = [t.get("checks", {}) for t in tasks]
    return (med([t["total_s"] for t in tasks]), med([c.get("checks_s", 0.0) for c in checks]),
            med([c.get("ready_wait_s", 0.0) for c in checks]),
            med([x for c in checks for x in c.get("per_check_s", [])]))


def realistic(a) -> None:
    with tempfile.TemporaryDirectory(prefix="tfs-bench-") as tmp:
        tmp = Path(tmp)
        make_realistic(tmp / "subs", a.students)
        plain = plain_nbgrader(tmp / "subs", tmp, 60, REALISTIC)
        two, tasks, stages = ours(tmp / "subs", tmp / "w2", 2, 60, REALISTIC)
    task, checks, wait, one = fixed_costs(tasks)
    rows = [("class", f"{a.students} students x (01_attention, 02_masks): full, partial, wrong, untouched", ""),
            ("plain sequential `nbgrader autograde`", f"{plain:.1f} s", ""),
            ("`tfs-grade grade`, 2 workers, end to end", f"{two:.1f} s", f"{plain / two:.2f}x plain"),
            ("per task, median (sandbox, kernel, notebook, checks)", f"{task:.2f} s", ""),
            ("the checks of one task, median", f"{checks:.2f} s",
             f"of which waiting for the check server's warm-up {wait:.2f} s; one exercise {one:.2f} s"),
            ("stages", stages, "")]
    _write("grade-realistic.md", rows)


def _write(name: str, rows) -> None:
    md = ["| measure | value | note |", "|---|---|---|"] + [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
    text = "\n".join(md)
    print(text)
    (REPO / "bench").mkdir(exist_ok=True)
    (REPO / "bench" / name).write_text(text + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--students", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=10)
    ap.add_argument("--realistic", action="store_true")
    a = ap.parse_args()
    if a.realistic:
        return realistic(a)
    from tfsgrade import sandbox
    start_ms = sandbox.start_cost(20)
    with tempfile.TemporaryDirectory(prefix="tfs-bench-") as tmp:
        tmp = Path(tmp)
        make_class(tmp / "subs", a.students)
        plain = plain_nbgrader(tmp / "subs", tmp, a.timeout)
        one, tasks1, _ = ours(tmp / "subs", tmp / "w1", 1, a.timeout)
        two, tasks2, stages = ours(tmp / "subs", tmp / "w2", 2, a.timeout)
    per_task, checks, wait, one_check = fixed_costs(tasks1)
    proj = 300 * 8 * per_task / 64
    rows = [
        ("class", f"{a.students} x 01_attention (full, partial, mistake, untouched, infinite loop)", ""),
        ("plain sequential `nbgrader autograde` (execution only)", f"{plain:.1f} s", ""),
        ("`tfs-grade grade`, 1 worker (end to end: course, sandboxed runs, merge, feedback, report)", f"{one:.1f} s",
         f"{plain / one:.2f}x plain"),
        ("`tfs-grade grade`, 2 workers (end to end)", f"{two:.1f} s", f"{plain / two:.2f}x plain; {one / two:.2f}x from 1 to 2 workers"),
        ("per task (sandbox + kernel + notebook + checks), median, 1 worker", f"{per_task:.1f} s",
         f"the checks {checks:.2f} s (warm-up left {wait:.2f} s, one exercise {one_check:.2f} s)"),
        ("stages of the 2-worker run", stages, "the rest: fresh course, feedback, grades.csv, report"),
        ("empty sandbox start (bwrap, median of 20)", f"{start_ms:.1f} ms", ""),
        ("projection: 300 students x 8 notebooks on 64 cores", f"{proj / 60:.0f} min",
         "from the measured per-task cost of 01; later notebooks cost more"),
    ]
    _write("grade.md", rows)


if __name__ == "__main__":
    main()
