"""What a class receives: `tfs-grade release --student-bundle OUT --closed N`.

    OUT/notebooks/NN_name.ipynb      the released student notebooks (no solutions, no hidden tests)
    OUT/course/                      the course package, pip-installable (`pip install ./course`):
                                     tfscratch with the reference modules of the first N notebooks
                                     only (the ones already closed, which later notebooks import),
                                     and the checks' stored expectations
    OUT/README.md                    how to install and start
    OUT.zip                          the same, zipped, to upload to the LMS

No answer key of an open notebook is in it: its reference module is absent, so neither `chk`,
`R`, `pick`, the plots nor the widgets can hand it out; its checks judge from the stored
expectations of the public seed (tfscratch.specs.stored). Re-run with a larger N as each
deadline passes, so the next bundle carries the closed notebooks' blocks.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from . import course, manifest

PYPROJECT = '''[build-system]
requires = ["setuptools>=68", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "transformers-from-scratch-student"
version = "0.1.0"
description = "Transformers from Scratch: the course package for students ({closed})."
requires-python = ">=3.10"
license = {{ text = "MIT" }}
dependencies = ["torch>=2.2", "numpy", "matplotlib>=3.7", "ipywidgets>=8.0", "ipykernel>=6.20",
                "jupyterlab>=4.0,<5", "nbgrader>=0.9.3", "nbformat>=5.9", "tqdm"]

[tool.setuptools.packages.find]
include = ["tfscratch*"]

[tool.setuptools.package-data]
tfscratch = ["expected/*.npz", "expected/*.json"]
'''

README = '''# Transformers from Scratch: your course files

{closed}

1. Install (once, in a fresh virtual environment):

       python -m venv .venv && . .venv/bin/activate
       pip install torch --index-url https://download.pytorch.org/whl/cpu   # a CPU build
       pip install ./course

2. Start: `jupyter lab notebooks/`, open the notebook due next, fill in every cell that says
   `# YOUR CODE HERE`, and run the check cell under each exercise.
3. Before handing in: restart the kernel, run all cells, press **Validate**.

The course's own implementation of a notebook arrives with the bundle after that notebook's
deadline: later notebooks then import it, so being stuck on one never blocks the next.
'''


def build(out: Path, closed: int) -> Path:
    """Write the bundle into `out` (emptied first) and `out`.zip; returns the zip."""
    m = manifest.load()
    if not 0 <= closed <= len(m.notebooks):
        raise SystemExit(f"--closed must be between 0 and {len(m.notebooks)}")
    shipped = [nb.module for nb in m.notebooks[:closed] if nb.module]
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "notebooks").mkdir(parents=True)
    for nb in m.notebooks:
        shutil.copyfile(course.NOTEBOOKS / f"{nb.name}.ipynb", out / "notebooks" / f"{nb.name}.ipynb")
    _package(out / "course" / "tfscratch", shipped)
    closed_text = (f"Notebooks closed so far: {', '.join(nb.name for nb in m.notebooks[:closed])}."
                   if closed else "No notebook is closed yet.")
    (out / "course" / "pyproject.toml").write_text(PYPROJECT.format(closed=closed_text))
    (out / "README.md").write_text(README.format(closed=closed_text))
    return Path(shutil.make_archive(str(out), "zip", out.parent, out.name))


def _package(dest: Path, shipped: list[str]) -> None:
    from .sandbox import package_files
    for rel, p in package_files(course.REFERENCE.parent, shipped):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest / rel)
