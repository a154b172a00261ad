"""Issue 26, class 7 (fast, no grading run): the sanitiser (autograder/tfsgrade/sanitise.py)
over a corpus of XSS payloads (OWASP filter-evasion variants and markdown-only ones), honest
content kept byte for byte, and a hostile notebook rendered with nbgrader's formgrader exporter
(the HTMLExporter, `formgrade` template and template paths its server extension configures).
Every page or fragment is read with a browser-grade HTML5 parser (tests/hostile/trust_html.py:
active)."""
from __future__ import annotations

import base64
import collections
import copy
import glob

import nbformat
import pytest

from hostile import trust_html as T
from nbtools import NOTEBOOKS, SOLUTIONS, read, solution_sources, student_notebook
from tfsgrade import sanitise

RESERVED = sanitise._reserved_ids(["q_softmax_shift", "q_scale_dk", "softmax"])


def render_markdown(source, attachments=None) -> str:
    """The cell as the formgrader renders it: nbconvert's markdown2html filter."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
    return MarkdownWithMath(renderer=IPythonRenderer(escape=False, attachments=attachments or {})).render(source)


def formgrader_exporter():
    """nbgrader's formgrader exporter, configured as its server extension configures it."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension
    cfg = FormgradeExtension().build_extra_config()
    assert cfg.HTMLExporter.template_name == "formgrade"
    return HTMLExporter(config=cfg)


RESOURCES = dict(assignment_id=T.A01, notebook_id=T.A01, submission_id="abc", index=0, total=3,
                 base_url="", student=T.STUDENT, last_name=None, first_name=None,
                 notebook_path=f"/autograded/{T.STUDENT}/{T.A01}/{T.A01}.ipynb")


def formgrade(nb) -> str:
    html, _ = formgrader_exporter().from_notebook_node(nb, resources=dict(RESOURCES))
    return html


def executed_hostile(missing_attachment=True):
    """The trust class's hostile notebook with the outputs its display cell makes."""
    nb = T.hostile_notebook(missing_attachment)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "payloads =" in c.source)
    cell.outputs, cell.execution_count = T.outputs(), 3
    return nb


# ------------------------------------------------------------------ the payload corpus
def test_the_corpus_is_live_without_the_sanitiser():
    """Most payloads run when the formgrader renders them as they are (the old behaviour);
    the rest the markdown parser already shows as text."""
    live = [p for p in T.PAYLOADS if T.active(render_markdown(p), fragment=True)]
    assert len(live) >= 0.75 * len(T.PAYLOADS), sorted(set(T.PAYLOADS) - set(live))


@pytest.mark.parametrize("payload", T.PAYLOADS)
def test_payload_in_markdown_renders_inert(payload):
    new, why = sanitise.markdown(payload, None, RESERVED)
    html = render_markdown(new)
    assert T.active(html, fragment=True) == []
    if "tfsxss" in payload:
        assert "tfsxss" in html  # the instructor still reads what the student typed
    if T.active(render_markdown(payload), fragment=True):
        assert why, "a live payload passed the check"


@pytest.mark.parametrize("where", ["> {}", "- {}", "1. {}", "| a |\n|---|\n| {} |", "**{}**",
                                   "# {}", "text {} text", "<div>\n{}\n</div>"])
def test_payloads_in_markdown_contexts_render_inert(where):
    for p in T.HTML_PAYLOADS:
        new, _ = sanitise.markdown(where.format(p), None, RESERVED)
        assert T.active(render_markdown(new), fragment=True) == [], (where, p)


def test_all_payloads_in_one_cell_render_inert_and_readable():
    text = T.HONEST_ANSWER + "\n\n" + "\n\n".join(T.PAYLOADS + [T.MISSING_ATTACHMENT])
    new, why = sanitise.markdown(text, None, RESERVED)
    assert why and new != text
    html = render_markdown(new)
    assert T.active(html, fragment=True) == []
    for bit in ("$a&lt;b$", "$x_i - \\max_j x_j \\le 0$", "0.27", "multiplies top and bottom",
                "&lt;script&gt;alert('tfsxss')&lt;/script&gt;"):
        assert bit in html, bit
    assert "<table>" in html and '<div class="highlight">' in html  # table and code still render


def test_the_html_corpus_is_live_without_the_sanitiser():
    live = [p for p in T.HTML_PAYLOADS if T.active(p, fragment=True)]
    assert len(live) >= 0.75 * len(T.HTML_PAYLOADS), sorted(set(T.HTML_PAYLOADS) - set(live))


@pytest.mark.parametrize("payload", T.HTML_PAYLOADS)
def test_payload_in_html_output_is_cleaned(payload):
    out = sanitise.html_fragment(payload)
    assert T.active(out, fragment=True) == []
    assert "id=" not in out.lower() and "position" not in out


# ------------------------------------------------------------------ honest content kept
HONEST_CELLS = [
    T.HONEST_ANSWER,
    "YOUR ANSWER HERE",
    "$$\\operatorname{softmax}(x)_i = \\frac{e^{x_i}}{\\sum_j e^{x_j}}, \\quad a < b > c$$",
    "Inline $QK^\\top/\\sqrt{d_k}$ and \\(x<y\\) and\n\\begin{align}a &< b\\\\ c &> d\\end{align}",
    "```python\nif a<b and c>d:\n    print('<script>')\n```",
    "`x<y` and ``a `<b>` c``",
    "| a | b |\n|:--|--:|\n| x<y | 1 |",
    "- [x] done\n- [ ] todo\n\n1. one\n2. two",
    "![plot](attachment:plot.png) and ![web](https://example.org/a.png) and [docs](https://pytorch.org)",
    "<b>bold</b>, <i>it</i>, H<sub>2</sub>O, x<sup>2</sup>, a<br>b, <font color=\"red\">red</font>",
    '<div align="center">\n\n**centred**\n\n</div>',
    "<details><summary>hint</summary>\n\nthe max trick\n\n</details>",
    "Tokens such as <eos>, <pad> and <unk> mark the sequence.",
    "> a quote with `code` and a [link](#softmax-section)",
    "# A heading\n\n## Another: with punctuation, 'quotes' & more",
    "term\n: definition",
    "~~struck~~ <https://example.org> www.example.org",
]


@pytest.mark.parametrize("cell", HONEST_CELLS)
def test_honest_markdown_is_kept_byte_for_byte(cell):
    att = {"plot.png": {"image/png": T.PNG}}
    new, why = sanitise.markdown(cell, att, RESERVED)
    assert (new, why) == (cell, None)


def test_honest_answer_renders_with_its_math_and_formatting():
    html = render_markdown(T.HONEST_ANSWER)
    for bit in T.HONEST_BITS:
        assert bit in html, bit


@pytest.mark.parametrize("path", sorted(glob.glob(str(NOTEBOOKS / "*.ipynb")))
                         + sorted(glob.glob(str(SOLUTIONS / "*.ipynb"))))
def test_course_notebooks_pass_unchanged(path):
    nb = read(path)
    clean, notes = sanitise.notebook(nb)
    assert notes == []
    for a, b in zip(nb.cells, clean.cells):
        assert (a.cell_type, a.source, a.metadata, a.get("outputs"), a.get("attachments")) == \
               (b.cell_type, b.source, b.metadata, b.get("outputs"), b.get("attachments"))
    nbformat.validate(clean)


def test_plots_tables_and_text_outputs_survive():
    png = {"image/png": T.PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"}
    frame = ('<div><table border="1" class="dataframe"><thead><tr style="text-align: right;">'
             "<th></th><th>a</th></tr></thead><tbody><tr><th>0</th><td>1</td></tr></tbody></table></div>")
    progress = ("<div class='tfs-progress'><p><b>3/5</b></p><table><tr><td style='color:green;"
                "text-align:left'>ok</td></tr></table></div>")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("plot()", execution_count=1, outputs=[
        nbformat.v4.new_output("display_data", data=png, metadata={"image/png": {"width": 300}}),
        nbformat.v4.new_output("execute_result", data={"text/html": frame, "text/plain": "df"},
                               execution_count=1),
        nbformat.v4.new_output("display_data", data={"text/html": progress, "text/plain": "p"}),
        nbformat.v4.new_output("display_data", data={"image/jpeg": T.PNG}),
        nbformat.v4.new_output("display_data", data={"text/latex": "$a<b$", "text/plain": "a<b"}),
        nbformat.v4.new_output("stream", name="stdout", text="loss 0.1 <eos>\n"),
        nbformat.v4.new_output("error", ename="ValueError", evalue="<b>", traceback=["ValueError: <b>"])])]
    clean, notes = sanitise.notebook(nb)
    outs = clean.cells[0].outputs
    assert notes == []
    assert outs[0].data == png and outs[0].metadata == {"image/png": {"width": 300}}
    assert 'class="dataframe"' in outs[1].data["text/html"] and "<td>1</td>" in outs[1].data["text/html"]
    assert "tfs-progress" in outs[2].data["text/html"] and "color:green" in outs[2].data["text/html"]
    assert outs[3].data == {"image/jpeg": T.PNG}
    assert outs[4].data["text/latex"] == "$a<b$"
    assert outs[5].text == "loss 0.1 <eos>\n" and outs[6].evalue == "<b>"
    assert outs[1].execution_count == 1


# ------------------------------------------------------------------ what notebook() removes
def test_hostile_outputs_metadata_and_cells():
    nb = executed_hostile()
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells[first].execution_count = "<script>alert('tfsxss')</script>"
    nb.cells[first].id = "\"><script>"
    weird = nbformat.from_dict({"cell_type": "unknown", "metadata": {}, "source": "<script>x</script>"})
    nb.cells.append(weird)
    clean, notes = sanitise.notebook(nb)
    assert clean.cells[first].execution_count is None and clean.cells[first].id == f"tfs-cell-{first}"
    assert "title" not in clean.metadata and "widgets" not in clean.metadata
    assert "<" not in clean.metadata.kernelspec.display_name
    code = next(c for c in clean.cells if c.cell_type == "code" and "payloads =" in c.source)
    mimes = collections.Counter(m for o in code.outputs for m in o.get("data", {}))
    for gone in ("application/javascript", "image/svg+xml", "application/vnd.jupyter.widget-view+json",
                 "text/markdown", "text/latex"):
        assert gone not in mimes, gone
    assert mimes["image/png"] == 2               # the valid images; the forged one is gone
    assert all(o.get("metadata", {}) in ({}, {"image/png": {"height": 1}}) for o in code.outputs)
    assert all("tags" not in c.metadata or all("<" not in t for t in c.metadata.tags) for c in clean.cells)
    md = [c for c in clean.cells if c.cell_type == "markdown" and "attachments" in c]
    assert md and set(md[0].attachments) == {"ok.png"}
    raws = [c for c in clean.cells if c.cell_type == "raw"]
    assert all("<script" not in c.source and "<iframe" not in c.source for c in raws)
    assert raws[-1].source == ""     # the cell of unknown type: kept as a raw cell, cleaned
    assert any("unknown type" in n for n in notes) and any("q_scale_dk" in n for n in notes)
    nbformat.validate(clean)


def test_malformed_nbgrader_metadata_is_dropped_not_rendered():
    nb = student_notebook(T.A01)
    cell = nbformat.v4.new_markdown_cell("x")
    cell.metadata["nbgrader"] = {"grade_id": "\"><script>alert('tfsxss')</script>", "grade": True,
                                 "solution": True, "points": 1}
    nb.cells.append(cell)
    clean, notes = sanitise.notebook(nb)
    assert "nbgrader" not in clean.cells[-1].metadata and any("nbgrader" in n for n in notes)


# ------------------------------------------------------------------ the formgrader's page
def test_formgrader_page_of_a_sanitised_hostile_notebook_runs_nothing():
    """The page nbgrader's formgrader serves for the notebook (its exporter and template):
    the hostile student's page holds exactly the active elements of an honest student's page
    (the formgrader's own scripts, buttons and inputs), none of them carrying a payload."""
    honest = T.active(formgrade(student_notebook(T.A01, solution_sources(T.A01))))
    clean, _ = sanitise.notebook(executed_hostile())
    page = formgrade(clean)
    found = T.active(page)
    assert T.marked(found) == []
    assert collections.Counter(k for k, _ in found) == collections.Counter(k for k, _ in honest)
    for bit in ("$a&lt;b$", "$x_i - \\max_j x_j \\le 0$", "multiplies top and bottom", "0.27"):
        assert bit in page, bit
    assert T.ids(page)["q_scale_dk"] == 1   # the score input's id is the page's only one


def test_formgrader_page_without_the_sanitiser_runs_the_payloads():
    """What the formgrader served before this change (the same notebook, unsanitised): the
    payloads are live; and one image of a missing attachment makes nbconvert fail the page."""
    found = T.active(formgrade(executed_hostile(missing_attachment=False)))
    kinds = collections.Counter(k for k, _ in T.marked(found))
    assert kinds["script"] and kinds["handler"] and kinds["url"] and kinds["iframe"], kinds
    with pytest.raises(Exception, match="missing attachment"):
        formgrade(executed_hostile())
    clean, _ = sanitise.notebook(executed_hostile())
    formgrade(clean)   # renders


# ------------------------------------------------------------------ the grader's own pages
def test_similarity_page_escapes_student_code_and_ids():
    from tfsgrade import similarity
    code = "def softmax(x):\n    s = \"</pre><script>alert('tfsxss')</script>\"\n    return x"
    pair = similarity.Pair(T.A01, "softmax", "<img src=x onerror=alert('tfsxss')>", "course solution",
                           0.95, 120, code, code, [(0, len(code))], [(0, 10)])
    page = similarity.render_html([pair])
    found = T.active(page, fragment=True)
    assert T.marked(found) == [] and {k for k, _ in found} <= {"style"}   # its own style sheet
    assert "&lt;script&gt;alert(&#x27;tfsxss&#x27;)&lt;/script&gt;" in page


def test_feedback_equations_are_mathml_and_nothing_else():
    """Issue 41.4: the course's `$...$` in a page's text becomes MathML drawn offline; code,
    money, a formula the converter cannot read and any formula the course did not write (a
    student's) stay as written; a formula cannot carry a link."""
    from tfsgrade import mathml
    page = ("<p>divide by $\\sqrt{d_k}$, pay $5 or $6</p><pre>$x$</pre><code>$y$</code>"
            "<p>$$a^2$$ and $\\href{javascript:alert(1)}{x}$ and $b^2$</p>")
    course = mathml.formulas_of(["$\\sqrt{d_k}$ then $$a^2$$ and $\\href{javascript:alert(1)}{x}$"])
    out = mathml.render(page, course)
    assert out.count("<math") == 3 and "<msqrt>" in out and 'display="block"' in out, out
    assert "pay $5 or $6" in out and "<pre>$x$</pre>" in out and "<code>$y$</code>" in out, out
    assert "href" not in out and "javascript" not in out, out
    assert "$b^2$" in out                      # not the course's: a student's text stays text
