"""Intake from where submissions really are (issue 29, items 5 and 6), without nbgrader: Canvas's
and Moodle's downloads and nbgrader's exchange, mapped through a roster into
<student>/<assignment>.ipynb; unknown and missing students flagged; submission times carried;
the Canvas/Moodle exports carry the roster's ids and points."""
from __future__ import annotations

import csv
import io
import struct
import zipfile
from datetime import datetime, timezone

import pytest

import lmstools as lt
from nbtools import A01
from tfsgrade import intake, lms, lms_export


def _intake(tmp_path, src, **kw):
    """What tfsgrade.grade does before normalising: unpack, prepare, collect."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(parents=True, exist_ok=True)
    root = intake.unpack(src, work)
    got = intake.prepare(root, work, out=out, from_zip=src.is_file(), log=lambda *a: None, **kw)
    items = intake.collect(got.root, [A01], intake=got)
    return got, {it.student: it for it in items}, out


def _table(out):
    with (out / "submissions.csv").open() as f:
        return list(csv.DictReader(f))


def _zip_local_time():
    return lms.iso(datetime(*lt.ZIP_TIME).astimezone())


def _marker(it):
    import json
    return json.loads(it.notebook)["metadata"].get("fixture")


# --------------------------------------------------------------------------- Canvas

def test_canvas_zip_mapped_through_the_roster(tmp_path):
    z = lt.write_zip(tmp_path / "submissions.zip", lt.canvas_files())
    got, items, out = _intake(tmp_path, z, roster=lt.roster(tmp_path / "roster.csv"))
    assert got.layout == "canvas"
    assert set(items) == {"ada", "ben", "cleo", "dan", "unknown-canvas-1999"}
    ada, ben, cleo = items["ada"], items["ben"], items["cleo"]
    assert ada.status == "pending" and ada.reasons == [] and _marker(ada) == "ada"
    assert ada.origin == f"lovelaceada_1001_5001_{A01}.ipynb"
    # late, and re-submitted: the later upload (Canvas's "-1") is graded, the first listed
    assert ben.status == "pending" and ben.lms_late is True and ada.lms_late is False
    assert _marker(ben) == "ben second"
    assert not any("renamed" in r for r in ben.reasons)   # "-1" is Canvas's, not the student's
    assert any("2 files for 01_attention" in r for r in ben.reasons)
    # renamed past recognition: matched by the grade ids of its cells
    assert cleo.status == "pending" and _marker(cleo) == "cleo"
    assert any("renamed to 'attention final.ipynb'" in r and "grade ids" in r for r in cleo.reasons)
    # on the roster, nothing handed in
    assert items["dan"].status == "flagged" and "no submission" in items["dan"].reasons[0]
    assert "Ito, Dan" in items["dan"].reasons[0]
    # not on the roster: listed and flagged, never graded
    zed = items["unknown-canvas-1999"]
    assert zed.status == "flagged" and zed.notebook is None and zed.assignment == A01
    assert "unknown student: Canvas user 1999 (zedzed) is not in the roster" in zed.reasons[0]
    # timestamps: the zip entry's time (Canvas's is when the zip was made: the LATE marker
    # is what the download says about lateness)
    assert ada.submitted_at == _zip_local_time() and ada.submitted_at.endswith("+00:00")
    assert ada.submitted_from == "zip entry time"
    rows = {r["file"]: r for r in _table(out)}
    assert rows["parkcleo_1003_5004_notes.txt"]["intake"] == "not a notebook"
    assert rows[f"okaforben_LATE_1002_5002_{A01}.ipynb"]["intake"] == "older copy"
    assert rows[f"okaforben_LATE_1002_5006_{A01}-1.ipynb"]["lms_late"] == "LATE"
    assert rows[f"zedzed_1999_5009_{A01}.ipynb"]["intake"] == "unknown student"
    assert rows["parkcleo_1003_5003_attention final.ipynb"]["matched_by"] == "grade ids"
    assert any(r["student_id"] == "dan" and r["intake"] == "no submission" for r in rows.values())
    assert (out / "roster.csv").exists() and lms.saved_settings(out)["roster_given"]


def test_canvas_without_a_roster_uses_canvas_user_ids(tmp_path):
    z = lt.write_zip(tmp_path / "s.zip", lt.canvas_files())
    got, items, out = _intake(tmp_path, z)
    assert set(items) == {"1001", "1002", "1003", "1999"}
    assert all(it.status == "pending" for it in items.values())
    assert not lms.saved_settings(out)["roster_given"]   # derived: replaced by the next run
    assert lms.saved_roster(out).get("1001")["canvas_id"] == "1001"


def test_canvas_anonymous_grading_without_a_roster(tmp_path):
    z = lt.write_zip(tmp_path / "s.zip", {f"LATE_anon_x7Yq2_555_{A01}.ipynb": lt.notebook_bytes(),
                                          f"anon_Pq9Zz_556_{A01}.ipynb": lt.notebook_bytes()})
    got, items, _ = _intake(tmp_path, z)
    assert set(items) == {"anon_x7Yq2", "anon_Pq9Zz"}
    assert items["anon_x7Yq2"].status == "pending" and items["anon_x7Yq2"].lms_late is True


def test_canvas_names_and_anonymous_files():
    m = lms.CANVAS.match("o_brienpat_LATE_12345_67890_01_attention-2.ipynb")
    assert (m["name"], m["late"], m["uid"], m["fid"], m["file"]) == \
        ("o_brienpat", "LATE", "12345", "67890", "01_attention-2.ipynb")
    m = lms.CANVAS_ANON.match("LATE_anon_x7Yq2_555_01_attention.ipynb")
    assert (m["anon"], m["fid"], m["file"]) == ("x7Yq2", "555", "01_attention.ipynb")
    assert lms.CANVAS_OTHER.match("lovelaceada_1001_text.html")
    keys = lms.canvas_name_keys("Ada Lovelace") | lms.canvas_name_keys("Lovelace, Ada")
    assert keys >= {"lovelaceada"}


# --------------------------------------------------------------------------- Moodle

@pytest.mark.parametrize("flat", [False, True], ids=["folders", "flat"])
def test_moodle_zip_with_its_grading_worksheet_as_roster(tmp_path, flat):
    z = lt.write_zip(tmp_path / "moodle.zip", lt.moodle_files(flat=flat))
    (tmp_path / "worksheet.csv").write_text(lt.MOODLE_WORKSHEET)
    got, items, out = _intake(tmp_path, z, roster=tmp_path / "worksheet.csv")
    assert got.layout == "moodle"
    ada, ben, cleo = (items[f"{n}@uni.example"] for n in ("ada", "ben", "cleo"))
    assert ada.status == ben.status == cleo.status == "pending"
    assert _marker(ada) == "ada" and _marker(ben) == "ben" and _marker(cleo) == "cleo"
    assert any("grade ids" in r for r in ben.reasons)
    assert any("matched by name ('Cleo Park')" in r for r in cleo.reasons)
    assert items["dan@uni.example"].status == "flagged"
    zed = items["unknown-moodle-777"]
    assert zed.status == "flagged" and "Moodle participant 777 (Zed Zed)" in zed.reasons[0]
    assert ada.submitted_at == _zip_local_time() and ada.lms_late is None
    rows = {r["file"]: r for r in _table(out)}
    assert rows["Ada Lovelace_201_assignsubmission_onlinetext_/onlinetext.html"]["intake"] == "not a notebook"


def test_moodle_without_a_roster_uses_names(tmp_path):
    z = lt.write_zip(tmp_path / "moodle.zip", lt.moodle_files())
    got, items, _ = _intake(tmp_path, z)
    assert {"ada-lovelace", "ben-okafor", "cleo-park", "zed-zed"} <= set(items)


# --------------------------------------------------------------------------- nbgrader

def test_nbgrader_submitted_with_timestamps(tmp_path):
    course = lt.nbgrader_submitted(tmp_path / "ex")
    got, items, out = _intake(tmp_path, course, roster=lt.roster(tmp_path / "r.csv"))
    assert got.layout == "nbgrader"
    assert items["ada"].submitted_at == "2025-03-01T09:30:00+00:00"
    assert items["ada"].submitted_from == "nbgrader timestamp.txt"
    assert items["ben"].submitted_at == "2025-03-02T17:00:00+00:00"   # +0100, in UTC
    assert items["ben"].status == "pending" and _marker(items["ben"]) == "ben"
    assert any("renamed to 'mine.ipynb'" in r for r in items["ben"].reasons)
    assert items["cleo"].status == items["dan"].status == "flagged"
    assert "no submission" in items["cleo"].reasons[0]
    assert items["unknown-zed"].status == "flagged"
    # without a roster: nbgrader's student ids as they are
    got, items, _ = _intake(tmp_path / "b", course / "submitted")
    assert set(items) == {"ada", "ben", "zed"} and items["zed"].status == "pending"


def test_nbgrader_inbound_latest_submission_wins(tmp_path):
    inbound = tmp_path / "exchange" / "course101" / "inbound"
    for ts, marker in (("2025-03-01 09:00:00.000000 UTC", "first"),
                       ("2025-03-01 11:00:00.000000 UTC", "second")):
        d = inbound / f"ada+{A01}+{ts}+Xy3kPq"
        d.mkdir(parents=True)
        (d / f"{A01}.ipynb").write_bytes(lt.notebook_bytes("solution", marker))
    got, items, out = _intake(tmp_path, tmp_path / "exchange" / "course101")
    assert got.layout == "nbgrader"
    assert _marker(items["ada"]) == "second"
    assert items["ada"].submitted_at == "2025-03-01T11:00:00+00:00"
    assert items["ada"].submitted_from == "nbgrader inbound folder name"
    assert [r["intake"] for r in _table(out)].count("older copy") == 1


def test_nbgrader_timestamps_parse():
    assert lms.iso(lms.parse_time("2025-03-01 12:00:00.999999 UTC")) == "2025-03-01T12:00:00+00:00"
    assert lms.iso(lms.parse_time("2025-03-01 12:00:00 America/New_York")) == "2025-03-01T17:00:00+00:00"
    assert lms.iso(lms.parse_time("2025-03-01T12:00:00-02:00")) == "2025-03-01T14:00:00+00:00"
    assert lms.parse_time("yesterday-ish") is None


# --------------------------------------------------------------------------- folders

def test_folders_keep_working_and_a_roster_checks_them(tmp_path):
    subs = tmp_path / "subs"
    for sid, name in (("ada", f"{A01}.ipynb"), ("ben", "attention final.ipynb"), ("zed", f"{A01}.ipynb")):
        (subs / sid).mkdir(parents=True)
        (subs / sid / name).write_bytes(lt.notebook_bytes("solution", sid))
    # no roster: read in place, as before; a renamed notebook found by its grade ids
    got, items, out = _intake(tmp_path, subs)
    assert got.layout == "folders" and got.root == subs and not got.converted
    assert set(items) == {"ada", "ben", "zed"}
    assert any("grade ids" in r for r in items["ben"].reasons) and _marker(items["ben"]) == "ben"
    assert items["ada"].submitted_from == "file time" and items["ada"].submitted_at
    # a roster: zed is unknown, cleo and dan are missing (roster ids matched on any id column)
    ada = ("a.lovelace", "Lovelace, Ada", "1001", "S-1001", "ada", "Sec A", "201", "ada@x.example")
    got, items, out = _intake(tmp_path / "r", subs,   # ada's folder is her SIS login, not her id
                              roster=lt.roster(tmp_path / "r.csv", [ada, *lt.CLASS[1:]]))
    assert items["a.lovelace"].status == "pending" and items["ben"].status == "pending"
    assert items["unknown-zed"].status == "flagged"
    assert "unknown student: folder 'zed' is not in the roster" in items["unknown-zed"].reasons[0]
    assert items["cleo"].status == items["dan"].status == "flagged"


def test_the_old_layouts_in_a_zip_are_unchanged(tmp_path):
    z = lt.write_zip(tmp_path / "c.zip", {f"class/ada/{A01}.ipynb": lt.notebook_bytes(),
                                          f"class/ben/{A01}/{A01}.ipynb": lt.notebook_bytes()})
    got, items, _ = _intake(tmp_path, z)
    assert got.layout == "folders" and set(items) == {"ada", "ben"}
    assert all(it.status == "pending" for it in items.values())
    assert items["ada"].submitted_from == "zip entry time"


def test_layout_detection_and_forcing(tmp_path):
    lt.write_zip(tmp_path / "c.zip", {f"wrap/{k}": v for k, v in lt.canvas_files().items()})
    root = intake.unpack(tmp_path / "c.zip", tmp_path / "w1")
    assert lms.detect(root)[0] == "canvas"     # one wrapping folder around the flat files
    lt.write_zip(tmp_path / "m.zip", lt.moodle_files())
    assert lms.detect(intake.unpack(tmp_path / "m.zip", tmp_path / "w2"))[0] == "moodle"
    lt.nbgrader_submitted(tmp_path / "n")
    assert lms.detect(tmp_path / "n")[0] == "nbgrader"
    assert lms.detect(tmp_path / "n" / "course" / "submitted")[0] == "nbgrader"
    with pytest.raises(ValueError, match="layout"):
        lms.convert(root, tmp_path / "w3", layout="blackboard")
    # forced: the Canvas files read as student folders are no students at all
    got = lms.convert(root, tmp_path / "w4", layout="folders", roster=lms.Roster.load(
        lt.roster(tmp_path / "r.csv")))
    assert {e.intake for e in got.entries} == {"unknown student"}


def test_zip_entry_time_prefers_the_utc_extra_field():
    info = zipfile.ZipInfo("x.ipynb", date_time=(1999, 1, 1, 0, 0, 0))
    t = int(datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc).timestamp())
    info.extra = struct.pack("<HHBi", 0x5455, 5, 1, t)
    assert intake._entry_time(info) == t


# --------------------------------------------------------------------------- roster

def test_roster_reads_canvas_and_moodle_exports(tmp_path):
    canvas = ('Student,ID,SIS User ID,SIS Login ID,Section,01_attention (301)\n'
              '    Points Possible,,,,,20\n'
              '"Lovelace, Ada",1001,S-1001,ada.l,Sec A,\n'
              '"Okafor, Ben",1002,S-1002,,Sec A,12\n')
    r = lms.Roster.parse(canvas, "canvas.csv")
    assert r.ids() == ["ada.l", "S-1002"]     # no student_id column: the SIS login, else user id
    assert r.get("ada.l")["canvas_id"] == "1001" and r.get("S-1002")["section"] == "Sec A"
    moodle = ("\ufeffFirst name;Surname;ID number;Institution;Email address\n"
              "Ada;Lovelace;A17;Uni;ada@uni.example\n")
    r = lms.Roster.parse(moodle.lstrip("\ufeff"), "moodle.csv")
    assert r.rows[0]["name"] == "Ada Lovelace" and r.ids() == ["A17"]
    r = lms.Roster.parse(lt.MOODLE_WORKSHEET)
    assert r.get("ada@uni.example")["moodle_id"] == "201"
    with pytest.raises(lms.RosterError, match="twice|lines"):
        lms.Roster.parse("student_id,name\nada,A\nada,B\n")
    with pytest.raises(lms.RosterError, match="no known column"):
        lms.Roster.parse("who,what\nx,y\n")
    with pytest.raises(SystemExit, match="cannot grade"):
        intake.prepare(tmp_path, tmp_path, roster=tmp_path / "missing.csv")
    with pytest.raises(SystemExit, match="id-field"):
        intake.prepare(tmp_path, tmp_path, id_fields=["Student number"])


# --------------------------------------------------------------------------- exports

def _csv(path):
    return list(csv.reader(io.StringIO(path.read_text())))


def test_exports_carry_the_rosters_ids_and_points(tmp_path):
    z = lt.write_zip(tmp_path / "submissions.zip", lt.canvas_files())
    got, items, out = _intake(tmp_path, z, roster=lt.roster(tmp_path / "roster.csv"))
    rows = [{"student_id": s, A01: {"ada": "20", "ben": "12.5", "cleo": "7"}.get(s, "")}
            for s in items]
    paths = lms_export.write_exports(out, rows, {A01: 20}, notebooks=[A01])   # what grading calls
    canvas = _csv(paths["canvas"])
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A01]
    assert canvas[1] == ["Points Possible", "", "", "", "", "20"]
    body = {r[1]: r for r in canvas[2:]}
    assert body["1001"] == ["Lovelace, Ada", "1001", "S-1001", "ada.l", "Sec A", "20"]
    assert body["1002"][5] == "12.5" and body["1004"][5] == ""      # dan: blank, left as is
    assert "1999" not in body and len(canvas) == 2 + 4               # the unknown student: out
    moodle = _csv(paths["moodle"])
    assert moodle[0] == ["ID number", A01] or moodle[0] == ["Email address", A01]
    assert moodle[0][0] == "Email address"                          # what the roster has
    assert ["ben@uni.example", "12.5"] in moodle                    # points, not percent
    # --id-field, kept in OUT for `tfs-grade export`
    lms.save(out, roster=lms.saved_roster(out), given=True, id_fields=["SIS User ID", "username"])
    assert lms_export.split_id_fields(["sis_login_id", "Email address"]) == ("SIS Login ID", "Email address")
    assert _csv(lms_export.write_exports(out, rows, {A01: 20}, notebooks=[A01])["moodle"])[0][0] == "Username"
    pct = lms_export.moodle_csv(rows, {A01: 20}, notebooks=[A01], scale="percent")
    assert "ada,100" in pct


def test_exports_without_a_roster_use_canvas_user_ids(tmp_path):
    z = lt.write_zip(tmp_path / "s.zip", lt.canvas_files())
    got, items, out = _intake(tmp_path, z)
    rows = [{"student_id": s, A01: "20"} for s in items]
    canvas = _csv(lms_export.write_exports(out, rows, {A01: 20}, notebooks=[A01])["canvas"])
    ids = {r[1] for r in canvas[2:]}
    assert ids == {"1001", "1002", "1003", "1999"}   # Canvas matches on ID
    # a later run on plain folders without a roster forgets the derived one
    lms.save(out, roster=None, given=False)
    assert lms.saved_roster(out) is None


def test_one_students_folder_is_not_taken_for_a_wrapper(tmp_path):
    course = lt.nbgrader_submitted(tmp_path / "n")
    import shutil
    for sid in ("ben", "zed"):
        shutil.rmtree(course / "submitted" / sid)
    assert lms.detect(course / "submitted") == ("nbgrader", course / "submitted")
    (tmp_path / "f" / "ada").mkdir(parents=True)
    (tmp_path / "f" / "ada" / "notes.txt").write_text("x")
    assert lms.detect(tmp_path / "f") == ("folders", tmp_path / "f")


def test_a_renamed_notebook_still_says_which_assignment_is_graded(tmp_path):
    (tmp_path / "ann").mkdir()
    (tmp_path / "ann" / "my work.ipynb").write_bytes(lt.notebook_bytes())
    from tfsgrade import course
    assert intake.assignments_present(intake.students_in(tmp_path), course.assignments()) == [A01]


def test_a_student_id_is_the_whole_name_never_a_trailing_newline():
    """`$` matches before a final newline: "alice\\n" passed the id rule and reached course paths."""
    from tfsgrade import intake, lms
    for rule in (intake.STUDENT_RE, lms.STUDENT_RE):
        assert rule.match("alice") and rule.match("a.b-c+d@e_1")
        assert not any(rule.match(s) for s in ("alice\n", "a/b", "../x", ".hidden", ""))
