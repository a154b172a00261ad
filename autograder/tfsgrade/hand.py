"""Hand grades across regrades (issue 29, item 1): nothing an instructor entered is lost.

nbgrader's autograde keeps a grade's `manual_score` and every comment when it rescores a
submission, and marks each hand-graded cell as needing review again. After a regrade this module
looks at what the hand grade was given for:

- an answer cell (a free-text answer) whose text is what was graded: the hand grade stands, the
  cell no longer waits for review;
- an answer cell whose text changed since: the hand score is kept, the cell waits for review,
  and the item is flagged "answer changed since graded by hand";
- a test cell the instructor overrode: the override stands unless the student's code (the
  solution cells) changed since, which is flagged the same way.

What was graded is the course's autograded copy from the run before (OUT/course/autograded),
compared with this run's (the staging course) before it replaces it.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from . import course
from .cells import key as _key


def _cells(path: Path) -> dict | None:
    """{grade_id: source} of the solution and grade cells, and "*code*": the solution code."""
    if not path.exists():
        return None
    nb = nbformat.read(path, as_version=4)
    out, code = {}, []
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade_id"):
            out[meta["grade_id"]] = _key(c.source)
        if meta.get("solution") and c.cell_type == "code":
            code.append(_key(c.source))
    out["*code*"] = "\n\n".join(code)
    return out


def _what_was_graded(gid: str, cells: dict, answer: bool) -> str | None:
    return cells.get(gid) if answer else cells.get("*code*")


def carry(pending, s, stage: Path, gb) -> None:
    """For each item of this run with hand grades: keep them; flag those whose answer changed."""
    from nbgrader.api import MissingEntry
    for it in pending:
        new = _cells(course.notebook_path(stage, "autograded", it.assignment, it.student))
        if new is None:
            continue
        try:
            sub = gb.find_submission(it.assignment, it.student)
        except MissingEntry:
            continue
        old = _cells(course.notebook_path(s.course, "autograded", it.assignment, it.student))
        for nb in sub.notebooks:
            answers = {c.name for c in nb.notebook.solution_cells}
            for g in nb.grades:
                if g.manual_score is None:
                    continue
                answer = g.name in answers
                before = None if old is None else _what_was_graded(g.name, old, answer)
                if before is not None and before == _what_was_graded(g.name, new, answer):
                    g.needs_manual_grade = False          # the same work: the hand grade stands
                    continue
                g.needs_manual_grade = True
                it.answer_changed.append(g.name)
                what = "answer" if answer else "code under this test (an override)"
                msg = (f"answer changed since graded by hand: {g.name} (the {what} differs from "
                       f"what was graded; the hand score {float(g.manual_score):g}/"
                       f"{float(g.max_score):g} is kept until you review it in the formgrader)")
                if old is None:
                    msg = (f"graded by hand before, but the graded copy is gone: {g.name} (the "
                           f"hand score {float(g.manual_score):g}/{float(g.max_score):g} is kept; "
                           "review it in the formgrader)")
                it.flags.append(msg)
                it.reasons.append(msg)
    gb.db.commit()
