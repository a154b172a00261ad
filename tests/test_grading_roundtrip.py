"""The grading command end to end on every notebook: the solution earns every point, the
untouched student notebook earns 0, and its grading completes (nbgrader's real apps and
gradebook)."""
import pytest

from nbtools import NOTEBOOKS, assignments, points, solution_sources, student_notebook, write
from tfsgrade.grade import grade


@pytest.fixture(scope="session")
def roundtrip(tmp_path_factory):
    base = tmp_path_factory.mktemp("roundtrip")
    subs = base / "subs"
    for a in assignments():
        write(student_notebook(a, solution_sources(a)), subs / "solution" / f"{a}.ipynb")
        (subs / "untouched").mkdir(parents=True, exist_ok=True)
        (subs / "untouched" / f"{a}.ipynb").write_bytes((NOTEBOOKS / f"{a}.ipynb").read_bytes())
    out = base / "out"
    items = grade(subs, out, names=assignments(), log=lambda *a: None)
    return out, items


@pytest.mark.parametrize("assignment", assignments())
def test_roundtrip_solution_full_untouched_zero(roundtrip, assignment):
    out, items = roundtrip
    by = {(it.student, it.assignment): it for it in items}
    sol, stu = by[("solution", assignment)], by[("untouched", assignment)]
    total = sum(points(assignment).values())
    assert sol.status == "graded" and stu.status == "graded", (sol.reasons, stu.reasons)
    assert sol.max_score == pytest.approx(total)
    assert sol.score == pytest.approx(total), f"solution scored {sol.score}/{total}: {sol.reasons}"
    assert stu.score == 0, f"untouched student notebook scored {stu.score}"
    assert not [r for r in sol.reasons if "exited" in r], sol.reasons
    for s in ("solution", "untouched"):
        assert (out / "feedback" / s / f"{assignment}.html").stat().st_size > 1000


@pytest.mark.parametrize("assignment", assignments())
def test_untouched_notebook_errors_are_only_the_stubs(roundtrip, assignment):
    """Run untouched (as autograde does), the only errors are NotImplementedError: a demo cell
    that crashes because an exercise is not done yet would bury the student in tracebacks."""
    import nbformat
    out, _ = roundtrip
    nb = nbformat.read(out / "course" / "autograded" / "untouched" / assignment / f"{assignment}.ipynb",
                       as_version=4)
    bad = [(i, o.ename, o.evalue[:120]) for i, c in enumerate(nb.cells) if c.cell_type == "code"
           for o in c.get("outputs", []) if o.output_type == "error" and o.ename != "NotImplementedError"]
    assert not bad, f"{assignment}: errors other than the stubs' NotImplementedError: {bad}"
