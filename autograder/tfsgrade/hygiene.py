"""Feedback hygiene (issue 14, item 8): what a student gets back shows what counted, never the
hidden tests, never an unbounded output, and nothing that runs in the instructor's browser.

Three steps, each a pure function on a notebook or a page:

* hide_hidden_tests(nb, source, reveal_hidden=False): for every test cell whose source (in the
  instructor's notebook) holds a `### BEGIN HIDDEN TESTS` block, the feedback notebook gets the
  visible part of the cell only plus a one-line note; its outputs keep the test's name, pass/fail
  (an error output or not) and the message (`ename: evalue`, the streams the checks print), and
  lose tracebacks (they quote the hidden code) and rich outputs (they may show hidden inputs).
  With reveal_hidden=True (after the deadline) nothing is hidden.
* truncate_outputs(nb, limit=20_000): each cell's text outputs together keep at most `limit`
  characters, with a note saying how much was cut; an image over `image_limit` is replaced by a
  note.
* sanitise_notebook(nb) before export (HTML outputs cleaned with nh3, JavaScript and SVG outputs
  dropped), and sanitise_html(page) after nbgrader's generate_feedback: the page's <head> (from
  nbgrader's template: its CSS and MathJax) is kept, the <title> re-escaped, and the <body> cleaned
  with nh3 so that no <script>, event handler, javascript: URL, <iframe>, <form> or <style>
  survives while nbgrader's layout (panels, anchors, classes, highlighted code, data: images)
  does.

clean_feedback_notebook(nb, source, ..., verdicts=...) runs the notebook steps in order; with
the coordinator's verdicts, each judged test cell shows the grade's verdict alone
(add_verdicts: one verdict, one "What differs" block per cell).
"""
from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import nbformat
import nh3

from . import course
from . import mathml as _mathml
from .cells import meta as _meta
from .cells import source as _src

BEGIN_HIDDEN = "BEGIN HIDDEN TESTS"
END_HIDDEN = "END HIDDEN TESTS"
LIMIT = 20_000
IMAGE_LIMIT = 2_000_000
HIDDEN_NOTE = ("# Hidden tests ran here ({n} line{s} not shown). Your result and the message "
               "are below.")
_TEXT_MIMES = ("text/plain", "text/html", "text/markdown", "text/latex", "application/json")
_IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp")


# --------------------------------------------------------------------------- hidden tests
def _split_hidden(source: str) -> tuple[str, int]:
    """(source without its hidden blocks, number of hidden lines removed)."""
    out, hidden, inside = [], 0, False
    for line in source.split("\n"):
        if BEGIN_HIDDEN in line:
            inside = True
            hidden += 1
            continue
        if END_HIDDEN in line:
            inside = False
            hidden += 1
            continue
        if inside:
            hidden += 1
        else:
            out.append(line)
    return "\n".join(out).rstrip("\n"), hidden


def hidden_test_ids(source) -> set[str]:
    """grade_ids of the instructor notebook's cells that hold hidden tests."""
    return {_meta(c)["grade_id"] for c in source.cells
            if c.get("cell_type") == "code" and BEGIN_HIDDEN in _src(c)
            and isinstance(_meta(c).get("grade_id"), str)}


def hide_hidden_tests(nb, source=None, *, reveal_hidden: bool = False):
    """A copy of the autograded notebook `nb` with the hidden tests' code and inputs removed.
    `source` is the instructor's notebook (where the hidden blocks are); any cell of `nb` that
    still holds the markers is treated the same way."""
    nb = copy.deepcopy(nb)
    if reveal_hidden:
        return nb
    ids = hidden_test_ids(source) if source is not None else set()
    src_by_id = {}
    if source is not None:
        src_by_id = {_meta(c)["grade_id"]: _src(c) for c in source.cells
                     if isinstance(_meta(c).get("grade_id"), str)}
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        gid = _meta(c).get("grade_id")
        gid = gid if isinstance(gid, str) else None
        c.source = _src(c)
        if gid not in ids and BEGIN_HIDDEN not in c.source:
            continue
        visible, n = _split_hidden(c.source)
        if gid in src_by_id:  # the source decides how much was hidden
            _, n_src = _split_hidden(src_by_id[gid])
            n = max(n, n_src)
            if BEGIN_HIDDEN not in c.source:
                # autograde left only the visible part (or the markers were edited away):
                # keep the visible lines of the source, never the submitted text
                visible = _split_hidden(src_by_id[gid])[0]
        note = HIDDEN_NOTE.format(n=n, s="" if n == 1 else "s")
        c.source = (visible + "\n" if visible.strip() else "") + note
        c.outputs = [_hidden_output(o) for o in c.get("outputs", [])]
        c.outputs = [o for o in c.outputs if o is not None]
        c.metadata.setdefault("tfsgrade", {})["hidden_tests"] = True
    return nb


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _hidden_output(o):
    if o.output_type == "error":
        o = copy.deepcopy(o)
        tb = list(o.get("traceback") or [])
        # the course's one-line verdict (the grey "not implemented yet" line) says no more than
        # the message; any longer traceback may quote hidden code: replaced by the message
        if not (len(tb) == 1 and "\n" not in tb[0] and "Traceback" not in tb[0]
                and "File " not in tb[0] and o.get("evalue", "") in _strip_ansi(tb[0])):
            o.traceback = [f"{o.ename}: {o.evalue}"]
        return o
    if o.output_type == "stream":
        return o
    return None  # display_data / execute_result may show hidden inputs


# --------------------------------------------------------------------------- truncation
def _cut(text: str, budget: int) -> tuple[str, int]:
    if len(text) <= budget:
        return text, 0
    return text[:max(budget, 0)], len(text) - max(budget, 0)


def _note(cut: int, total: int, limit: int) -> str:
    return (f"\n... [output truncated: {cut:,} of {total:,} characters not shown; "
            f"feedback keeps at most {limit:,} per cell]\n")


def _join(v) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def truncate_outputs(nb, limit: int = LIMIT, image_limit: int = IMAGE_LIMIT):
    """A copy of `nb` whose cells' text outputs hold at most `limit` characters in all (in
    order: later outputs get what earlier ones left), ending with a note that says how much was
    cut; images larger than `image_limit` characters of base64 are replaced by a note."""
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        budget, total, cut = limit, 0, 0
        for o in c.get("outputs", []):
            if o.output_type == "stream":
                t = _join(o.text)
                o.text, k = _cut(t, budget)
                total, cut, budget = total + len(t), cut + k, budget - len(o.text)
            elif o.output_type == "error":
                tb = "\n".join(_join(x) for x in o.traceback)
                kept, k = _cut(tb, budget)
                o.traceback = [kept] if k else o.traceback
                o.evalue = _cut(_join(o.evalue), limit)[0]
                total, cut, budget = total + len(tb), cut + k, budget - len(kept)
            elif o.output_type in ("display_data", "execute_result"):
                data = o.get("data", {})
                shown, size, k_max = 0, 0, 0
                for mime in list(data):
                    if isinstance(data[mime], dict):
                        continue
                    v = _join(data[mime])
                    if mime in _IMAGE_MIMES:
                        if len(v) > image_limit:
                            del data[mime]
                            data.setdefault("text/plain", f"[image of {len(v):,} characters "
                                                          "removed from feedback]")
                        continue
                    if not (mime.startswith("text/") or mime in _TEXT_MIMES):
                        continue
                    kept, k = _cut(v, budget)
                    if k and mime == "text/html":  # cut markup would be broken: show it as text
                        kept = "<pre>" + html.escape(kept) + "</pre>"
                    data[mime] = kept
                    shown, size, k_max = max(shown, min(len(v), budget)), max(size, len(v)), max(k_max, k)
                total, cut, budget = total + size, cut + k_max, budget - shown
        if cut:
            c.outputs.append(_stream(_note(cut, total, limit)))
    return nb


def _stream(text: str):
    import nbformat
    return nbformat.v4.new_output("stream", name="stdout", text=text)


# --------------------------------------------------------------------------- sanitising
_TAGS = set(nh3.ALLOWED_TAGS) | {"section", "main", "center", "font"}
_TAGS -= {"area", "map"}
_ATTRS = {k: set(v) for k, v in nh3.ALLOWED_ATTRIBUTES.items()}
for _tag in _TAGS:
    _ATTRS.setdefault(_tag, set()).update({"class", "id", "title", "align", "style"})
_ATTRS["a"] |= {"name"}
_ATTRS["div"] |= {"data-mime-type"}
_ATTRS["img"] |= {"src", "alt", "width", "height"}
_STYLE = {"color", "background-color", "font-weight", "font-style", "font-family", "font-size",
          "text-align", "text-decoration", "vertical-align", "white-space", "width", "height",
          "max-width", "min-width", "margin", "margin-top", "margin-bottom", "margin-left",
          "margin-right", "padding", "padding-top", "padding-bottom", "padding-left",
          "padding-right", "border", "border-collapse", "display", "float"}
_DATA_IMAGE = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*$", re.I)


def _attribute_filter(tag, attr, value):
    if attr in ("href", "src", "cite") and value.strip().lower().startswith("data:"):
        return value if tag == "img" and attr == "src" and _DATA_IMAGE.match(value.strip()) else None
    return value


def sanitise_fragment(fragment: str) -> str:
    """nh3 with the allowlist the feedback page needs."""
    return nh3.clean(fragment, tags=_TAGS, attributes=_ATTRS, attribute_filter=_attribute_filter,
                     clean_content_tags={"script", "style", "noscript", "template", "iframe",
                                         "object", "embed", "textarea", "select"},
                     url_schemes={"http", "https", "mailto", "data"},
                     filter_style_properties=_STYLE, strip_comments=True)


def sanitise_notebook(nb):
    """A copy of `nb` whose outputs cannot run code when rendered: text/html and text/markdown
    outputs cleaned with nh3, JavaScript, SVG and widget outputs replaced by a note, attachments
    other than images dropped. (Raw HTML in a student's markdown cells is removed from the
    rendered page by sanitise_html.)"""
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        for o in c.get("outputs", []) if c.cell_type == "code" else []:
            data = o.get("data") if o.output_type in ("display_data", "execute_result") else None
            if not data:
                continue
            for mime in list(data):
                if mime in ("text/html", "text/markdown"):
                    data[mime] = sanitise_fragment(_join(data[mime]))
                elif mime in ("application/javascript", "text/javascript", "image/svg+xml") \
                        or mime.startswith("application/vnd.") or mime.endswith("+json") \
                        and mime != "application/json":
                    del data[mime]
                    data.setdefault("text/plain", f"[{mime} output removed from feedback]")
        for att in (c.get("attachments") or {}).values():
            for mime in list(att):
                if mime not in _IMAGE_MIMES:
                    del att[mime]
    return nb


def sanitise_html(page: str, formulas=frozenset()) -> str:
    """Sanitise a whole feedback page written by nbgrader: the head (the template's own CSS and
    MathJax) is kept with its <title> re-escaped; the body is cleaned with nh3, then the
    course's own `formulas` in its text are drawn as MathML (tfsgrade.mathml; a formula a
    student wrote stays text)."""
    low = page.lower()
    start = low.find("<body")
    if start < 0:
        return sanitise_fragment(page)
    open_end = page.find(">", start)
    end = low.rfind("</body>")
    if end < open_end:
        end = len(page)
    head = page[:start]
    head = re.sub(r"(<title>)(.*?)(</title>)",
                  lambda m: m.group(1) + html.escape(html.unescape(re.sub(r"<[^>]*>", "", m.group(2))))
                  + m.group(3), head, flags=re.S | re.I)
    body = sanitise_fragment(page[open_end + 1:end])
    if formulas:                                       # the course's equations, drawn offline
        body = _mathml.render(body, formulas)
    if WRAP not in head:
        head = re.sub(r"</head>", WRAP + "</head>", head, count=1, flags=re.I)
    return f"{head}<body>\n{body}\n</body>\n</html>\n"


# long lines of a check's message wrap inside their box instead of running past its edge
WRAP = ("<style>.jp-OutputArea-output pre, .output_area pre, pre { white-space: pre-wrap; "
        "overflow-wrap: anywhere; }</style>")


def add_verdicts(nb, verdicts: dict | None):
    """One verdict per graded test cell: the grade's (issue 29, point 11). Where the
    coordinator judged a cell ({grade_id: (passed, message)}), that verdict, which decides the
    score, replaces everything the notebook's own check left there: the in-kernel check ran on
    the public inputs and may show other expected values for the same label, and two "What
    differs" blocks for one cell leave the student to guess which counted. A failure stays an
    error output (the cell still reads as failed), with the message once."""
    if not verdicts:
        return nb
    nb = copy.deepcopy(nb)
    for c in nb.cells:
        gid = _meta(c).get("grade_id")
        if c.cell_type != "code" or gid not in verdicts:
            continue
        passed, message = verdicts[gid]
        own = next((o for o in c.get("outputs", []) if o.get("output_type") == "error"), None)
        if not passed and own is not None and own.get("ename") == "NotDone":
            continue          # the stub, as the notebook showed it: "not attempted" either way
        c.outputs = [_verdict_output(gid, passed, str(message)[:2000], own)]
    return nb


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _student_lines(own) -> list[str]:
    """From the notebook's own failure box: the student's line(s) it pointed at ("your code,
    Cell In[5], line 7, in softmax:" and the source line under it), nothing of its verdict."""
    if own is None:
        return []
    lines = _ANSI.sub("", "\n".join(own.get("traceback") or [])).splitlines()
    out = []
    for i, ln in enumerate(lines):
        if ln.strip().startswith("your code, "):
            out += [ln] + [x for x in lines[i + 1:i + 2] if x.startswith("      ")]
    return out


def _verdict_output(gid: str, passed: bool, message: str, own=None):
    import nbformat
    if passed:
        return _stream(f"\u2714 {gid}: graded by the independent check: passed\n")
    box = [f"\u2718 {gid}: graded by the independent check: failed"]
    box += [f"  {ln}" for ln in message.rstrip().splitlines()] + _student_lines(own)
    return nbformat.v4.new_output("error", ename="CheckFailed", evalue=message,
                                  traceback=["\n".join(box)])


def clean_feedback_notebook(nb, source=None, *, reveal_hidden: bool = False,
                            limit: int = LIMIT, verdicts: dict | None = None):
    """hide_hidden_tests, truncate_outputs, add_verdicts (the grade's verdict, alone, in each
    judged test cell) and sanitise_notebook, in that order."""
    nb = hide_hidden_tests(nb, source, reveal_hidden=reveal_hidden)
    nb = truncate_outputs(nb, limit=limit)
    nb = add_verdicts(nb, verdicts)
    return sanitise_notebook(nb)


# -- the feedback stage's two steps on a graded class (tfsgrade.grade, tfsgrade.outputs) ----

def clean_autograded(items, s) -> None:
    """Rewrite each graded submission's autograded notebook as the student may see it."""
    for a in s.names:
        src = course.notebook_path(s.course, "source", a)
        source = nbformat.read(src, as_version=4) if src.exists() else None
        for it in items:
            if it.assignment != a or it.status != "graded":
                continue
            path = course.notebook_path(s.course, "autograded", a, it.student)
            if path.exists():
                nb = nbformat.read(path, as_version=4)
                nbformat.write(clean_feedback_notebook(
                    nb, source, reveal_hidden=s.reveal_hidden, verdicts=it.verdicts), path)


def sanitise_page(html_path: Path, formulas=frozenset()) -> None:
    """A feedback page made safe for the instructor's browser (sanitise_html), in place."""
    page = Path(html_path).read_text(encoding="utf-8")
    Path(html_path).write_text(sanitise_html(page, formulas), encoding="utf-8")
