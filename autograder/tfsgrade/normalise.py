"""Stage 1, normalise: turn whatever the student handed in into the notebook nbgrader
would expect, so that cell metadata never costs a grade and never stops the class.

- nbformat 3 is upgraded; the course's kernelspec is used whatever the student's says;
- every graded test cell and read-only cell is the source's (its text with hidden tests,
  its metadata: points and grade ids are always the source's), in the source's order;
  deleted, edited, duplicated, moved, retyped or re-pointed ones are replaced and noted;
- the student's answer cells keep the student's code under the source's metadata;
- cells the student added (no nbgrader metadata) stay where the student put them;
- demonstration cells that nothing graded needs are marked, so the sandbox may leave them
  out (tfsgrade.demos).

The template comes from the course directory this run made: the released notebook for
layout and stubs, the gradebook's source cells for test text (hidden tests included).
"""
from __future__ import annotations

import copy
import json
import uuid

import nbformat

from . import course, demos
from .cells import meta as _meta
from .cells import same as _same


def _kind(m: dict) -> str | None:
    if m.get("solution"):
        return "answer"
    if m.get("grade") or m.get("locked") or m.get("task"):
        return "fixed"
    return None


def template(course_root, a: str, db_url: str):
    """The released notebook with the gradebook's source text in every fixed cell."""
    from nbgrader.api import Gradebook, MissingEntry
    nb = nbformat.read(course.notebook_path(course_root, "release", a), as_version=4)
    nb.metadata["tfsgrade_released"] = {_meta(c)["grade_id"]: c.source for c in nb.cells
                                        if _meta(c).get("grade_id")}
    nb.metadata["tfsgrade_demos"] = sorted(demos.demo_texts(nb))
    with Gradebook(db_url) as gb:
        for c in nb.cells:
            m = _meta(c)
            if _kind(m) == "fixed" and m.get("grade_id"):
                try:
                    c.source = gb.find_source_cell(m["grade_id"], a, a).source
                except MissingEntry:
                    pass
    return nb


def normalise(raw: bytes, tmpl) -> tuple[bytes, list[str]]:
    """(notebook bytes ready to execute, notes for the student and the instructor)."""
    notes: list[str] = []
    data = json.loads(raw.decode("utf-8"))
    if int(data.get("nbformat", 4)) < 4:
        notes.append(f"nbformat {data.get('nbformat')} notebook upgraded to nbformat 4")
    nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    known = {_meta(c)["grade_id"]: c for c in tmpl.cells if _kind(_meta(c)) and _meta(c).get("grade_id")}
    found = _match(nb, known)
    cells, changed = _rebuild(tmpl, found)
    notes += _notes(tmpl, known, found, changed)
    return _write(nb, tmpl, cells), notes


def _match(nb, known: dict) -> dict:
    """The student's cells against the source's grade ids: the first cell of each known id,
    the student's own cells before it (segments) and after the last (pending), and what was
    dropped or unmarked (dup, unknown, extra)."""
    first, pending, segments, order = {}, [], {}, []
    dup, unknown, extra = [], [], []
    for c in nb.cells:
        m = _meta(c)
        gid = m.get("grade_id")
        if gid in known and gid not in first:
            first[gid] = c
            segments[gid] = pending
            pending = []
            order.append(gid)
            continue
        if gid in known:            # a second cell claiming a known grade id
            if _kind(_meta(known[gid])) == "answer" and c.cell_type == "code":
                extra.append(gid)   # a copy of an answer: the student's code, kept unmarked
                c = _plain(c)
            else:
                dup.append(gid)
                continue
        elif m and (m.get("grade") or m.get("locked")):
            unknown.append(str(gid))  # a test cell pointing at no test of this notebook
            continue
        elif m:
            c = _plain(c)
        pending.append(c)
    return {"first": first, "pending": pending, "segments": segments, "order": order,
            "dup": dup, "unknown": unknown, "extra": extra}


def _fresh(t):
    """The source's cell t, without outputs."""
    new = copy.deepcopy(t)
    if new.cell_type == "code":
        new["outputs"], new["execution_count"] = [], None
    else:
        new.pop("outputs", None)
        new.pop("execution_count", None)
    return new


def _rebuild(tmpl, found: dict):
    """The cells in the source's order: each graded or answer cell from the source (an answer
    keeps the student's text), the student's own cells where they stood."""
    released = tmpl.metadata.get("tfsgrade_released", {})
    changed = {"deleted": [], "edited": [], "retyped": [], "missing_answers": []}
    cells = []
    for t in tmpl.cells:
        m = _meta(t)
        gid = m.get("grade_id")
        if not (_kind(m) and gid):
            continue
        cells += found["segments"].get(gid, [])
        s = found["first"].get(gid)
        new = _fresh(t)
        if s is None:
            changed["missing_answers" if _kind(m) == "answer" else "deleted"].append(gid)
        elif s.cell_type != t.cell_type:
            changed["retyped"].append(gid)
        elif m.get("grade") and _kind(m) != "answer" and not _same(s.source, released.get(gid, t.source)):
            # compare with what the student was given (the released text hides hidden tests)
            changed["edited"].append(gid)
        if s is not None and _kind(m) == "answer":
            new.source = s.source
        cells.append(new)
    return cells + found["pending"], changed


def _notes(tmpl, known: dict, found: dict, changed: dict) -> list[str]:
    notes = []
    tests = [g for g in found["order"] if _meta(known[g]).get("grade") and not _meta(known[g]).get("solution")]
    want = [g for g in (_meta(t).get("grade_id") for t in tmpl.cells) if g in tests]
    if tests != want:
        notes.append("test cells were moved; they were graded where the source has them")
    deleted = changed["deleted"]
    if deleted:
        graded = [g for g in deleted if _meta(known[g]).get("grade")]
        notes.append("test cells deleted by the student were put back from the source and graded: "
                     + ", ".join(graded) if graded
                     else "read-only cells deleted by the student were put back from the source")
    for key, text in (("missing_answers", "answer cells deleted by the student were put back as stubs (not attempted): "),
                      ("edited", "test cells edited by the student were replaced by the source's and graded: "),
                      ("retyped", "cells whose type the student changed were given the source's type back: ")):
        if changed[key]:
            notes.append(text + ", ".join(changed[key]))
    if found["dup"]:
        notes.append("duplicated test cells were removed (the source's cell was graded once): "
                     + ", ".join(sorted(set(found["dup"]))))
    if found["extra"]:
        notes.append("copies of answer cells were kept as ordinary code cells: " + ", ".join(found["extra"]))
    if found["unknown"]:
        notes.append("cells marked as tests with an unknown grade id were removed: " + ", ".join(found["unknown"]))
    return notes


def _write(nb, tmpl, cells) -> bytes:
    """The notebook to execute: the student's metadata with the source's kernel, unique cell
    ids, the demonstrations nothing needs marked for the fast path."""
    out = nbformat.v4.new_notebook()
    out.metadata = copy.deepcopy(nb.metadata)
    out.metadata.pop("tfsgrade_released", None)
    out.metadata.pop("tfsgrade_demos", None)
    for k in ("kernelspec", "language_info"):
        if k in tmpl.metadata:
            out.metadata[k] = copy.deepcopy(tmpl.metadata[k])
    out.nbformat_minor = max(tmpl.nbformat_minor, 5)
    seen = set()
    for c in cells:
        c = copy.deepcopy(c)
        cid = c.get("id")
        if not cid or cid in seen or not isinstance(cid, str):
            cid = uuid.uuid5(uuid.NAMESPACE_OID, f"{len(seen)}:{c.source}").hex[:12]
            while cid in seen:
                cid = uuid.uuid4().hex[:12]
        c["id"] = cid
        seen.add(cid)
        if c.cell_type == "code":
            c.setdefault("outputs", [])
            c.setdefault("execution_count", None)
        out.cells.append(c)
    # the grading fast path: which unchanged demonstration cells nothing that runs needs
    demos.mark(out.cells, set(tmpl.metadata.get("tfsgrade_demos", [])))
    nbformat.validate(out)
    return nbformat.writes(out).encode()


def _plain(c):
    c = copy.deepcopy(c)
    c.metadata.pop("nbgrader", None)
    return c
