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
    return sorted(p.stem for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))


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
    """test grade_id -> points, from the solution notebook."""
    nb = read(SOLUTIONS / f"{assignment}.ipynb")
    return {c.metadata.nbgrader["grade_id"]: c.metadata.nbgrader["points"]
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
