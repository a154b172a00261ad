"""Each grading stage alone, on fixtures: settings, intake, normalise (metadata repairs),
RanInSandbox (only sandbox-executed outputs count), the runner's crash isolation."""
import copy

import nbformat
import pytest

from nbtools import A01, points, solution_sources, student_notebook
from tfsgrade import intake, merge, normalise
from tfsgrade.settings import Settings


def test_settings_built_once(tmp_path):
    s = Settings.build(tmp_path / "o", timeout=7, mem_gb=2)
    assert s.db_url == f"sqlite:///{tmp_path / 'o' / 'course' / 'gradebook.db'}"
    assert s.course == tmp_path / "o" / "course" and s.tasks == tmp_path / "o" / "tasks"
    assert s.limits.cell_timeout == 7 and s.limits.mem_gb == 2 and s.sandbox
    assert Settings.build(tmp_path, db_url="postgresql+psycopg://x/y").db_url == "postgresql+psycopg://x/y"
    assert s.fingerprint() != Settings.build(tmp_path / "o", timeout=8).fingerprint()


def test_intake_flags_and_finds(tmp_path):
    (tmp_path / "ann").mkdir()
    nbformat.write(student_notebook(A01), tmp_path / "ann" / f"{A01} (2).ipynb")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / f"{A01}.ipynb").write_text("{not json")
    (tmp_path / "b d").mkdir()
    items = {it.student: it for it in intake.collect(tmp_path, [A01])}
    assert items["ann"].status == "pending" and "renamed" in items["ann"].reasons[0]
    assert items["bob"].status == "flagged" and "malformed" in items["bob"].reasons[0]
    assert items["b d"].status == "flagged" and "not a usable id" in items["b d"].reasons[0]


@pytest.fixture(scope="module")
def tmpl(tmp_path_factory):
    s = Settings.build(tmp_path_factory.mktemp("course"), names=[A01])
    merge.fresh_course(s)
    return normalise.template(s.course, A01, s.db_url)


def _graded(nb):
    return [(c.metadata.nbgrader["grade_id"], c.metadata.nbgrader.get("points"), c.source)
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")]


def _norm(nb, tmpl):
    raw, notes = normalise.normalise(nbformat.writes(nb).encode(), tmpl)
    return nbformat.reads(raw.decode(), as_version=4), notes


def test_normalise_untouched_is_quiet(tmpl):
    out, notes = _norm(student_notebook(A01), tmpl)
    assert notes == []
    assert out.metadata.kernelspec == tmpl.metadata.kernelspec
    want = [g for g in _graded(tmpl)]
    assert _graded(out) == want


def test_normalise_repairs_every_kind_of_test_cell_damage(tmpl):
    nb = student_notebook(A01, solution_sources(A01))
    by = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    by["test_softmax_rows"].source = "pass  # edited"                         # edited
    nb.cells.remove(by["test_softmax_dim"])                                     # deleted
    nb.cells.append(copy.deepcopy(by["test_softmax_stable"]))                   # duplicated
    nb.cells.remove(by["test_softmax_gradient"])                                # moved
    nb.cells.insert(2, by["test_softmax_gradient"])
    by["test_softmax_random"].cell_type = "markdown"                            # retyped
    by["test_softmax_random"].pop("outputs", None)
    by["test_softmax_random"].pop("execution_count", None)
    by["test_scaled_dot_product_attention_shapes"].metadata.nbgrader["points"] = 100   # points
    by["test_scaled_dot_product_attention_weights"].metadata.nbgrader["grade_id"] = "mine"  # re-pointed
    nb.metadata.kernelspec = {"name": "julia", "display_name": "Julia", "language": "julia"}
    out, notes = _norm(nb, tmpl)
    text = " | ".join(notes)
    for word in ("edited", "deleted", "duplicated", "moved", "type", "unknown grade id"):
        assert word in text, (word, notes)
    assert "test_softmax_rows" in text and "test_softmax_dim" in text
    assert out.metadata.kernelspec.name == tmpl.metadata.kernelspec.name
    # every graded cell is the source's: text, points, grade id, order; answers are the student's
    sols = solution_sources(A01)
    for (g, p, src), (tg, tp, tsrc) in zip(_graded(out), _graded(tmpl)):
        assert (g, p) == (tg, tp)
        assert src == (sols[g] if g in sols else tsrc), g
    assert len(_graded(out)) == len(_graded(tmpl))
    assert sum(p for g, p, _ in _graded(out) if g.startswith("test_")) == sum(points(A01).values())


def test_normalise_upgrades_nbformat3(tmpl):
    nb3 = nbformat.convert(student_notebook(A01, solution_sources(A01)), 3)
    out, notes = _norm(nb3, tmpl)
    assert any("nbformat 3" in n for n in notes)
    assert out.nbformat == 4 and len(_graded(out)) == len(_graded(tmpl))


def test_ran_in_sandbox_rejects_outputs_not_from_the_sandbox():
    import hashlib
    pre = merge.RanInSandbox()
    ok = nbformat.v4.new_code_cell("print(1)", outputs=[])
    ok.metadata["tfsgrade"] = {"ran": hashlib.sha256(b"print(1)").hexdigest()[:16]}
    forged = nbformat.v4.new_code_cell("assert False", outputs=[])
    forged.metadata["tfsgrade"] = {"ran": hashlib.sha256(b"print(1)").hexdigest()[:16]}
    assert pre.preprocess_cell(ok, {}, 0)[0].outputs == []
    assert pre.preprocess_cell(forged, {}, 0)[0].outputs[0]["ename"] == "NotExecuted"
    assert pre.preprocess_cell(nbformat.v4.new_code_cell("x"), {}, 0)[0].outputs[0]["ename"] == "NotExecuted"


@pytest.mark.slow
def test_runner_isolates_a_kernel_death_unsandboxed():
    """The runner alone (no bwrap, so it runs anywhere): os._exit in one cell costs that
    cell; the kernel is restarted, earlier cells replayed, later cells run."""
    from dataclasses import asdict
    from tfsgrade.sandbox import execute_task
    from tfsgrade.settings import Limits
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("x = 41"), nbformat.v4.new_code_cell("import os; os._exit(3)"),
                nbformat.v4.new_code_cell("print(x + 1)")]
    r = execute_task({"student": "s", "assignment": "t", "notebook": nbformat.writes(nb).encode(),
                      "limits": asdict(Limits(cell_timeout=30, notebook_timeout=120)), "sandbox": False})
    out = nbformat.reads(r["notebook"], as_version=4)
    assert r["events"] == [{"cell": 1, "kind": "died"}]
    assert out.cells[1].outputs[-1]["ename"] == "KernelDied"
    assert out.cells[2].outputs[0]["text"] == "42\n"


def test_no_bubblewrap_refuses_and_names_the_ways_out(tmp_path, monkeypatch):
    from tfsgrade import sandbox
    from tfsgrade.grade import grade
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable) as e:
        sandbox.check()
    for way in ("--no-sandbox", "--scheduler", "apt-get install bubblewrap"):
        assert way in str(e.value)
    (tmp_path / "s" / "x").mkdir(parents=True)
    with pytest.raises(SystemExit, match="cannot grade in a sandbox"):
        grade(tmp_path / "s", tmp_path / "o", names=[A01], log=lambda *a: None)


@pytest.mark.sandbox
@pytest.mark.slow
def test_watchdog_caps_children_together_without_a_cgroup(monkeypatch):
    """Where no cgroup can be had, children that together pass the cap are killed (largest
    first) while the notebook goes on."""
    from dataclasses import asdict
    from tfsgrade.sandbox import execute_task
    from tfsgrade.settings import Limits
    monkeypatch.setenv("TFS_NO_CGROUP", "1")
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    hog = ("import subprocess, sys\nps = [subprocess.Popen([sys.executable, '-c', "
           "'b = bytearray(400 * 2**20); import time; time.sleep(8)']) for _ in range(4)]\n"
           "print(sorted(p.wait() for p in ps))")
    nb.cells = [nbformat.v4.new_code_cell("x = 41"), nbformat.v4.new_code_cell(hog),
                nbformat.v4.new_code_cell("print(x + 1)")]
    r = execute_task({"student": "s", "assignment": "t", "notebook": nbformat.writes(nb).encode(),
                      "limits": asdict(Limits(cell_timeout=60, notebook_timeout=120, mem_gb=1.0)),
                      "sandbox": True})
    assert r["sandbox"]["memory_cap"] == "rlimit+watchdog"
    out = nbformat.reads(r["notebook"], as_version=4)
    waits = out.cells[1].outputs[0]["text"]
    assert "-9" in waits, waits          # some children were killed ...
    assert out.cells[2].outputs[0]["text"] == "42\n"   # ... and the notebook went on


def test_the_check_runs_the_cells_above_the_exercises_first_test_cell():
    """runner.check_place / Run.cells_for: the check of an exercise runs the code cells above
    its first graded test cell that the kernel ran to their end: not the test cells, not a
    demonstration left out, not a cell that looped or killed the kernel."""
    import nbformat
    from tfsgrade import sandbox_runner as runner
    nb = nbformat.v4.new_notebook()
    sol = nbformat.v4.new_code_cell("def softmax(x, dim=-1): ...")
    sol.metadata["nbgrader"] = {"grade_id": "softmax", "solution": True}
    test = nbformat.v4.new_code_cell("chk.check_softmax_rows(softmax)")
    test.metadata["nbgrader"] = {"grade_id": "test_softmax_rows", "grade": True}
    helper = nbformat.v4.new_code_cell("def _helper(): ...")
    nb.cells = [nbformat.v4.new_code_cell("import torch"), nbformat.v4.new_markdown_cell("text"),
                sol, helper, nbformat.v4.new_code_cell("while True: pass"), test,
                nbformat.v4.new_code_cell("later = 1")]
    p = {"exercise": "softmax", "cells": ["test_softmax_rows"]}
    assert runner.check_place(nb, p) == 5
    assert runner.check_place(nb, dict(p, cells=[])) == 3          # no test cell: after the solution
    run = runner.Run.__new__(runner.Run)
    run.cells, run.done, run.broken, run.demo = nb.cells, [0, 2, 3, 4, 5, 6], {4}, {3}
    assert run.cells_for(5) == [0, 2]


def test_verdict_of_a_probe_that_never_came_back_is_a_failure_with_the_reason():
    from tfsgrade import verdict
    v = verdict.judge_item("01_attention", 5, {"softmax": {"docs": [], "error": "CellTimeoutError: "}})
    softmax_cells = [g for g in v if g.startswith("test_softmax")]
    assert softmax_cells and all(not v[g].passed and "could not run" in v[g].message for g in softmax_cells)
    # the other exercise's check sent nothing back at all: failed too, never passed
    assert all(not v[g].passed for g in v)


@pytest.mark.nbgrader
@pytest.mark.slow
def test_generated_course_is_reused_only_for_the_same_inputs(tmp_path, monkeypatch):
    """course.generate(reuse=True): a second grading course with the same solutions and config
    copies what nbgrader generated (release/ and the fresh gradebook, the same content); other
    solutions, another config or a gradebook elsewhere generate again."""
    import sqlite3

    from tfsgrade import course
    monkeypatch.setenv("TFS_CACHE_DIR", str(tmp_path / "cache"))
    entries = lambda: sorted(p.name for p in (tmp_path / "cache" / "generated").iterdir())  # noqa: E731

    def made(name, **kw):
        kw.setdefault("executed_elsewhere", True)
        root = course.make_course(tmp_path / name, [A01], **kw)
        course.generate(root, [A01], reuse=True)
        return root
    a, b = made("a", timeout=30), made("b", timeout=30)
    assert len(entries()) == 1
    rel = f"release/{A01}/{A01}.ipynb"
    assert (a / rel).read_bytes() == (b / rel).read_bytes()
    dump = lambda r: list(sqlite3.connect(r / "gradebook.db").iterdump())  # noqa: E731
    assert dump(a) == dump(b) and any("test_softmax_rows" in line for line in dump(b))
    made("c", timeout=31)                  # generate_assignment executes nothing: the same entry
    assert len(entries()) == 1
    # the formgrader's course (no grading settings) shares it; other solutions or another
    # course config get another key; a gradebook elsewhere is never copied
    plain = course.make_course(tmp_path / "d", [A01], executed_elsewhere=False)
    assert course._generate_key(plain, [A01]) == course._generate_key(a, [A01])
    nb = plain / "source" / A01 / f"{A01}.ipynb"
    nb.write_text(nb.read_text().replace("softmax", "soft_max", 1))
    assert course._generate_key(plain, [A01]) != course._generate_key(a, [A01])
    cfg = a / "nbgrader_config.py"
    key = course._generate_key(a, [A01])
    cfg.write_text(cfg.read_text() + "c.ClearSolutions.code_stub = {'python': 'pass'}\n")
    assert course._generate_key(a, [A01]) != key
    assert course._own_sqlite(a) and not course._own_sqlite(
        course.make_course(tmp_path / "e", [A01], db_url=f"sqlite:///{tmp_path / 'elsewhere.db'}"))
