"""The gradebook on a real PostgreSQL server (departments with several graders):
`--db-url postgresql+psycopg://...` grades a small class like SQLite does.

The server is Debian's `postgresql` binaries, started by this test in a temporary
directory with a Unix socket (as the `postgres` user when the tests run as root: initdb
and pg_ctl refuse root, which is why pytest-postgresql's own process fixture is not used);
pytest-postgresql's DatabaseJanitor creates and drops the database. Skipped, with the reason, where they are not installed
(`apt-get install postgresql`) or psycopg is missing."""
import csv
import glob
import os
import shutil
import subprocess

import pytest

from nbtools import A01, points, solution_sources, student_notebook, write
from tfsgrade.grade import grade


def _bindir():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else (os.path.dirname(shutil.which("initdb") or "") or None)


def _skip_reason():
    try:
        import psycopg  # noqa: F401
        import pytest_postgresql  # noqa: F401
    except ImportError:
        return "psycopg or pytest-postgresql is not installed (pip install -e '.[test]')"
    if not _bindir():
        return "PostgreSQL server binaries not found (apt-get install postgresql)"
    try:
        from tfsgrade.sandbox import check
        check()
    except Exception as e:  # noqa: BLE001
        return f"no sandbox here: {e}"
    return None


pytestmark = [pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason())),
              pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]


@pytest.fixture(scope="module")
def pg():
    import tempfile
    from pathlib import Path
    d = Path(tempfile.mkdtemp(prefix="tfs-pg-"))   # outside pytest's 0700 tree: postgres must reach it
    data, sock = d / "data", d / "sock"
    sock.mkdir()
    as_pg = []
    if os.geteuid() == 0:
        import pwd
        pw = pwd.getpwnam("postgres")
        for p in (d, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
    b = _bindir()
    subprocess.run(as_pg + [f"{b}/initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)
    subprocess.run(as_pg + [f"{b}/pg_ctl", "-D", str(data), "-w", "-l", str(d / "log"), "-o",
                            f"-k {sock} -c listen_addresses='' -p 5439", "start"], check=True, capture_output=True)
    try:
        from pytest_postgresql.janitor import DatabaseJanitor
        version = os.path.basename(os.path.dirname(b))     # /usr/lib/postgresql/15/bin -> 15
        with DatabaseJanitor(user="postgres", host=str(sock), port=5439, dbname="gradebook",
                             version=version if version[:1].isdigit() else None):
            yield f"postgresql+psycopg://postgres@/gradebook?host={sock}&port=5439"
    finally:
        subprocess.run(as_pg + [f"{b}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_grade_into_postgresql(tmp_path, pg):
    sols = solution_sources(A01)
    subs = tmp_path / "subs"
    write(student_notebook(A01, sols), subs / "ada" / f"{A01}.ipynb")
    write(student_notebook(A01), subs / "ben" / f"{A01}.ipynb")
    out = tmp_path / "out"
    grade(subs, out, names=[A01], db_url=pg, timeout=60, workers=2, log=lambda *a: None)
    with (out / "grades.csv").open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(rows["ada"][A01]) == sum(points(A01).values())
    assert float(rows["ben"][A01]) == 0
    assert not (out / "course" / "gradebook.db").exists()
    from nbgrader.api import Gradebook
    with Gradebook(pg) as gb:
        assert gb.find_submission(A01, "ada").score == sum(points(A01).values())
        assert {s.id for s in gb.students} >= {"ada", "ben"}
