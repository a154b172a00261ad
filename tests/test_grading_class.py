"""The grading command on a named fixture class for 01_attention, given as a zip: full
marks, untouched, partial, a catalogued mistake, malformed JSON, missing notebook, infinite
loop, deleted test cell, renamed notebook. Assertions on grades.csv, the feedback, the report
and nbgrader's gradebook."""
import csv

import re

import pytest

from catalogue import run_exercise
from nbtools import A01, make_fixture_class, manual_points, points, student_notebook
from tfsgrade.grade import grade

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # nbgrader autograde on a fixture class


def _rows(out):
    with (out / "grades.csv").open() as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def _expected_score(fill, out, student):
    """What the independent check, run in-process with the seed of this student's task, says
    these exercise cells earn (cross-checks the sandboxed run and the gradebook). Exercises
    missing from `fill` keep the student stub."""
    from catalogue import cells
    from tfscratch.specs import engine
    pts = points(A01)
    stub_nb = student_notebook(A01)
    stubs = {c.metadata.nbgrader["grade_id"]: c.source for c in stub_nb.cells
             if c.metadata.get("nbgrader", {}).get("solution")}
    fills = {**stubs, **fill}
    import json
    seed = json.loads((out / "tasks" / student / f"{A01}.json").read_text())["seed"]
    ns = {"__name__": "__main__"}
    for kind, gid, src in cells(A01):
        if kind in ("setup", "solution"):
            exec(compile(fills.get(gid, src) if kind == "solution" else src, gid, "exec"), ns)
    return sum(pts[g] for ex in engine.specs_for(A01)
               for g, v in engine.judge(ex, seed, engine.student_run(ex, seed, ns)).items()
               if v.passed)


@pytest.fixture(scope="session")
def fixture_class(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    zpath, fills = make_fixture_class(base)
    out = base / "out"
    items = grade(zpath, out, names=[A01], timeout=10, log=lambda *a: None)  # gus loops: 10 s a cell
    return out, items, fills


def test_fixture_class_scores(fixture_class):
    out, items, fills = fixture_class
    rows = _rows(out)
    total = sum(points(A01).values())
    assert set(rows) == {"ada", "ben", "cleo", "dan", "eve", "fay", "gus", "hal", "ivy"}
    assert float(rows["ada"][A01]) == total
    assert float(rows["ben"][A01]) == 0
    assert float(rows["cleo"][A01]) == pytest.approx(_expected_score(fills["partial"], out, "cleo"))
    assert 0 < float(rows["cleo"][A01]) < total
    assert float(rows["dan"][A01]) == pytest.approx(_expected_score(fills["mistake"], out, "dan"))
    assert 0 < float(rows["dan"][A01]) < total
    assert float(rows["ivy"][A01]) == total  # renamed, still graded
    # a deleted test cell is restored from the source by nbgrader and graded
    assert float(rows["hal"][A01]) == total
    assert "deleted" in rows["hal"]["notes"] and "test_softmax_stable" in rows["hal"]["notes"]
    # the infinite loop is interrupted; the rest of the notebook is graded
    gus = float(rows["gus"][A01])
    assert 0 < gus < total, gus
    # once the loop has run past the limit, the exercise's other checks are not run again, and
    # the notes say so once: which function, within how many seconds, how many cells it cost
    notes = rows["gus"]["notes"]
    assert notes.count("did not return within 10 s") == 1, notes
    assert "scaled_dot_product_attention did not return within 10 s" in notes, notes
    assert re.search(r"its \d test cells score 0", notes), notes
    assert "KeyboardInterrupt" not in notes and ": :" not in notes, notes


def test_fixture_class_flags_broken_submissions(fixture_class):
    out, items, _ = fixture_class
    rows = _rows(out)
    assert rows["eve"]["status"] == "flagged" and "malformed" in rows["eve"]["notes"]
    assert rows["eve"][A01] == ""
    assert rows["fay"]["status"] == "flagged" and "missing notebook" in rows["fay"]["notes"]
    assert "notes.txt" in rows["fay"]["notes"]
    assert "renamed" in rows["ivy"]["notes"]
    for s in ("ada", "ben", "cleo", "dan", "gus", "hal", "ivy"):
        assert rows[s]["status"] == "graded", (s, rows[s]["notes"])


def test_fixture_class_feedback_and_report(fixture_class):
    out, items, _ = fixture_class
    for s in ("ada", "ben", "cleo", "dan", "gus", "hal", "ivy"):
        fb = out / "feedback" / s / f"{A01}.html"
        assert fb.exists() and fb.stat().st_size > 1000, s
    # equations drawn offline (MathML), no raw LaTeX left in the visible text; long lines wrap
    page = (out / "feedback" / "gus" / f"{A01}.html").read_text()
    text = re.sub(r"<(pre|code|script|style)\b.*?</\1>|<[^>]+>", " ", page, flags=re.S)
    assert "<math" in page and "$\\" not in text, re.findall(r".{40}\$\\.{40}", text)[:3]
    assert "white-space: pre-wrap" in page
    # the loop said once, in plain words, where its verdict is
    assert "did not return within 10 s" in page and "your code raised not run" not in page
    eve = (out / "feedback" / "eve" / f"{A01}.html").read_text()   # not graded: why, and what to hand in
    assert "could not be graded" in eve and "malformed" in eve and "What to hand in" in eve
    report = (out / "report.md").read_text()
    assert "test_softmax_rows" in report and "pass rate" in report.lower()
    assert "eve" in report and "malformed" in report
    assert "Demonstration cells: unchanged ones that nothing graded reads were left out" in report
    by = {it.student: it for it in items}
    assert by["ada"].result["demos_left_out"] > 0, "the grading fast path is off"
    assert (out / "score_histogram.png").read_bytes()[:4] == b"\x89PNG"
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html
    # a styled page: its own style sheet, tables with a header row, no model answer's markers
    assert "<style>" in html and "<th>student</th>" in html, html[:600]
    assert "BEGIN SOLUTION" not in html and "END SOLUTION" not in html
    assert (out / "nbgrader_export.csv").exists()


def test_fixture_class_gradebook(fixture_class):
    out, items, _ = fixture_class
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gb:
        students = {s.id for s in gb.students}
        assert {"ada", "ben", "dan"} <= students
        assert "eve" not in students  # never imported, so never half-graded
        sub = gb.find_submission(A01, "ada")
        assert sub.score == sum(points(A01).values())  # every autograded point
        assert sub.max_score == sum(points(A01).values()) + sum(manual_points(A01).values())
        g = gb.find_grade("test_softmax_rows", A01, A01, "ben")
        assert g.score == 0


def _first_diagnosis(fill, exercise):
    """The first line of the first failing test's message, from the in-process runner."""
    stub_nb = student_notebook(A01)
    stubs = {c.metadata.nbgrader["grade_id"]: c.source for c in stub_nb.cells
             if c.metadata.get("nbgrader", {}).get("solution")}
    res = run_exercise(A01, exercise, fills={**stubs, **fill})
    first = next(r for r in res if not r.passed)
    kind, _, text = first.message.partition(": ")
    if kind in ("NotImplementedError", "NotDone"):  # a stub (NotDone: how the checks say it)
        return "not attempted (the exercise still raises NotImplementedError)"
    # the kernel names the exercise first; the feedback shows the grade's verdict, which does not
    return text.splitlines()[0].strip().removeprefix(f"{exercise}: ")


def test_fixture_class_report_lists_diagnoses(fixture_class):
    """What the class got wrong: per exercise, the first diagnosis each student saw, counted
    over the 7 graded submissions (ben untouched; cleo without attention; dan without the
    sqrt(d_k); gus looping in attention; the rest right)."""
    from tfsgrade.report import class_diagnoses
    out, items, fills = fixture_class
    diag = class_diagnoses(out / "course", items, [A01])[A01]
    n_sm, softmax = diag["softmax"]
    n_at, attention = diag["scaled_dot_product_attention"]
    assert n_sm == n_at == 7
    not_done = "not attempted (the exercise still raises NotImplementedError)"
    assert softmax == {not_done: 1}  # ben only
    dan = _first_diagnosis(fills["mistake"], "scaled_dot_product_attention")
    assert "sqrt(d_k)" in dan, dan
    assert attention[not_done] == 2  # ben and cleo
    assert attention[dan] == 1
    assert sum(attention.values()) == 4, attention  # + gus, whose loop was interrupted
    assert _first_diagnosis(fills["partial"], "scaled_dot_product_attention") == not_done
    report = (out / "report.md").read_text()
    assert "## What the class got wrong" in report
    assert f"- 2 of 7: {not_done}" in report and f"- 1 of 7: {dan}" in report
    assert "**scaled_dot_product_attention**: 4 of 7 failed" in report
    assert "What the class got wrong" in (out / "report.html").read_text()


def test_grade_rejects_unknown_assignment(tmp_path):
    (tmp_path / "s" / "x").mkdir(parents=True)
    with pytest.raises(SystemExit, match="unknown assignment"):
        grade(tmp_path / "s", tmp_path / "o", names=["99_nope"], log=lambda *a: None)
