"""Judges and feedback hygiene: what the coordinator decides outside the student's process.

The merge stage runs the judges of `in_order()` after nbgrader has scored the executed
notebooks (one protocol: `judge(items, settings, gradebook) -> None`; a judge may change
automatic scores through nbgrader's Gradebook API and add to `item.reasons` / `item.flags`);
What the student gets back is cleaned afterwards, by the feedback stage (tfsgrade.hygiene:
`clean_autograded`, `sanitise_page`). This module plugs the pure modules in:

- `verdict_judge` (tfsgrade.verdict): the coordinator's own check of every graded cell an
  exercise spec backs, against the reference on the submission's own seed. It runs first.

- `scan_judge`: the static scan (tfsgrade.scan) of every submission. A certain shortcut scores
  the exercise's test cells 0 through nbgrader's Gradebook API (an automatic score of 0 marked
  for review, so the formgrader lists it and an instructor's manual score overrides it, and a
  regrade of clean work restores the points); anything uncertain is flagged for review.
  Both go into the item's notes and `flags` (grades.csv, the report).
- `similarity_judge`: copying signals (tfsgrade.similarity, tfsgrade.copying): pairs of
  solution cells over the threshold, cells equal to the course's solution or the reference
  package's source, the instructor's solution notebook handed in (markers, model answers), and
  free-text answers equal to a classmate's or the model answer; written to OUT/similarity.html
  and listed in the report. Flags only: they never change a score.
"""
from __future__ import annotations

import nbformat

from . import course, manifest, scan, similarity


def in_order() -> list:
    """The judges, in the order they run; the order matters: the verdict writes every backed
    cell's automatic score, then the scan's certain shortcuts set the exercise's cells to 0 over
    it, then the copying signals (flags only, never a score)."""
    from .verdict import verdict_judge     # imports torch and the specs: only when grading
    return [verdict_judge, scan_judge, similarity_judge]


def _course_nb(s, folder: str, a: str):
    path = course.notebook_path(s.course, folder, a)
    return nbformat.read(path, as_version=4) if path.exists() else None


def scan_judge(items, s, gb) -> None:
    for a in s.names:
        released, source = _course_nb(s, "release", a), _course_nb(s, "source", a)
        owners = manifest.owners(a)      # {test cell: its exercise}, as the specs declare them
        unowned = sorted(c.metadata["nbgrader"]["grade_id"] for c in (source.cells if source else [])
                         if c.metadata.get("nbgrader", {}).get("grade")
                         and not c.metadata["nbgrader"].get("solution")
                         and c.metadata["nbgrader"]["grade_id"] not in owners)
        for it in items:
            if it.assignment != a or it.status != "pending" or not it.notebook:
                continue
            try:
                nb = nbformat.reads(it.notebook, as_version=4)
                res = scan.scan_notebook(nb, a, released=released, source=source)
            except Exception as e:  # noqa: BLE001 - this submission only: a person reads it
                why = f"the scan could not read this notebook ({type(e).__name__}); read it yourself"
                it.reasons.append(f"scan: {why}")
                it.flags.append(why)
                it.review.append(why)
                continue
            hidden = {f.exercise for f in res.hidden}
            for gid in [g for g, ex in owners.items() if ex in hidden]:
                try:                # listed for a person in the formgrader; the score stays
                    gb.find_grade(gid, a, a, it.student).needs_manual_grade = True
                except Exception:  # noqa: BLE001 - nbgrader recorded no such cell
                    continue
            for gid, why in res.zeroed_cells(owners).items():
                try:
                    g = gb.find_grade(gid, a, a, it.student)
                except Exception:  # noqa: BLE001 - nbgrader recorded no such cell
                    continue
                # the grader's own score, recomputed by every regrade; an instructor who
                # disagrees enters a manual score in the formgrader, which then stands
                g.auto_score, g.needs_manual_grade = 0.0, True
            gb.db.commit()
            notes = res.notes()
            if unowned and res.zeroed():   # OUT/course is older than the specs: fail loudly
                notes.append(f"the course directory's test cells {', '.join(unowned)} are not in the "
                             "current specs, so the scan could not zero them: check them by hand, or "
                             "grade into a new output folder")
            it.reasons += [f"scan: {n}" for n in notes]
            it.flags += notes
            it.review += [f"{f.exercise}: {f.describe()}" + (f" `{f.code[:120]}`" if f.code else "")
                          for f in res.hidden]


def similarity_judge(items, s, gb) -> None:
    """Copying signals (tfsgrade.copying, tfsgrade.similarity): the instructor's notebook,
    markers, reference code or model answers handed in, and code cells or free-text answers
    shared with a classmate. Flags only: no score changes."""
    from . import copying
    pairs, sections = [], []
    for a in s.names:
        mine = [it for it in items if it.assignment == a and it.notebook and it.status == "pending"]
        subs = {}
        for it in mine:
            try:
                subs[it.student] = nbformat.reads(it.notebook, as_version=4)
            except Exception:  # noqa: BLE001 - the scan has said why; no signal from this one
                continue
        if not subs:
            continue
        try:
            r = copying.review(subs, a, source=_course_nb(s, "source", a),
                               released=_course_nb(s, "release", a))
        except Exception as e:  # noqa: BLE001 - copying signals are flags: never the class's end
            s.log(f"  copying signals for {a} could not be computed ({type(e).__name__}: {e})")
            continue
        for it in mine:
            it.flags += r.flags.get(it.student, [])
        pairs += r.code_pairs
        sections.append(copying.render_html(a, r))
    path = s.out / "similarity.html"
    path.write_text("<!doctype html><html><head><meta charset='utf-8'><title>Copying signals"
                    "</title></head><body>" + "".join(sections) + similarity.render_html(pairs)
                    + "</body></html>\n", encoding="utf-8")
