"""Issue 26, class 7, through a real grading run (the trust class, tests/conftest.py:
class_trust): nothing `xss_answer` wrote (tests/hostile/trust_html.py) runs in the
instructor's browser, anywhere the grader or nbgrader wrote HTML, and the formgrader's page
of its autograded notebook (rendered here with the formgrader's own exporter, template and the
course's nbgrader_config.py) holds exactly the active elements of an honest student's page.
The student keeps every autograded point its code earns, and its free-text answer still waits
for the instructor, readable."""
from __future__ import annotations

import collections

import nbformat
import pytest

from hostile import trust_html as T
from nbtools import points
from tfsgrade import sanitise

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # the trust class

A = T.A01


@pytest.fixture(scope="module")
def run(class_trust):
    return class_trust[A]


def formgrader_page(course, student) -> str:
    """The page the formgrader serves for this submission (SubmissionHandler.get): nbconvert's
    HTMLExporter configured by the course's nbgrader_config.py plus the formgrader extension's
    own settings (the `formgrade` template), on the autograded notebook."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.api import Gradebook
    from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension
    from traitlets.config.loader import PyFileConfigLoader
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    cfg.merge(FormgradeExtension().build_extra_config())
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        sub = gb.find_submission_notebook(A, A, student)
        resources = dict(assignment_id=A, notebook_id=A, submission_id=sub.id, index=0, total=3,
                         base_url="", student=student, last_name=sub.student.last_name,
                         first_name=sub.student.first_name,
                         notebook_path=f"/autograded/{student}/{A}/{A}.ipynb")
    path = course / "autograded" / student / A / f"{A}.ipynb"
    html, _ = HTMLExporter(config=cfg).from_filename(str(path), resources=resources)
    return html


def kinds(found):
    return collections.Counter(k for k, _ in found)


def test_the_student_keeps_every_autograded_point(run):
    """Its code is the course's solution: every test cell scores what the honest fixture's
    does (full marks; tests/test_trust_honest.py holds the honest fixture to them)."""
    from nbgrader.api import Gradebook
    row, honest = run["rows"][T.STUDENT], run["rows"]["honest"]
    assert row["status"] == "graded", row
    assert float(row[A]) == float(honest[A]), (row[A], honest[A])
    with Gradebook(f"sqlite:///{run['out'] / 'course' / 'gradebook.db'}") as gb:
        for gid in points(A):
            assert gb.find_grade(gid, A, A, T.STUDENT).score == gb.find_grade(gid, A, A, "honest").score, gid
    assert "shown safely" in row["notes"] and T.answer_cell_id() in row["notes"]


def test_formgrader_page_runs_nothing(run):
    course = run["out"] / "course"
    honest = T.active(formgrader_page(course, "honest"))
    page = formgrader_page(course, T.STUDENT)
    found = T.active(page)
    assert T.marked(found) == [], T.marked(found)
    assert kinds(found) == kinds(honest)      # the formgrader's own scripts, buttons, inputs
    assert T.ids(page)[T.answer_cell_id()] == 1   # its score input is found, not a heading
    for bit in ("$a&lt;b$", "$x_i - \\max_j x_j \\le 0$", "multiplies top and bottom", "0.27",
                "&lt;script&gt;alert('tfsxss')&lt;/script&gt;"):
        assert bit in page, bit               # the answer, readable, payloads as text


def test_notebooks_in_the_course_directory_are_inert(run):
    course = run["out"] / "course"
    ids = sanitise._reserved_ids([T.answer_cell_id()])
    for stage in ("submitted", "autograded"):
        nb = nbformat.read(course / stage / T.STUDENT / A / f"{A}.ipynb", as_version=4)
        assert "title" not in nb.metadata and "widgets" not in nb.metadata, stage
        for c in nb.cells:
            if c.cell_type == "markdown":
                assert sanitise.markdown_problem(c.source, c.get("attachments"), ids) is None, c.source[:200]
                assert all(set(b) <= {"image/png", "image/jpeg", "image/gif"}
                           for b in (c.get("attachments") or {}).values())
            for o in c.get("outputs", []):
                assert set(o.get("data", {})) <= {"text/plain", "text/html", "text/markdown",
                                                   "text/latex", "image/png", "image/jpeg",
                                                   "image/gif"}, (stage, o.get("data", {}).keys())
                if "text/html" in o.get("data", {}):
                    assert T.active(o.data["text/html"], fragment=True) == []


def test_every_html_page_the_grader_wrote_runs_nothing(run):
    out = run["out"]
    pages = sorted(out.rglob("*.html"))
    names = {str(p.relative_to(out)) for p in pages}
    assert {"report.html", "similarity.html", f"feedback/{T.STUDENT}/{A}.html",
            f"course/feedback/{T.STUDENT}/{A}/{A}.html"} <= names, names
    honest_found = T.active((out / "feedback" / "honest" / f"{A}.html").read_text(encoding="utf-8"))
    honest = {f"{A}.html": kinds(honest_found)}
    # MathML (foreign content) on a feedback page is the course's own equations only
    # (tfsgrade.mathml): a student's answer may repeat one (`$c$`), never bring its own
    course_math = {d for k, d in honest_found if k == "foreign"}
    for p in pages:
        found = T.active(p.read_text(encoding="utf-8"))
        assert T.marked(found) == [], (p, T.marked(found))
        if "feedback" in p.parts:   # nbgrader's template: its own head scripts, nothing more
            mine = [d for k, d in found if k == "foreign"]
            assert set(mine) <= course_math, (p, sorted(set(mine) - course_math)[:5])
            assert {k: n for k, n in kinds(found).items() if k != "foreign"} == \
                {k: n for k, n in honest[f"{A}.html"].items() if k != "foreign"}, (p, found)
        else:                       # the grader's own pages: at most their own style sheet
            assert set(kinds(found)) <= {"style"}, (p, found)
    fb = (out / "feedback" / T.STUDENT / f"{A}.html").read_text(encoding="utf-8")
    assert "multiplies top and bottom" in fb and "tfsxss" in fb   # shown, as text


def test_report_quotes_student_text_escaped(run):
    report = (run["out"] / "report.html").read_text(encoding="utf-8")
    assert T.STUDENT in report and "shown safely" in report
    assert "<script>alert" not in report


def test_the_answer_waits_for_review_readable(run):
    from nbgrader.api import Gradebook
    course = run["out"] / "course"
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        g = gb.find_grade(T.answer_cell_id(), A, A, T.STUDENT)
        assert g.needs_manual_grade and g.manual_score is None
    review = (run["out"] / "manual_review.md").read_text(encoding="utf-8")
    mine = review.split(f"## {T.STUDENT}", 1)[1].split("\n## ", 1)[0]
    assert "multiplies top and bottom" in mine and "tfsxss" in mine
    assert f"{A}:{T.answer_cell_id()}" in run["rows"][T.STUDENT]["manual_pending"]
