"""Submissions where they really are: an LMS's bulk download or nbgrader's exchange, turned into
the tree the rest of intake reads (`<student>/<notebook>.ipynb`), each file mapped to a student
id through a roster, each submission with its time.

Layouts (detected by themselves; `layout=` forces one):

    folders   <student>/<notebook>.ipynb or <student>/<notebook>/<notebook>.ipynb (the folder
              name is the student id; a roster, when given, only checks it)
    canvas    Canvas's "Download Submissions" zip: flat files named
              <name>[_LATE]_<user id>_<file id>_<file name>   (lib/content_zipper.rb:
              get_filename joins the sortable name lower-cased without non-word characters,
              "LATE" when Canvas marked the submission late, and the user id; the upload's
              attachment id and display name follow, e.g. `lovelaceada_LATE_1001_5551_01_attention-1.ipynb`;
              anonymous grading: [LATE_]anon_<anonymous id>_<file id>_<file name>)
    moodle    Moodle's "Download all submissions": one folder per student and plugin,
              <Full Name>_<participant id>_assignsubmission_file_/<file name>, or flat files
              <Full Name>_<participant id>_assignsubmission_file_<file name>
              (mod/assign/locallib.php download_submissions; the participant id is Moodle's
              per-assignment id, the "Participant 12345" of the grading worksheet)
    nbgrader  the course directory after `nbgrader collect`: submitted/<student>/<assignment>/
              <notebook>.ipynb with timestamp.txt (autograded/ likewise), or the exchange's
              inbound/<student>+<assignment>+<timestamp>[+<random>]/<notebook>.ipynb

The roster (a CSV) maps the ids the download carries to the student ids of the gradebook; see
`Roster`. A file whose student is not on the roster is kept as an "unknown student" (listed and
flagged, never graded under a guessed id); roster students with nothing in the download are
listed as missing. Without a roster the download's own ids are used: Canvas's user id, the
student's name for Moodle (its participant ids change from one assignment to the next), the
folder name otherwise; a roster is then derived from the download for the Canvas/Moodle exports.

A notebook is matched to its assignment by its file name, or, renamed (`attention final.ipynb`),
by the nbgrader grade ids of its cells compared with the course manifest.

Submission times, first found wins: nbgrader's timestamp.txt (or the inbound folder's name);
the file's time in the zip (the entry's UTC extra field, else its DOS time read as this machine's
local time) or on disk. Canvas's zip entries carry the time the zip was made, not the
submission's: for Canvas, the LATE marker (`lms_late`) is what the download says.

Entry points:
    Roster.load(path) / roster.save(path)
    convert(root, work, roster=None, layout="auto", from_zip=False) -> Intake
    submitted_at_of(path, from_zip) -> (iso time or None, where it came from)
"""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

LAYOUTS = ("auto", "folders", "canvas", "moodle", "nbgrader")
STUDENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]*\Z")  # with .match: the whole id, no newline

# ---------------------------------------------------------------------------------- times


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with its offset, to the second: 2025-03-01T12:00:00+00:00."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).replace(microsecond=0).isoformat()


def _tz(name: str):
    name = name.strip()
    if name.upper() in ("UTC", "GMT", "Z", "UT"):
        return timezone.utc
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", name)
    if m:
        d = timedelta(hours=int(m[2]), minutes=int(m[3]))
        return timezone(d if m[1] == "+" else -d)
    try:
        from zoneinfo import ZoneInfo
        return ZoneInfo(name)
    except Exception:  # noqa: BLE001 - an unknown zone name
        return None


def parse_time(text: str) -> datetime | None:
    """nbgrader's timestamps ("2025-03-01 12:00:00.123456 UTC", its default format; a numeric
    offset or a zone name also) and ISO 8601. A time without a zone is UTC (nbgrader's default
    timezone). None if it cannot be read."""
    text = (text or "").strip()
    if not text:
        return None
    parts = text.split()
    tz = None
    if len(parts) == 3:
        tz = _tz(parts[2])
        text = " ".join(parts[:2])
    elif len(parts) == 2 and _tz(parts[1]) is not None and ":" not in parts[1][:3]:
        tz, text = _tz(parts[1]), parts[0]
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            from dateutil import parser
            dt = parser.parse(text)
        except Exception:  # noqa: BLE001 - unreadable: no time rather than a wrong one
            return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz or timezone.utc)
    return dt


def file_time(path: Path) -> datetime:
    return datetime.fromtimestamp(Path(path).stat().st_mtime, tz=timezone.utc)


def submitted_at_of(path: Path, from_zip: bool = False, top: Path | None = None,
                    stamps: bool = True) -> tuple[str | None, str]:
    """The submission time of the notebook at `path`: a timestamp.txt beside it or in a folder
    above it (up to `top`), else the file's time. Returns (ISO time, where it came from).
    stamps=False: a timestamp.txt is not read (student folders: a student may have written
    it, and would then choose their own lateness)."""
    path = Path(path)
    d = path.parent
    while stamps:
        ts = d / "timestamp.txt"
        if ts.is_file():
            t = parse_time(ts.read_text(errors="replace"))
            if t is not None:
                return iso(t), "nbgrader timestamp.txt"
        if top is None or d == Path(top) or d == d.parent or not d.is_relative_to(top):
            break
        d = d.parent
    return iso(file_time(path)), ("zip entry time" if from_zip else "file time")


# --------------------------------------------------------------------------------- roster

COLUMNS = ("student_id", "name", "canvas_id", "sis_user_id", "sis_login_id", "section",
           "moodle_id", "idnumber", "username", "email")
_ALIASES = {
    "student_id": ("student id", "studentid", "student_id"),
    "name": ("name", "student", "full name", "fullname", "student name", "sortable name"),
    "first": ("first name", "firstname", "given name"),
    "last": ("last name", "lastname", "surname", "family name"),
    "canvas_id": ("canvas id", "canvas user id", "canvas_id", "id"),
    "sis_user_id": ("sis user id", "sis_user_id"),
    "sis_login_id": ("sis login id", "sis_login_id", "login id"),
    "section": ("section", "sections"),
    "moodle_id": ("moodle id", "moodle_id", "participant id", "participant", "identifier"),
    "idnumber": ("idnumber", "id number"),
    "username": ("username", "user name"),
    "email": ("email", "email address", "e mail", "e mail address", "mail"),
}
# when the roster has no student_id column, the student id is the first of these it has
DERIVE_ID_FROM = ("sis_login_id", "username", "sis_user_id", "idnumber", "email", "canvas_id",
                  "moodle_id")


def _header_key(h: str) -> str | None:
    h = re.sub(r"[\s_\-]+", " ", (h or "").strip().lower().lstrip("\ufeff"))
    for key, names in _ALIASES.items():
        if h in {re.sub(r"[\s_\-]+", " ", n) for n in names}:
            return key
    return None


def safe_id(value: str) -> str:
    """A student id usable as a folder name and a gradebook id."""
    v = re.sub(r"[^A-Za-z0-9_.@+-]+", "_", (value or "").strip())
    return re.sub(r"^[^A-Za-z0-9]+", "", v)


def _name_tokens(name: str) -> list[str]:
    return re.findall(r"[^\W_]+", (name or "").lower())


def name_key(name: str) -> str:
    """Order-free: "Lovelace, Ada" and "Ada Lovelace" give the same key."""
    return " ".join(sorted(_name_tokens(name)))


def canvas_name_keys(name: str) -> set[str]:
    """What Canvas puts in a file name for this student: the sortable name ("Last, First"),
    lower-cased, without anything but letters and digits. A roster name without a comma is
    taken as "First Last" (Canvas's default sortable name moves the last word first)."""
    t = _name_tokens(name)
    if not t:
        return set()
    keys = {"".join(t)}
    if "," not in name:
        keys.add("".join(t[-1:] + t[:-1]))
    return keys


class RosterError(ValueError):
    pass


class Roster:
    """Students and the ids each system knows them by. Columns (any order, any subset, one row
    per student; headers are matched case-insensitively):

        student_id    the id in the gradebook, grades.csv and feedback/ (default: the first
                      of sis_login_id, username, sis_user_id, idnumber, email, canvas_id,
                      moodle_id the row has)
        name          "Last, First" or "First Last" (or `first name` + `last name`)
        canvas_id     Canvas's user id (its gradebook's "ID"; the number in download file names)
        sis_user_id, sis_login_id, section              as in Canvas's gradebook
        moodle_id     Moodle's participant id ("Participant 12345" in its grading worksheet)
        idnumber, username, email                       Moodle's user identity fields

    Canvas's own gradebook export (Student, ID, SIS User ID, SIS Login ID, Section, ...; its
    "Points Possible" row is skipped) and Moodle's grading worksheet (Identifier, Full name,
    Email address, ...) or grade export (First name, Last name, ID number, Email address) are
    read as they are."""

    def __init__(self, rows: list[dict], source: str = ""):
        self.rows = rows
        self.source = source
        self._by_sid = {r["student_id"]: r for r in rows}

    @classmethod
    def load(cls, path) -> "Roster":
        path = Path(path)
        text = path.read_text(encoding="utf-8-sig", errors="replace")
        return cls.parse(text, source=str(path))

    @classmethod
    def parse(cls, text: str, source: str = "") -> "Roster":
        first = text.splitlines()[0] if text.strip() else ""
        delim = max(",;\t", key=first.count) if first else ","
        reader = csv.reader(io.StringIO(text), delimiter=delim)
        header = next(reader, None)
        if not header:
            raise RosterError(f"roster {source}: empty")
        keys = [_header_key(h) for h in header]
        if not any(k in COLUMNS for k in keys):
            raise RosterError(f"roster {source}: no known column in {header}; expected some of "
                              f"{', '.join(COLUMNS)} (or Canvas's / Moodle's export headers)")
        rows, seen = [], {}
        for n, raw in enumerate(reader, start=2):
            row = {}
            for k, v in zip(keys, raw):
                if k and v.strip() and not row.get(k):
                    row[k] = v.strip()
            if not row.get("name") and (row.get("first") or row.get("last")):
                row["name"] = " ".join(x for x in (row.get("first"), row.get("last")) if x)
            row.pop("first", None)
            row.pop("last", None)
            name = row.get("name", "")
            if name.strip().lower() in ("points possible", "muted", "manual posting"):
                continue   # Canvas's rows under the header
            if row.get("moodle_id"):
                digits = re.findall(r"\d+", row["moodle_id"])
                row["moodle_id"] = digits[-1] if digits else row["moodle_id"]
            sid = row.get("student_id") or next(
                (row[k] for k in DERIVE_ID_FROM if row.get(k)), "")
            if not sid:
                if any(row.get(k) for k in COLUMNS):
                    raise RosterError(f"roster {source}, line {n}: no id for {name or raw!r}")
                continue   # a blank line
            sid = safe_id(sid)
            if not sid:
                raise RosterError(f"roster {source}, line {n}: unusable student id")
            if sid in seen:
                raise RosterError(f"roster {source}: student id {sid!r} on lines {seen[sid]} "
                                  f"and {n}")
            seen[sid] = n
            row["student_id"] = sid
            rows.append({k: row.get(k, "") for k in COLUMNS})
        if not rows:
            raise RosterError(f"roster {source}: no students")
        return cls(rows, source)

    def save(self, path) -> Path:
        path = Path(path)
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(COLUMNS), lineterminator="\n")
            w.writeheader()
            w.writerows(self.rows)
        return path

    def __contains__(self, sid) -> bool:
        return sid in self._by_sid

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, sid) -> dict | None:
        return self._by_sid.get(sid)

    def ids(self) -> list[str]:
        return [r["student_id"] for r in self.rows]

    def has(self, column: str) -> bool:
        return any(r.get(column) for r in self.rows)

    def find(self, column: str, value: str) -> dict | None:
        value = (value or "").strip()
        if not value:
            return None
        fold = column in ("email", "username", "sis_login_id", "student_id")
        for r in self.rows:
            v = r.get(column, "")
            if v and (v == value or (fold and v.lower() == value.lower())):
                return r
        return None

    def find_folder(self, folder: str) -> dict | None:
        """A folder name (nbgrader's or JupyterHub's student id) against every id column."""
        for col in ("student_id", "sis_login_id", "username", "email", "sis_user_id",
                    "idnumber", "canvas_id"):
            r = self.find(col, folder)
            if r:
                return r
        return None

    def find_name(self, name: str, canvas: bool = False) -> list[dict]:
        if canvas:
            key = re.sub(r"[\W_]", "", name.lower())
            return [r for r in self.rows if key in canvas_name_keys(r.get("name", ""))]
        key = name_key(name)
        return [r for r in self.rows if key and name_key(r.get("name", "")) == key]

    def for_exports(self) -> dict[str, dict]:
        """{student id: {name, id, sis_user_id, sis_login_id, section, idnumber, email,
        username}}: what tfsgrade.lms_export reads."""
        return {r["student_id"]: {"name": r.get("name", ""), "id": r.get("canvas_id", ""),
                                  "sis_user_id": r.get("sis_user_id", ""),
                                  "sis_login_id": r.get("sis_login_id", ""),
                                  "section": r.get("section", ""), "idnumber": r.get("idnumber", ""),
                                  "email": r.get("email", ""), "username": r.get("username", "")}
                for r in self.rows}


# ------------------------------------------------------------------------ what the download is

CANVAS_ANON = re.compile(r"^(?:(?P<late>LATE)_)?anon_(?P<anon>[A-Za-z0-9]+)_(?P<fid>\d+)_(?P<file>.+)$")
CANVAS = re.compile(r"^(?P<name>.*?)_(?:(?P<late>LATE)_)?(?P<uid>\d+)_(?P<fid>\d+)_(?P<file>.+)$")
CANVAS_OTHER = re.compile(r"^(?P<name>.*?)_(?:(?P<late>LATE)_)?(?P<uid>\d+)_(?P<file>(?:text|link)\.html)$")
MOODLE = re.compile(r"^(?P<name>.*?)_(?P<pid>\d+)_assignsubmission_(?P<plugin>[a-z0-9]+)_(?P<file>.*)$")
INBOUND = re.compile(r"^(?P<student>.+?)\+(?P<assignment>[^+]+)\+(?P<ts>[^+]+)(?:\+[^+]*)?$")
_SKIP = ("__MACOSX", ".DS_Store", "Thumbs.db")


def _visible(p: Path) -> bool:
    return not (p.name.startswith(".") or p.name in _SKIP or p.name.startswith("__"))


def _kids(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if _visible(p))


def _base(root: Path) -> Path:
    """Descend through wrapping folders that hold nothing but one folder (never into one
    student's folder: <student>/<assignment>/ or <student>/<files>)."""
    from . import course
    known = set(course.assignments())
    while True:
        kids = _kids(root)
        if len(kids) != 1 or not kids[0].is_dir() or MOODLE.match(kids[0].name) \
                or INBOUND.match(kids[0].name) or kids[0].name in ("submitted", "autograded", "inbound"):
            return root
        inner = _kids(kids[0])
        if not inner or any(k.is_dir() and k.name in known for k in inner):
            return root
        if all(k.is_file() for k in inner) and not _is_canvas(inner):
            return root
        root = kids[0]


def _is_canvas(files: list[Path]) -> bool:
    files = [f for f in files if f.is_file()]
    hits = sum(bool(CANVAS.match(f.name) or CANVAS_ANON.match(f.name) or CANVAS_OTHER.match(f.name))
               for f in files)
    return bool(files) and hits * 2 >= len(files) and hits > 0


def detect(root: Path) -> tuple[str, Path]:
    """(layout, the folder it starts at)."""
    base = _base(Path(root))
    kids = _kids(base)
    names = {k.name for k in kids}
    if names & {"submitted", "autograded", "inbound"}:
        return "nbgrader", base
    if any(INBOUND.match(k.name) for k in kids if k.is_dir()):
        return "nbgrader", base
    if any(MOODLE.match(k.name) for k in kids):
        return "moodle", base
    files = [k for k in kids if k.is_file()]
    if files and not any(k.is_dir() for k in kids) and _is_canvas(files):
        return "canvas", base
    for k in kids:   # <student>/<assignment>/timestamp.txt: the contents of submitted/
        if k.is_dir() and any((g / "timestamp.txt").is_file() for g in k.iterdir() if g.is_dir()):
            return "nbgrader", base
    return "folders", base


# ------------------------------------------------------------------------ notebook -> assignment

def course_grade_ids() -> dict[str, set]:
    """{assignment: every nbgrader grade id of its cells} from the course manifest."""
    from . import manifest
    out = {}
    for nb in manifest.load():
        ids = set(nb.setup_ids) | {e.name for e in nb.exercises} | set(nb.grade_ids) \
            | {a.grade_id for a in nb.answers}
        out[nb.name] = ids
    return out


def grade_ids_of(raw: bytes) -> set[str]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return set()
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        ws = data.get("worksheets") if isinstance(data, dict) else None   # nbformat 3
        cells = [c for w in ws or [] if isinstance(w, dict) for c in w.get("cells", [])]
    out = set()
    for c in cells or []:
        md = c.get("metadata") if isinstance(c, dict) else None
        nbg = md.get("nbgrader") if isinstance(md, dict) else None
        if isinstance(nbg, dict) and isinstance(nbg.get("grade_id"), str):
            out.add(nbg["grade_id"])
    return out


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def match_by_grade_ids(raw: bytes, known: dict[str, set]) -> str | None:
    """The assignment whose grade ids this notebook's cells carry: the one sharing the most,
    at least 3 and more than half of the notebook's own; None when two tie."""
    ids = grade_ids_of(raw)
    if not ids:
        return None
    scored = sorted(((len(ids & g), a) for a, g in known.items()), reverse=True)
    if not scored:
        return None
    best, a = scored[0]
    if best < 3 or best * 2 <= len(ids) or (len(scored) > 1 and scored[1][0] == best):
        return None
    return a


def match_assignment(file_name: str, raw: bytes | None, names: list[str], known: dict[str, set],
                     *, canvas: bool = False, hint: str | None = None) -> tuple[str | None, str]:
    """(assignment, how) for a notebook file: its name as released, its name with a copy
    suffix ("-1" that Canvas adds to a re-submitted file, " (1)"), a name that contains the
    assignment's, nbgrader's folder (hint), or its cells' grade ids."""
    stem = Path(file_name).stem
    if stem in names:
        return stem, "file name"
    if canvas:
        m = re.fullmatch(r"(.+)-\d+", stem)
        if m and m[1] in names:
            return m[1], "file name"
    if hint in names:
        return hint, "nbgrader folder"
    close = [a for a in names if _norm(a) in _norm(stem)]
    if len(close) == 1:
        return close[0], "file name"
    if raw is not None:
        a = match_by_grade_ids(raw, {k: v for k, v in known.items() if k in names})
        if a:
            return a, "grade ids"
    return None, ""


# -------------------------------------------------------------------------------- conversion

@dataclass
class Entry:
    """One file (or, for the folders layout, one folder) in the download, and what became of it."""
    file: str                      # its path inside the download
    layout: str
    lms_id: str = ""               # Canvas user id, Moodle participant id, folder name
    name: str = ""                 # the student's name as the download gives it
    student: str = ""              # the student id it was filed under
    assignment: str = ""
    matched_by: str = ""
    submitted_at: str | None = None
    submitted_from: str = ""
    lms_late: bool | None = None   # Canvas's LATE marker: True/False; None where the LMS says nothing
    intake: str = "used"           # used | unknown student | not a notebook | not a course notebook
    #                                | older copy | no submission
    notes: list[str] = field(default_factory=list)
    path: Path | None = None       # the file on disk
    order: tuple = ()              # among copies of one (student, assignment), the largest is used
    display: str = ""              # the file name the student gave it (without the LMS's prefix)
    hint: str | None = None        # nbgrader's assignment folder


@dataclass
class Intake:
    layout: str
    root: Path                      # what intake.collect reads: <student>/<notebook>.ipynb
    entries: list[Entry] = field(default_factory=list)
    roster: Roster | None = None
    roster_given: bool = False
    from_zip: bool = False
    converted: bool = False

    def used(self) -> dict[tuple[str, str], Entry]:
        return {(e.student, e.assignment): e for e in self.entries if e.intake == "used"}

    def unknown(self) -> list[Entry]:
        return [e for e in self.entries if e.intake == "unknown student"]

    def absent(self) -> list[str]:
        """Roster students with nothing at all in the download."""
        if self.roster is None:
            return []
        present = {e.student for e in self.entries if e.student and e.intake != "no submission"
                   and e.intake != "unknown student"}
        return [sid for sid in self.roster.ids() if sid not in present]

    def table(self) -> list[dict]:
        """One row per file of the download (and per roster student with nothing in it)."""
        rows = [{"file": e.file, "layout": e.layout, "lms_id": e.lms_id, "name": e.name,
                 "student_id": e.student, "assignment": e.assignment, "matched_by": e.matched_by,
                 "submitted_at": e.submitted_at or "", "submitted_from": e.submitted_from,
                 "lms_late": "" if e.lms_late is None else ("LATE" if e.lms_late else "on time"),
                 "intake": e.intake, "notes": "; ".join(e.notes)} for e in self.entries]
        for sid in self.absent():
            r = self.roster.get(sid) or {}
            rows.append({"file": "", "layout": self.layout, "lms_id": "", "name": r.get("name", ""),
                         "student_id": sid, "assignment": "", "matched_by": "",
                         "submitted_at": "", "submitted_from": "", "lms_late": "",
                         "intake": "no submission", "notes": "on the roster; nothing in the download"})
        return rows


TABLE_COLUMNS = ("file", "layout", "lms_id", "name", "student_id", "assignment", "matched_by",
                 "submitted_at", "submitted_from", "lms_late", "intake", "notes")


def convert(root: Path, work: Path, *, roster: Roster | None = None, layout: str = "auto",
            from_zip: bool = False, names: list[str] | None = None) -> Intake:
    """Read the download at `root` (unpacked), write the canonical tree under work/canonical
    (except for a plain folders layout without a roster: read where it is) and return what was
    found. `names`: the assignments a notebook may be matched to (default: the course's)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout is one of {', '.join(LAYOUTS)}; got {layout!r}")
    found, base = detect(root)
    layout = found if layout == "auto" else layout
    if layout == "folders" and roster is None:
        return Intake("folders", Path(root), roster=None, from_zip=from_zip)
    if names is None:
        from . import course
        names = course.assignments()
    known = course_grade_ids()
    out = Path(work) / "canonical"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    scan = {"canvas": _scan_canvas, "moodle": _scan_moodle, "nbgrader": _scan_nbgrader,
            "folders": _scan_folders}[layout]
    entries = scan(base, from_zip)
    derived = roster is None
    if derived:
        roster = _derive_roster(entries, layout)
    for e in entries:
        _file_student(e, roster, derived)
    if layout == "folders":
        _place_folders(entries, out)
    else:
        _place_files(entries, out, names, known)
    return Intake(layout, out, entries, roster=roster, roster_given=not derived,
                  from_zip=from_zip, converted=True)


def _time(path: Path, from_zip: bool, top: Path | None = None) -> tuple[str | None, str]:
    return submitted_at_of(path, from_zip, top)


def _scan_canvas(base: Path, from_zip: bool) -> list[Entry]:
    entries = []
    for p in sorted(base.rglob("*")):
        if not p.is_file() or not all(_visible(Path(x)) for x in p.relative_to(base).parts):
            continue
        rel = str(p.relative_to(base))
        at, src = _time(p, from_zip)
        m = CANVAS_ANON.match(p.name)
        if m:
            e = Entry(rel, "canvas", lms_id=f"anon_{m['anon']}")
            e.notes.append("anonymous grading: the download names no student")
        else:
            m = CANVAS.match(p.name) or CANVAS_OTHER.match(p.name)
            if not m:
                entries.append(_unknown(rel, "canvas", p, at, src, "the file name is not in Canvas's "
                                        "naming (<name>[_LATE]_<user id>_<file id>_<file name>)"))
                continue
            e = Entry(rel, "canvas", lms_id=m["uid"], name=m["name"])
        fid = m.groupdict().get("fid")
        e.lms_late = bool(m["late"])
        e.path, e.submitted_at, e.submitted_from, e.display = p, at, src, m["file"]
        e.order = (int(fid) if fid else 0, at or "")
        entries.append(e)
    return entries


def _unknown(rel: str, layout: str, p: Path, at, src, why: str) -> Entry:
    """A file whose name says no student: listed as such, never dropped."""
    return Entry(rel, layout, intake="unknown student", path=p, submitted_at=at,
                 submitted_from=src, notes=[why])


def _scan_moodle(base: Path, from_zip: bool) -> list[Entry]:
    entries = []
    for k in _kids(base):
        m = MOODLE.match(k.name)
        files = [(k, m["file"] if m else k.name)] if k.is_file() else \
            [(p, p.name) for p in sorted(k.rglob("*")) if p.is_file() and _visible(p)]
        for p, display in files:
            rel = str(p.relative_to(base))
            at, src = _time(p, from_zip)
            if not m:
                entries.append(_unknown(rel, "moodle", p, at, src, "the name is not in Moodle's naming "
                                        "(<Full Name>_<participant id>_assignsubmission_file_...)"))
                continue
            e = Entry(rel, "moodle", lms_id=m["pid"], name=m["name"], path=p, submitted_at=at,
                      submitted_from=src, order=(at or "",), display=display)
            if m["plugin"] != "file":
                e.intake = "not a notebook"
                e.notes.append(f"Moodle's {m['plugin']} submission, not a file")
            entries.append(e)
    return entries


def _scan_nbgrader(base: Path, from_zip: bool) -> list[Entry]:
    entries = []
    tops = [base / d for d in ("submitted", "autograded") if (base / d).is_dir()]
    if not tops and not (base / "inbound").is_dir() \
            and not any(INBOUND.match(k.name) for k in _kids(base)):
        tops = [base]   # the contents of submitted/
    if tops:
        top = tops[0]   # submitted/ when both are there: what the students handed in
        for sdir in _kids(top):
            if not sdir.is_dir():
                continue
            for p in sorted(sdir.rglob("*")):
                if not p.is_file() or p.name == "timestamp.txt" or not _visible(p):
                    continue
                rel = str(p.relative_to(base))
                at, src = _time(p, from_zip, sdir)
                hint = p.relative_to(sdir).parts[0] if len(p.relative_to(sdir).parts) > 1 else None
                entries.append(Entry(rel, "nbgrader", lms_id=sdir.name, path=p, submitted_at=at,
                                     submitted_from=src, order=(at or "",), display=p.name,
                                     hint=hint))
    inbound = base / "inbound"
    for sub in (_kids(inbound) if inbound.is_dir() else [k for k in _kids(base) if INBOUND.match(k.name)]):
        m = INBOUND.match(sub.name)
        if not sub.is_dir() or not m:
            continue
        t = parse_time(m["ts"])
        for p in sorted(sub.rglob("*")):
            if not p.is_file() or p.name == "timestamp.txt" or not _visible(p):
                continue
            at, src = (iso(t), "nbgrader inbound folder name") if t else _time(p, from_zip, sub)
            entries.append(Entry(str(p.relative_to(base)), "nbgrader", lms_id=m["student"],
                                 path=p, submitted_at=at, submitted_from=src, order=(at or "",),
                                 display=p.name, hint=m["assignment"]))
    return entries


def _scan_folders(base: Path, from_zip: bool) -> list[Entry]:
    entries = []
    for k in _kids(base):
        if k.is_dir():
            e = Entry(k.name + "/", "folders", lms_id=k.name, path=k)
            entries.append(e)
        else:
            entries.append(Entry(k.name, "folders", intake="unknown student", path=k,
                                 notes=["a file outside any student folder"]))
    return entries


def _slug(name: str) -> str:
    return safe_id("-".join(_name_tokens(name))) or "student"


def _derive_roster(entries: list[Entry], layout: str) -> Roster:
    """No roster given: the students are the download's own. Canvas: the user id (global in
    Canvas); Moodle: the name (participant ids change from one assignment to the next), with
    the participant id added where two share a name; nbgrader and folders: the folder name."""
    rows, by_key = [], {}
    slugs: dict[str, set] = {}
    for e in entries:
        if e.layout == "moodle" and e.lms_id:
            slugs.setdefault(_slug(e.name), set()).add(e.lms_id)
    for e in entries:
        if not e.lms_id or e.intake == "unknown student":
            continue
        if (e.layout, e.lms_id) in by_key:
            continue
        if e.layout == "canvas":
            sid, extra = e.lms_id, {"canvas_id": e.lms_id if e.lms_id.isdigit() else ""}
        elif e.layout == "moodle":
            s = _slug(e.name)
            sid = s if len(slugs.get(s, ())) == 1 else f"{s}-{e.lms_id}"
            extra = {"moodle_id": e.lms_id}
        else:
            sid, extra = e.lms_id, {}
        by_key[(e.layout, e.lms_id)] = sid
        if sid in {r["student_id"] for r in rows}:
            continue
        rows.append({**{k: "" for k in COLUMNS}, "student_id": sid, "name": e.name, **extra})
    return Roster(rows, source=f"derived from the {layout} download")


def _file_student(e: Entry, roster: Roster, derived: bool) -> None:
    """Set e.student from the roster; an entry whose student the roster lacks becomes unknown."""
    if e.intake == "unknown student" or e.path is None:
        e.student = f"unknown-{e.layout}-{safe_id(Path(e.file).stem)[:40]}" if not e.student else e.student
        e.intake = "unknown student"
        return
    r, how = None, ""
    if e.layout == "canvas":
        if e.lms_id.isdigit():
            r = roster.find("canvas_id", e.lms_id)
        if r is None and e.name:
            hits = roster.find_name(e.name, canvas=True)
            if len(hits) == 1:
                r, how = hits[0], f"matched by name ({e.name!r}): the roster has no canvas_id {e.lms_id}"
        what = f"Canvas user {e.lms_id}" + (f" ({e.name})" if e.name else "")
    elif e.layout == "moodle":
        r = roster.find("moodle_id", e.lms_id)
        if r is None and e.name:
            hits = roster.find_name(e.name)
            if len(hits) == 1:
                r = hits[0]
                if roster.has("moodle_id") and not derived:
                    how = (f"matched by name ({e.name!r}): participant {e.lms_id} is not in the "
                           f"roster's moodle_id (Moodle's participant ids are per assignment)")
        what = f"Moodle participant {e.lms_id} ({e.name})"
    else:
        r = roster.find_folder(e.lms_id)
        what = f"folder {e.lms_id!r}"
    if r is None and derived:   # Canvas's anonymous ids: the derived roster's own
        r = roster.get(e.lms_id)
    if r is None:
        e.intake = "unknown student"
        e.student = f"unknown-{e.layout}-{safe_id(e.lms_id)}" if e.layout in ("canvas", "moodle") \
            else f"unknown-{safe_id(e.lms_id)}"
        if e.student in roster:
            e.student = f"unknown-{e.student}"
        e.notes.append(f"unknown student: {what} is not in the roster ({roster.source}); add "
                       f"them and grade again")
        return
    e.student = r["student_id"]
    if how:
        e.notes.append(how)


def _place_folders(entries: list[Entry], out: Path) -> None:
    for e in entries:
        if e.intake == "used" and e.path is not None and e.path.is_dir():
            dest = out / e.student
            if dest.exists():
                e.intake = "older copy"
                e.notes.append(f"a second folder for {e.student}: not used")
                continue
            shutil.copytree(e.path, dest)


def _place_files(entries: list[Entry], out: Path, names: list[str], known: dict) -> None:
    groups: dict[tuple, list[Entry]] = {}
    for e in entries:
        if e.intake == "unknown student" and e.path is not None and e.path.is_file() \
                and (e.display or e.path.name).lower().endswith(".ipynb"):
            try:   # which assignment it is, for the listing (it is not graded)
                e.assignment, e.matched_by = match_assignment(
                    e.display or e.path.name, e.path.read_bytes(), names, known,
                    canvas=e.layout == "canvas", hint=e.hint)
                e.assignment = e.assignment or ""
            except OSError:
                pass
        if e.intake not in ("used",):
            continue
        display = e.display or e.path.name
        if not display.lower().endswith(".ipynb"):
            e.intake = "not a notebook"
            _copy_aside(e, out, display)
            continue
        try:
            raw = e.path.read_bytes()
        except OSError as err:
            raw = None
            e.notes.append(f"cannot read: {err}")
        a, how = match_assignment(display, raw, names, known, canvas=e.layout == "canvas",
                                  hint=e.hint)
        if a is None:
            e.intake = "not a course notebook"
            e.notes.append(f"{display!r} matches no assignment by name or by its cells' grade ids")
            _copy_aside(e, out, display)
            continue
        e.assignment, e.matched_by = a, how
        stem = Path(display).stem
        lms_made = e.layout == "canvas" and re.fullmatch(re.escape(a) + r"-\d+", stem)
        if stem != a and not lms_made:
            why = " by its cells' grade ids" if how == "grade ids" else ""
            e.notes.append(f"notebook was renamed to {display!r}; matched to {a}{why}, graded as "
                           f"{a}.ipynb")
        groups.setdefault((e.student, a), []).append(e)
    for (sid, a), group in groups.items():
        group.sort(key=lambda x: x.order)
        chosen = group[-1]
        for older in group[:-1]:
            older.intake = "older copy"
            older.notes.append(f"not used: {Path(chosen.file).name!r} is the later copy of {a}")
            _copy_aside(older, out, older.display or older.path.name)
        if len(group) > 1:
            chosen.notes.append(f"{len(group)} files for {a}: graded {Path(chosen.file).name!r} "
                                f"(the last uploaded), not "
                                + ", ".join(repr(Path(o.file).name) for o in group[:-1]))
        dest = out / sid / f"{a}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(chosen.path, dest)


def _copy_aside(e: Entry, out: Path, display: str) -> None:
    """A file of a known student that is not graded still shows in the "found:" list."""
    if e.intake == "unknown student" or not e.student:
        return
    d = out / e.student
    d.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[/\\]", "_", display) or "file"
    dest, n = d / name, 1
    while dest.exists():
        dest, n = d / f"{n}_{name}", n + 1
    if Path(name).suffix == ".ipynb":
        dest = dest.with_name(dest.name + ".not-used")   # never picked up as the notebook
    shutil.copy2(e.path, dest)


# ------------------------------------------------------------------------- kept in OUT

def write_table(intake: Intake, path: Path) -> Path:
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(TABLE_COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows(intake.table())
    return Path(path)


SETTINGS_FILE = "lms.json"
ROSTER_FILE = "roster.csv"


def saved_settings(out: Path) -> dict:
    try:
        return json.loads((Path(out) / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def saved_roster(out: Path) -> Roster | None:
    p = Path(out) / ROSTER_FILE
    if not p.is_file():
        return None
    try:
        r = Roster.load(p)
    except RosterError:
        return None
    r.source = saved_settings(out).get("roster_source", str(p))
    return r


def save(out: Path, *, roster: Roster | None, given: bool, layout: str | None = None,
         id_fields=None) -> None:
    """Keep the roster and the export settings in OUT for later runs and `tfs-grade export`.
    A given roster stays until another is given; one derived from a download is replaced by
    the next run's (and removed by a run that has none)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = saved_settings(out)
    if roster is not None and (given or not cfg.get("roster_given")):
        roster.save(out / ROSTER_FILE)
        cfg["roster_given"] = bool(given)
        cfg["roster_source"] = roster.source
    elif roster is None and not cfg.get("roster_given"):
        (out / ROSTER_FILE).unlink(missing_ok=True)
        cfg.pop("roster_source", None)
        cfg["roster_given"] = False
    if layout:
        cfg["layout"] = layout
    if id_fields:
        cfg["id_fields"] = list(id_fields)
    (out / SETTINGS_FILE).write_text(json.dumps(cfg, indent=1) + "\n")
