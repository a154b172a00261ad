"""What a cell says, and what the student changed: the one place where a handed-in notebook is
read against the course's text. Safe on any notebook (a hostile submission's too, where
metadata or source may have any type). Imports nothing of tfsgrade.

One rule for "changed": two texts are the same when they are equal once the whitespace around
them is removed (an editor's trailing newline is no change). Every stage asks here:
normalise (a test cell the student edited), demos (a demonstration handed in as released), the
scan (the cells the student wrote), similarity and copying (an exercise or answer attempted),
hand grades (an answer changed since it was graded). The sandbox runner, which imports nothing
of ours, hashes the same stripped texts."""
from __future__ import annotations


def meta(cell) -> dict:
    """A cell's nbgrader metadata as a dict, whatever a submission put there."""
    m = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    m = m.get("nbgrader") if isinstance(m, dict) else None
    return m if isinstance(m, dict) else {}


def source(cell) -> str:
    """A cell's source as one string (nbformat allows a list of lines)."""
    s = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(s) if isinstance(s, list) else str(s or "")


def key(text: str) -> str:
    """A text as compared: the whitespace around it does not count."""
    return (text or "").strip()


def same(a: str, b: str) -> bool:
    return key(a) == key(b)


def answered(text: str | None, stub: str | None) -> str | None:
    """The student's text of an exercise or answer cell; None when deleted, empty or left as
    released (`stub`, None when unknown)."""
    if text is None or not key(text) or (stub is not None and same(text, stub)):
        return None
    return text


def solutions(nb, only=None, *, cell_type: str = "code") -> dict[str, str]:
    """grade id -> text of each cell the student answers in: the exercises (code solution
    cells) or, with cell_type="markdown", the free-text answers (solution cells graded by
    hand). The first cell of a grade id wins; `only`: those grade ids."""
    out: dict[str, str] = {}
    for c in (nb.get("cells", []) if nb is not None else []):
        m, gid = meta(c), meta(c).get("grade_id")
        if isinstance(c, dict) and c.get("cell_type") == cell_type and m.get("solution") \
                and (cell_type == "code" or m.get("grade")) \
                and isinstance(gid, str) and gid not in out and (only is None or gid in only):
            out[gid] = source(c)
    return out


def course_texts(*notebooks) -> set[str]:
    """The course's own code, as compared: every code cell of these notebooks (the released one,
    the instructor's) except the exercises, whose text is the student's to write."""
    return {key(source(c)) for nb in notebooks if nb is not None for c in nb.get("cells", [])
            if isinstance(c, dict) and c.get("cell_type") == "code" and not meta(c).get("solution")}


def written(text: str, course: set[str]) -> bool:
    """Whether the student wrote or changed this code cell (it is none of the course's)."""
    return key(text) not in course
