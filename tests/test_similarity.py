"""Copying signals (autograder/tfsgrade/similarity.py): the catalogue's valid variants, which are
different code, are not flagged against the course solution or each other; renamed, re-commented
and re-formatted copies are. Pure: no kernel, no nbgrader."""
from __future__ import annotations

import ast
import builtins
import difflib
import sys
from pathlib import Path

import pytest

from nbtools import solution_sources, student_notebook
from tfsgrade import cells
from tfsgrade import similarity as sim

sys.path.insert(0, str(Path(__file__).parent))
from catalogue import modules  # noqa: E402

MODS = modules()
KEEP = {"self", "super", "torch", "nn", "F", "math", "np", "R", "copy", "functools", "chk"}


class _Rename(ast.NodeTransformer):
    """What a copier does: every local name, argument and helper renamed."""

    def __init__(self, keep):
        self.map, self.keep = {}, keep

    def new(self, name):
        if name in self.keep or name.startswith("__") or hasattr(builtins, name):
            return name
        return self.map.setdefault(name, f"my_{len(self.map)}_{name[::-1]}")

    def visit_Name(self, node):
        if node.id in self.map:
            node.id = self.map[node.id]
        return node

    def visit_arg(self, node):
        node.arg = self.new(node.arg)
        return node


def disguise(code: str, exercise: str) -> str:
    """Rename every local name (the exercise's own name stays: it is graded by it), drop the
    comments, re-wrap through ast.unparse, and add comments of one's own."""
    tree = ast.parse(code)
    r = _Rename(KEEP | {exercise})
    for n in ast.walk(tree):
        if isinstance(n, ast.arg):
            r.new(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            r.new(n.id)
    for n in tree.body:  # top-level helpers (methods keep their names: they are the API)
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name != exercise:
            n.name = r.new(n.name)
    tree = r.visit(tree)
    lines = ast.unparse(tree).split("\n")
    return "# my own implementation, written from scratch\n" + "\n".join(
        ln + ("  # step" if ln.strip().startswith("return") else "") for ln in lines)


def _different(a: str, b: str) -> bool:
    """Ground truth for "different code": the texts differ by more than 10 % (difflib)."""
    return difflib.SequenceMatcher(None, a, b).ratio() < 0.9


def test_renamed_copy_is_flagged_and_rendered():
    sols = solution_sources("03_multihead")
    code = sols["MultiHeadAttention"]
    score, overlap, sa, sb = sim.cell_similarity(code, disguise(code, "MultiHeadAttention"))
    assert score > 0.95 and overlap > 200 and sa and sb
    assert difflib.SequenceMatcher(None, code, disguise(code, "MultiHeadAttention")).ratio() < 0.9


@pytest.mark.parametrize("m", MODS, ids=[m.ASSIGNMENT for m in MODS])
def test_class_variants_vs_disguised_copies(m):
    """A class per notebook: one student per valid variant (in its exercise cell, the rest left
    as stubs), plus copiers who hand in disguised copies of the course solution and of a
    classmate's variant. Every copy of enough code is flagged with its source; no pair of
    different code is."""
    a = m.ASSIGNMENT
    sols = solution_sources(a)
    subs, truth = {}, {}
    for i, v in enumerate(m.VARIANTS):
        sid = f"var{i:02d}"
        subs[sid] = student_notebook(a, {v.exercise: v.code})
        truth[sid] = (v.exercise, v.code)
    for ex in m.EXERCISES:
        subs[f"copy-course-{ex}"] = student_notebook(a, {ex: disguise(sols[ex], ex)})
        truth[f"copy-course-{ex}"] = (ex, sols[ex])
    first = {}
    for i, v in enumerate(m.VARIANTS):
        first.setdefault(v.exercise, (f"var{i:02d}", v))
    for ex, (sid, v) in first.items():
        subs[f"copy-{sid}"] = student_notebook(a, {ex: disguise(v.code, ex)})
        truth[f"copy-{sid}"] = (ex, v.code)

    pairs = sim.compare_class(subs, a)
    found = {(p.exercise, frozenset((p.left, p.right))) for p in pairs}

    # copies of enough code are flagged, with the right partner
    stubs = cells.solutions(student_notebook(a))
    for ex in m.EXERCISES:
        _, ov, _, _ = sim.cell_similarity(sols[ex], sols[ex], stubs[ex])
        if ov >= 80:  # one-liners are never flagged (every honest student writes them alike)
            assert (ex, frozenset((sim.COURSE, f"copy-course-{ex}"))) in found, (ex, ov)
    for ex, (sid, v) in first.items():
        _, ov, _, _ = sim.cell_similarity(v.code, v.code, stubs[ex])
        if ov >= 80:
            assert (ex, frozenset((sid, f"copy-{sid}"))) in found, (ex, sid, v.description)

    # different code is never flagged (the instructor's side: the course cell or the reference)
    def code(name, ex):
        if name == sim.COURSE:
            return sols[ex]
        return dict(refs.get(ex, []))[name] if sim.is_instructor(name) else truth[name][1]

    refs = sim.reference_sources()
    for p in pairs:
        left, right = code(p.left, p.exercise), code(p.right, p.exercise)
        assert not _different(left, right), (
            f"{a}/{p.exercise}: {p.left} and {p.right} flagged at {p.similarity:.2f} "
            f"but their code differs")


def test_untouched_stubs_are_not_compared():
    a = "01_attention"
    subs = {"ben": student_notebook(a), "bob": student_notebook(a)}
    assert sim.compare_class(subs, a) == []


def test_render_html_escapes_student_code():
    code = solution_sources("03_multihead")["MultiHeadAttention"]
    evil = code + '\nNOTE = \'</pre><script>alert("x")</script><img src=x onerror=alert(1)>\'\n'
    subs = {"<b>mallory</b>": student_notebook("03_multihead", {"MultiHeadAttention": evil}),
            "trent": student_notebook("03_multihead", {"MultiHeadAttention": disguise(code, "MultiHeadAttention")})}
    pairs = sim.compare_class(subs, "03_multihead")
    assert {frozenset((p.left, p.right)) for p in pairs} >= {frozenset(("<b>mallory</b>", "trent"))}
    out = sim.render_html(pairs)
    assert "<script>" not in out and "<img" not in out and "<b>mallory" not in out
    assert "&lt;script&gt;" in out and "&lt;b&gt;mallory&lt;/b&gt;" in out
    assert out.count('<mark class="copied">') >= len(pairs)
    assert "No pair" in sim.render_html([])
    assert pairs[0].to_row()["similarity"] >= 0.9
