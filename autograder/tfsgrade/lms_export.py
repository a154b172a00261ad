"""Gradebook exports for learning management systems (issue 15, item 8; issue 29, item 6):
Canvas and Moodle CSVs, one column per notebook, written beside grades.csv from the same rows.

Canvas (Grades > Import): the header is `Student, ID, SIS User ID, SIS Login ID, Section` and one
column per assignment; the second row, `Points Possible`, gives each assignment's maximum (as in
Canvas's own export). A student is matched by one of ID, SIS User ID or SIS Login ID; a column
whose title matches no assignment creates a new assignment with that title. With a roster
(tfsgrade.lms.Roster) each row carries the student's name, Canvas ID, SIS User ID, SIS Login ID
and section from it; a student the roster gives none of these gets the student id in the field
named by `id_field` (default `SIS Login ID`: JupyterHub and nbgrader ids are usually the login).

Moodle (Grades > Import > CSV file): any header; the instructor maps one column to identify
users ("ID number", "Email address" or "Username") and each other column to a grade item.
Scores are points (the grade items' maxima are the notebooks'); scale="percent" writes a
percentage of the notebook's maximum instead (for "new grade item", which Moodle creates with a
maximum of 100). The identifying column is `id_field`, by default the first of ID number, Email
address, Username that the roster has (else ID number holding the student id).

With a roster, a student who is not on it (an unknown student, flagged in grades.csv) is left
out: neither system could match them. A notebook that was not graded (missing, unreadable) is an
empty cell: both systems leave the grade as it is. Scores are written with up to 4 decimals,
never in exponent notation.

`write_exports(OUT, ...)` reads what a grading run kept in OUT when not told otherwise: the
roster (OUT/roster.csv: given with --roster, or derived from a Canvas/Moodle download) and the
id fields (--id-field, OUT/lms.json), so `tfs-grade export OUT` writes the same files.

Entry points:
    read_grades_csv(path) -> (rows, notebooks)
    canvas_csv(rows, max_points, *, notebooks=None, roster=None, id_field="SIS Login ID") -> str
    moodle_csv(rows, max_points, *, notebooks=None, roster=None, scale="points",
               id_field=None) -> str
    split_id_fields(names) -> (canvas field or None, moodle field or None)
    write_exports(out_dir, rows, max_points, **kw) -> {"canvas": path, "moodle": path}
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Mapping, Sequence

CANVAS_ID_FIELDS = ("ID", "SIS User ID", "SIS Login ID")
MOODLE_ID_FIELDS = ("ID number", "Email address", "Username")
# the roster's column names are accepted for the LMS's
_ROSTER_NAMES = {"canvas_id": "ID", "sis_user_id": "SIS User ID", "sis_login_id": "SIS Login ID",
                 "idnumber": "ID number", "email": "Email address", "username": "Username"}
_FIXED = {"student_id", "total", "max_total", "status", "notes"}


def read_grades_csv(path) -> tuple[list[dict], list[str]]:
    """The rows of a grades.csv (tfs-grade's columns) and its notebook columns, in order."""
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        rows = list(r)
        header = r.fieldnames or []
    notebooks = []
    for h in header[1:]:
        if h == "total":
            break
        notebooks.append(h)
    return rows, notebooks


def _num(v) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    v = str(v).strip()
    if not v:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    s = f"{x:.4f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _notebooks(rows, notebooks):
    if notebooks is not None:
        return list(notebooks)
    seen = []
    for row in rows:
        for k in row:
            if k not in _FIXED and k not in seen:
                seen.append(k)
    return seen


def _safe(text: str) -> str:
    """Spreadsheet programs run cells that start with = + - @ as formulas: neutralise them."""
    text = "" if text is None else str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def canvas_csv(rows: Sequence[Mapping], max_points: Mapping[str, float], *,
               notebooks: Sequence[str] | None = None, roster: Mapping[str, Mapping] | None = None,
               id_field: str = "SIS Login ID", titles: Mapping[str, str] | None = None) -> str:
    """Canvas's gradebook import CSV. `rows` are grades.csv rows (student_id and one score per
    notebook); `max_points` maps each notebook to its maximum; `roster` may map a student id to
    {"name", "id", "sis_user_id", "sis_login_id", "section"}; `titles` renames the columns
    (default: the notebook names, which become the Canvas assignments' titles)."""
    if id_field not in CANVAS_ID_FIELDS:
        raise ValueError(f"id_field must be one of {CANVAS_ID_FIELDS}")
    nbs = _notebooks(rows, notebooks)
    titles = titles or {}
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                *[_safe(titles.get(n, n)) for n in nbs]])
    w.writerow(["Points Possible", "", "", "", "", *[_fmt(_num(max_points.get(n))) for n in nbs]])
    keys = {"ID": "id", "SIS User ID": "sis_user_id", "SIS Login ID": "sis_login_id"}
    for row in sorted(rows, key=lambda r: str(r["student_id"])):
        sid = str(row["student_id"])
        info = dict((roster or {}).get(sid, {}))
        ids = {f: info.get(keys[f], "") for f in CANVAS_ID_FIELDS}
        if not any(ids.values()):
            ids[id_field] = sid
        w.writerow([_safe(info.get("name", "")), *[_safe(ids[f]) for f in CANVAS_ID_FIELDS],
                    _safe(info.get("section", "")), *[_fmt(_num(row.get(n))) for n in nbs]])
    return out.getvalue()


def moodle_id_field(roster: Mapping[str, Mapping] | None) -> str:
    """The identifying column the roster can fill: ID number, else Email address, else Username
    (ID number, holding the student id, without a roster)."""
    for field_, key in (("ID number", "idnumber"), ("Email address", "email"), ("Username", "username")):
        if roster and any(info.get(key) for info in roster.values()):
            return field_
    return "ID number"


def moodle_csv(rows: Sequence[Mapping], max_points: Mapping[str, float], *,
               notebooks: Sequence[str] | None = None, roster: Mapping[str, Mapping] | None = None,
               scale: str = "points", id_field: str | None = None,
               titles: Mapping[str, str] | None = None) -> str:
    """Moodle's CSV grade import. Columns: the identifying field (`id_field`: "ID number",
    "Email address" or "Username", default moodle_id_field(roster); from `roster` keys
    "idnumber", "email", "username" when given, else the student id), then one column per
    notebook: points (scale="points") or a percentage of its maximum (scale="percent")."""
    id_field = id_field or moodle_id_field(roster)
    if id_field not in MOODLE_ID_FIELDS:
        raise ValueError(f"id_field must be one of {MOODLE_ID_FIELDS}")
    if scale not in ("percent", "points"):
        raise ValueError("scale is 'percent' or 'points'")
    nbs = _notebooks(rows, notebooks)
    titles = titles or {}
    keys = {"ID number": "idnumber", "Email address": "email", "Username": "username"}
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([id_field, *[_safe(titles.get(n, n)) for n in nbs]])
    for row in sorted(rows, key=lambda r: str(r["student_id"])):
        sid = str(row["student_id"])
        ident = (roster or {}).get(sid, {}).get(keys[id_field]) or sid
        vals = []
        for n in nbs:
            x = _num(row.get(n))
            if x is not None and scale == "percent":
                m = _num(max_points.get(n))
                x = 100.0 * x / m if m else None
            vals.append(_fmt(x))
        w.writerow([_safe(ident), *vals])
    return out.getvalue()


def split_id_fields(names) -> tuple[str | None, str | None]:
    """--id-field values -> (Canvas's field, Moodle's field). Each name is one of Canvas's
    (ID, SIS User ID, SIS Login ID) or Moodle's (ID number, Email address, Username) or the
    roster column behind it (canvas_id, sis_user_id, sis_login_id, idnumber, email, username)."""
    canvas = moodle = None
    for n in names or ():
        n = _ROSTER_NAMES.get(str(n).strip(), str(n).strip())
        hit = next((f for f in CANVAS_ID_FIELDS + MOODLE_ID_FIELDS if f.lower() == n.lower()), None)
        if hit is None:
            raise ValueError(f"--id-field {n!r}: one of {', '.join(CANVAS_ID_FIELDS)} (Canvas), "
                             f"{', '.join(MOODLE_ID_FIELDS)} (Moodle), or the roster columns "
                             f"{', '.join(_ROSTER_NAMES)}")
        if hit in CANVAS_ID_FIELDS:
            canvas = hit
        else:
            moodle = hit
    return canvas, moodle


def write_exports(out_dir, rows, max_points, *, notebooks=None, roster=None,
                  canvas_id_field: str | None = None, moodle_id_field: str | None = None,
                  moodle_scale: str = "points", id_fields=None) -> dict[str, Path]:
    """Write canvas_grades.csv and moodle_grades.csv into `out_dir` (beside grades.csv).
    `roster`: {student id: fields} or a tfsgrade.lms.Roster; default: the one the grading run
    kept in out_dir. `id_fields`: --id-field values (see split_id_fields); default: the run's."""
    from . import lms
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = lms.saved_settings(out_dir)
    c_field, m_field = split_id_fields(id_fields if id_fields is not None else saved.get("id_fields"))
    canvas_id_field = canvas_id_field or c_field or "SIS Login ID"
    moodle_id_field = moodle_id_field or m_field
    if roster is None:
        roster = lms.saved_roster(out_dir)
    if isinstance(roster, lms.Roster):
        roster = roster.for_exports()
    if roster:   # an unknown student cannot be matched by the LMS: left out
        rows = [r for r in rows if str(r["student_id"]) in roster]
    paths = {"canvas": out_dir / "canvas_grades.csv", "moodle": out_dir / "moodle_grades.csv"}
    paths["canvas"].write_text(canvas_csv(rows, max_points, notebooks=notebooks, roster=roster,
                                          id_field=canvas_id_field), encoding="utf-8")
    paths["moodle"].write_text(moodle_csv(rows, max_points, notebooks=notebooks, roster=roster,
                                          scale=moodle_scale, id_field=moodle_id_field),
                               encoding="utf-8")
    return paths
