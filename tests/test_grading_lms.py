"""End to end (issue 29, items 5 and 6): a Canvas "Download Submissions" zip of 01_attention
graded through the command line with a roster. ada hands in the solution on time; ben his
untouched notebook, late, re-submitted (Canvas's `-1`); dan is on the roster and hands in
nothing; Canvas user 1999 is not on the roster. grades.csv, submissions.csv and the Canvas and
Moodle files carry the roster's ids, the points and the submission times."""
import csv
import io

import pytest

import lmstools as lt
from nbtools import A01, points
from tfsgrade import cli, lms

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # a Canvas zip and a roster, end to end


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("lms_class")
    zpath = lt.write_zip(base / "course-01 submissions.zip", lt.canvas_files(graded=True))
    roster = lt.roster(base / "roster.csv", [lt.CLASS[0], lt.CLASS[1], lt.CLASS[3]])
    out = base / "out"
    assert cli.main(["grade", str(zpath), "--out", str(out), "-a", A01, "--timeout", "30",
                     "--roster", str(roster), "--id-field", "Email address"]) == 0
    return out


def test_canvas_zip_graded_under_the_rosters_ids(graded):
    rows = {r["student_id"]: r for r in _rows(graded / "grades.csv")}
    assert set(rows) == {"ada", "ben", "dan", "unknown-canvas-1999"}
    assert float(rows["ada"][A01]) == sum(points(A01).values())
    assert float(rows["ben"][A01]) == 0 and rows["ben"]["status"] == "graded"
    assert rows["ben"]["lms_late"] == "LATE" and rows["ada"]["lms_late"] == ""
    assert rows["ada"]["submitted_at"] == lms.iso(__import__("datetime").datetime(*lt.ZIP_TIME).astimezone())
    assert rows["dan"]["status"] == "flagged" and "no submission" in rows["dan"]["notes"]
    zed = rows["unknown-canvas-1999"]
    assert zed["status"] == "flagged" and zed[A01] == ""
    assert "unknown student: Canvas user 1999 (zedzed) is not in the roster" in zed["notes"]
    table = _rows(graded / "submissions.csv")
    assert {r["intake"] for r in table} == {"used", "unknown student", "no submission"}


def test_canvas_and_moodle_files_import(graded):
    ada_total = sum(points(A01).values())
    for _ in range(2):   # after grading, and again after `tfs-grade export` (roster kept in OUT)
        canvas = list(csv.reader(io.StringIO((graded / "canvas_grades.csv").read_text())))
        assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A01]
        assert canvas[1][0] == "Points Possible" and float(canvas[1][5]) >= ada_total
        body = {r[1]: r for r in canvas[2:]}
        assert set(body) == {"1001", "1002", "1004"}          # the unknown student is left out
        assert body["1001"][:5] == ["Lovelace, Ada", "1001", "S-1001", "ada.l", "Sec A"]
        assert float(body["1001"][5]) == ada_total and float(body["1002"][5]) == 0
        assert body["1004"][5] == ""                          # nothing handed in: left as is
        moodle = list(csv.reader(io.StringIO((graded / "moodle_grades.csv").read_text())))
        assert moodle[0] == ["Email address", A01]
        assert [r for r in moodle if r[0] == "ada@uni.example"][0][1] == f"{ada_total:g}"  # points
        assert cli.main(["export", str(graded), "--no-feedback"]) == 0
