"""Dates of the term: due dates, per-student extensions and the late policy (issue 29, item 4).

They live where nbgrader keeps them, so that its own tools agree with ours:

- the due date of each assignment is the gradebook's `Assignment.duedate`;
- an extension is the gradebook's `SubmittedAssignment.extension` (nbgrader adds it to the due
  date in `total_seconds_late`);
- the submission time is nbgrader's `timestamp.txt` in the submitted folder (autograde reads it
  into `SubmittedAssignment.timestamp`);
- the penalty is computed by `TermLatePenalty`, an nbgrader `LateSubmissionPlugin`, and stored
  per notebook in `SubmittedNotebook.late_submission_penalty`; nbgrader's export and feedback
  subtract it. `tfsgrade.outputs` recomputes it after every change of score (the coordinator's
  verdict, a hand grade) because nbgrader only computes it once, during autograde.

The settings are given on the command line (`--due`, `--extensions`, `--late-policy`,
`--penalty-per-day`, `--cutoff-days`) or in a TOML file (`--term FILE`):

    [due]
    "01_attention" = "2026-10-02 23:59 Europe/Berlin"
    "*" = "2026-12-18 23:59 UTC"          # every other assignment

    [late]
    policy = "per-day"                    # none | per-day | zero-after
    penalty_per_day = 0.10                # a share of the notebook's score per started day
    cutoff_days = 7                       # after this many days late: 0 (per-day and zero-after)

    [extensions]
    file = "extensions.csv"               # student_id,assignment,extension ("*" = every one)

and kept in OUT/term.json, so that later runs and `tfs-grade export` apply the same ones.
An extension is a duration ("2d", "36h", "1d12h", "3" = days) or a new due date.

A submission whose time is not known (Canvas's download carries the time the zip was made, not
the submission's) is late when the LMS marked it LATE; it is then charged one day, and says so.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Enum, Float

TERM_FILE = "term.json"
POLICIES = ("none", "per-day", "zero-after")
DAY = 86400.0


@dataclass
class Term:
    due: dict = field(default_factory=dict)         # assignment (or "*") -> ISO time in UTC
    policy: str = "none"
    penalty_per_day: float = 0.0                    # share of the notebook's score per day
    cutoff_days: float | None = None                # later than this: the notebook scores 0
    extensions: dict = field(default_factory=dict)  # "student/assignment" -> ISO due or seconds

    def due_of(self, assignment: str) -> datetime | None:
        t = self.due.get(assignment, self.due.get("*"))
        return _utc(t) if t else None

    def extension_of(self, student: str, assignment: str, due: datetime | None) -> timedelta:
        """The extra time this student has for this assignment (a new due date counts from
        the assignment's)."""
        v = self.extensions.get(f"{student}/{assignment}", self.extensions.get(f"{student}/*"))
        if v is None:
            return timedelta(0)
        if isinstance(v, (int, float)):
            return timedelta(seconds=float(v))
        return max(timedelta(0), _utc(v) - due) if due else timedelta(0)

    def penalty(self, score: float, seconds_late: float) -> float:
        """The points taken off a notebook scoring `score`, `seconds_late` after its due date."""
        if seconds_late <= 0 or self.policy == "none" or score <= 0:
            return 0.0
        days = math.ceil(seconds_late / DAY)            # every started day counts
        if self.cutoff_days is not None and seconds_late > self.cutoff_days * DAY:
            return score
        if self.policy == "zero-after":
            return score if self.cutoff_days is None else 0.0
        return min(score, score * self.penalty_per_day * days)

    def describe(self) -> str:
        if self.policy == "none":
            return "no late penalty"
        cut = (f"; 0 after {self.cutoff_days:g} day(s) late" if self.cutoff_days is not None else "")
        if self.policy == "zero-after":
            return "late: 0" if self.cutoff_days is None else f"late: no penalty up to {self.cutoff_days:g} day(s){cut}"
        return f"late: -{100 * self.penalty_per_day:g}% of the score per started day{cut}"


class TermLatePenalty(LateSubmissionPlugin):
    """nbgrader's late-submission plugin for the term's policy (configured in the course's
    nbgrader_config.py, so AssignLatePenalties uses it during autograde too)."""
    policy = Enum(POLICIES, default_value="none").tag(config=True)
    penalty_per_day = Float(0.0).tag(config=True)
    cutoff_days = Float(-1.0, help="negative: no cut-off").tag(config=True)

    def late_submission_penalty(self, student_id, score, total_seconds_late):
        t = Term(policy=self.policy, penalty_per_day=self.penalty_per_day,
                 cutoff_days=None if self.cutoff_days < 0 else self.cutoff_days)
        return t.penalty(float(score or 0.0), float(total_seconds_late or 0.0))


def nbgrader_config(t: Term) -> str:
    """Lines for the course's nbgrader_config.py: autograde applies the same policy."""
    return ("\nc.AssignLatePenalties.plugin_class = 'tfsgrade.term.TermLatePenalty'\n"
            f"c.TermLatePenalty.policy = {t.policy!r}\n"
            f"c.TermLatePenalty.penalty_per_day = {float(t.penalty_per_day)!r}\n"
            f"c.TermLatePenalty.cutoff_days = {float(-1 if t.cutoff_days is None else t.cutoff_days)!r}\n")


# ------------------------------------------------------------------------------ reading

def _utc(text) -> datetime:
    from .lms import parse_time
    if isinstance(text, datetime):
        return text.astimezone(timezone.utc)
    t = parse_time(str(text))
    if t is None:
        raise ValueError(f"not a date and time: {text!r} (e.g. 2026-10-02T23:59+02:00, "
                         "'2026-10-02 23:59 Europe/Berlin')")
    return t.astimezone(timezone.utc)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*d)?\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+)\s*m)?\s*$", re.I)


def parse_extension(text: str):
    """A duration in seconds ("2d", "36h", "1d12h", "90m", "3" = days), or an ISO due date."""
    text = (text or "").strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text) * DAY
    m = _DURATION.match(text)
    if m and any(m.groups()):
        d, h, mi = (float(x) if x else 0.0 for x in m.groups())
        return d * DAY + h * 3600 + mi * 60
    return iso(_utc(text))


def read_extensions(path) -> dict:
    """student_id,assignment,extension rows (assignment "*" or empty: every assignment)."""
    out = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        for n, row in enumerate(csv.DictReader(f), start=2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}
            sid, ext = row.get("student_id") or row.get("student"), row.get("extension")
            if not sid or not ext:
                raise ValueError(f"{path}, line {n}: need student_id and extension")
            try:
                out[f"{sid}/{row.get('assignment') or '*'}"] = parse_extension(ext)
            except ValueError as e:
                raise ValueError(f"{path}, line {n}: {e}") from None
    return out


def parse_due(values) -> dict:
    """--due values: "DATE" (every assignment) or "ASSIGNMENT=DATE"."""
    out = {}
    for v in values or ():
        a, sep, when = v.partition("=")
        if not sep or re.match(r"^\d{4}-", v):
            a, when = "*", v
        out[a.strip()] = iso(_utc(when))
    return out


def load(out: Path) -> Term:
    p = Path(out) / TERM_FILE
    if not p.exists():
        return Term()
    return Term(**json.loads(p.read_text()))


def configure(out: Path, *, term_file=None, due=(), extensions=None, policy=None,
              penalty_per_day=None, cutoff_days=None) -> Term:
    """The term kept in OUT, updated by what is given now (a TOML file, then the flags), saved.
    Raises ValueError with a message that names the bad value."""
    t = load(out)
    if term_file:
        t = _from_toml(Path(term_file), t)
    t.due.update(parse_due(due))
    if extensions:
        t.extensions = read_extensions(extensions)
    if policy:
        if policy not in POLICIES:
            raise ValueError(f"late policy {policy!r}: one of {', '.join(POLICIES)}")
        t.policy = policy
    if penalty_per_day is not None:
        t.penalty_per_day = float(penalty_per_day)
    if cutoff_days is not None:
        t.cutoff_days = None if float(cutoff_days) < 0 else float(cutoff_days)
    if t.policy == "per-day" and not 0 < t.penalty_per_day <= 1:
        raise ValueError("a per-day late policy needs --penalty-per-day between 0 and 1 (0.1 = 10%)")
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / TERM_FILE).write_text(json.dumps(asdict(t), indent=1, sort_keys=True) + "\n")
    return t


def _from_toml(path: Path, t: Term) -> Term:
    import tomllib
    with path.open("rb") as f:
        cfg = tomllib.load(f)
    t.due.update({a: iso(_utc(v)) for a, v in cfg.get("due", {}).items()})
    late = cfg.get("late", {})
    t.policy = late.get("policy", t.policy)
    t.penalty_per_day = float(late.get("penalty_per_day", t.penalty_per_day))
    if "cutoff_days" in late:
        t.cutoff_days = float(late["cutoff_days"])
    ext = cfg.get("extensions", {}).get("file")
    if ext:
        t.extensions = read_extensions((path.parent / ext) if not Path(ext).is_absolute() else ext)
    return t
