"""It runs where instructors run it (issue 29, item 8): the wheel `pip wheel .` builds holds the
whole grader (tfscratch.specs and the stored expectations included), and a fresh venv with only
that wheel installed grades a submission, in the sandbox. The venv borrows the test venv's
third-party packages through a .pth file (installing torch and nbgrader again would take
minutes), never our own: the editable install's finder is not loaded from a .pth path."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbtools import A01, points, solution_sources, student_notebook, write

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
    return r


def test_wheel_in_a_fresh_venv_grades_a_submission(tmp_path):
    import sysconfig
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(tmp_path / "dist"), str(REPO)], cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    venv = tmp_path / "venv"
    _run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "zz_borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)])
    # the borrowed packages' scripts (nbgrader calls `alembic` by name) and data files
    # (nbconvert's templates) are the borrowed venv's, not our wheel's
    env = {"HOME": str(tmp_path), "PATH": f"{venv / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "TFS_COURSE": str(REPO),
           "JUPYTER_PATH": str(Path(sys.prefix) / "share" / "jupyter")}
    where = _run([str(py), "-c", "import tfscratch.specs.stored, tfsgrade.cli, tfscratch; "
                  "print(tfscratch.__file__)"], env=env).stdout
    assert where.startswith(str(site)), where          # the wheel's copy, not the source tree
    write(student_notebook(A01, solution_sources(A01)), tmp_path / "subs" / "ada" / f"{A01}.ipynb")
    r = _run([str(py), "-m", "tfsgrade.cli", "grade", str(tmp_path / "subs"), "--out",
              str(tmp_path / "out"), "--timeout", "60"], env=env, cwd=tmp_path)
    assert "problems" not in r.stdout, r.stdout
    with (tmp_path / "out" / "grades.csv").open() as f:
        row = next(csv.DictReader(f))
    assert row["student_id"] == "ada" and row["sandbox"] == "on"
    assert float(row[A01]) == sum(points(A01).values())
    assert (tmp_path / "out" / "feedback" / "ada" / f"{A01}.html").exists()


def test_an_installed_grader_without_the_course_says_so(tmp_path):
    env = dict(os.environ, TFS_COURSE=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "tfsgrade.cli", "grade", str(tmp_path), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "TFS_COURSE" in r.stderr, r.stderr[-500:]
