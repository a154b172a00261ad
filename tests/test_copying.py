"""Copying flagged (issue 29, point 9): the instructor's solution notebook, the reference's code
or nbgrader's solution markers handed in, and free-text answers shared with a classmate or
equal to the model answer. The judge is called as merge.py calls it, on Items and a course
directory (source/ and release/), with no gradebook: flags never touch a score. Pure: no
kernel, no nbgrader run."""
from __future__ import annotations

import copy
import itertools
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat

from nbtools import A01, NOTEBOOKS, SOLUTIONS, read, solution_sources, student_notebook
from tfsgrade import cells, copying
from tfsgrade import similarity as sim
from tfsgrade.intake import Item
from tfsgrade.judges import similarity_judge

sys.path.insert(0, str(Path(__file__).parent))
from catalogue import modules  # noqa: E402

Q1, Q2 = "q_softmax_shift", "q_scale_dk"

# Written independently, as four students would: same facts, own words.
HONEST = {
    Q1: ["Subtracting c from every score multiplies numerator and denominator by exp(-c), which "
         "cancels, so the probabilities do not change. Choosing c as the maximum makes every "
         "exponent at most zero, so exp never overflows and the sum is at least one.",
         "Softmax is invariant to adding a constant to all inputs because exp(x - c) = exp(x) "
         "exp(-c) and the common factor divides out. With the max subtracted the largest term is "
         "exp(0) = 1, so we never compute exp of a huge number (which would give inf and then nan).",
         "The shift is a constant that appears in both the top and the bottom of the fraction, so "
         "it cancels out. Large logits like 1000 overflow float32 exp to infinity; after shifting, "
         "all values are <= 0 and exp stays in [0, 1].",
         "In float32 exp(89) is already inf. If we take the maximum away first, the biggest entry "
         "becomes 0 and its exponential 1, so the denominator can't be 0 or inf. Mathematically "
         "the result is identical since $e^{-m}$ factors out of every term."],
    Q2: ["Each score is a sum of d_k products with unit variance, so its variance is d_k = 256 and "
         "its std 16. Softmax of such large scores is nearly one-hot and its gradient is close to "
         "zero, so training stalls. Dividing by 16 restores unit variance.",
         "Without scaling the dot products grow like sqrt(d_k): with 256 dimensions they are about "
         "16 times bigger than the entries. The softmax then saturates, putting almost all the "
         "weight on one key, and the gradients vanish. The sqrt(d_k) factor keeps the logits "
         "around 1.",
         "q.k adds up 256 independent terms, each of mean 0 and variance 1, so the sum has standard "
         "deviation sqrt(256)=16. Big differences between scores push softmax into a regime where "
         "the Jacobian is almost zero: small changes to q or k do nothing to the output, so "
         "learning is slow.",
         "The variance of the dot product is proportional to the dimension. Large scores make the "
         "attention weights extreme (close to 0 or 1), the derivative of softmax there is tiny, and "
         "the model barely learns. Scaling by one over the square root of d_k brings the scores "
         "back to a comfortable range."],
}


def _course(tmp_path: Path, assignments) -> Path:
    """A course directory as grading builds it: source/ (the instructor's notebook) and
    release/ (the student's)."""
    root = tmp_path / "course"
    for a in assignments:
        for folder, nb in (("source", SOLUTIONS), ("release", NOTEBOOKS)):
            (root / folder / a).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nb / f"{a}.ipynb", root / folder / a / f"{a}.ipynb")
    return root


def judge(tmp_path: Path, subs: dict, a: str = A01):
    """similarity_judge on one Item per submission; returns ({sid: flags}, similarity.html)."""
    items = [Item(sid, a, notebook=nbformat.writes(nb).encode(), score=1.5)
             for sid, nb in subs.items()]
    s = SimpleNamespace(names=[a], out=tmp_path, course=_course(tmp_path, [a]))
    similarity_judge(items, s, None)   # no gradebook: nothing here may change a score
    assert all(it.score == 1.5 and it.status == "pending" and not it.reasons for it in items)
    return {it.student: it.flags for it in items}, (tmp_path / "similarity.html").read_text()


def _without_markers(nb):
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        c.source = copying.MARKER.sub("", c.source)
    return nb


def _honest_class():
    """Four students of 01: a different catalogue variant per exercise and their own answers."""
    mod = next(m for m in modules() if m.ASSIGNMENT == A01)
    per_ex = {ex: [v.code for v in mod.VARIANTS if v.exercise == ex] for ex in mod.EXERCISES}
    subs = {}
    for i in range(4):
        fill = {ex: codes[i % len(codes)] for ex, codes in per_ex.items()}
        fill.update({q: HONEST[q][i] for q in HONEST})
        subs[f"honest{i}"] = student_notebook(A01, fill)
    return subs


def test_solution_notebook_handed_in_is_flagged_with_its_reason(tmp_path):
    solution = read(SOLUTIONS / f"{A01}.ipynb")
    edited = copy.deepcopy(solution)   # one answer rewritten after copying: markers still there
    next(c for c in edited.cells if c.metadata.get("nbgrader", {}).get("grade_id") == Q1).source = \
        HONEST[Q1][0]
    subs = {"sol": solution, "edited": edited, "clean": _without_markers(solution),
            "ada": student_notebook(A01, solution_sources(A01))}
    flags, page = judge(tmp_path, subs)
    reason = "hands in the instructor's solution notebook: {} of 4 solution cells equal the model answer"
    assert flags["sol"][0] == reason.format(4) + " (nbgrader solution markers in 4 cells)", flags
    assert flags["edited"][0] == reason.format(3) + " (nbgrader solution markers in 3 cells)", flags
    assert flags["clean"][0] == reason.format(4), flags   # markers deleted: the model answers say it
    # one line says it all: no per-cell "equals the model answer" or "course solution" echo
    assert not any("model answer" in f or "course solution" in f for f in flags["sol"][1:]), flags
    # solution code without the model's free text is what a strong honest student writes
    assert flags["ada"] == [], flags
    assert "hands in the instructor&#x27;s solution notebook" in page


def test_solution_markers_in_a_students_cell_are_flagged(tmp_path):
    own = "def softmax(x, dim=-1):\n    ### BEGIN SOLUTION\n    e = (x - x.max(dim, keepdim=True).values).exp()\n" \
          "    return e / e.sum(dim, keepdim=True)\n    ### END SOLUTION\n"
    flags, _ = judge(tmp_path, {"mo": student_notebook(A01, {"softmax": own}),
                                "ben": student_notebook(A01)})
    assert flags["mo"] == ["nbgrader solution markers (### BEGIN/END SOLUTION) in softmax: copied "
                           "from the instructor's notebook?"], flags
    assert flags["ben"] == []


def test_reference_source_pasted_into_one_exercise_is_flagged():
    """03's MultiHeadAttention from reference/multihead.py (the same code as the course cell:
    one flag, the course solution's), and 02's masked attention from reference/masks.py pasted
    into 01 (different from 01's course cell: only the reference catches it)."""
    ref = sim.reference_sources()
    mha = dict(ref["MultiHeadAttention"])["reference source (tfscratch/reference/multihead.py)"]
    subs = {"rex": student_notebook("03_multihead", {"MultiHeadAttention": mha}),
            "ben": student_notebook("03_multihead")}
    pairs = sim.compare_class(subs, "03_multihead")
    assert [(p.exercise, p.left, p.right) for p in pairs] == \
        [("MultiHeadAttention", sim.COURSE, "rex")]
    masked = dict(ref["scaled_dot_product_attention"])[
        "reference source (tfscratch/reference/masks.py)"]
    subs = {"rex": student_notebook(A01, {"scaled_dot_product_attention": masked})}
    r = copying.review(subs, A01, source=read(SOLUTIONS / f"{A01}.ipynb"),
                       released=read(NOTEBOOKS / f"{A01}.ipynb"))
    assert r.flags == {"rex": ["similar to reference source (tfscratch/reference/masks.py) in "
                               "scaled_dot_product_attention (100%)"]}, r.flags


def test_reference_copy_is_flagged_through_the_judge(tmp_path):
    mha = sim.reference_sources()["MultiHeadAttention"][0][1]
    flags, page = judge(tmp_path, {"rex": student_notebook("03_multihead", {"MultiHeadAttention": mha}),
                                   "ben": student_notebook("03_multihead")}, "03_multihead")
    assert flags == {"rex": ["similar to course solution in MultiHeadAttention (100%)"], "ben": []}
    assert '<mark class="copied">' in page


def test_same_free_text_answer_is_flagged_for_both(tmp_path):
    text = HONEST[Q2][1]
    copied = text.replace("keeps the logits", "keeps the scores").upper().replace(". ", ".\n\n")
    subs = {"ann": student_notebook(A01, {Q2: text}), "bea": student_notebook(A01, {Q2: copied}),
            "cy": student_notebook(A01, {Q2: HONEST[Q2][2]})}
    flags, page = judge(tmp_path, subs)
    pct = f"{100 * copying.text_similarity(text, copied):.0f}%"
    assert 0.9 < copying.text_similarity(text, copied) < 1
    assert flags["ann"] == [f"free-text answer {Q2} {pct} similar to bea's"], flags
    assert flags["bea"] == [f"free-text answer {Q2} {pct} similar to ann's"], flags
    assert flags["cy"] == []
    assert f"{Q2}: ann and bea ({pct} similar)" in page


def test_free_text_equal_to_model_answer_is_flagged(tmp_path):
    model = cells.solutions(read(SOLUTIONS / f"{A01}.ipynb"), cell_type="markdown")
    plain = copying.MARKER.sub("", model[Q1]).strip()
    reworded = copying.MARKER.sub("", model[Q2]).replace("learning stalls", "it stops learning")
    subs = {"mia": student_notebook(A01, {Q1: plain}), "noa": student_notebook(A01, {Q2: reworded}),
            "ola": student_notebook(A01, {Q1: HONEST[Q1][3]})}
    flags, _ = judge(tmp_path, subs)
    assert flags["mia"] == [f"free-text answer {Q1} equals the model answer"], flags
    assert len(flags["noa"]) == 1 and flags["noa"][0].startswith(f"free-text answer {Q2} 9") \
        and flags["noa"][0].endswith("% similar to the model answer"), flags
    assert flags["ola"] == []


def test_honest_class_gets_no_flags(tmp_path):
    subs = _honest_class()
    subs["short1"] = student_notebook(A01, {Q1: "The constant cancels out."})
    subs["short2"] = student_notebook(A01, {Q1: "The constant cancels out."})  # too short to say
    flags, page = judge(tmp_path, subs)
    assert all(f == [] for f in flags.values()), flags
    assert "No submission copies" in page and "No pair of free-text answers" in page
    model = cells.solutions(read(SOLUTIONS / f"{A01}.ipynb"), cell_type="markdown")
    for q, texts in HONEST.items():   # the margin under the 80 % threshold
        worst = max(copying.text_similarity(a, b) for a, b in itertools.combinations(texts + [model[q]], 2))
        assert worst < 0.5, (q, worst)


def test_similarity_html_escapes_student_text(tmp_path):
    evil = ("</pre><script>alert('x')</script><img src=x onerror=alert(1)> the shift cancels in "
            "the numerator and the denominator of softmax, and exp never overflows")
    subs = {"<b>mallory</b>": student_notebook(A01, {Q1: evil}),
            "trent": student_notebook(A01, {Q1: evil + " at all"})}
    flags, page = judge(tmp_path, subs)
    assert flags["trent"] == [f"free-text answer {Q1} 96% similar to <b>mallory</b>'s"], flags
    assert "<script>" not in page and "<img" not in page and "<b>mallory" not in page
    assert "&lt;script&gt;" in page and "&lt;b&gt;mallory&lt;/b&gt;" in page


def test_a_class_of_forty_is_compared_quickly():
    """Every pair of a class: word-sequence pre-filters keep free text cheap."""
    import time
    n = 40
    base = _honest_class()
    subs = {f"s{i:02d}": base[f"honest{i % 4}"] for i in range(n)}
    t = time.perf_counter()
    pairs = copying.compare_answers(subs, A01, source=read(SOLUTIONS / f"{A01}.ipynb"),
                                    released=read(NOTEBOOKS / f"{A01}.ipynb"))
    assert len(pairs) == 2 * 4 * (n // 4) * (n // 4 - 1) // 2   # the identical ones, only
    assert time.perf_counter() - t < 5


def test_model_answers_are_shown_without_nbgrader_markers():
    from tfsgrade.copying import without_markers
    text = "### BEGIN SOLUTION\nThe scores grow with d_k.\n### END SOLUTION\n"
    assert without_markers(text) == "The scores grow with d_k."
    assert without_markers("no markers here") == "no markers here"
