"""Stage 0, intake: find each student's notebooks in a folder or zip of submissions.

Accepted layouts (a zip may wrap either in one top folder):
    SUBMISSIONS/<student>/<assignment>.ipynb
    SUBMISSIONS/<student>/<assignment>/<assignment>.ipynb
A missing, renamed or unreadable notebook becomes a flagged Item with its reason.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import course

STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")


@dataclass
class Item:
    """One (student, assignment): what the stages know about it."""
    student: str
    assignment: str
    path: Path | None = None
    status: str = "pending"  # pending -> graded | flagged
    reasons: list[str] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0
    notebook: bytes | None = None                  # the normalised notebook (stage 1)
    result: dict | None = None                     # the task's result (stage 2)
    flags: list[str] = field(default_factory=list)  # for review: scan findings, similar work
    verdicts: dict = field(default_factory=dict)   # grade_id -> (passed, message): the coordinator's


def unpack(src: Path, work: Path) -> Path:
    if src.is_file() and zipfile.is_zipfile(src):
        dest = work / "unzipped"
        with zipfile.ZipFile(src) as z:
            for m in z.infolist():
                p = Path(m.filename)
                if p.is_absolute() or ".." in p.parts:
                    raise ValueError(f"unsafe path in zip: {m.filename}")
            z.extractall(dest)
        entries = [p for p in dest.iterdir() if not p.name.startswith(("__MACOSX", "."))]
        # one wrapping folder whose children are all folders: descend into it
        if len(entries) == 1 and entries[0].is_dir():
            kids = [p for p in entries[0].iterdir() if not p.name.startswith(".")]
            if kids and all(k.is_dir() for k in kids) and not any(
                    k.name in course.assignments() for k in kids):
                return entries[0]
        return dest
    if src.is_dir():
        return src
    raise FileNotFoundError(f"{src} is neither a folder nor a zip file")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find(student_dir: Path, a: str) -> tuple[Path | None, str | None]:
    """Find the notebook for assignment `a`; return (path, note about renaming)."""
    for cand in (student_dir / f"{a}.ipynb", student_dir / a / f"{a}.ipynb"):
        if cand.is_file():
            return cand, None
    pool = list(student_dir.glob("*.ipynb")) + list((student_dir / a).glob("*.ipynb"))
    pool = [p for p in pool if not p.name.startswith(".")]
    close = [p for p in pool if _norm(a) in _norm(p.stem)]
    if len(close) == 1:
        return close[0], f"notebook was renamed to {close[0].name!r}; graded as {a}.ipynb"
    inside = list((student_dir / a).glob("*.ipynb"))
    if len(inside) == 1:
        return inside[0], f"notebook was renamed to {inside[0].name!r}; graded as {a}.ipynb"
    return None, None


def validate(raw: bytes) -> str | None:
    """Why these bytes are not a notebook we can grade, or None. Metadata problems are not
    reasons: normalisation repairs them."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"malformed notebook: not valid JSON ({e})"
    if not isinstance(data, dict) or not isinstance(data.get("cells", data.get("worksheets")), list):
        return "malformed notebook: no 'cells' list (not a Jupyter notebook)"
    return None


def students_in(root_in: Path) -> list[Path]:
    return sorted(p for p in root_in.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def assignments_present(students: list[Path], known: list[str]) -> list[str]:
    present = set()
    for s in students:
        for p in list(s.glob("*.ipynb")) + list(s.glob("*/*.ipynb")):
            for a in known:
                if _norm(a) in _norm(p.stem) or _norm(a) == _norm(p.parent.name):
                    present.add(a)
    return sorted(present) or known


def collect(root_in: Path, names: list[str], only: tuple = ()) -> list[Item]:
    """One Item per (student folder, assignment); broken ones already flagged."""
    items: list[Item] = []
    for sdir in students_in(root_in):
        sid = sdir.name
        if only and sid not in only:
            continue
        if not STUDENT_RE.match(sid):
            items.append(Item(sid, "*", status="flagged",
                              reasons=[f"student folder name {sid!r} is not a usable id"]))
            continue
        for a in names:
            it = Item(sid, a)
            items.append(it)
            path, note = find(sdir, a)
            if note:
                it.reasons.append(note)
            if path is None:
                found = sorted(str(p.relative_to(sdir)) for p in sdir.rglob("*") if p.is_file())[:10]
                it.status = "flagged"
                it.reasons.append(f"missing notebook {a}.ipynb (found: {', '.join(found) or 'nothing'})")
                continue
            it.path = path
            try:
                raw = path.read_bytes()
            except OSError as e:
                it.status = "flagged"
                it.reasons.append(f"cannot read file: {e}")
                continue
            bad = validate(raw)
            if bad:
                it.status = "flagged"
                it.reasons.append(bad)
                continue
            it.notebook = raw
    return items
