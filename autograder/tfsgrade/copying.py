"""Copying of the instructor's material and of free-text answers (issue 29, point 9).

tfsgrade.similarity compares solution CODE cells; this module adds what it cannot see:

- the instructor's solution notebook handed in: its answer cells (code exercises and the
  free-text questions) equal the model answers, often with nbgrader's `### BEGIN SOLUTION` /
  `### END SOLUTION` lines still in them (the released notebook never has those lines, so an
  honest student never types them);
- free-text answers (nbgrader "manually graded answer" cells: markdown, `solution` and `grade`,
  grade ids `q_...`) against the model answer and against every classmate's answer.

Free text is compared as a sequence of lower-case words (difflib's ratio, 2 * matched /
total): punctuation, Markdown and LaTeX delimiters, case and line wrapping change nothing,
while two people who explain the same idea in their own words share far less than 80 %
of their word sequence (tests/test_copying.py measures an honest class). Answers shorter than
`MIN_WORDS` are not compared: two students who both write "No, the rows sum to 1." copied
nothing.

All of it goes to the item's `flags` (grades.csv, the report) and to OUT/similarity.html:
signals for a human, never a score.

Entry points:
    text_similarity(a, b) -> float
    compare_answers(submissions, assignment, *, source, released) -> list[TextPair]
    marker_cells(nb, released) -> [cell label]
    notebook_copy(nb, source, released) -> (equal, total)
    review(submissions, assignment, *, source, released) -> Review   (flags and HTML)
"""
from __future__ import annotations

import difflib
import html
import itertools
import re
from dataclasses import dataclass, field

from . import similarity
from .cells import answered as _answered
from .cells import key as _key
from .cells import written as _written
from .cells import solutions
from .cells import meta as _meta
from .cells import source as _src

MODEL = "the model answer"
TEXT_THRESHOLD = 0.8   # a classmate's or the model answer: 80 % of the word sequence shared
EQUAL = 0.9            # "equal" for the notebook count: near-verbatim, a word or two changed
MIN_WORDS = 10         # shorter answers are not compared (too many honest coincidences)
MARKER = re.compile(r"^[ \t]*#*[ \t]*(BEGIN|END) SOLUTION\b", re.M)
_MARKER_LINE = re.compile(r"^[ \t]*#*[ \t]*(BEGIN|END) SOLUTION\b.*(\n|$)", re.M)


def without_markers(text: str) -> str:
    """A model answer as a reader sees it: nbgrader's BEGIN/END SOLUTION lines taken out."""
    return _MARKER_LINE.sub("", text).strip()
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The answer as compared: markers dropped, lower-case words only."""
    return _WORD.findall(MARKER.sub(" ", text).lower())


def text_similarity(a: str, b: str) -> float:
    """Shared fraction of the two word sequences (difflib ratio), 0..1."""
    wa, wb = words(a), words(b)
    if not wa or not wb:
        return 0.0
    return difflib.SequenceMatcher(None, wa, wb, autojunk=False).ratio()


@dataclass
class TextPair:
    assignment: str
    question: str
    left: str            # submission id, or MODEL
    right: str
    similarity: float
    left_text: str
    right_text: str

    def to_row(self) -> dict:
        return {"assignment": self.assignment, "question": self.question, "left": self.left,
                "right": self.right, "similarity": round(self.similarity, 3)}


def _text_pair(assignment, q, left, right, threshold, min_words):
    (ln, lt), (rn, rt) = left, right
    wl, wr = words(lt), words(rt)
    if min(len(wl), len(wr)) < min_words:
        return None
    m = difflib.SequenceMatcher(None, wl, wr, autojunk=False)
    if m.real_quick_ratio() < threshold or m.quick_ratio() < threshold:
        return None  # cheap upper bounds first: most pairs stop here
    score = m.ratio()
    return TextPair(assignment, q, ln, rn, score, lt, rt) if score >= threshold else None


def compare_answers(submissions, assignment, *, source, released,
                    threshold: float = TEXT_THRESHOLD, min_words: int = MIN_WORDS) -> list[TextPair]:
    """Every answered free-text cell against the model answer (source) and every classmate's
    answer to the same question; the pairs at or over `threshold`, most similar first."""
    stubs, model = solutions(released, cell_type="markdown"), solutions(source, cell_type="markdown")
    model = {q: without_markers(t) for q, t in model.items()}
    questions = list(stubs or model)
    texts = {sid: solutions(nb, questions, cell_type="markdown") for sid, nb in submissions.items()}
    pairs = []
    for q in questions:
        given = [(sid, t) for sid, cs in texts.items()
                 if (t := _answered(cs.get(q), stubs.get(q))) is not None]  # not deleted, empty or as released
        cands = [((MODEL, model[q]), g) for g in given] if q in model else []
        for left, right in cands + list(itertools.combinations(given, 2)):
            p = _text_pair(assignment, q, left, right, threshold, min_words)
            if p is not None:
                pairs.append(p)
    pairs.sort(key=lambda p: (-p.similarity, p.question, p.left, p.right))
    return pairs


def marker_cells(nb, released=None) -> list[str]:
    """Labels (grade id, else "cell N") of the student's cells holding nbgrader solution
    markers: answer cells and cells the student added; locked cells are the course's own."""
    shipped = {_key(_src(c)) for c in released.cells} if released is not None else set()
    found = []
    for i, c in enumerate(nb.cells):
        m = _meta(c)
        mine = m.get("solution") or not (m.get("grade") or m.get("locked"))
        if mine and _written(_src(c), shipped) and MARKER.search(_src(c)):
            found.append(m.get("grade_id") or f"cell {i + 1}")
    return found


def _same_code(a: str, b: str, stub: str) -> bool:
    if similarity.normalise(a) == similarity.normalise(b):
        return True
    return similarity.cell_similarity(a, b, stub)[0] >= EQUAL


def notebook_copy(nb, source, released) -> tuple[int, int]:
    """(answer cells equal to the model answer, answer cells the source has): code cells
    equal once comments, layout and names are normalised, free text near-verbatim."""
    code, text = solutions(source), solutions(source, cell_type="markdown")
    stubs = solutions(released) if released is not None else {}
    mine_code, mine_text = solutions(nb, code), solutions(nb, text, cell_type="markdown")
    equal = sum(_same_code(mine_code[ex], code[ex], stubs.get(ex, ""))
                for ex in code if ex in mine_code)
    equal += sum(text_similarity(mine_text[q], text[q]) >= EQUAL for q in text if q in mine_text)
    return equal, len(code) + len(text)


def _copies_notebook(equal: int, total: int, markers: list, texts_equal: bool) -> bool:
    """The whole notebook is the instructor's: every answer cell equal, with the free text
    as evidence (solution code alone is what a strong honest student writes); or, with the
    markers as evidence, at least half of them (the rest edited after copying)."""
    if total < 2 or not (markers or texts_equal):
        return False
    return equal == total or (bool(markers) and 2 * equal >= total)


@dataclass
class Review:
    flags: dict = field(default_factory=dict)     # sid -> [flag text]
    notes: list = field(default_factory=list)     # [(sid, text)]: the instructor-material findings
    code_pairs: list = field(default_factory=list)
    text_pairs: list = field(default_factory=list)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _instructor_notes(subs, source, released, text_pairs) -> dict:
    """sid -> (copied whole notebook?, [notes]) from markers, notebook count, model answers."""
    out = {}
    for sid, nb in subs.items():
        marks = marker_cells(nb, released)
        model = [p for p in text_pairs if p.left == MODEL and p.right == sid]
        texts_equal = any(p.similarity >= EQUAL for p in model)
        # the cell-by-cell count only where there is evidence: it costs a fingerprint per cell
        evidence = source is not None and (marks or texts_equal)
        equal, total = notebook_copy(nb, source, released) if evidence else (0, 0)
        whole = _copies_notebook(equal, total, marks, texts_equal)
        if whole:
            note = (f"hands in the instructor's solution notebook: {equal} of {total} solution "
                    f"cells equal the model answer")
            notes = [note + (f" (nbgrader solution markers in {len(marks)} cells)" if marks else "")]
        else:
            notes = [f"nbgrader solution markers (### BEGIN/END SOLUTION) in {', '.join(marks)}: "
                     "copied from the instructor's notebook?"] if marks else []
            notes += [f"free-text answer {p.question} "
                      + ("equals the model answer" if p.similarity >= 0.999
                         else f"{_pct(p.similarity)} similar to the model answer") for p in model]
        out[sid] = (whole, notes)
    return out


def review(subs, assignment, *, source, released, reference=None) -> Review:
    """Every copying signal of one assignment's submissions, as flags per student."""
    r = Review(code_pairs=similarity.compare_class(subs, assignment, source=source,
                                                   released=released, reference=reference),
               text_pairs=compare_answers(subs, assignment, source=source, released=released))
    mine = _instructor_notes(subs, source, released, r.text_pairs)
    for sid, (_, notes) in mine.items():
        r.flags.setdefault(sid, []).extend(notes)
        r.notes += [(sid, n) for n in notes]
    for p in r.code_pairs:   # the notebook-level note already says it for a whole copy
        for sid, other in ((p.left, p.right), (p.right, p.left)):
            if sid in subs and not (similarity.is_instructor(other) and mine[sid][0]):
                r.flags[sid].append(f"similar to {other} in {p.exercise} ({_pct(p.similarity)})")
    for p in r.text_pairs:
        if p.left != MODEL:
            for sid, other in ((p.left, p.right), (p.right, p.left)):
                r.flags[sid].append(f"free-text answer {p.question} {_pct(p.similarity)} "
                                    f"similar to {other}'s")
    r.flags = {sid: f for sid, f in r.flags.items() if f}
    return r


def render_html(assignment: str, r: Review) -> str:
    """The instructor-material findings and the free-text pairs of one assignment, as an HTML
    section; every student-written text and id is escaped."""
    e = html.escape
    h = [f'<section class="copying"><h2>{e(assignment)}: copies of the instructor\'s material '
         "and free-text answers</h2>"]
    h += ["<ul>" + "".join(f"<li><b>{e(sid)}</b>: {e(n)}</li>" for sid, n in r.notes) + "</ul>"
          if r.notes else "<p>No submission copies the instructor's notebook, its markers or a "
          "model answer.</p>"]
    if not r.text_pairs:
        h.append("<p>No pair of free-text answers over the threshold.</p></section>")
        return "".join(h)
    h.append(f"<p>{len(r.text_pairs)} pair(s) of free-text answers share at least "
             f"{_pct(TEXT_THRESHOLD)} of their words in order (case, punctuation and Markdown "
             "ignored). A signal for review, not a verdict.</p>")
    for p in r.text_pairs:
        h.append(f"<h3>{e(p.question)}: {e(p.left)} and {e(p.right)} "
                 f"({_pct(p.similarity)} similar)</h3><table class=\"pair\"><tr>"
                 f"<th>{e(p.left)}</th><th>{e(p.right)}</th></tr><tr>"
                 f"<td><pre>{e(p.left_text)}</pre></td><td><pre>{e(p.right_text)}</pre></td>"
                 "</tr></table>")
    h.append("</section>")
    return "".join(h)
