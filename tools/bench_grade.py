"""make bench-grade: the same synthetic class graded by plain sequential nbgrader autograde
(its own course directory, nbgrader's own Execute) and by `tfs-grade grade` (sandboxed,
on a LocalCluster) with 1 and 2 workers; prints a markdown table and writes it to
bench/grade.md. Mixed class of 01_attention: full marks, partial, a catalogued mistake,
untouched, an infinite loop (timeout).

    python tools/bench_grade.py [--students N] [--timeout S]
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


def plain_nbgrader(subs: Path, work: Path, timeout: int) -> float:
    from nbtools import A01
    from tfsgrade import course
    root = course.make_course(work / "plain", [A01], timeout=timeout)
    course.generate(root, [A01])
    for d in subs.iterdir():
        dst = root / "submitted" / d.name / A01
        dst.mkdir(parents=True)
        shutil.copyfile(d / f"{A01}.ipynb", dst / f"{A01}.ipynb")
    t = time.perf_counter()
    r = course.run_nbgrader(root, ["autograde", A01, "--force"])
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
    return time.perf_counter() - t


def ours(subs: Path, out: Path, workers: int, timeout: int):
    from nbtools import A01
    from tfsgrade.grade import grade
    lines = []
    t = time.perf_counter()
    items = grade(subs, out, names=[A01], timeout=timeout, workers=workers,
                  log=lambda *a: lines.append(" ".join(map(str, a))))
    total = time.perf_counter() - t
    tasks = [it.result["timings"]["total_s"] for it in items if it.result and "timings" in it.result]
    stages = "; ".join(ln.strip() for ln in lines if ln.strip().split(":")[0] in ("normalise", "run", "merge"))
    return total, tasks, stages


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--students", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=10)
    a = ap.parse_args()
    from tfsgrade import sandbox
    start_ms = sandbox.start_cost(20)
    with tempfile.TemporaryDirectory(prefix="tfs-bench-") as tmp:
        tmp = Path(tmp)
        make_class(tmp / "subs", a.students)
        plain = plain_nbgrader(tmp / "subs", tmp, a.timeout)
        one, tasks1, _ = ours(tmp / "subs", tmp / "w1", 1, a.timeout)
        two, tasks2, stages = ours(tmp / "subs", tmp / "w2", 2, a.timeout)
    per_task = statistics.median(tasks1)
    proj = 300 * 8 * per_task / 64
    rows = [
        ("class", f"{a.students} x 01_attention (full, partial, mistake, untouched, infinite loop)", ""),
        ("plain sequential `nbgrader autograde` (execution only)", f"{plain:.1f} s", ""),
        ("`tfs-grade grade`, 1 worker (end to end: course, sandboxed runs, merge, feedback, report)", f"{one:.1f} s",
         f"{plain / one:.2f}x plain"),
        ("`tfs-grade grade`, 2 workers (end to end)", f"{two:.1f} s", f"{plain / two:.2f}x plain; {one / two:.2f}x from 1 to 2 workers"),
        ("per task (sandbox + kernel + notebook), median, 1 worker", f"{per_task:.1f} s", ""),
        ("stages of the 2-worker run", stages, "the rest: fresh course, feedback, grades.csv, report"),
        ("empty sandbox start (bwrap, median of 20)", f"{start_ms:.1f} ms", ""),
        ("projection: 300 students x 8 notebooks on 64 cores", f"{proj / 60:.0f} min",
         "from the measured per-task cost of 01; later notebooks cost more"),
    ]
    md = ["| measure | value | note |", "|---|---|---|"] + [f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows]
    text = "\n".join(md)
    print(text)
    (REPO / "bench").mkdir(exist_ok=True)
    (REPO / "bench" / "grade.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
