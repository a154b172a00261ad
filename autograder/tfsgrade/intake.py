"""Stage 0, intake: find each student's notebooks in a folder or zip of submissions.

Accepted layouts (a zip may wrap any in one top folder; tfsgrade.lms detects which):
    SUBMISSIONS/<student>/<assignment>.ipynb
    SUBMISSIONS/<student>/<assignment>/<assignment>.ipynb
    Canvas's "Download Submissions" zip, Moodle's "Download all submissions" zip, nbgrader's
    submitted/ (or inbound/) folders: converted by tfsgrade.lms into the first layout, each
    file's student found through the roster
A missing, renamed or unreadable notebook becomes a flagged Item with its reason; a file of a
student not on the roster, and a roster student with nothing handed in, too. Each Item carries
its submission time (`submitted_at`, ISO 8601 in UTC) and where that time came from.
"""
from __future__ import annotations

import json
import os
import re
import struct
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from . import course, lms

STUDENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]*\Z")  # with .match: the whole id, no newline


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
    submitted_at: str | None = None                # ISO 8601 in UTC: when it was handed in
    submitted_from: str = ""                       # where that time came from (timestamp.txt, ...)
    lms_late: bool | None = None                   # Canvas's LATE marker; None: the LMS says nothing
    origin: str = ""                               # the file's path in the download
    time_known: bool = True                        # False: the download's times are not the
                                                   # submission's (Canvas); lms_late decides
    answer_changed: list[str] = field(default_factory=list)  # hand-graded answers edited since
    graded_at: str = ""                            # the run that graded it (ISO, UTC)
    review: list[str] = field(default_factory=list)  # code the scan cannot read: status `review`


def unpack(src: Path, work: Path) -> Path:
    if src.is_file() and zipfile.is_zipfile(src):
        dest = work / "unzipped"
        with zipfile.ZipFile(src) as z:
            for m in z.infolist():
                p = Path(m.filename)
                if p.is_absolute() or ".." in p.parts:
                    raise ValueError(f"unsafe path in zip: {m.filename}")
            for m in z.infolist():
                if not m.flag_bits & 0x800:   # no UTF-8 flag: read as cp437; most LMSs wrote UTF-8
                    try:
                        m.filename = m.filename.encode("cp437").decode("utf-8")
                    except (UnicodeEncodeError, UnicodeDecodeError):
                        pass
                target = z.extract(m, dest)
                if not m.is_dir():
                    t = _entry_time(m)
                    os.utime(target, (t, t))   # the submission's time, as far as the zip has it
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


def _entry_time(info: zipfile.ZipInfo) -> float:
    """A zip entry's modification time: its extended timestamp (UTC, extra field 0x5455) when
    there is one, else its DOS time, which has no zone, read as this machine's local time."""
    extra, i = info.extra or b"", 0
    while i + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4:i + 4 + size]
        if tag == 0x5455 and size >= 5 and body[0] & 1:
            return float(struct.unpack_from("<i", body, 1)[0])
        i += 4 + size
    return time.mktime(info.date_time + (0, 0, -1))


def prepare(root_in: Path, work: Path, *, out: Path | None = None, roster=None,
            layout: str = "auto", from_zip: bool = False, id_fields=(), log=print) -> lms.Intake:
    """Convert an LMS download (or nbgrader's folders) into <student>/<assignment>.ipynb and
    note every file's fate. `roster`: a path, a tfsgrade.lms.Roster, or None (then the roster
    given to an earlier run into `out`, if any). Writes OUT/submissions.csv (one row per file),
    OUT/roster.csv and OUT/lms.json (what the Canvas/Moodle exports read)."""
    from .lms_export import split_id_fields
    try:   # a wrong --id-field or roster stops the run before anything is graded
        split_id_fields(id_fields)
        given = roster is not None
        if isinstance(roster, (str, Path)):
            roster = lms.Roster.load(roster)
    except (ValueError, OSError) as e:
        raise SystemExit(f"cannot grade: {e}") from None
    if roster is None and out is not None and lms.saved_settings(out).get("roster_given"):
        roster = lms.saved_roster(out)
        given = roster is not None
        if given:
            log(f"roster: {roster.source} (given to an earlier run into {out})")
    got = lms.convert(Path(root_in), Path(work), roster=roster, layout=layout, from_zip=from_zip)
    got.roster_given = given
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        if got.converted:
            lms.write_table(got, Path(out) / "submissions.csv")
        lms.save(out, roster=got.roster, given=given, layout=got.layout, id_fields=id_fields)
    if got.converted:
        unknown = {e.student for e in got.unknown()}
        log(f"intake: {got.layout} layout, {len(got.entries)} file(s); "
            f"{len(unknown)} unknown student(s), {len(got.absent())} on the roster with nothing "
            f"handed in")
    return got


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
    # renamed past recognition ("attention final.ipynb"): its cells' nbgrader grade ids
    known = None
    hits = []
    for p in sorted(set(pool) | set(student_dir.glob("*/*.ipynb"))):
        if p.name.startswith("."):
            continue
        known = known if known is not None else lms.course_grade_ids()
        try:
            raw = p.read_bytes()
        except OSError:
            continue
        if lms.match_by_grade_ids(raw, known) == a:
            hits.append(p)
    if len(hits) == 1:
        return hits[0], (f"notebook was renamed to {hits[0].name!r}; matched to {a} by its "
                         f"cells' grade ids, graded as {a}.ipynb")
    return None, None


MAX_DEPTH = 100    # a notebook's JSON is about 6 levels deep; nothing later walks deeper safely


def validate(raw: bytes) -> str | None:
    """Why these bytes are not a notebook we can grade, or None. Metadata problems are not
    reasons: normalisation repairs them. Whatever goes wrong reading them (any exception) is
    this submission's reason, never the class's end."""
    if b"\0" in raw[:4096] and not raw.lstrip().startswith(b"{"):
        return "malformed notebook: binary data, not JSON"
    try:
        if _depth(raw) > MAX_DEPTH:
            return f"malformed notebook: JSON nested more than {MAX_DEPTH} levels deep"
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"malformed notebook: not valid JSON ({str(e)[:200]})"
    except Exception as e:  # noqa: BLE001 - RecursionError, MemoryError, ...: this file only
        return f"malformed notebook: cannot be read ({type(e).__name__})"
    if not isinstance(data, dict) or not isinstance(data.get("cells", data.get("worksheets")), list):
        return "malformed notebook: no 'cells' list (not a Jupyter notebook)"
    return None


def _depth(raw: bytes) -> int:
    """How deep the JSON's brackets nest (strings skipped), without parsing it."""
    depth = deepest = 0
    for b in _BRACKETS.findall(_STRINGS.sub(b"", raw)):
        depth += 1 if b in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")


def students_in(root_in: Path) -> list[Path]:
    return sorted(p for p in root_in.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def assignments_present(students: list[Path], known: list[str]) -> list[str]:
    present = set()
    grade_ids = None
    for s in students:
        for p in list(s.glob("*.ipynb")) + list(s.glob("*/*.ipynb")):
            hit = False
            for a in known:
                if _norm(a) in _norm(p.stem) or _norm(a) == _norm(p.parent.name):
                    present.add(a)
                    hit = True
            if not hit:   # renamed past recognition: its cells' grade ids say which
                grade_ids = grade_ids if grade_ids is not None else lms.course_grade_ids()
                try:
                    a = lms.match_by_grade_ids(p.read_bytes(), grade_ids)
                except OSError:
                    a = None
                if a in known:
                    present.add(a)
    return sorted(present) or known


def collect(root_in: Path, names: list[str], only: tuple = (), intake: lms.Intake | None = None
            ) -> list[Item]:
    """One Item per (student folder, assignment); broken ones already flagged. With `intake`
    (from prepare): each Item's submission time and notes from the download, plus flagged Items
    for unknown students (files the roster cannot place) and for roster students who handed in
    nothing."""
    items: list[Item] = []
    used = intake.used() if intake else {}
    from_zip = intake.from_zip if intake else False
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
            entry = used.get((sid, a))
            if entry is not None:
                it.reasons += entry.notes
                it.origin, it.lms_late = entry.file, entry.lms_late
            path, note = find(sdir, a)
            if note:
                it.reasons.append(note)
            if path is None:
                found = sorted(str(p.relative_to(sdir)).removesuffix(".not-used")
                               for p in sdir.rglob("*") if p.is_file())[:10]
                it.status = "flagged"
                it.reasons.append(f"missing notebook {a}.ipynb (found: {', '.join(found) or 'nothing'})")
                continue
            it.path = path
            if entry is not None:
                it.submitted_at, it.submitted_from = entry.submitted_at, entry.submitted_from
                # Canvas's zip holds the time the zip was made: its LATE marker decides
                it.time_known = entry.layout != "canvas" or "timestamp" in entry.submitted_from
            else:
                it.origin = it.origin or str(path.relative_to(root_in))
                # student folders: their own timestamp.txt is not evidence (nbgrader's
                # exchange layout, read by tfsgrade.lms, is)
                it.submitted_at, it.submitted_from = lms.submitted_at_of(path, from_zip, sdir,
                                                                         stamps=False)
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
    if intake is not None:
        items += _not_placed(intake, names, only)
    return items


def _not_placed(intake: lms.Intake, names: list[str], only: tuple) -> list[Item]:
    """Flagged Items for what the canonical tree does not hold: unknown students (one Item per
    student and assignment, every file's reason kept) and roster students with no file."""
    out: dict[tuple, Item] = {}
    for e in intake.unknown():
        if only and e.student not in only:
            continue
        a = e.assignment or "*"
        it = out.setdefault((e.student, a), Item(e.student, a, status="flagged"))
        it.reasons += [f"{n} (file {e.file!r})" for n in e.notes] or [f"unknown student (file {e.file!r})"]
        it.origin = it.origin or e.file
        it.submitted_at, it.submitted_from, it.lms_late = e.submitted_at, e.submitted_from, e.lms_late
        it.time_known = e.layout != "canvas"
    for sid in intake.absent():
        if only and sid not in only:
            continue
        name = (intake.roster.get(sid) or {}).get("name", "") if intake.roster else ""
        for a in names:
            out[(sid, a)] = Item(sid, a, status="flagged", reasons=[
                f"no submission: {sid}{f' ({name})' if name else ''} is on the roster, but the "
                f"download holds nothing of theirs"])
    return list(out.values())


def submitted_at(items) -> str:
    """The latest submission time of these Items (one student's notebooks), or ""."""
    times = [it.submitted_at for it in items if getattr(it, "submitted_at", None)]
    return max(times) if times else ""


def lms_late(items) -> str:
    """"LATE" when the LMS marked any of these Items late (Canvas), else ""."""
    return "LATE" if any(getattr(it, "lms_late", None) for it in items) else ""
