"""What the grader knows about each (student, notebook) beyond the gradebook: OUT/record.json.

nbgrader's gradebook holds the scores, hand grades, comments and times; it has no place for a
run's notes (why a submission was flagged, the scan's findings, similar work, where the file
came from). Those are kept here, one entry per (student, notebook), so that every output can be
written for the whole class from the gradebook and this record (tfsgrade.outputs), whoever a
run graded: a regrade of one student replaces that student's entries and keeps the others'.

Nothing a submission wrote is kept: only what the coordinator decided about it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from .intake import Item

RECORD_FILE = "record.json"
FIELDS = ("status", "reasons", "flags", "submitted_at", "submitted_from", "lms_late", "origin",
          "time_known", "answer_changed", "graded_at", "review")


@contextlib.contextmanager
def writing(out: Path):
    """One writer at a time for a grading folder (a run, an export): a second one stops with a
    clear message instead of interleaving its gradebook and record writes with the first."""
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"another tfs-grade run or export is writing {out}: wait for it "
                             "to finish") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _key(student: str, assignment: str) -> str:
    return f"{student}/{assignment}"


def load(out: Path) -> dict:
    p = Path(out) / RECORD_FILE
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else {}


def update(out: Path, items, when: str, sandbox: str = "") -> dict:
    """Replace the entries of this run's items (an assignment "*" stands for a student folder
    that could not be read at all); write atomically; return the whole record."""
    rec = load(out)
    for it in items:
        e = {f: getattr(it, f, None) for f in FIELDS}
        e["graded_at"], e["sandbox"] = when, sandbox
        old = rec.get(_key(it.student, it.assignment))
        if it.status == "flagged" and old and old.get("status") == "graded":
            e = _keep_graded(old, it, when)
        rec[_key(it.student, it.assignment)] = e
    tmp = Path(out) / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, Path(out) / RECORD_FILE)
    return rec


def _keep_graded(old: dict, it, when: str) -> dict:
    """A submission graded earlier stands when a later run cannot grade this one (missing from
    the new download, malformed, ...): its grade is in the gradebook, and the record says why the
    newer one was not graded."""
    e = dict(old)
    why = [f"newer submission ({when}) not graded: {r}; the one graded {old.get('graded_at')} stands"
           for r in it.reasons] or [f"newer submission ({when}) not graded; the earlier grade stands"]
    e["reasons"] = list(old.get("reasons") or []) + why
    e["flags"] = list(old.get("flags") or []) + why
    return e


def items(out: Path) -> list[Item]:
    """Every recorded (student, notebook) as an Item (no notebook bytes, no task result)."""
    out_items = []
    for key, e in sorted(load(out).items()):
        student, _, assignment = key.partition("/")
        it = Item(student, assignment)
        for f in FIELDS:
            if f in e and e[f] is not None and hasattr(it, f):
                setattr(it, f, e[f])
        out_items.append(it)
    return out_items
