"""Copying signals (issue 14, item 6): how much of each submitted solution cell is shared with
the course's own solution and with every other submission of the class.

We use `copydetect` (MOSS-style winnowing fingerprints): pygments tokenises the cell, names
become one placeholder and comments and docstrings disappear, so renaming variables, re-wrapping
lines or rewriting comments changes nothing; k-grams of that token string are hashed and winnowed,
and the stub the course handed out (its signature) is passed as boilerplate, so only the
student's own code counts. Before fingerprinting, each cell is parsed and re-printed with
`ast.unparse` (docstrings and comments dropped, parentheses and line wrapping canonical), so a
copy that was only re-formatted scores like the original. copydetect fits: it takes code from memory (`fp=`), returns
the copied slices in the unfiltered text (for highlighting), and needs no server.

A pair is reported when the shared part covers at least `threshold` of BOTH cells (0.9 by default)
and is at least `min_overlap` filtered characters long (80 by default): one-line exercises
(`make_padding_mask`) are written the same way by every honest student, so they never count.
These are signals for a human, never a grade.

The instructor's side of each exercise is the course solution cell AND every definition of the
same name in the reference package (helpers/tfscratch/reference/*.py, generated from the
solution cells): a student who pastes the reference's code is caught even where the reference
holds a later notebook's version (01's scaled_dot_product_attention is 02's there). Each
submission keeps only its best match among them, so one copied cell gives one flag.

Entry points:
    reference_sources() -> {name: [(label, code)]}
    compare_class(submissions, assignment, *, source=None, released=None, reference=None,
                  threshold=0.9, min_overlap=80) -> list[Pair]
    cell_similarity(a, b, stub="") -> (score, overlap, spans_a, spans_b)
    render_html(pairs, title="Similar solution cells") -> str   (an escaped HTML section)
"""
from __future__ import annotations

import ast
import functools
import html
import io
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from .cells import answered as _answered
from .cells import solutions

COURSE = "course solution"
REFERENCE = "reference source"   # labels read "reference source (tfscratch/reference/masks.py)"
K = 20          # copydetect noise threshold: shared runs shorter than this are ignored
WIN = 1         # winnowing window (guarantee threshold K + WIN - 1)
PREFILTER = 0.5  # pairs sharing fewer fingerprints than this fraction are not compared in full
_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$", re.M)


@dataclass
class Pair:
    assignment: str
    exercise: str
    left: str                 # submission id, or COURSE
    right: str
    similarity: float         # shared fraction of the LESS covered cell (min of both sides)
    overlap: int              # shared filtered characters
    left_code: str            # the cells as compared (normalise(): no comments, canonical layout)
    right_code: str
    left_spans: list = field(default_factory=list)   # [(start, end)] copied parts, char offsets
    right_spans: list = field(default_factory=list)

    def to_row(self) -> dict:
        return {"assignment": self.assignment, "exercise": self.exercise, "left": self.left,
                "right": self.right, "similarity": round(self.similarity, 3),
                "overlap": self.overlap}


def _clean(code: str) -> str:
    """Blank out the solution markers and IPython lines, keeping every offset."""
    code = _MARKERS.sub(lambda m: " " * len(m.group(0)), code)
    return "\n".join(" " * len(ln) if ln.lstrip().startswith(("%", "!")) else ln
                     for ln in code.split("\n"))


def normalise(code: str) -> str:
    """The code as compared: docstrings and comments dropped and the layout made canonical by
    ast.unparse (parentheses, line wrapping, number spelling), so that re-formatting changes
    nothing. Code that does not parse is only cleaned."""
    code = _clean(code)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _fingerprint(code: str, boilerplate=None):
    from copydetect import CodeFingerprint
    return CodeFingerprint("cell.py", K, WIN, boilerplate=boilerplate,
                           fp=io.StringIO(normalise(code)), language="python")


def _boilerplate(stub: str):
    if not stub.strip():
        return None
    return np.array(sorted(int(h) for h in _fingerprint(stub).hashes), dtype=np.int64)


def _spans(slices) -> list[tuple[int, int]]:
    if slices is None or len(slices) == 0 or len(slices[0]) == 0:
        return []
    return [(int(a), int(b)) for a, b in zip(slices[0], slices[1])]


def cell_similarity(a: str, b: str, stub: str = ""):
    """(score, overlap, spans_a, spans_b): score is the shared fraction of the less covered of
    the two cells after the stub is removed; spans are the copied parts' character ranges in
    normalise(a) and normalise(b)."""
    bp = _boilerplate(stub)
    fa, fb = _fingerprint(a, bp), _fingerprint(b, bp)
    return _compare(fa, fb)


def _compare(fa, fb):
    from copydetect import compare_files
    if len(fa.hashes) == 0 or len(fb.hashes) == 0:
        return 0.0, 0, [], []
    overlap, sims, slices = compare_files(fa, fb)
    if not overlap:
        return 0.0, 0, [], []
    return float(min(sims)), int(overlap), _spans(slices[0]), _spans(slices[1])


def _course_nb(name: str, folder: str):
    import nbformat
    p = Path(__file__).resolve().parents[2] / folder / f"{name}.ipynb"
    return nbformat.read(p, as_version=4) if p.exists() else None


def _reference_dir() -> Path | None:
    """helpers/tfscratch/reference, found without importing tfscratch (no torch at import)."""
    import importlib.util
    spec = importlib.util.find_spec("tfscratch")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "reference").is_dir():
            return Path(loc) / "reference"
    return None


@functools.lru_cache(maxsize=4)
def _reference_of(folder: str) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted(Path(folder).glob("*.py")):
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                label = f"{REFERENCE} (tfscratch/reference/{path.name})"
                out.setdefault(node.name, []).append((label, ast.get_source_segment(text, node)))
    return out


def reference_sources(folder=None) -> dict[str, list[tuple[str, str]]]:
    """name -> [(label, code)]: every top-level def/class of the reference package's modules."""
    folder = folder or _reference_dir()
    return _reference_of(str(folder)) if folder else {}


def _pair(assignment, ex, left, right, min_overlap):
    """The Pair of two (name, (code, fingerprint)) entries, or None under the overlap floor
    (the caller checks the threshold)."""
    (ln, (lc, lf)), (rn, (rc, rf)) = left, right
    # cheap pre-filter: a pair over the threshold shares most of its fingerprints
    shared = len(lf.hashes & rf.hashes)
    if not shared or shared < PREFILTER * min(len(lf.hashes), len(rf.hashes)):
        return None
    score, overlap, ls, rs = _compare(lf, rf)
    if overlap < min_overlap:
        return None
    return Pair(assignment, ex, ln, rn, score, overlap, normalise(lc), normalise(rc), ls, rs)


def _attempts(cells, ex, stub, bp) -> dict:
    """sid -> (code, fingerprint) of every submission that changed the exercise's stub."""
    stub_fp = _fingerprint(stub, bp) if stub is not None else None
    prints = {}
    for sid, cs in cells.items():
        code = _answered(cs.get(ex), stub)
        if code is None:
            continue  # not attempted
        fp = _fingerprint(code, bp)
        if stub_fp is not None and len(fp.hashes) == 0:
            continue
        prints[sid] = (code, fp)
    return prints


def _instructor(ex, course, reference, bp) -> list:
    """The instructor's versions of an exercise, course solution first (it wins ties), then
    the reference's definitions that are not the same code."""
    found = [(COURSE, course[ex])] if ex in course else []
    seen = {normalise(code) for _, code in found}
    for label, code in reference.get(ex, []):
        if normalise(code) not in seen:
            seen.add(normalise(code))
            found.append((label, code))
    return [(label, (code, _fingerprint(code, bp))) for label, code in found]


def compare_class(submissions: Mapping[str, object], assignment: str, *, source=None,
                  released=None, reference=None, threshold: float = 0.9,
                  min_overlap: int = 80) -> list[Pair]:
    """Every submission's solution cells against the instructor's (the course solution,
    `source`, default solutions/<assignment>.ipynb, and the reference package's definition
    of the same name, `reference` as reference_sources() gives) and against every other
    submission's same cell.

    `submissions` maps a student id to the notebook (NotebookNode) they handed in; `released`
    is the student notebook (its stubs are boilerplate). Returns the pairs at or over
    `threshold`, most similar first; against the instructor, each submission's best only."""
    source = source if source is not None else _course_nb(assignment, "solutions")
    released = released if released is not None else _course_nb(assignment, "notebooks")
    reference = reference if reference is not None else reference_sources()
    stubs = solutions(released) if released is not None else {}
    course = solutions(source) if source is not None else {}
    exercises = list(stubs or course)
    cells = {sid: solutions(nb, exercises) for sid, nb in submissions.items()}
    pairs: list[Pair] = []
    for ex in exercises:
        bp = _boilerplate(stubs.get(ex, ""))
        others = list(_attempts(cells, ex, stubs.get(ex), bp).items())
        teachers = _instructor(ex, course, reference, bp)
        for item in others:
            found = [p for t in teachers if (p := _pair(assignment, ex, t, item, min_overlap))]
            best = max(found, key=lambda p: p.similarity, default=None)  # first wins ties
            if best is not None and best.similarity >= threshold:
                pairs.append(best)
        for left, right in itertools.combinations(others, 2):
            p = _pair(assignment, ex, left, right, min_overlap)
            if p is not None and p.similarity >= threshold:
                pairs.append(p)
    pairs.sort(key=lambda p: (-p.similarity, p.assignment, p.exercise, p.left, p.right))
    return pairs


def is_instructor(name: str) -> bool:
    """True for the instructor's side of a pair (course solution or reference source)."""
    return name == COURSE or name.startswith(REFERENCE)


def _highlight(code: str, spans) -> str:
    out, pos = [], 0
    for a, b in sorted(spans):
        a, b = max(a, pos), min(b, len(code))
        if a >= b:
            continue
        out.append(html.escape(code[pos:a]))
        out.append(f'<mark class="copied">{html.escape(code[a:b])}</mark>')
        pos = b
    out.append(html.escape(code[pos:]))
    return "".join(out)


def render_html(pairs: list[Pair], title: str = "Similar solution cells") -> str:
    """An HTML section (no <html>/<body>) listing each pair with both cells side by side and
    the shared parts highlighted. Everything from a submission is escaped."""
    h = [f'<section class="similarity"><h2>{html.escape(title)}</h2>',
         "<style>.similarity table.pair{width:100%;table-layout:fixed;border-collapse:collapse}"
         ".similarity td{vertical-align:top;border:1px solid #ccc;padding:4px}"
         ".similarity pre{white-space:pre-wrap;font-size:12px;margin:0}"
         ".similarity mark.copied{background:#ffe08a}</style>"]
    if not pairs:
        h.append("<p>No pair of solution cells over the threshold.</p></section>")
        return "".join(h)
    h.append(f"<p>{len(pairs)} pair(s) of solution cells share most of their code once names, "
             "comments and the handed-out stub are ignored. A signal for review, not a verdict. "
             "Cells are shown as compared: comments and docstrings removed, layout made "
             "canonical; shared parts are highlighted.</p>")
    for p in pairs:
        h.append(f"<h3>{html.escape(p.assignment)} / {html.escape(p.exercise)}: "
                 f"{html.escape(p.left)} and {html.escape(p.right)} "
                 f"({p.similarity:.0%} shared, {p.overlap} tokens)</h3>")
        h.append('<table class="pair"><tr>'
                 f"<th>{html.escape(p.left)}</th><th>{html.escape(p.right)}</th></tr><tr>"
                 f"<td><pre>{_highlight(p.left_code, p.left_spans)}</pre></td>"
                 f"<td><pre>{_highlight(p.right_code, p.right_spans)}</pre></td></tr></table>")
    h.append("</section>")
    return "".join(h)
