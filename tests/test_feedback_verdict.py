"""One verdict per cell in the feedback (issue 29, point 11). A failing test cell used to show
the notebook's own check (run in the student's kernel on the public inputs) and, under it, the
independent check's verdict (the grade, on inputs drawn for the student): two "What differs"
blocks, with different expected values for the same label. The feedback shows the grade's
verdict alone. Pure: the notebook's own outputs come from the real checks run in-process (the
catalogue's kernel lane), the verdicts from the coordinator's judgement, the page from
nbgrader's feedback template; no nbgrader run."""
from __future__ import annotations

import copy
from functools import lru_cache

import nbformat

import catalogue
from nbtools import SOLUTIONS, read
from test_hygiene import SECRET, render
from tfsgrade import hygiene

A, EX = "01_attention", "scaled_dot_product_attention"
WRONG_SCALE = ("def scaled_dot_product_attention(q, k, v):\n"
               "    w = softmax(q @ k.transpose(-2, -1) / q.size(-1))\n"
               "    return w @ v, w\n")


def gid(c):
    """A code cell's grade id (None for markdown cells and cells nbgrader does not track)."""
    return c.metadata.get("nbgrader", {}).get("grade_id") if c.cell_type == "code" else None


def autograded(code: str):
    nb, kernel = _autograded(code)
    return copy.deepcopy(nb), kernel


@lru_cache(maxsize=None)
def _autograded(code: str):
    """The instructor's notebook with what autograde leaves in the exercise's test cells: the
    in-kernel checks' own outputs for `code` (an error output per failing cell, the green
    line per passing one)."""
    kernel = {r.grade_id: r for r in catalogue.run_exercise(A, EX, code)}
    nb = copy.deepcopy(read(SOLUTIONS / f"{A}.ipynb"))
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade") or meta.get("solution"):      # what the feedback template reads
            meta["score"] = meta.get("points", 0)
            meta.setdefault("points", 0)
        r = kernel.get(gid(c))
        if r is None:
            continue
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=r.stdout)] if r.stdout else []
        if not r.passed:
            name, _, value = r.message.partition(": ")
            c.outputs.append(nbformat.v4.new_output("error", ename=name, evalue=value,
                                                    traceback=[r.message]))
    return nb, kernel


def text_of(cell) -> str:
    return "\n".join(o.get("text", "") if o.output_type == "stream" else
                     "\n".join(o.get("traceback", [])) + o.get("evalue", "") for o in cell.outputs)


def test_each_judged_cell_shows_the_grades_verdict_alone():
    nb, kernel = autograded(WRONG_SCALE)
    verdicts = {g: (v.passed, v.message) for g, v in catalogue.independent(A, EX, WRONG_SCALE).items()}
    failing = [g for g, (ok, _) in verdicts.items() if not ok]
    assert failing and len(failing) < len(verdicts)      # partial credit: both kinds of cell
    # the situation of the issue: the kernel's check and the grade differ in what they show
    assert any(not kernel[g].passed and verdicts[g][1] not in kernel[g].message for g in failing)

    fb = hygiene.clean_feedback_notebook(nb, read(SOLUTIONS / f"{A}.ipynb"), verdicts=verdicts)
    cells = {gid(c): c for c in fb.cells if gid(c) in verdicts}
    assert set(cells) == set(verdicts)
    for g, c in cells.items():
        ok, message = verdicts[g]
        [out] = c.outputs                                  # one verdict, nothing beside it
        if ok:
            assert out.output_type == "stream" and "graded by the independent check: passed" in out.text
            continue
        assert out.output_type == "error" and out.evalue == message
        shown = text_of(c)
        assert shown.count("What differs") == 2            # evalue and traceback: one block
        assert "\n".join(out.traceback).count("What differs") == 1
        kernel_only = [ln for ln in kernel[g].message.splitlines()
                       if "differs" in ln and ln not in message]
        assert not any(ln in shown for ln in kernel_only), f"{g}: the kernel's verdict is still shown"
    # the page: one "What differs" block per failing cell, the hidden tests still hidden
    page = render(fb)
    assert page.count("What differs") == len(failing), page.count("What differs")
    assert "graded by the independent check: failed" in page and SECRET not in page


def test_cells_without_a_verdict_keep_their_own_output():
    """A cell the coordinator did not judge (a notebook with no spec, a manual cell) keeps what
    the notebook showed; with no verdicts nothing changes."""
    nb, _ = autograded(WRONG_SCALE)
    some = "test_scaled_dot_product_attention_weights"
    fb = hygiene.add_verdicts(nb, {some: (True, "passed")})
    before = {gid(c): c.outputs for c in nb.cells if gid(c)}
    for c in fb.cells:
        if gid(c) and gid(c) != some:
            assert c.outputs == before[gid(c)]
    assert hygiene.add_verdicts(nb, {}) is nb
