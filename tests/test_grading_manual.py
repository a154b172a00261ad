"""Free-text answers graded by hand, end to end: grade a submission, find the answer in the
review list, enter a score through nbgrader's API (what the formgrader does), re-export, and
see it in grades.csv."""
import csv

import pytest

from nbtools import A01, manual_points, points, solution_sources, student_notebook, write
from tfsgrade import cli

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # grade, score by hand, export


def _rows(out):
    with (out / "grades.csv").open() as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def students(subs):
    """zoe answers one free-text question (the rest is the solution), yan hands in the
    untouched notebook, xia deleted an answer cell. Graded in one run with
    test_grading_cheats's students (tests/conftest.py: class01_shared)."""
    questions = sorted(manual_points(A01))
    assert len(questions) >= 2
    answered, skipped = questions[0], questions[1]
    text = "Subtracting a constant multiplies top and bottom by the same factor, which cancels."
    fill = dict(solution_sources(A01), **{answered: text})
    write(student_notebook(A01, fill), subs / "zoe" / f"{A01}.ipynb")
    write(student_notebook(A01), subs / "yan" / f"{A01}.ipynb")
    nb = student_notebook(A01, solution_sources(A01))  # xia deleted an answer cell
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != answered]
    write(nb, subs / "xia" / f"{A01}.ipynb")
    return answered, skipped, text


@pytest.fixture(scope="module")
def graded(class01_shared):
    return (class01_shared["out"], *class01_shared["manual"])


def test_answers_wait_for_review(graded):
    out, answered, skipped, text = graded
    auto = sum(points(A01).values())
    rows = _rows(out)
    assert float(rows["zoe"][A01]) == auto  # autograded points only, so far
    assert rows["zoe"]["manual_pending"] == f"{A01}:{answered}"
    assert rows["yan"]["manual_pending"] == ""  # nothing answered: nothing to review
    assert float(rows["zoe"]["max_total"]) == auto + sum(manual_points(A01).values())
    review = (out / "manual_review.md").read_text()
    assert "## zoe" in review and answered in review and text in review
    assert skipped not in review.split("## zoe", 1)[1]  # left unanswered: scored 0, not listed
    assert "yan" not in review
    # a deleted answer cell is put back empty, never with the model answer from the source
    import nbformat
    xia = nbformat.read(out / "course" / "autograded" / "xia" / A01 / f"{A01}.ipynb", as_version=4)
    cell = next(c for c in xia.cells if c.metadata.get("nbgrader", {}).get("grade_id") == answered)
    assert "BEGIN SOLUTION" not in cell.source and "cancels" not in cell.source
    assert float(rows["xia"][A01]) == auto
    assert "formgrader" in review and "tfs-grade export" in review


def test_manual_score_entered_in_gradebook_shows_in_grades_csv(graded):
    out, answered, _, _ = graded
    from nbgrader.api import Gradebook
    auto = sum(points(A01).values())
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gb:
        g = gb.find_grade(answered, A01, A01, "zoe")
        assert g.needs_manual_grade and g.auto_score is None
        g.manual_score = 0.5  # what the formgrader stores when the instructor types 0.5
        g.needs_manual_grade = False
        gb.db.commit()
    assert cli.main(["export", str(out)]) == 0
    rows = _rows(out)
    assert float(rows["zoe"][A01]) == pytest.approx(auto + 0.5)
    assert float(rows["zoe"]["total"]) == pytest.approx(auto + 0.5)
    assert rows["zoe"]["manual_pending"] == ""
    assert float(rows["yan"][A01]) == 0
    assert "0 answer(s) waiting" in (out / "manual_review.md").read_text()
    html = (out / "feedback" / "zoe" / f"{A01}.html").read_text()
    assert f"{auto + 0.5:g}" in html  # the regenerated feedback carries the manual score
