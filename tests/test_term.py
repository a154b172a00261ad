"""A scripted term (issue 29): release, intake of a Canvas zip with a roster and a late
submission, grading, two answers graded by hand through nbgrader's formgrader API (the server
`tfs-grade formgrader` starts, as root here), a regrade of one student, an export, feedback
released. Every output agrees with the gradebook, no hand grade is lost, the late penalty is
applied and shown everywhere.

The class (Canvas user ids 1001...): ada hands in the solution and two free-text answers; ben
the same, late (Canvas's LATE marker); cleo the solution code only; eve a file that is not a
notebook; dan is on the roster with nothing handed in; zed is not on the roster.
"""
from __future__ import annotations

import copy
import csv
import io
import re
import subprocess
import time
import zipfile

import nbformat
import pytest

import lmstools as lt
from nbtools import A01, manual_points, points, solution_sources
from tfsgrade import bundle, cli, formgrader

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]

ROSTER = lt.CLASS + [("eve", "Eve, Eve", "1005", "S-1005", "eve.e", "Sec B", "205", "eve@uni.example")]
Q1, Q2 = sorted(manual_points(A01))
ANSWERS = {
    "ada": {Q1: "Shifting every logit by one constant scales numerator and denominator alike.",
            Q2: "Dot products grow like sqrt(d_k), which saturates the softmax."},
    "ben": {Q1: "exp(x - c) = exp(x) exp(-c), and exp(-c) cancels in the ratio.",
            Q2: "Without the scale the variance of the scores is d_k."},
}
DUE = "2025-02-28T12:00:00Z"
OVERRIDE = "test_softmax_rows"


def _notebook(released, student: str, answers: dict | None = None) -> bytes:
    nb = copy.deepcopy(released)
    fill = dict(solution_sources(A01), **(answers or {}))
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid in fill:
            c.source = fill[gid]
    return nbformat.writes(nb).encode()


def _zip(path, released, ada_answers) -> str:
    return str(lt.write_zip(path, {
        f"lovelaceada_1001_5001_{A01}.ipynb": _notebook(released, "ada", ada_answers),
        f"okaforben_LATE_1002_5002_{A01}.ipynb": _notebook(released, "ben", ANSWERS["ben"]),
        f"parkcleo_1003_5003_{A01}.ipynb": _notebook(released, "cleo"),
        f"eveeve_1005_5005_{A01}.ipynb": b"{this is not a notebook",
        f"zedzed_1999_5009_{A01}.ipynb": _notebook(released, "zed"),
    }))


def _api(base, token):
    import requests
    h = {"Authorization": f"token {token}"}

    def call(method, path, **kw):
        r = requests.request(method, base + path, headers=h, timeout=30, **kw)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        return r.json()
    return call


def _hand_grade(out):
    """What an instructor does in the formgrader: ada's first answer 0.5 with a comment, ben's
    first answer 1 (through the formgrader's own HTTP API, on the server tfs-grade starts)."""
    import requests
    port, token = 8917, "term-test-token"
    proc, url = formgrader.start(out, port=port, token=token, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    assert url.endswith(f"/formgrader?token={token}")
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                if requests.get(base + "/formgrader/api/status", timeout=2,
                                headers={"Authorization": f"token {token}"}).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        api = _api(base, token)
        subs = {s["student"]: s for s in api("GET", f"/formgrader/api/submitted_notebooks/{A01}/{A01}")}
        for student, score, comment in (("ada", 0.5, "Half: say why the constant cancels."),
                                        ("ben", 1.0, None)):
            grades = api("GET", "/formgrader/api/grades", params={"submission_id": subs[student]["id"]})
            g = next(g for g in grades if g["name"] == Q1)
            assert g["needs_manual_grade"] and g["manual_score"] is None
            api("PUT", f"/formgrader/api/grade/{g['id']}", json={"manual_score": score})
            if comment:
                cs = api("GET", "/formgrader/api/comments", params={"submission_id": subs[student]["id"]})
                c = next(c for c in cs if c["name"] == Q1)
                api("PUT", f"/formgrader/api/comment/{c['id']}", json={"manual_comment": comment})
        # an override of an autograded test cell: cleo's softmax rows, from full marks to 0
        grades = api("GET", "/formgrader/api/grades", params={"submission_id": subs["cleo"]["id"]})
        g = next(g for g in grades if g["name"] == OVERRIDE)
        assert g["auto_score"] == g["max_score"] > 0
        api("PUT", f"/formgrader/api/grade/{g['id']}", json={"manual_score": 0})
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    base = tmp_path_factory.mktemp("term")
    t0 = time.perf_counter()
    bundle.build(base / "bundle", 0)                                  # release
    released = nbformat.read(base / "bundle" / "notebooks" / f"{A01}.ipynb", as_version=4)
    roster = lt.roster(base / "roster.csv", ROSTER)
    out = base / "out"
    first = _zip(base / "week1.zip", released, ANSWERS["ada"])
    assert cli.main(["grade", first, "--out", str(out), "--roster", str(roster), "--timeout", "30",
                     "--due", DUE, "--late-policy", "per-day", "--penalty-per-day", "0.1"]) == 0
    before = _grades(out)
    _hand_grade(out)
    assert cli.main(["export", str(out)]) == 0
    after_hand = _grades(out)
    # ada re-submits with her first answer reworded; the whole class is in the new download
    changed = dict(ANSWERS["ada"], **{Q1: "A constant shift cancels between top and bottom."})
    second = _zip(base / "week2.zip", released, changed)
    assert cli.main(["grade", second, "--out", str(out), "--student", "ada", "--timeout", "30"]) == 0
    assert cli.main(["export", str(out)]) == 0
    assert cli.main(["release-feedback", str(out), "--to", str(base / "released"), "--zip"]) == 0
    print(f"\nscripted term: {time.perf_counter() - t0:.0f} s")
    return {"out": out, "base": base, "before": before, "after_hand": after_hand}


def _pts(gid) -> float:
    return float(points(A01)[gid])


def _grades(out) -> dict:
    with (out / "grades.csv").open() as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def _gradebook(out):
    from nbgrader.api import Gradebook
    return Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}")


def test_hand_grades_survive_the_regrade(term):
    out = term["out"]
    with _gradebook(out) as gb:
        ada, ben = (gb.find_grade(Q1, A01, A01, s) for s in ("ada", "ben"))
        assert ada.manual_score == 0.5 and ben.manual_score == 1.0
        assert ben.needs_manual_grade is False              # the same answer: the grade stands
        assert ada.needs_manual_grade is True               # edited since: back to review
        c = gb.find_comment(Q1, A01, A01, "ada")
        assert c.manual_comment == "Half: say why the constant cancels."
        cleo = gb.find_grade(OVERRIDE, A01, A01, "cleo")        # the override stands
        assert cleo.manual_score == 0 and cleo.auto_score == cleo.max_score
        assert cleo.needs_manual_grade is False                 # her code did not change
        cleo_score = gb.find_submission(A01, "cleo").score
    rows = _grades(out)
    assert float(rows["cleo"][A01]) == cleo_score == float(term["before"]["cleo"][A01]) - _pts(OVERRIDE)
    assert "answer changed since graded by hand: " + Q1 in rows["ada"]["flags"]
    assert "answer changed" not in rows["ben"]["flags"]
    review = (out / "manual_review.md").read_text()
    assert "Answers changed since you graded them" in review and f"ada · {A01} · `{Q1}`" in review


def test_every_output_agrees_with_the_gradebook(term):
    out = term["out"]
    rows = _grades(out)
    with _gradebook(out) as gb:
        want = {}
        for s in ("ada", "ben", "cleo"):
            sub = gb.find_submission(A01, s)
            want[s] = max(0.0, sub.score - sub.late_submission_penalty)
    nbx = {r["student_id"]: r for r in csv.DictReader((out / "nbgrader_export.csv").open())}
    canvas = {r[1]: r for r in csv.reader(io.StringIO((out / "canvas_grades.csv").read_text()))}
    report = (out / "report.md").read_text()
    for s, cid in (("ada", "1001"), ("ben", "1002"), ("cleo", "1003")):
        assert float(rows[s][A01]) == pytest.approx(want[s]), s
        assert float(nbx[s]["score"]) == pytest.approx(want[s]), s
        page = (out / "feedback" / s / f"{A01}.html").read_text()
        head = re.search(r"\(Score: ([0-9.]+) / ([0-9.]+)\)", page)
        assert float(head.group(1)) == pytest.approx(want[s]), s
        assert f"| {s} | {want[s]:g}/" in report, s
        if not rows[s]["waiting"]:                       # graded in full: the LMS gets it
            assert float(canvas[cid][5]) == pytest.approx(want[s]), s
    assert rows["ben"]["waiting"].startswith("waiting for a grader: 1 answer(s)")   # Q2 still waits
    assert float(rows["ben"][A01]) > float(term["before"]["ben"][A01])
    # the hand score is in every output the moment it is exported
    assert float(term["after_hand"]["ben"][A01]) == pytest.approx(want["ben"])


def test_pending_answers_wait_for_a_grader_never_zero(term):
    out = term["out"]
    rows = _grades(out)
    # Q2 waits; Q1 keeps its hand score while it waits for review (flagged, not "waiting")
    assert rows["ada"]["waiting"].startswith("waiting for a grader: 1 answer(s)")
    canvas = {r[1]: r for r in csv.reader(io.StringIO((out / "canvas_grades.csv").read_text()))}
    assert canvas["1001"][5] == ""                         # not sent as a partial score
    page = (out / "feedback" / "ada" / f"{A01}.html").read_text()
    assert "Score: waiting for a grader / 1.0" in page and "waiting for a grader: the score" in page
    assert "+ 1 waiting" in (out / "report.md").read_text()
    assert f"{A01}:{Q2}" in rows["ada"]["manual_pending"]


def test_late_penalty_applied_and_shown(term):
    out = term["out"]
    rows = _grades(out)
    assert rows["ben"]["lms_late"] == "LATE" and float(rows["ben"]["late_penalty"]) > 0
    assert "charged as 1 day late" in rows["ben"]["late"] and rows["ada"]["late"] == ""
    with _gradebook(out) as gb:
        sub = gb.find_submission(A01, "ben")
        assert sub.late_submission_penalty == pytest.approx(0.1 * sub.score)
    nbx = {r["student_id"]: r for r in csv.DictReader((out / "nbgrader_export.csv").open())}
    assert float(nbx["ben"]["late_submission_penalty"]) == pytest.approx(float(rows["ben"]["late_penalty"]))
    assert nbx["ben"]["duedate"].startswith("2025-02-28 12:00")
    assert "Late submission penalty" in (out / "feedback" / "ben" / f"{A01}.html").read_text()
    assert "**ben / 01_attention**: marked LATE" in (out / "report.md").read_text()


def test_everyone_gets_feedback_released(term):
    out, base = term["out"], term["base"]
    eve = (out / "feedback" / "eve" / f"{A01}.html").read_text()
    assert "could not be graded" in eve and "not valid JSON" in eve and "What to hand in" in eve
    zips = {p.stem for p in (base / "released").glob("*.zip")}
    assert {"ada", "ben", "cleo", "eve"} <= zips
    with zipfile.ZipFile(base / "released" / "ben.zip") as z:
        assert z.namelist() == [f"ben/{A01}.html"]
    rows = _grades(out)
    assert rows["dan"]["status"] == "flagged" and "no submission" in rows["dan"]["notes"]
    assert any(k.startswith("unknown-canvas-1999") for k in rows)   # listed, never dropped
