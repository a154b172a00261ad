"""The grading fast path (tfsgrade.demos): which demonstration cells the sandbox may leave
out. Only unchanged demonstration cells that nothing run after them needs; a student's
code that reads what a demonstration defined keeps it. The round trip proves the other half
(every solution keeps full marks with its demonstrations left out)."""
import copy
from dataclasses import asdict

import nbformat
import pytest

from nbtools import NOTEBOOKS, assignments, solution_sources, student_notebook
from tfsgrade import demos

code = nbformat.v4.new_code_cell


def _release(*sources, keep=()):
    nb = nbformat.v4.new_notebook()
    nb.cells = [code(s) for s in sources]
    for c in nb.cells:
        if c.source in keep:
            c.metadata["tags"] = ["keep"]
    return nb


def _answer(src, gid="f"):
    c = code(src)
    c.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": gid, "locked": False}
    return c


def _test(src, gid="test_f"):
    c = code(src)
    c.metadata["nbgrader"] = {"solution": False, "grade": True, "grade_id": gid, "points": 1, "locked": True}
    return c


def _left_out(cells, release):
    demos.mark(cells, demos.demo_texts(release))
    return [c.source for c in cells if c.metadata.get(demos.MARK)]


DEMO_PLOT = "fig = plot(f(x))"
DEMO_DATA = "x = make_data(seed=0)"
DEMO_SIZE = "WIDTH = 8"


def test_unchanged_demonstrations_nothing_reads_are_left_out():
    rel = _release(DEMO_DATA, DEMO_PLOT)
    cells = [_answer("def f(x):\n    return x"), code(DEMO_DATA), code(DEMO_PLOT), _test("check(f)")]
    assert _left_out(cells, rel) == [DEMO_DATA, DEMO_PLOT]


def test_a_name_the_student_reads_keeps_its_demonstration_and_what_that_reads():
    rel = _release(DEMO_SIZE, "scale = 2 * WIDTH", DEMO_PLOT)
    body = "def f(x):\n    return x * scale"           # reads a global a demonstration made
    cells = [code(DEMO_SIZE), code("scale = 2 * WIDTH"), code(DEMO_PLOT), _answer(body), _test("check(f)")]
    assert _left_out(cells, rel) == [DEMO_PLOT]
    # parameters and locals of the student's function are not notebook names
    body = "def f(x, scale=1):\n    WIDTH = 3\n    return x * scale * WIDTH"
    cells = [code(DEMO_SIZE), code("scale = 2 * WIDTH"), _answer(body), _test("check(f)")]
    assert _left_out(cells, rel) == [DEMO_SIZE, "scale = 2 * WIDTH"]


def test_edited_added_and_marked_cells_always_run():
    rel = _release(DEMO_DATA, DEMO_PLOT)
    edited = code(DEMO_PLOT.replace("f(x)", "f(2)"))          # reads no x
    added = code("y = 1")
    forged = code("z = 1")
    forged.metadata[demos.MARK] = True                 # a student cannot mark a cell
    cells = [code(DEMO_DATA), edited, added, forged, _test("check(f)")]
    assert _left_out(cells, rel) == [DEMO_DATA]
    assert not forged.metadata.get(demos.MARK)


def test_a_cell_that_does_not_parse_keeps_every_demonstration_above_it():
    rel = _release(DEMO_DATA, DEMO_PLOT)
    cells = [code(DEMO_DATA), code("def f(:"), code(DEMO_PLOT)]
    assert _left_out(cells, rel) == [DEMO_PLOT]


@pytest.mark.parametrize("demo, later", [
    ("config.width = 4", "def f(x):\n    return x * config.width"),      # changes an object
    ("table[0] = 4", "print(table)"),
    ("def g():\n    global K\n    K = 3\ng()", "print(K)"),              # a global from a function
    ("import numpy as np", "def f(x):\n    return np.tanh(x)"),
    ("from helpers import *", "print(1)"),                                # binds unknown names
    ("counter = 0", "counter += 1"),
    ("%%time\nsize = 4", "print(1)"),                                   # a cell magic's body
])
def test_what_a_demonstration_binds_or_changes_keeps_it(demo, later):
    rel = _release(demo)
    assert _left_out([code(demo), code(later)], rel) == []


def test_magics_and_keep_tags():
    rel = _release("%timeit f(1)", "torch.set_printoptions(precision=3)",
                   keep=("torch.set_printoptions(precision=3)",))
    cells = [code("torch.set_printoptions(precision=3)"), code("%timeit f(1)"), _test("check(f)")]
    assert _left_out(cells, rel) == ["%timeit f(1)"]


@pytest.mark.parametrize("a", assignments())
def test_course_solutions_leave_out_only_demonstrations(a):
    """For each notebook of the course: the solution leaves out demonstration cells and never
    an answer, a test or a read-only cell; the released notebook's demonstrations are the
    solution's."""
    released = nbformat.read(NOTEBOOKS / f"{a}.ipynb", as_version=4)
    nb = student_notebook(a, solution_sources(a))
    texts = demos.demo_texts(released)
    n = demos.mark(nb.cells, texts)
    assert n > 0, f"{a}: no demonstration cell left out"
    for c in nb.cells:
        if c.metadata.get(demos.MARK):
            assert not c.metadata.get("nbgrader"), f"{a}: an nbgrader cell marked: {c.source[:80]}"
            assert c.source.strip() in texts


@pytest.mark.slow
def test_the_runner_leaves_out_marked_cells_and_says_they_ran_nowhere():
    """Unsandboxed runner: a marked cell gets one line saying it was left out (never the
    outputs it was handed in with) and the sandbox's hash (so nbgrader does not call it
    NotExecuted); run_demos runs it."""
    from tfsgrade.merge import RanInSandbox
    from tfsgrade.sandbox_runner import LEFT_OUT
    from tfsgrade.sandbox import execute_task
    from tfsgrade.settings import Limits
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [code("x = 1"), code("print('demo', x)"), code("print(x + 1)")]
    nb.cells[1].metadata[demos.MARK] = True
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="forged\n")]
    for run_demos, shown in ((False, [LEFT_OUT]), (True, ["demo 1\n"])):
        r = execute_task({"student": "s", "assignment": "t", "notebook": nbformat.writes(copy.deepcopy(nb)).encode(),
                          "limits": asdict(Limits(cell_timeout=30, notebook_timeout=120)),
                          "sandbox": False, "run_demos": run_demos})
        out = nbformat.reads(r["notebook"], as_version=4)
        assert r["demos_left_out"] == (0 if run_demos else 1)
        assert [o["text"] for o in out.cells[1].outputs] == shown
        assert out.cells[2].outputs[0]["text"] == "2\n"
        assert demos.MARK not in out.cells[1].metadata
        cell, _ = RanInSandbox().preprocess_cell(out.cells[1], {}, 1)
        assert [o.get("ename") for o in cell.outputs] == [None] * len(shown)


def test_run_demos_for_everyone_or_some(tmp_path):
    from tfsgrade.settings import Settings
    assert not Settings.build(tmp_path).runs_demos("ann")
    assert Settings.build(tmp_path, run_demos=True).runs_demos("ann")
    some = Settings.build(tmp_path, run_demos=["ann"])
    assert some.runs_demos("ann") and not some.runs_demos("bob")
