"""A student's first hour in JupyterLab (issue 41), on 01, 11 and 12: the student notebook
with its first exercise written wrong (a catalogued mistake), its second written right and
the rest still stubs, run from the top in a fresh kernel (Run All, as after Restart), then
Validate. What the person sees: one box naming the mistake, a green line for the right one,
one grey "not implemented yet" line per stub, no frame of the course's code anywhere, the
free-text questions in the progress table, Chinese drawn (11), and a Validate dialog that says
what is left. Screenshots: test-artifacts/browser/screenshots/first_hour__*.jpg."""
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from labdriver import NOTEBOOKS, REPO, Nb, strip_ansi
from test_browser_notebooks import CJK_JS

pytestmark = [pytest.mark.browser, pytest.mark.slow]   # JupyterLab in Chromium

FIRST_HOUR = ("01_attention", "11_tokenizer", "12_training")


@dataclass(frozen=True)
class HourNb(Nb):
    @property
    def id(self) -> str:
        return f"first_hour/{self.name}"

    def __str__(self):
        return self.id


def _exercises(name: str) -> list[str]:
    from tfscratch.specs import engine
    return [ex.name for ex in engine.specs_for(name)]


def _plan(name: str):
    """(fill, the wrong exercise, its mistake, the right exercise) for notebook `name`."""
    from catalogue import modules
    from nbtools import solution_sources
    exercises = _exercises(name)
    mod = next(m for m in modules() if m.ASSIGNMENT == name)
    wrong = exercises[0]
    mistake = next(m for m in mod.MISTAKES if m.exercise == wrong)
    right = exercises[1]
    return {wrong: mistake.code.strip(), right: solution_sources(name)[right]}, wrong, mistake, right


HOURS = [HourNb("student", n, Path("first_hour")) for n in FIRST_HOUR
         if any(nb.name == n for nb in NOTEBOOKS)]


@pytest.mark.parametrize("nb", HOURS, ids=[str(n) for n in HOURS])
def test_first_hour(runs, nb):
    from nbtools import student_notebook, write
    fill, wrong, mistake, right = _plan(nb.name)
    write(student_notebook(nb.name, fill), REPO / runs.relpath(nb.id))
    run = runs.get(nb)
    where = run.where()

    def checks_of(ex):
        return [c for c in run.cells if c.is_graded_test and re.search(rf"\(\s*{re.escape(ex)}\s*\)", c.source)]
    # the wrong exercise: one box, which names the mistake
    boxes = [e for c in checks_of(wrong) for e in c.errors]
    assert boxes and all(e.ename == "CheckFailed" for e in boxes), f"{nb}: {[str(e) for e in boxes]} {where}"
    said = "\n".join(strip_ansi(e.traceback) for e in boxes)
    assert re.search(mistake.hint, said, re.I), f"{nb}: the mistake ({mistake.description}) is not named:\n{said}"
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    empty = [i for i, ln in enumerate(lines) if ln == "What differs:"
             and (i + 1 == len(lines) or not lines[i + 1].startswith("-"))]
    assert not empty, f"{nb}: a 'What differs:' with nothing under it:\n{said}"
    # the right exercise: green lines only
    for c in checks_of(right):
        assert not c.errors, f"{nb}: {right} is right, but cell {c.index} shows {c.errors[0]} {where}"
        assert any("\u2714" in (o.get("text") or "") for o in c.outputs), f"{nb}: no green line in cell {c.index}"
    # everything else still a stub: one grey line each, no course frame anywhere
    others = [e for c in run.cells for e in c.errors if c not in checks_of(wrong)]
    stubs_left = len(_exercises(nb.name)) > 2
    assert bool(others) == stubs_left and all(e.ename in ("NotDone", "NotImplementedError") for e in others), \
        f"{nb}: {[str(e) for e in others if e.ename not in ('NotDone', 'NotImplementedError')][:3]} {where}"
    assert all(strip_ansi(e.traceback).strip().endswith("not implemented yet") for e in others)
    frames = [(c.index, o) for c in run.cells for o in c.outputs
              if "tfscratch/" in (o.get("traceback") or "") + (o.get("text") or "")]
    assert not frames, f"{nb}: outputs show the course's own frames: {frames[:2]} {where}"
    # the progress table counts every point: the free-text questions are in it
    table = run.notebook.cell_text(len(run.cells) - 1)
    assert "graded by hand" in table and re.search(r"\bq_\w+", table), f"{nb}: {table[:800]}"
    assert "failed" in table and "passed" in table, table[:800]
    if nb.name == "11_tokenizer":
        drawn = run.notebook.page.evaluate(CJK_JS)
        assert all(d["drawn"] for d in drawn), f"{nb}: CJK glyphs drawn as boxes: {drawn} {where}"
    # Validate: saves, runs the notebook again on the server, and says what fails
    t0 = time.monotonic()
    res = run.notebook.validate()
    run.timings["validate_s"] = round(time.monotonic() - t0, 1)
    assert res.status == "failed", f"{nb}: Validate said {res.title}: {res.text[:1500]}"
    assert "tfscratch/" not in res.text, f"{nb}: Validate shows the course's frames: {res.text[:1500]}"
