"""Gradebook exports for learning management systems (issue 15, item 8): Canvas and Moodle CSVs,
one column per notebook, written beside grades.csv from the same rows.

Canvas (Grades > Import): the header is `Student, ID, SIS User ID, SIS Login ID, Section` and one
column per assignment; the second row, `Points Possible`, gives each assignment's maximum (as in
Canvas's own export). A student is matched by one of ID, SIS User ID or SIS Login ID; a column
whose title matches no assignment creates a new assignment with that title. We fill the field
named by `id_field` (default `SIS Login ID`: JupyterHub and nbgrader ids are usually the login)
with the student id, or each field from a roster when one is given.

Moodle (Grades > Import > CSV file): any header; the instructor maps one column to identify
users ("ID number", "Email address" or "Username") and each other column to a grade item (or
"new grade item", which Moodle creates with a maximum of 100). Hence the default scale is a
percentage of the notebook's maximum; pass scale="points" when the grade items already have the
notebooks' maxima.

A notebook that was not graded (missing, unreadable) is an empty cell: both systems leave the
grade as it is. Scores are written with up to 4 decimals, never in exponent notation.

Entry points:
    read_grades_csv(path) -> (rows, notebooks)
    canvas_csv(rows, max_points, *, notebooks=None, roster=None, id_field="SIS Login ID") -> str
    moodle_csv(rows, max_points, *, notebooks=None, roster=None, scale="percent",
               id_field="ID number") -> str
    write_exports(out_dir, rows, max_points, **kw) -> {"canvas": path, "moodle": path}
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Mapping, Sequence

CANVAS_ID_FIELDS = ("ID", "SIS User ID", "SIS Login ID")
MOODLE_ID_FIELDS = ("ID number", "Email address", "Username")
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


def moodle_csv(rows: Sequence[Mapping], max_points: Mapping[str, float], *,
               notebooks: Sequence[str] | None = None, roster: Mapping[str, Mapping] | None = None,
               scale: str = "percent", id_field: str = "ID number",
               titles: Mapping[str, str] | None = None) -> str:
    """Moodle's CSV grade import. Columns: the identifying field (`id_field`: "ID number",
    "Email address" or "Username"; from `roster` keys "idnumber", "email", "username" when given,
    else the student id), then one column per notebook: a percentage of its maximum
    (scale="percent", right for a new grade item whose maximum is 100) or points
    (scale="points")."""
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


def write_exports(out_dir, rows, max_points, *, notebooks=None, roster=None,
                  canvas_id_field: str = "SIS Login ID", moodle_id_field: str = "ID number",
                  moodle_scale: str = "percent") -> dict[str, Path]:
    """Write canvas_grades.csv and moodle_grades.csv into `out_dir` (beside grades.csv)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"canvas": out_dir / "canvas_grades.csv", "moodle": out_dir / "moodle_grades.csv"}
    paths["canvas"].write_text(canvas_csv(rows, max_points, notebooks=notebooks, roster=roster,
                                          id_field=canvas_id_field), encoding="utf-8")
    paths["moodle"].write_text(moodle_csv(rows, max_points, notebooks=notebooks, roster=roster,
                                          scale=moodle_scale, id_field=moodle_id_field),
                               encoding="utf-8")
    return paths
