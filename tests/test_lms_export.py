"""Canvas and Moodle gradebook CSVs (autograder/tfsgrade/lms_export.py) from grades.csv rows."""
from __future__ import annotations

import csv
import io

import pytest

from tfsgrade import lms_export

HEADER = ["student_id", "01_attention", "03_multihead", "total", "max_total", "status", "notes"]
ROWS = [
    ["bob", "12.5", "", "12.5", "40", "flagged", "03_multihead: missing notebook"],
    ["ada", "20", "20", "40", "40", "graded", ""],
    ["=cmd|'/c calc'!A1", "0", "7.3333333", "7.3333333", "40", "graded", ""],
]
MAX = {"01_attention": 20, "03_multihead": 20}


@pytest.fixture
def grades(tmp_path):
    p = tmp_path / "grades.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(ROWS)
    return p


def _read(text):
    return list(csv.reader(io.StringIO(text)))


def test_read_grades_csv(grades):
    rows, nbs = lms_export.read_grades_csv(grades)
    assert nbs == ["01_attention", "03_multihead"]
    assert [r["student_id"] for r in rows] == ["bob", "ada", "=cmd|'/c calc'!A1"]


def test_canvas_layout(grades):
    rows, nbs = lms_export.read_grades_csv(grades)
    out = _read(lms_export.canvas_csv(rows, MAX))
    assert out[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_attention", "03_multihead"]
    assert out[1] == ["Points Possible", "", "", "", "", "20", "20"]
    body = {r[3]: r for r in out[2:]}
    assert body["ada"] == ["", "", "", "ada", "", "20", "20"]
    assert body["bob"][5:] == ["12.5", ""]  # a missing notebook stays blank: Canvas leaves it
    # a formula-looking id is neutralised for spreadsheets, and scores are plain decimals
    evil = next(r for r in out[2:] if "cmd" in r[3])
    assert evil[3].startswith("'=") and evil[5:] == ["0", "7.3333"]
    assert len({len(r) for r in out}) == 1


def test_canvas_roster_and_id_field(grades):
    rows, _ = lms_export.read_grades_csv(grades)
    roster = {"ada": {"name": "Lovelace, Ada", "id": "1001", "sis_user_id": "S1", "section": "A"}}
    out = _read(lms_export.canvas_csv(rows, MAX, roster=roster, id_field="SIS User ID"))
    ada = next(r for r in out if r[0] == "Lovelace, Ada")
    assert ada[:5] == ["Lovelace, Ada", "1001", "S1", "", "A"]
    bob = next(r for r in out if r[2] == "bob")
    assert bob[3] == ""
    with pytest.raises(ValueError):
        lms_export.canvas_csv(rows, MAX, id_field="email")


def test_moodle_points_and_percent(grades):
    rows, _ = lms_export.read_grades_csv(grades)
    out = _read(lms_export.moodle_csv(rows, MAX))    # points by default (issue 29, item 6)
    assert out[0] == ["ID number", "01_attention", "03_multihead"]
    pts = {r[0]: r[1:] for r in out[1:]}
    assert pts["ada"] == ["20", "20"] and pts["bob"] == ["12.5", ""]
    body = {r[0]: r[1:] for r in _read(lms_export.moodle_csv(rows, MAX, scale="percent"))[1:]}
    assert body["ada"] == ["100", "100"] and body["bob"] == ["62.5", ""]
    roster = {"ada": {"email": "ada@example.org"}}
    em = _read(lms_export.moodle_csv(rows, MAX, roster=roster))  # the column the roster can fill
    assert em[0][0] == "Email address" and ["ada@example.org", "20", "20"] in em
    with pytest.raises(ValueError):
        lms_export.moodle_csv(rows, MAX, scale="letters")


def test_write_exports_beside_grades(grades):
    rows, nbs = lms_export.read_grades_csv(grades)
    paths = lms_export.write_exports(grades.parent, rows, MAX, notebooks=nbs)
    assert paths["canvas"].name == "canvas_grades.csv" and paths["canvas"].parent == grades.parent
    assert _read(paths["moodle"].read_text())[0] == ["ID number", *nbs]
    # one column per notebook even when a notebook has no score at all
    only = lms_export.canvas_csv([{"student_id": "x", "01_attention": ""}], MAX, notebooks=list(MAX))
    assert _read(only)[2] == ["", "", "", "x", "", "", ""]
