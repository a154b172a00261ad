"""What a class receives (issue 26, Deliver 2): `tfs-grade release --student-bundle OUT
--closed N` ships the student notebooks and a course package with the reference modules of the
first N notebooks only; an open notebook's checks still work from it, and nothing in it hands
out that notebook's answer."""
import json
import subprocess
import sys
import zipfile

import pytest

from catalogue import cells
from tfsgrade import bundle, manifest
from tfscratch.progress import strip_hidden

pytestmark = pytest.mark.slow

RUN = r"""
import importlib, json, sys, traceback
import matplotlib
matplotlib.use("Agg")
cells = json.loads(sys.stdin.read())
import tfscratch
assert tfscratch.__file__.startswith(BUNDLE), tfscratch.__file__
out = {"absent": [], "tests": {}}
for mod in ("multihead", "norm", "efficient_attention"):
    try:
        importlib.import_module("tfscratch.reference." + mod)
    except ModuleNotFoundError:
        out["absent"].append(mod)
ns = {"__name__": "__main__"}
for kind, gid, src in cells:
    try:
        exec(compile(src, gid, "exec"), ns)
        if kind == "test":
            out["tests"][gid] = "passed"
    except Exception as e:
        if kind != "test":
            raise
        out["tests"][gid] = f"{type(e).__name__}: {e}"
from tfscratch.fallback import pick
from tfscratch.checks.core import NotDone
def _stub():
    raise NotImplementedError
try:
    pick("MultiHeadAttention", _stub, lambda: ns["R"].MultiHeadAttention)
    out["pick"] = "returned an object"
except NotDone as e:
    out["pick"] = str(e)
try:
    next(iter(ns["chk"]._cells.values())).reference()
    out["chk_reference"] = "returned the answer"
except ImportError as e:
    out["chk_reference"] = type(e).__name__
print(json.dumps(out))
"""


def test_a_bundle_with_two_closed_notebooks(tmp_path):
    course = manifest.load()
    z = bundle.build(tmp_path / "class", closed=2)
    root = tmp_path / "class"
    ref = sorted(p.name for p in (root / "course" / "tfscratch" / "reference").glob("*.py"))
    assert ref == ["__init__.py", "attention.py", "masks.py"]
    assert not list((root / "course").rglob("*.pyc"))
    assert sorted(p.stem for p in (root / "notebooks").glob("*.ipynb")) == course.names()
    assert (root / "course" / "tfscratch" / "expected" / "03_multihead.npz").exists()
    assert "pip install ./course" in (root / "README.md").read_text()
    with zipfile.ZipFile(z) as zf:
        names = zf.namelist()
    assert "class/course/tfscratch/reference/masks.py" in names
    assert not [n for n in names if n.endswith("reference/multihead.py")]
    # notebook 03, open: its setup, the solutions a student would write, its visible checks
    todo = [(k, g, strip_hidden(s) if k == "test" else s) for k, g, s in cells("03_multihead")]
    env = {"PYTHONPATH": str(root / "course"), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg",
           "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", f"BUNDLE = {str(root)!r}\n" + RUN], input=json.dumps(todo),
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["absent"] == ["multihead", "norm", "efficient_attention"]
    assert got["tests"] and all(v == "passed" for v in got["tests"].values()), got["tests"]
    assert got["pick"] == "MultiHeadAttention: not implemented yet"
    assert got["chk_reference"] in ("ModuleNotFoundError", "ImportError")
