"""Cheats graded end to end with `tfs-grade grade`, in one class with honest fixtures: a
certain shortcut scores 0 on the exercise it cheats (and only there), tampering is flagged for
review with cell and line, and the honest students keep their exact scores and notes.
(tests/hostile/scan_cases.py proves the scan itself on 143 cases; this proves the wiring.)"""
import csv

import pytest

from nbtools import A01, exercise_points, points, solution_sources, student_notebook, write

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # cheats beside honest students

ALIAS = """from torch.nn.functional import softmax as _sm

def softmax(x, dim=-1):
    return _sm(x, dim=dim)
"""
REFERENCE = """from tfscratch.reference import scaled_dot_product_attention
"""
PATCH = """def softmax(x, dim=-1):
    return x.exp() / x.exp().sum(dim, keepdim=True)

chk.test_softmax_stable = lambda *a, **k: print("\\u2714 stable")  # tampering with a check
"""

# Wrong code that silences every check of its kernel: only the independent check can see it.
FORGE = """import torch as _t
_t.allclose = lambda *a, **k: True
for _n in dir(chk):
    if _n.startswith("test_"):
        setattr(chk, _n, lambda *a, **k: print("\u2714 passed"))

def softmax(x, dim=-1):
    return x / x.sum(dim=dim, keepdim=True)
"""


def students(subs):
    """The cheats and their honest classmates. They are graded in one run with
    test_grading_manual's students (tests/conftest.py: class01_shared), whose zoe answers a
    free-text question and is otherwise the honest solution."""
    sols = solution_sources(A01)
    write(student_notebook(A01, sols), subs / "ada" / f"{A01}.ipynb")
    write(student_notebook(A01, dict(sols, softmax=ALIAS)), subs / "kim" / f"{A01}.ipynb")
    write(student_notebook(A01, dict(sols, scaled_dot_product_attention=REFERENCE)),
          subs / "max" / f"{A01}.ipynb")
    write(student_notebook(A01, dict(sols, softmax=PATCH)), subs / "leo" / f"{A01}.ipynb")
    write(student_notebook(A01, dict(sols, softmax=FORGE)), subs / "ivy" / f"{A01}.ipynb")
    # honest, and tries the answer on the demonstration's `x` above it (the grading fast path
    # must run that demonstration: a NameError here would be a grade lost to an accident)
    write(student_notebook(A01, dict(sols, softmax=sols["softmax"] + TRY_IT)), subs / "ola" / f"{A01}.ipynb")


TRY_IT = """

print(softmax(x))  # the large scores of the example above: no nan any more
"""


@pytest.fixture(scope="module")
def graded(class01_shared):
    out = class01_shared["out"]
    with (out / "grades.csv").open() as f:
        return out, {r["student_id"]: r for r in csv.DictReader(f)}


def _part(exercise):
    return exercise_points(A01, exercise)


def test_honest_students_keep_full_marks_and_no_flags(graded):
    _, rows = graded
    full = sum(points(A01).values())
    for sid in ("ada", "zoe", "ola"):
        assert float(rows[sid][A01]) == full, rows[sid]
        assert rows[sid]["flags"] == "" and "scan" not in rows[sid]["notes"], rows[sid]


def test_an_answer_that_reads_a_demonstration_keeps_it_running(graded):
    """ola's softmax cell prints softmax(x), x being the demonstration's tensor above it:
    that demonstration ran (its own print is there), the answer cell shows no error, and the
    demonstrations nothing reads were left out."""
    import nbformat

    from tfsgrade.sandbox_runner import LEFT_OUT
    out, _ = graded
    nb = nbformat.read(out / "course" / "autograded" / "ola" / A01 / f"{A01}.ipynb", as_version=4)
    text = lambda c: "".join(o.get("text", "") for o in c.outputs)  # noqa: E731
    demo = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("x = torch.tensor([1000.0"))
    assert "naive softmax of [1000, 1001, 1002]" in text(demo), demo.outputs
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    assert not [o for o in answer.outputs if o.output_type == "error"] and "nan" not in text(answer)
    assert "tensor([0.0900, 0.2447, 0.6652])" in text(answer), answer.outputs
    assert any(text(c) == LEFT_OUT for c in nb.cells if c.cell_type == "code")


def test_certain_shortcut_scores_zero_on_its_exercise_only(graded):
    _, rows = graded
    full = sum(points(A01).values())
    assert float(rows["kim"][A01]) == full - _part("softmax"), rows["kim"]
    assert "0 points, softmax" in rows["kim"]["flags"], rows["kim"]
    assert float(rows["max"][A01]) == full - _part("scaled_dot_product_attention"), rows["max"]
    assert "0 points, scaled_dot_product_attention" in rows["max"]["flags"], rows["max"]


def test_tampering_is_flagged_for_review_with_cell_and_line(graded):
    out, rows = graded
    assert "flagged for review" in rows["leo"]["flags"] and "line" in rows["leo"]["flags"]
    report = (out / "report.md").read_text()
    assert "## For review" in report and "leo" in report.split("## For review")[1]


def test_the_independent_check_decides_what_a_tampered_kernel_passed(graded):
    """leo patched the stability check of an unstable softmax; ivy silenced every check and
    torch.allclose around a softmax that is not one (which her attention uses). Their kernels
    pass those cells; the
    coordinator's verdict (probes run in the sandbox, judged outside) is what counts, and
    the disagreement is flagged with the cell's name."""
    out, rows = graded
    pts = points(A01)
    full = sum(pts.values())
    assert float(rows["leo"][A01]) == full - pts["test_softmax_stable"] - pts["test_softmax_random"], rows["leo"]
    assert "results differ between the notebook and the independent check" in rows["leo"]["flags"]
    assert "test_softmax_stable" in rows["leo"]["flags"]
    # ivy's attention calls her softmax, so it is wrong too: every cell that promises values
    # fails the check; the cells that promise shapes and batch axes (right in her code) pass
    kept = pts["test_scaled_dot_product_attention_shapes"] + pts["test_scaled_dot_product_attention_batch_axes"]
    assert float(rows["ivy"][A01]) == kept, rows["ivy"]
    assert "results differ" in rows["ivy"]["flags"] and "test_softmax_rows" in rows["ivy"]["flags"]
    page = (out / "feedback" / "ivy" / f"{A01}.html").read_text()
    assert "graded by the independent check: failed" in page
