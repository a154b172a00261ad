"""Feedback hygiene (autograder/tfsgrade/hygiene.py): hidden tests' code and inputs never reach
the feedback, outputs are cut to 20,000 characters per cell with a note, and nothing a student
printed runs in the instructor's browser while nbgrader's feedback layout survives. Pure: the
feedback page is rendered with nbgrader's own template through nbconvert, no kernel."""
from __future__ import annotations

import base64
import copy
import json
import os

import nbformat
import pytest

from nbtools import SOLUTIONS, read
from tfsgrade import hygiene

A = "01_attention"
SECRET = "seed=9173"  # appears only inside 01's hidden tests


def _hidden_lines(source_nb):
    """Lines of the hidden blocks that appear nowhere in the released (student) notebook."""
    from nbtools import NOTEBOOKS
    released = json.dumps(read(NOTEBOOKS / f"{A}.ipynb"))
    lines = []
    for c in source_nb.cells:
        inside = False
        for ln in c.source.split("\n"):
            if hygiene.BEGIN_HIDDEN in ln:
                inside = True
            elif hygiene.END_HIDDEN in ln:
                inside = False
            elif inside and ln.strip() and json.dumps(ln.strip())[1:-1] not in released:
                lines.append(ln.strip())
    return lines


def autograded():
    """What nbgrader autograde leaves: the source's test cells (hidden tests included), with
    outputs; test_softmax_random failed inside its hidden part."""
    nb = copy.deepcopy(read(SOLUTIONS / f"{A}.ipynb"))
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "test_softmax_random":
            c.outputs = [
                nbformat.v4.new_output("stream", name="stdout", text="checking softmax on 4 shapes\n"),
                nbformat.v4.new_output("display_data", data={"text/plain": "tensor([0.1, 0.9]) <- hidden input"}),
                nbformat.v4.new_output(
                    "error", ename="CheckFailed",
                    evalue="softmax(x, dim=0) does not sum to 1 along dim=0",
                    traceback=["Traceback (most recent call last):",
                               "Cell In[13], line 3\n----> 3 chk.check_softmax_against_torch(softmax, "
                               "seed=9173, shapes=[(7, 13), (3, 5, 11)]",
                               "CheckFailed: softmax(x, dim=0) does not sum to 1 along dim=0"])]
        if c.metadata.get("nbgrader", {}).get("grade") or c.metadata.get("nbgrader", {}).get("solution"):
            c.metadata.nbgrader["score"] = c.metadata.nbgrader.get("points", 0)
            c.metadata.nbgrader.setdefault("points", 0)
    return nb


def render(nb) -> str:
    """The feedback page as nbgrader's generate_feedback writes it (same template, same config)."""
    import nbgrader
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    from traitlets.config import Config
    base = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
    c = Config()
    c.HTMLExporter.template_name = "feedback"
    c.HTMLExporter.extra_template_basedirs = [os.path.join(base, "templates")]
    c.HTMLExporter.extra_template_paths = [os.path.join(base, "static", "node_modules", "bootstrap",
                                                        "dist", "css")]
    e = HTMLExporter(config=c)
    e.register_preprocessor(CSSHTMLHeaderPreprocessor(config=c), enabled=True)
    out, _ = e.from_notebook_node(nb, resources={"nbgrader": {
        "notebook": A, "score": 3, "max_score": 5, "late_penalty": 0}})
    return out


# ------------------------------------------------------------------ (a) hidden tests
def test_hidden_tests_code_and_inputs_never_reach_feedback():
    src = read(SOLUTIONS / f"{A}.ipynb")
    hidden = _hidden_lines(src)
    assert hidden and any(SECRET in h for h in hidden)
    before = render(autograded())
    assert SECRET in before  # the leak this module closes

    fb = hygiene.hide_hidden_tests(autograded(), src)
    text = json.dumps(fb)
    for ln in hidden:
        assert ln not in text, f"hidden line leaked: {ln}"
    assert "hidden input" not in text
    page = render(fb)
    assert SECRET not in page and "BEGIN HIDDEN" not in page

    cell = next(c for c in fb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax_random")
    # test name, visible part, pass/fail and message survive
    assert cell.source.startswith("chk.test_softmax_random(softmax)")
    assert "Hidden tests ran here (3 lines not shown)" in cell.source
    [err] = [o for o in cell.outputs if o.output_type == "error"]
    assert err.ename == "CheckFailed" and "does not sum to 1" in err.evalue
    assert err.traceback == ["CheckFailed: softmax(x, dim=0) does not sum to 1 along dim=0"]
    assert any(o.output_type == "stream" for o in cell.outputs)
    assert "test_softmax_random" in page and "does not sum to 1" in page
    # other cells untouched
    orig = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in autograded().cells}
    for c in fb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid and gid not in ("test_softmax_random", "test_scaled_dot_product_attention_random"):
            assert c.source == orig.get(gid, c.source)


def test_reveal_hidden_after_the_deadline():
    src = read(SOLUTIONS / f"{A}.ipynb")
    fb = hygiene.hide_hidden_tests(autograded(), src, reveal_hidden=True)
    assert SECRET in json.dumps(fb)


def test_hidden_markers_without_source_and_edited_cells():
    nb = autograded()
    fb = hygiene.hide_hidden_tests(nb)  # no source: the markers in the cell still decide
    assert SECRET not in json.dumps(fb)
    # a submission whose test cell lost its markers: the source's visible part is shown instead
    nb = autograded()
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax_random":
            c.source = c.source.replace("### BEGIN HIDDEN TESTS\n", "").replace("### END HIDDEN TESTS", "")
    fb = hygiene.hide_hidden_tests(nb, read(SOLUTIONS / f"{A}.ipynb"))
    assert SECRET not in json.dumps(fb)


# ------------------------------------------------------------------ (b) truncation
def _cell(*outputs):
    c = nbformat.v4.new_code_cell("print(x)")
    c.outputs = list(outputs)
    nb = nbformat.v4.new_notebook()
    nb.cells = [c]
    return nb


def test_huge_output_is_truncated_with_a_note():
    big = "x" * 5_000_000
    nb = hygiene.truncate_outputs(_cell(nbformat.v4.new_output("stream", name="stdout", text=big)))
    outs = nb.cells[0].outputs
    assert len(outs[0].text) == 20_000
    assert "output truncated: 4,980,000 of 5,000,000 characters" in outs[-1].text
    assert sum(len(json.dumps(o)) for o in outs) < 21_000


def test_budget_is_per_cell_across_outputs_and_kinds():
    s1 = nbformat.v4.new_output("stream", name="stdout", text="a" * 15_000)
    s2 = nbformat.v4.new_output("stream", name="stderr", text="b" * 15_000)
    d = nbformat.v4.new_output("execute_result", data={"text/plain": "c" * 30_000,
                                                       "text/html": "<b>" + "d" * 30_000 + "</b>"},
                               execution_count=1)
    e = nbformat.v4.new_output("error", ename="E", evalue="v", traceback=["t" * 50_000])
    nb = hygiene.truncate_outputs(_cell(s1, s2, d, e))
    o = nb.cells[0].outputs
    assert len(o[0].text) == 15_000 and len(o[1].text) == 5_000
    assert o[2].data["text/plain"] == "" and "<b>" not in o[2].data["text/html"]
    assert len(o[3].traceback[0]) == 0
    assert "output truncated" in o[-1].text


def test_small_outputs_and_plots_are_untouched():
    png = base64.b64encode(b"\x89PNG" + b"0" * 30_000).decode()
    small = _cell(nbformat.v4.new_output("stream", name="stdout", text="ok\n"),
                  nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}))
    assert hygiene.truncate_outputs(small) == small
    huge = _cell(nbformat.v4.new_output("display_data", data={"image/png": "A" * 3_000_001}))
    out = hygiene.truncate_outputs(huge).cells[0].outputs[0].data
    assert "image/png" not in out and "removed from feedback" in out["text/plain"]


# ------------------------------------------------------------------ (c) sanitising
EVIL = [
    '<script>alert("stolen")</script>',
    '<img src=x onerror="alert(1)">',
    '<a href="javascript:alert(2)">click</a>',
    '<iframe src="https://example.org"></iframe>',
    '<svg onload="alert(3)"><circle r=1 /></svg>',
    '<div onclick="alert(4)" style="background:url(javascript:alert(5))">x</div>',
    '<a href="data:text/html;base64,PHNjcmlwdD5hbGVydCg2KTwvc2NyaXB0Pg==">d</a>',
    '<form action="https://example.org"><input name=p></form>',
    '<object data="x.swf"></object><embed src="x.swf">',
    '<style>body{display:none}</style>',
]


def evil_notebook():
    nb = autograded()
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "softmax":
            c.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "".join(EVIL),
                                                                      "text/plain": "x"}),
                         nbformat.v4.new_output("display_data", data={"application/javascript": "alert(7)"}),
                         nbformat.v4.new_output("display_data", data={"image/svg+xml": EVIL[4]}),
                         nbformat.v4.new_output("display_data", data={"image/png": png}),
                         nbformat.v4.new_output("stream", name="stdout", text=EVIL[0])]
    nb.cells.insert(3, nbformat.v4.new_markdown_cell("My notes " + EVIL[0] + EVIL[1] + " **bold**"))
    return nb


def _assert_inert(page: str):
    body = page[page.lower().find("<body"):]
    low = body.lower()
    for bad in ("<script", "onerror", "onload", "onclick", "javascript:", "<iframe", "<form",
                "<object", "<embed", "<svg", "data:text/html", "<style"):
        assert bad not in low, f"{bad} survived"


def test_sanitised_feedback_page_runs_nothing_and_keeps_layout():
    raw = render(evil_notebook())
    assert "<script>alert(" in raw or 'onerror="alert(1)"' in raw  # the page as nbgrader writes it
    page = hygiene.sanitise_html(raw)
    _assert_inert(page)
    # nbgrader's layout: the head's CSS, the table of contents, panels, anchors, scores, code
    head = page[:page.lower().find("<body")]
    assert "<style" in head and "div.nbgrader_cell" in head
    for keep in ('id="toc"', 'class="panel panel-primary nbgrader_cell"', 'name="test_softmax_rows"',
                 'href="#test_softmax_rows"', "Score: 1.0 / 1.0", 'class="highlight',
                 "Student's answer", "data:image/png;base64,", "<strong>bold</strong>",
                 "01_attention (Score: 3.0 / 5.0)", "My notes"):
        assert keep in page, keep


def test_sanitise_notebook_before_export():
    nb = hygiene.clean_feedback_notebook(evil_notebook(), read(SOLUTIONS / f"{A}.ipynb"))
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    mimes = [m for o in cell.outputs for m in o.get("data", {})]
    assert "application/javascript" not in mimes and "image/svg+xml" not in mimes
    assert "image/png" in mimes
    html_out = cell.outputs[0].data["text/html"]
    assert "<script" not in html_out and "onerror" not in html_out and "javascript:" not in html_out
    _assert_inert(hygiene.sanitise_html(render(nb)))
    assert SECRET not in render(nb)


def test_title_is_escaped():
    page = "<html><head><title><script>alert(1)</script>nb</title></head><body><p>x</p></body></html>"
    out = hygiene.sanitise_html(page)
    assert "<script>" not in out and "<title>alert(1)nb</title>" in out


@pytest.mark.parametrize("payload", EVIL)
def test_each_payload_is_neutralised(payload):
    _assert_inert("<body>" + hygiene.sanitise_fragment(payload))
