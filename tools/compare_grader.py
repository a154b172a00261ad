"""The trust_process class graded by two versions of the grader, side by side: what each
hostile fixture of tests/hostile/trust_process.py earns (and whether it is marked `review`)
before and after the check moved into a process of its own, and what the honest ones keep.
A second, small class (honest + one notebook nested 100,000 levels deep) shows whether one
file can end the whole run.

    python tools/compare_grader.py                      # this tree's grader, one table
    python tools/compare_grader.py --tree /tmp/old      # another checkout's grader
    python tools/compare_grader.py --old 845a55d --md bench/trust.md
        # a temporary worktree of 845a55d: both trees graded, the side-by-side tables
        # (docs/trust-before-after.md holds one such run, with what it shows)

The fixtures always come from THIS tree (the old tree has no trust_process.py); only the
grader changes. Each run is `python -m tfsgrade.cli grade` in a subprocess whose PYTHONPATH
and cwd are the graded tree, so its tfsgrade and tfscratch (and its solutions/, notebooks/,
nbgrader config) are the ones used, whatever the venv's editable install points at.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hostile import trust_process as tp   # noqa: E402
from nbtools import A01, points, solution_sources, student_notebook, write   # noqa: E402

FULL = sum(points(A01).values())   # the autograded points (grades.csv's max_total adds 2 by hand)

# a few words for each student of the class, for the table
WHAT = {
    "proc_pydoc": "pydoc.locate runs hidden code: builtins.exec replaced",
    "proc_pkgutil": "pkgutil.resolve_name runs hidden code: builtins.__import__ replaced",
    "proc_pickle": "pickle.loads runs hidden code: builtins.compile replaced",
    "proc_type_hints": "typing.get_type_hints runs hidden code: a pre_execute hook",
    "proc_codecs": "rot13 docstring (codecs) runs hidden code: builtins.exec replaced",
    "proc_builtins": "builtins.exec replaced (guard cell's vm_source patched)",
    "proc_import": "builtins.__import__ replaced (boot globals patched)",
    "proc_compile": "builtins.compile replaced (tfs_probe_vm source patched)",
    "proc_pre_execute": "pre_execute hook forges the guard's hand-over state",
    "proc_post_execute": "post_execute hook forges the hand-over state",
    "proc_input_transformer": "input transformer rewrites the guard cell's text",
    "proc_ast_transformer": "AST transformer patches the guard cell's vm_source",
    "proc_gc_exit": "gc finds the guards, exits them around the call, puts them back",
    "proc_get_kernel": "get_kernel CPU handle taken before the guard (+ autograd.Function)",
    "proc_c_kernel": "torch._C computed-kernel handles (forward, backward) taken early",
    "proc_decomp_clone": "torch._decomp softmax copied before the guard swaps its code",
    "proc_fresh_python": "a fresh python -I computes softmax",
    "proc_daemon_server": "double-forked torch server computes softmax",
    "proc_fork_copy": "a forked copy takes its guards off, runs torch.softmax (SIGCHLD ignored)",
    "proc_sdpa_softmax": "softmax via F.scaled_dot_product_attention's fused CPU kernel",
    "proc_mem_handle": "FINDING: the locked guard's leaked handle found in memory (ctypes), released",
    "proc_np_handle": "FINDING: the same with numpy as_strided (no ctypes, no gc)",
    "proc_naive": "reference: the naive softmax (overflows)",
    "ok_zombie": "a finished child never waited for",
    "ok_sleepers": "50 `sleep 600` children left running",
    "ok_daemon": "a detached sleeping daemon",
    "ok_float64": "float64 as the default dtype",
    "ok_jit_script": "softmax under torch.jit.script",
    "ok_compile_eager": "torch.compile(backend='eager')",
    "ok_colab": "saved by Colab (its metadata, outputs)",
    "honest": "the course's solution",
    "untouched": "the released notebook",
}


ONLY: set = set()     # --only: these students (and honest, untouched) only


def released_by(tree: Path):
    """A function that puts the course's own cells of `tree`'s released notebook (the cells a
    student leaves as handed out) into a notebook built from this tree's: the old grader then
    sees its own release, not one it would call changed (its scan reads a changed course cell
    as the student's code). The student's cells (solutions, cells added) stay as they are."""
    import nbformat
    if tree.resolve() == REPO:
        return lambda nb: nb
    mine = nbformat.read(REPO / "notebooks" / f"{A01}.ipynb", as_version=4)
    theirs = nbformat.read(tree / "notebooks" / f"{A01}.ipynb", as_version=4)
    here = {c.get("id"): c.source for c in mine.cells}
    there = {c.get("id"): c.source for c in theirs.cells}
    same_shape = len(mine.cells) == len(theirs.cells)

    def put(nb):
        by_place = same_shape and len(nb.cells) == len(mine.cells)   # ids renamed (Colab)
        for i, c in enumerate(nb.cells):
            if c.get("id") in there and here.get(c.get("id")) == c.source:
                c.source = there[c.get("id")]
            elif by_place and mine.cells[i].source == c.source:
                c.source = theirs.cells[i].source
        return nb
    return put


def trust_class(subs: Path, tree: Path = REPO) -> list[str]:
    """The class of tests/conftest.py's class_trust for trust_process (its FINDINGS, the
    routes the new grader's guard does not stop, included): honest, untouched and every fixture, one folder
    each (only those of --only, where given), as handed out by `tree` (`released_by`).
    Returns the student ids in table order."""
    ids, put = [], released_by(tree)
    for sid, _, nb in tp.students():
        if ONLY and sid not in ONLY:
            continue
        write(put(nb), subs / sid / f"{A01}.ipynb")
        ids.append(sid)
    write(put(student_notebook(A01, solution_sources(A01))), subs / "honest" / f"{A01}.ipynb")
    write(put(student_notebook(A01)), subs / "untouched" / f"{A01}.ipynb")
    return ids + ["honest", "untouched"]


def deep_class(subs: Path, tree: Path = REPO) -> list[str]:
    """Issue 37 class 5: valid JSON nested 100,000 levels deep in one cell's metadata
    (as tests/test_grading_malformed.py builds it), beside an honest student."""
    import nbformat
    write(student_notebook(A01, solution_sources(A01)), subs / "honest" / f"{A01}.ipynb")
    text = nbformat.writes(student_notebook(A01))
    deep = text.replace('"metadata": {', '"metadata": {"deep": ' + "[" * 100000 + "]" * 100000 + ", ", 1)
    (subs / "deep").mkdir(parents=True)
    (subs / "deep" / f"{A01}.ipynb").write_text(deep)
    return ["honest", "deep"]


def grade_with(tree: Path, subs: Path, out: Path) -> dict:
    """`tfs-grade grade` of the given tree on subs; its exit status, seconds, rows, and the
    files its tfsgrade and tfscratch were imported from (to be sure which grader ran)."""
    env = dict(os.environ, PYTHONPATH=f"{tree / 'autograder'}:{tree / 'helpers'}")
    env.pop("TFS_COURSE", None)        # paths.REPO then follows the imported package
    which = subprocess.run([sys.executable, "-c", "import tfsgrade, tfscratch; "
                            "print(tfsgrade.__file__); print(tfscratch.__file__)"],
                           cwd=tree, env=env, capture_output=True, text=True, check=True).stdout.split()
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "tfsgrade.cli", "grade", str(subs), "--out", str(out),
                        "-a", A01, "--timeout", "30"],       # 30 s a cell, as class_trust
                       cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    secs = time.time() - t0
    rows = {}
    if (out / "grades.csv").exists():
        with (out / "grades.csv").open() as f:
            rows = {r["student_id"]: r for r in csv.DictReader(f)}
    for sid, cells in _cell_scores(out / "course" / "gradebook.db").items():
        if sid in rows:
            rows[sid]["cells"] = cells
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return {"tree": str(tree), "commit": _commit(tree), "rc": p.returncode, "seconds": round(secs, 1),
            "imported": which, "rows": rows, "stderr_tail": err[-3:]}


def _cell_scores(db: Path) -> dict:
    """{student: {test cell: points}} from the run's gradebook (nbgrader's tables)."""
    if not db.exists():
        return {}
    import sqlite3
    out: dict = {}
    with sqlite3.connect(db) as c:
        for sid, name, pts in c.execute(
                "select sa.student_id, bc.name, g.auto_score from grade g "
                "join base_cell bc on g.cell_id = bc.id join submitted_notebook sn on g.notebook_id = sn.id "
                "join submitted_assignment sa on sn.assignment_id = sa.id where bc.name like 'test_%'"):
            out.setdefault(sid, {})[name] = pts or 0.0
    return out


def _commit(tree: Path) -> str:
    """The tree's commit, "+dirty" when its grader has uncommitted changes (a tree someone is
    editing is not that commit's grader: grade a clean worktree of it instead)."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "autograder", "helpers"],
                           capture_output=True, text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def run_tree(tree: Path, work: Path, deep: bool = True) -> dict:
    """Both classes graded by one tree (the trust class only, without `deep`)."""
    res = {}
    for name, make in (("trust", trust_class), ("deep", deep_class))[:2 if deep else 1]:
        subs, out = work / name / "subs", work / name / "out"
        ids = make(subs, tree)
        r = grade_with(tree, subs, out)
        r["ids"] = ids
        res[name] = r
        print(f"{name}: {tree} @ {r['commit']}: rc {r['rc']}, {r['seconds']} s, "
              f"{len(r['rows'])} rows; imported {', '.join(r['imported'])}", file=sys.stderr)
    return res


# the kinds of note a row can carry, by words its notes hold (the notes themselves are long)
NOTE_KINDS = [("scan: flagged for review", "scan"), ("GuardChanged", "guard changed"),
              ("ShortcutUsed", "shortcut"), ("ChildProcess", "child process"),
              ("another process ran", "process beside check"), ("did not run", "check did not run"),
              ("results differ", "check differs"), ("malformed notebook", None)]


def cell(row: dict | None) -> str:
    """`score/FULL status (kinds of note)` of one grades.csv row."""
    if not row:
        return "no row"
    notes, kinds = row.get("notes", ""), []
    for words, kind in NOTE_KINDS:
        if words in notes:
            kinds.append(kind or short(notes[notes.index(words):], 60))
    if notes and not kinds:
        kinds.append(short(notes, 60))
    split = ""
    if row.get("cells"):     # where the points came from: softmax + attention
        sm = sum(v for k, v in row["cells"].items() if k.startswith("test_softmax"))
        split = f" [{sm:g}+{sum(row['cells'].values()) - sm:g}]"
    return (f"{row.get(A01) or '-'}/{FULL:g}{split} {row['status']}"
            + (f" ({', '.join(kinds)})" if kinds else ""))


def short(text: str, n: int = 90) -> str:
    text = " ".join(text.replace("|", "/").split())
    return text if len(text) <= n else text[:n - 1] + "…"


def score(row: dict | None) -> float | None:
    try:
        return float(row[A01])
    except (TypeError, KeyError, ValueError):
        return None


def diff(old: dict | None, new: dict | None) -> str:
    """Points the old grader gave beyond the new one's (negative: fewer)."""
    so, sn = score(old), score(new)
    if so is None or sn is None:
        return "?"
    return "same" if so == sn else f"{so - sn:+g}"


def markdown(old: dict, new: dict) -> str:
    """Two tables (hostile, then honest and reference students), then the deep class."""
    o, n = old["trust"], new["trust"]
    head = f"| student | what it does | old {o['commit']} | new {n['commit']} |"
    hostile = [s for s in n["ids"] if s.startswith("proc_") and s != "proc_naive"]
    lines = [head + " old minus new (points) | status old / new |", "| --- " * 6 + "|"]
    for sid in hostile:
        ro, rn = o["rows"].get(sid), n["rows"].get(sid)
        lines.append(f"| `{sid}` | {WHAT.get(sid, '')} | {cell(ro)} | {cell(rn)} | {diff(ro, rn)} | "
                     f"{(ro or {}).get('status', '-')} / {(rn or {}).get('status', '-')} |")
    lines += ["", head + " points lost on old | notes on old |", "| --- " * 6 + "|"]
    for sid in [s for s in n["ids"] if s not in hostile]:
        ro, rn = o["rows"].get(sid), n["rows"].get(sid)
        lost = diff(rn, ro).lstrip("+") if diff(rn, ro) != "same" else "none"
        lines.append(f"| `{sid}` | {WHAT.get(sid, '')} | {cell(ro)} | {cell(rn)} | {lost} | "
                     f"{'yes' if ro and ro.get('notes') else 'no'} |")
    lines += ["", f"Trust class wall time: old {o['seconds']} s (exit {o['rc']}), "
                  f"new {n['seconds']} s (exit {n['rc']})."]
    if "deep" not in old or "deep" not in new:
        return "\n".join(lines) + "\n"
    lines += ["", "| deep class | exit status | seconds | rows | `honest` | `deep` | last line on stderr |",
              "| --- " * 7 + "|"]
    for label, d in (("old " + old["deep"]["commit"], old["deep"]), ("new " + new["deep"]["commit"], new["deep"])):
        lines.append(f"| {label} | {d['rc']} | {d['seconds']} | {len(d['rows'])} | {cell(d['rows'].get('honest'))} | "
                     f"{cell(d['rows'].get('deep'))} | {short(d['stderr_tail'][-1] if d['stderr_tail'] else '', 110)} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=REPO, help="the grader's source tree (default: this one)")
    ap.add_argument("--old", metavar="REV|DIR",
                    help="also grade with an old tree (a checkout, or a revision put in a temporary "
                         "git worktree) and compare")
    ap.add_argument("--md", type=Path, help="write the side-by-side markdown here (with --old)")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    ap.add_argument("--work", type=Path, help="keep the classes and the grader's outputs here")
    ap.add_argument("--only", help="comma-separated student ids: grade these (with honest and "
                                   "untouched) and no others, to iterate on a few fixtures")
    ap.add_argument("--no-deep", action="store_true", help="skip the deep-nesting class")
    ap.add_argument("--from-json", type=Path, metavar="FILE",
                    help="no grading: the side-by-side markdown of an earlier --old --json run")
    ap.add_argument("--old-only", action="store_true",
                    help="with --old: grade with the old tree only (one table)")
    a = ap.parse_args()
    ONLY.update(x for x in (a.only or "").split(",") if x)
    if a.from_json:
        both = json.loads(a.from_json.read_text())
        md = markdown(both["old"], both["new"])
        print(md)
        if a.md:
            a.md.write_text(md)
        return
    with tempfile.TemporaryDirectory(prefix="tfs-compare-") as tmp:
        work = a.work.resolve() if a.work else Path(tmp)   # outside the trees: the sandbox binds them
        if not a.old or a.old_only:
            tree = a.tree.resolve() if not a.old else Path(a.old).resolve()
            if not tree.is_dir():
                sys.exit("--old-only wants --old DIR (a checkout)")
            res = run_tree(tree, work / "tree", deep=not a.no_deep)
            print(f"| student | {res['trust']['commit']} |\n| --- | --- |")
            for name in res:
                for sid in res[name]["ids"]:
                    print(f"| {name} `{sid}` | {cell(res[name]['rows'].get(sid))} |")
            if "deep" in res:
                print(f"deep class: exit {res['deep']['rc']}, {res['deep']['stderr_tail'][-1:]}")
            both = {"tree": res}
        else:
            made = not Path(a.old).is_dir()
            wt = Path(tmp) / "old-tree" if made else Path(a.old).resolve()
            if made:
                subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(wt), a.old],
                               check=True, capture_output=True)
            try:
                both = {"old": run_tree(wt, work / "old", deep=not a.no_deep),
                        "new": run_tree(a.tree.resolve(), work / "new", deep=not a.no_deep)}
            finally:
                if made:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)],
                                   capture_output=True)
            md = markdown(both["old"], both["new"])
            print(md)
            if a.md:
                a.md.write_text(md)
        both["machine"] = (f"{platform.machine()}, {os.cpu_count()} cores, "
                           f"Python {platform.python_version()}")
        if a.json:
            a.json.write_text(json.dumps(both, indent=1))


if __name__ == "__main__":
    main()
