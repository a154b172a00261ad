"""Small helpers the tests share: read notebooks, fill in exercises, find cells."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"


def assignments():
    """The course's notebooks, from the manifest (solutions/src/*.py)."""
    from tfsgrade import manifest
    return manifest.load().names()


def read(path):
    return nbformat.read(path, as_version=4)


def solution_sources(assignment) -> dict:
    """grade_id -> solution cell source without the BEGIN/END SOLUTION markers."""
    nb = read(SOLUTIONS / f"{assignment}.ipynb")
    out = {}
    for c in nb.cells:
        m = c.metadata.get("nbgrader", {})
        if m.get("solution") and c.cell_type == "code":
            out[m["grade_id"]] = re.sub(r"^\s*### (BEGIN|END) SOLUTION\s*$\n?", "", c.source,
                                        flags=re.M)
    return out


def student_notebook(assignment, fill: dict | None = None):
    """The released student notebook with some exercise cells replaced: fill maps
    grade_id -> source (use solution_sources for the correct code)."""
    nb = copy.deepcopy(read(NOTEBOOKS / f"{assignment}.ipynb"))
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if fill and gid in fill:
            c.source = fill[gid]
    return nb


def write(nb, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def points(assignment) -> dict:
    """Autograded test cells: grade_id -> points, from the solution notebook."""
    nb = read(SOLUTIONS / f"{assignment}.ipynb")
    return {c.metadata.nbgrader["grade_id"]: c.metadata.nbgrader["points"]
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
            and not c.metadata.nbgrader.get("solution")}


def exercise_points(assignment, exercise) -> float:
    """The points of one exercise's test cells (their owner as the spec declares it)."""
    from tfsgrade import manifest
    owners = manifest.owners(assignment)
    return sum(p for g, p in points(assignment).items() if owners.get(g) == exercise)


def manual_points(assignment) -> dict:
    """Free-text answer cells graded by hand (nbgrader "manually graded answer" cells):
    grade_id -> points."""
    nb = read(SOLUTIONS / f"{assignment}.ipynb")
    return {c.metadata.nbgrader["grade_id"]: c.metadata.nbgrader["points"]
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
            and c.metadata.nbgrader.get("solution")}


A01 = "01_attention"


def make_fixture_class(base: Path):
    """The named fixture class for 01_attention, zipped: ada (full marks), ben (untouched),
    cleo (partial, nested layout), dan (a catalogued mistake), eve (malformed JSON), fay
    (missing notebook), gus (infinite loop), hal (a deleted test cell), ivy (renamed file).
    Returns (zip path, {"partial": fill, "mistake": fill})."""
    import zipfile
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from catalogue import modules
    subs = base / "class"
    sols = solution_sources(A01)
    write(student_notebook(A01, sols), subs / "ada" / f"{A01}.ipynb")
    write(student_notebook(A01), subs / "ben" / f"{A01}.ipynb")
    partial = {"softmax": sols["softmax"]}
    write(student_notebook(A01, partial), subs / "cleo" / A01 / f"{A01}.ipynb")
    mod = next(m for m in modules() if m.ASSIGNMENT == A01)
    wrong = next(m for m in mod.MISTAKES if "forgets the 1/sqrt(d_k)" in m.description).code
    mistake = dict(sols, scaled_dot_product_attention=wrong)
    write(student_notebook(A01, mistake), subs / "dan" / f"{A01}.ipynb")
    (subs / "eve").mkdir(parents=True)
    (subs / "eve" / f"{A01}.ipynb").write_text('{"cells": [ {"cell_type": "code", ')
    (subs / "fay").mkdir(parents=True)
    (subs / "fay" / "notes.txt").write_text("forgot the notebook")
    loop = dict(sols, scaled_dot_product_attention="def scaled_dot_product_attention(q, k, v):\n"
                "    while True:\n        pass\n")
    write(student_notebook(A01, loop), subs / "gus" / f"{A01}.ipynb")
    nb = student_notebook(A01, sols)
    nb.cells = [c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") != "test_softmax_stable"]
    write(nb, subs / "hal" / f"{A01}.ipynb")
    write(student_notebook(A01, sols), subs / "ivy" / f"{A01} (1).ipynb")
    zpath = base / "class.zip"
    with zipfile.ZipFile(zpath, "w") as z:
        for p in sorted(subs.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(base))
    return zpath, {"partial": partial, "mistake": mistake}
