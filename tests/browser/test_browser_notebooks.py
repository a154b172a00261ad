"""Every solution notebook and the first student notebook, opened in JupyterLab in a real
browser and run as a student runs it (Run > Run All Cells, then on past each error). The
notebooks come from the course manifest, so a new notebook is covered on arrival; the other
untouched student notebooks are checked headless by the grading round trip
(TFS_BROWSER_ALL_STUDENT=1 opens them here too)."""
import os
import shutil
import time
from pathlib import Path

import pytest

from labdriver import DOCS_IMG, NOTEBOOKS, REPO, SHOTS, image_is_blank, shot_is_blank, strip_ansi

pytestmark = [pytest.mark.browser, pytest.mark.slow]   # JupyterLab in Chromium

IDS = [str(n) for n in NOTEBOOKS]
DRAWS = ("plots.", "explore(", "plt.", "fig.", ".plot(", "imshow(")  # a cell that draws

# COURSE_SPEC sections 3 and 7: these notebooks promise heatmaps (attention, per-head,
# positional encoding, cross-attention); their solution must draw at least one.
HEATMAP_NOTEBOOKS = ("01_attention", "03_multihead", "05_positional_encoding", "07_transformer")

# README screenshots: notebook -> (file in docs/img, which cell, whole cell or its outputs). Written to
# test-artifacts/browser/screenshots/docs/ on every run; copied into docs/img when
# TFS_UPDATE_DOCS_IMG=1.
README_SHOTS = {
    "01_attention": ("attention_heatmap.png", "heatmap", "cell"),
    "05_positional_encoding": ("pe_heatmap_explorer.png", "explorer", "output"),
}


def _lines(items) -> str:
    return "\n  " + "\n  ".join(str(x) for x in items)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_run_all_shows_only_expected_errors(runs, nb):
    run = runs.get(nb)
    assert run.shots, f"{nb}: no screenshot {run.where()}"
    blank = [b for b in map(shot_is_blank, run.shots) if b]
    assert not blank, f"{nb}: screenshot parts show an empty notebook: {blank}"
    errors = [e for c in run.cells for e in c.errors]
    if nb.kind == "solution":
        assert not errors, (f"{nb}: after Run All, JupyterLab shows {len(errors)} error output(s):"
                            f"{_lines(errors)}\n{run.where()}")
        # what a student who finished sees: every test cell silent on stderr (nbgrader scores
        # a test cell with stderr 0), every drawing cell a figure, the progress table all green
        noisy = [(c.index, o["text"][:200]) for c in run.cells if c.is_graded_test for o in c.outputs
                 if o["output_type"] == "stream" and o["name"] == "stderr"]
        assert not noisy, f"{nb}: test cells wrote to stderr (nbgrader would score 0): {noisy}"
        blank = [(c.index, c.first_line) for c in run.cells if c.type == "code" and not c.is_explorer
                 and any(d in c.source for d in DRAWS) and not c.source.lstrip().startswith("def ")
                 and "# no-figure" not in c.source
                 and not any("image/png" in o["mimes"] for o in c.outputs)]
        assert not blank, f"{nb}: cells that draw show no figure: {blank} {run.where()}"
        table = run.notebook.cell_text(len(run.cells) - 1)
        assert "0 failed, 0 not done" in table, f"{nb}: {table[:800]}"
    else:
        # A test cell whose exercise is not done shows NotDone, a demo cell that calls a stub
        # shows the stub's NotImplementedError: either way one grey line, no traceback.
        unexpected = [e for e in errors if e.ename not in ("NotDone", "NotImplementedError")]
        assert not unexpected, (
            f"{nb}: the untouched student notebook must show only the 'not implemented yet' of "
            f"its exercise stubs, but shows:{_lines(unexpected)}\n(demo cells must not depend on "
            f"names that a failing cell was meant to define) {run.where()}")
        assert errors, (f"{nb}: the student notebook runs without a single NotImplementedError: "
                        f"are its exercise stubs missing? {run.where()}")
        long = [e for e in errors if strip_ansi(e.traceback).strip().count("\n")
                or not strip_ansi(e.traceback).strip().endswith("not implemented yet")]
        assert not long, f"{nb}: not one grey line per stub:{_lines(long)} {run.where()}"
        wrong_kind = [e for c in run.cells for e in c.errors
                      if (e.ename == "NotDone") != c.is_graded_test]
        assert not wrong_kind, f"{nb}: NotDone outside a test cell or a raw stub error in one:" \
            f"{_lines(wrong_kind)} {run.where()}"
        # Run All went to the end (test cells are tagged raises-exception) and the last cell's
        # progress table says what is left to do.
        assert len(run.cells) - 1 not in run.timings.get("not_run_by_run_all", []), (
            f"{nb}: Run All stopped at an error: {run.timings} {run.where()}")
        table = run.notebook.cell_text(len(run.cells) - 1)
        assert "Progress: 0 of" in table and "not done" in table, f"{nb}: {table[:500]}"
    frames = [(c.index, o) for c in run.cells for o in c.outputs
              if "tfscratch/" in (o.get("traceback") or "") + (o.get("text") or "")]
    assert not frames, f"{nb}: outputs show the course's own frames: {frames[:3]} {run.where()}"


@pytest.mark.parametrize("nb", [n for n in NOTEBOOKS if n.kind == "solution" and n.name in README_SHOTS],
                         ids=lambda n: str(n))
def test_readme_screenshot(runs, nb):
    run = runs.get(nb)
    name, what, part = README_SHOTS[nb.name]
    explorers = [c for c in run.cells if c.is_explorer and c.dom["images"]]
    heatmaps = [c for c in run.cells if c.draws_heatmap and c.dom["images"]]
    attention = [c for c in heatmaps if "attention_heatmap" in c.source]
    order = (explorers + heatmaps) if what == "explorer" else (attention + heatmaps + explorers)
    assert order, f"{nb}: no cell with a drawn {what} to photograph {run.where()}"
    shot = SHOTS / "docs" / name
    run.notebook.cell_screenshot(order[0].index, shot, part=part)
    assert shot.stat().st_size > 5000
    if os.environ.get("TFS_UPDATE_DOCS_IMG"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / name)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_explorers_render_and_respond(runs, nb):
    """Every explorer shows its widgets, and dragging each slider redraws the figure it
    drives (different image bytes, no error)."""
    run = runs.get(nb)
    cells = [c for c in run.cells if c.is_explorer]
    if nb.kind == "student":  # an explorer built on a stub fails with it; that is expected
        cells = [c for c in cells if not c.errors]
    if not cells:
        pytest.skip(f"{nb}: no explorer")
    problems = []
    for c in cells:
        if c.errors:
            problems.append(f"cell {c.index} ({c.first_line!r}) raised: {c.errors[0]}")
            continue
        for p in c.dom["widget_problems"]:
            problems.append(f"cell {c.index} ({c.first_line!r}): widget not rendered: {p}")
        if not run.notebook.explorer_slots(c):
            kinds = [o["mimes"] or o["output_type"] for o in c.outputs]
            problems.append(f"cell {c.index} ({c.first_line!r}) makes an explorer but shows no "
                            f"widgets (outputs: {kinds})")
    t0 = time.monotonic()
    results = run.cache.setdefault(
        "sliders", [r for c in cells if not c.errors for r in run.notebook.check_sliders(c)])
    run.timings["sliders_s"] = round(time.monotonic() - t0, 1)
    run.timings["sliders_moved"] = len(results)
    problems += [str(r) for r in results if not r.ok]
    if problems:
        after = SHOTS / (str(nb).replace("/", "__") + "__after_sliders.jpg")
        run.notebook.screenshot(after)
        pytest.fail(f"{nb}: explorers:{_lines(problems)}\n(after the sliders moved: {after}) "
                    f"{run.where()}")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=IDS)
def test_heatmaps_drawn(runs, nb):
    """Each cell that draws a heatmap shows a non-empty image in the page."""
    run = runs.get(nb)
    cells = [c for c in run.cells if c.draws_heatmap]
    if nb.kind == "student":
        cells = [c for c in cells if not c.errors]
    required = nb.kind == "solution" and nb.name in HEATMAP_NOTEBOOKS
    if not cells and not required:
        pytest.skip(f"{nb}: no heatmap")
    problems = []
    for c in cells:
        shown = [im for im in c.dom["images"] if im["complete"] and im["width"] > 0]
        if not shown:
            problems.append(f"cell {c.index} ({c.first_line!r}) draws a heatmap but the page shows "
                            f"no image (outputs: {[o['mimes'] or o['output_type'] for o in c.outputs]})")
            continue
        blank = [image_is_blank(b) for b in run.notebook.images_of(c.index)]
        if all(blank):
            problems.append(f"cell {c.index} ({c.first_line!r}): the image is empty: {blank}")
    if required:
        drawn = [c for c in run.cells if "heatmap" in c.source and c.dom and c.dom["images"]]
        if not drawn:
            problems.append("the course promises heatmaps in this notebook (COURSE_SPEC 3, 7), "
                            "but no cell that calls a heatmap function shows an image")
    assert not problems, f"{nb}: heatmaps:{_lines(problems)}\n{run.where()}"


def test_wrong_solution_shows_one_box_naming_the_mistake(runs):
    """01 with a catalogued softmax mistake (max without keepdim, which crashes inside the
    student's code): the failing check shows one compact box, in view, that names the check,
    says the mistake, and shows the student's own failing line, and no frame of the course."""
    import re
    from dataclasses import dataclass

    from catalogue.nb01_attention import MISTAKES
    from labdriver import Nb
    from nbtools import solution_sources, student_notebook, write

    @dataclass(frozen=True)
    class MistakeNb(Nb):
        @property
        def id(self) -> str:
            return f"mistake/{self.name}"

        def __str__(self):
            return self.id

    m = next(x for x in MISTAKES if x.exercise == "softmax" and "keepdim" in x.description)
    fill = solution_sources("01_attention")
    fill["softmax"] = m.code.strip()
    nb = MistakeNb("student", "01_attention", Path("mistake"))
    write(student_notebook("01_attention", fill), REPO / runs.relpath(nb.id))
    run = runs.get(nb)
    cell = next(c for c in run.cells if c.source.strip() == "chk.test_softmax_rows(softmax)")
    assert [e.ename for e in cell.errors] == ["CheckFailed"], f"{cell.errors} {run.where()}"
    box = run.notebook.cell(cell.index).locator(".jp-OutputArea-output").first
    box.scroll_into_view_if_needed()
    assert box.is_visible()
    text = box.inner_text()
    shot = SHOTS / "mistake__01_attention__box.png"
    run.notebook.cell_screenshot(cell.index, shot, part="output")
    said = f"the box says:\n{text}\n(screenshot {shot})"
    assert "\u2718 test_softmax_rows" in text, said
    assert re.search(m.hint, text, re.I), f"the mistake ({m.hint}) is not named; {said}"
    assert "your code, Cell In[" in text and "e = torch.exp(x - m)" in text, said
    assert "tfscratch" not in text and "Traceback" not in text, said
    assert box.bounding_box()["height"] < 400, f"not a compact box; {said}"
    frames = [(c.index, o) for c in run.cells for o in c.outputs
              if "tfscratch/" in (o.get("traceback") or "") + (o.get("text") or "")]
    assert not frames, f"outputs show the course's own frames: {frames[:3]} {run.where()}"
    table = run.notebook.cell_text(len(run.cells) - 1)
    assert "failed" in table and "test_softmax_rows" in table, table[:800]


CJK_JS = """() => {
  const out = document.querySelector('.jp-OutputArea-output pre') || document.body;
  const family = getComputedStyle(out).fontFamily;
  const c = document.createElement('canvas'); c.width = c.height = 48;
  const x = c.getContext('2d');
  const draw = (ch) => { x.clearRect(0, 0, 48, 48); x.font = `36px ${family}`;
                         x.fillText(ch, 4, 40); return x.getImageData(0, 0, 48, 48).data.join(','); };
  const tofu = draw('\\uE000'), blank = draw(' ');
  return ['床', '前', '月'].map(ch => { const d = draw(ch); return {ch, drawn: d !== tofu && d !== blank}; });
}"""


@pytest.mark.parametrize("nb", [n for n in NOTEBOOKS if n.kind == "solution" and n.name == "11_tokenizer"],
                         ids=lambda n: str(n))
def test_chinese_is_drawn_not_boxes(runs, nb):
    """Notebook 11 prints Chinese text: the page draws its glyphs (a CJK font is installed with
    Chromium, tools/ensure_browser.py), not the empty boxes of a missing font."""
    run = runs.get(nb)
    assert any("床" in (o.get("text") or "") for c in run.cells for o in c.outputs), \
        f"{nb}: no output prints 床 any more; pick another glyph {run.where()}"
    drawn = run.notebook.page.evaluate(CJK_JS)
    assert all(d["drawn"] for d in drawn), f"{nb}: CJK glyphs drawn as boxes: {drawn} {run.where()}"
