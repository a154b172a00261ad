"""No answer key inside the sandbox (issue 26, Deliver 1): for every notebook N, the course
package the grading sandbox sees holds the reference modules of the notebooks before N and
nothing of N's own or a later one's, anywhere in the sandbox's file system, in sys.modules or
through `tfscratch.reference`."""
import json
import subprocess
import sys

import pytest

from tfsgrade import manifest, sandbox

pytestmark = pytest.mark.slow

PROBE = r"""
import importlib, json, os, sys
import tfscratch
pkg = os.path.dirname(tfscratch.__file__)
files = sorted(os.path.relpath(os.path.join(d, f), pkg) for d, _, fs in os.walk(pkg) for f in fs)
anywhere = []                              # a copy of a reference module anywhere else
for top in ("/home", "/tmp", "/opt", "/submission", sys.prefix, sys.base_prefix, "/usr/local"):
    for d, _, fs in os.walk(top):
        anywhere += [os.path.join(d, f) for f in fs if f in MODULES and "reference" in d]
imported = {}
for m in MODULES:
    try:
        importlib.import_module("tfscratch.reference." + m[:-3])
        imported[m] = "imported"
    except ImportError as e:
        imported[m] = type(e).__name__
import tfscratch.reference as R
print(json.dumps({"files": files, "anywhere": anywhere, "imported": imported,
                  "names": sorted(R.__all__),
                  "loaded": sorted(k for k in sys.modules if k.startswith("tfscratch.reference."))}))
"""


@pytest.fixture(scope="module")
def course():
    try:
        sandbox.check()
    except sandbox.SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    return manifest.load()


def _inside(package, code):
    cmd = sandbox._bwrap_args(None, package) + [sys.executable, "-c", code]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n", range(10))
def test_the_sandbox_of_notebook_n_holds_no_reference_of_n_or_later(course, n):
    nb = course.notebooks[n]
    closed = course.modules_before(nb.name)
    later = [x.module for x in course.notebooks[n:] if x.module]
    modules = [f"{x.module}.py" for x in course.notebooks if x.module]
    pkg = sandbox.course_package(closed, nb.name)
    seen = _inside(pkg, f"MODULES = {modules!r}\n" + PROBE)
    in_reference = sorted(f for f in seen["files"] if f.startswith("reference/"))
    assert in_reference == sorted(["reference/__init__.py"] + [f"reference/{m}.py" for m in closed]), in_reference
    assert not [f for f in seen["files"] if f.endswith((".pyc", ".pyo"))]
    assert not [f for f in seen["files"] if f.startswith("expected/") and f.split("/")[1][:2] > nb.name[:2]]
    later_files = {f"{m}.py" for m in later}
    assert [f for f in seen["anywhere"] if f.rsplit("/", 1)[-1] in later_files] == []
    for m in later:
        assert seen["imported"][f"{m}.py"] == "ModuleNotFoundError", (nb.name, m, seen["imported"])
        assert f"tfscratch.reference.{m}" not in seen["loaded"]
    for m in closed:
        assert seen["imported"][f"{m}.py"] == "imported", (nb.name, m)
    # what the notebook may import is there; none of its own exercises is
    assert set(nb.reference_imports) <= set(seen["names"]), (nb.name, nb.reference_imports)
    assert not {e.name for e in nb.exercises} & set(seen["names"]) - set(nb.may_import), nb.name
