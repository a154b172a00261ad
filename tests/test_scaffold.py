"""Issue 28: a new notebook is three hand-written files. `tfs-grade new` writes them from the
template (source, spec, catalogue) and a README row; in a throwaway copy of the course, `make
release`'s steps generate everything else, the solution earns every autograded point in the
sandbox, the untouched student notebook 0, and the catalogue's mistake and variant are judged as
they must be in both lanes."""
import os
import shutil
import subprocess
import sys

import pytest

from nbtools import REPO

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]

NAME = "13_scaffolded"

GRADE = """
from pathlib import Path
def main():
    from nbtools import NOTEBOOKS, solution_sources, student_notebook, write
    from tfsgrade.grade import grade
    a, base = %r, Path(%r)
    write(student_notebook(a, solution_sources(a)), base / "subs" / "solution" / f"{a}.ipynb")
    (base / "subs" / "untouched").mkdir(parents=True)
    (base / "subs" / "untouched" / f"{a}.ipynb").write_bytes((NOTEBOOKS / f"{a}.ipynb").read_bytes())
    for it in grade(base / "subs", base / "out", names=[a], log=lambda *x: None):
        print("ITEM", it.student, it.status, it.score, it.reasons)
if __name__ == "__main__":
    main()
"""


def _copy_course(dest):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    for f in filter(None, files):
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)


def test_a_new_notebook_is_three_files_and_grades(tmp_path):
    course = tmp_path / "course"
    _copy_course(course)
    env = dict(os.environ, TFS_COURSE=str(course), PYTHONPATH=os.pathsep.join(
        str(course / d) for d in ("helpers", "autograder", "tests")))

    def run(*args, **kw):
        r = subprocess.run([sys.executable, *args], cwd=course, env=env, capture_output=True, text=True, **kw)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return r.stdout

    before = set(p.relative_to(course) for p in course.rglob("*") if p.is_file())
    out = run("-m", "tfsgrade.cli", "new", NAME, "--title", "A scaffolded notebook")
    made = set(p.relative_to(course) for p in course.rglob("*") if p.is_file()) - before
    assert {str(p) for p in made} == {f"solutions/src/{NAME}.py", "helpers/tfscratch/specs/scaffolded.py",
                                      f"tests/catalogue/nb{NAME}.py"}, out
    assert f"| `{NAME}` |" in (course / "README.md").read_text(encoding="utf-8")
    with pytest.raises(AssertionError, match="already there"):
        run("-m", "tfsgrade.cli", "new", NAME)                       # nothing is overwritten

    run("-c", f"from tfsgrade import cli; cli.release(names=[{NAME!r}])")   # what make release does
    for generated in (f"solutions/{NAME}.ipynb", f"notebooks/{NAME}.ipynb",
                      "helpers/tfscratch/reference/scaffolded.py", f"helpers/tfscratch/expected/{NAME}.npz"):
        assert (course / generated).is_file(), generated
    import nbformat
    test = next(c for c in nbformat.read(course / "solutions" / f"{NAME}.ipynb", as_version=4).cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "test_affine_values")
    assert test.metadata.nbgrader["points"] == 2 and test.source == (   # the spec's Graded, made a cell
        "chk.test_affine_values(affine)\n### BEGIN HIDDEN TESTS\n"
        "chk.test_affine_values(affine, seed=4242)\n### END HIDDEN TESTS")

    (tmp_path / "grade.py").write_text(GRADE % (NAME, str(tmp_path / "graded")))
    items = [ln.split(" ", 4)[1:] for ln in run(str(tmp_path / "grade.py"), timeout=600).splitlines()
             if ln.startswith("ITEM ")]
    by = {s: (status, float(score), reasons) for s, status, score, reasons in items}
    assert by["solution"][:2] == ("graded", 2.0) and by["solution"][2] == "[]", by   # the spec's 2 points
    assert by["untouched"][:2] == ("graded", 0.0), by

    run("-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "tests/test_catalogue.py",
        "tests/test_specs.py", "-k", NAME, timeout=600)
