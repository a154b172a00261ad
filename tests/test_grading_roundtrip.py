"""The grading command end to end on every notebook: the solution earns every autograded point,
the untouched student notebook earns 0, and its grading completes (nbgrader's real apps and
gradebook). The free-text answers are graded by hand: left as released they score 0 and wait
for nobody; their points count in the maximum.

The solutions are graded as every class is, on the fast path (their demonstration cells left
out: full marks prove nothing graded needs them); the untouched notebooks run every cell
(`run_demos` for that student), which checks that a student who has done nothing yet sees only
the stubs' grey lines."""
import pytest

from nbtools import (NOTEBOOKS, assignments, manual_points, points, solution_sources,
                     student_notebook, write)
from tfsgrade.grade import grade

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # every notebook through nbgrader


# a catalogued mistake that crashes inside the student's code (max without keepdim)
MISTAKE = ("01_attention", """def softmax(x, dim=-1):
    m = x.max(dim=dim).values
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)""")


@pytest.fixture(scope="session")
def roundtrip(tmp_path_factory):
    base = tmp_path_factory.mktemp("roundtrip")
    subs = base / "subs"
    for a in assignments():
        write(student_notebook(a, solution_sources(a)), subs / "solution" / f"{a}.ipynb")
        (subs / "untouched").mkdir(parents=True, exist_ok=True)
        (subs / "untouched" / f"{a}.ipynb").write_bytes((NOTEBOOKS / f"{a}.ipynb").read_bytes())
    write(student_notebook(MISTAKE[0], {**solution_sources(MISTAKE[0]), "softmax": MISTAKE[1]}),
          subs / "mistake" / f"{MISTAKE[0]}.ipynb")
    out = base / "out"
    items = grade(subs, out, names=assignments(), run_demos=["untouched"], log=lambda *a: None)
    return out, items


@pytest.mark.parametrize("assignment", assignments())
def test_roundtrip_solution_full_untouched_zero(roundtrip, assignment):
    out, items = roundtrip
    by = {(it.student, it.assignment): it for it in items}
    sol, stu = by[("solution", assignment)], by[("untouched", assignment)]
    total = sum(points(assignment).values())  # autograded points
    manual = sum(manual_points(assignment).values())  # free-text answers, graded by hand
    assert manual > 0, f"{assignment} has no free-text questions"
    assert sol.status == "graded" and stu.status == "graded", (sol.reasons, stu.reasons)
    assert sol.max_score == pytest.approx(total + manual)
    # the filled-in exercises earn every autograded point; the answer cells were left as
    # released, which nbgrader scores 0 without asking for a manual grade
    assert sol.score == pytest.approx(total), f"solution scored {sol.score}/{total}: {sol.reasons}"
    assert stu.score == 0, f"untouched student notebook scored {stu.score}"
    assert not [r for r in sol.reasons if "exited" in r], sol.reasons
    for s in ("solution", "untouched"):
        assert (out / "feedback" / s / f"{assignment}.html").stat().st_size > 1000
    import csv
    with (out / "grades.csv").open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert rows["solution"]["manual_pending"] == "", "unanswered questions wait for no review"


@pytest.mark.parametrize("assignment", assignments())
def test_untouched_notebook_errors_are_only_the_stubs(roundtrip, assignment):
    """Run untouched (as autograde does), the only errors are the test cells' one grey line
    "<name>: not implemented yet" (NotDone, a NotImplementedError), with no frame of the course's
    code, and the demonstrations' own: a demo cell calling a stub shows the stub's error, and a
    demo that `pick`s an unfinished exercise stops with the same grey line, since the sandbox holds
    no reference of this notebook to stand in for it (issue 26); the demo cells after it that use
    what it would have made fail (NameError, KeyError), as they would in the student's lab. No traceback through tfscratch, no stderr. The
    progress table ends the notebook and says "not done"; the feedback shows the same lines."""
    import nbformat
    out, _ = roundtrip
    nb = nbformat.read(out / "course" / "autograded" / "untouched" / assignment / f"{assignment}.ipynb",
                       as_version=4)
    errors = [(i, c, o) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.output_type == "error"]
    tests = [e for e in errors if "graded-test" in e[1].metadata.get("tags", [])]
    demos = [e for e in errors if e not in tests]
    stopped = [i for i, c, o in demos if o.ename == "NotDone"]
    bad = [(i, o.ename, o.evalue[:120]) for i, c, o in errors
           if o.ename not in ("NotDone", "NotImplementedError")
           and not (stopped and i > stopped[0] and (i, c, o) in demos)]
    assert not bad, f"{assignment}: errors other than the stubs' not implemented yet: {bad}"
    assert tests, f"{assignment}: no test failed in the untouched notebook"
    for i, c, o in errors:
        if o.ename not in ("NotDone", "NotImplementedError"):
            continue                   # a demo after a stopped one, which made what it reads
        if (i, c, o) in tests:
            assert o.ename == "NotDone", (assignment, i, o.ename, c.source[:80])
        tb = "\n".join(o.traceback)
        assert tb.count("\n") == 0 and tb.endswith("not implemented yet\x1b[0m"), (i, tb)
        assert "tfscratch" not in tb and "Traceback" not in tb, (i, tb)
    stderr = [i for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
              if o.output_type == "stream" and o.name == "stderr"]
    assert not stderr, f"{assignment}: stderr in cells {stderr}"
    last = nb.cells[-1]
    assert last.id == "progress" and not last.metadata.get("nbgrader"), last.metadata
    text = "".join(o.get("data", {}).get("text/plain", "") for o in last.outputs)
    assert "Progress: 0 of" in text and "not done" in text and " passed," in text, text
    assert not [o for o in last.outputs if o.output_type == "error"], last.outputs
    html = (out / "feedback" / "untouched" / f"{assignment}.html").read_text()
    assert "not implemented yet" in html and "tfscratch/checks" not in html


@pytest.mark.parametrize("assignment", assignments())
def test_solution_graded_with_its_demonstrations_left_out(roundtrip, assignment):
    """The fast path: the solution's demonstration cells (the progress table among them) did
    not run and show only the line that says so (no "not executed" error), and it still earned
    every point (test above). The browser's Run All checks the same notebook's progress table."""
    import nbformat
    from tfsgrade import demos
    from tfsgrade.sandbox_runner import LEFT_OUT
    out, items = roundtrip
    by = {(it.student, it.assignment): it for it in items}
    released = nbformat.read(NOTEBOOKS / f"{assignment}.ipynb", as_version=4)
    n_demos = sum(1 for c in released.cells if demos._plain(c))
    assert by[("solution", assignment)].result["demos_left_out"] == n_demos
    assert by[("untouched", assignment)].result["demos_left_out"] == 0
    nb = nbformat.read(out / "course" / "autograded" / "solution" / assignment / f"{assignment}.ipynb",
                       as_version=4)
    plain = [c for c in nb.cells if c.cell_type == "code" and not c.metadata.get("nbgrader")]
    assert len(plain) == n_demos
    assert all([o.get("text") for o in c.outputs] == [LEFT_OUT] for c in plain), plain[0].outputs
    html = (out / "feedback" / "solution" / f"{assignment}.html").read_text()
    assert "not run when grading" in html


def test_feedback_shows_the_same_compact_box(roundtrip):
    """The feedback HTML of a wrong softmax shows the box the notebook shows: the check, the
    mistake's hint and the student's own line, and no frame of the course's code."""
    import html as html_lib
    import re
    out, items = roundtrip
    by = {(it.student, it.assignment): it for it in items}
    it = by[("mistake", MISTAKE[0])]
    assert it.status == "graded" and it.score < it.max_score, (it.score, it.reasons)
    page = (out / "feedback" / "mistake" / f"{MISTAKE[0]}.html").read_text()
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", page))
    assert "\u2718 test_softmax_rows" in text and "without keepdim=True" in text
    assert "your code, Cell In[" in text and "e = torch.exp(x - m)" in text
    assert "tfscratch/" not in text and "Traceback (most recent call last)" not in text
