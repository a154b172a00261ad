"""Nothing a student wrote runs in the instructor's browser (issue 26, item 6).

nbgrader's formgrader renders each autograded notebook in the instructor's browser, on the
Jupyter server's own origin, with nbconvert's HTMLExporter and nbgrader's `formgrade`
template: markdown cells (free-text answers included) through `markdown2html` with raw HTML
passed through and `javascript:` links kept, code outputs by MIME type (text/html as is,
application/javascript inside <script>, widget views, ...). The formgrade template never calls
nbconvert's `clean_html` on markdown, so `HTMLExporter.sanitize_html` would not help there.
Hence the grader makes the notebook inert *before nbgrader sees it*: merge.py passes every
executed notebook through `notebook()` on its way into the course's submitted/ folder, from
which nbgrader derives autograded/ (what the formgrader shows) and feedback/. The feedback pages
are sanitised once more after nbgrader writes them (`page()`), and the grader's own pages
(report.html, similarity.html) escape everything they quote.

What `notebook()` keeps and changes (a copy; the input is not modified):

* markdown cells (and text/markdown outputs) are rendered with nbconvert's own parser
  (MarkdownWithMath + IPythonRenderer, as the formgrader does) and checked: every raw HTML tag
  the parser lets through must be one of a short list of formatting tags (b, i, sub, sup, br,
  table, div, span, font, a with an http(s)/mailto/relative href, img with an http(s) or
  base64-image source, ...) with a few plain attributes (align, color, width, colspan, alt,
  title), or an attribute-less name HTML does not know (`<eos>`, `<pad>`: inert); the whole
  rendered cell must hold only allowlisted tags and attributes, safe URLs (no javascript:,
  vbscript:, data: other than base64 images), properly nested elements, no TeX command that
  MathJax turns into a link, style or load (`\\href`, `\\style`, `\\require`, ...), and no element
  id the formgrader's script looks up (a grade id, `<id>-comment`, `statusmessage`, ...); and
  it must render at all (an image of a missing attachment makes nbconvert fail the page). A
  cell that passes is kept byte for byte (so nbgrader's checksum of an untouched answer still
  says "no response"); math (`$a<b$`), code, tables, lists, links and images all pass. A cell
  that fails is rewritten: its raw HTML, link/image syntax and headings become visible text
  (`<` as `&lt;`, `[` as `\\[`, `#` as `\\#`, outside code spans, fenced code and math; a
  fence's info string such as `mermaid`, whose text nbconvert pastes unescaped, moves into the
  block), and if that still does not pass, the whole cell is shown as one fenced code block.
  Either way the instructor reads what the student typed, nothing runs, and a note (the
  item's notes: grades.csv, the report) says which cell was changed and why.
* attachments keep PNG, JPEG and GIF images with valid base64 (SVG and everything else go).
* raw cells that nbconvert would paste into the page (no or an HTML MIME type) are cleaned
  with nh3 (the same allowlist as text/html outputs).
* code cells keep their source (nbconvert highlights and escapes it). Outputs keep stream and
  error text (escaped by nbconvert), text/plain, text/latex (escaped; MathJax is loaded with its
  Safe extension), PNG/JPEG/GIF images whose data is base64 (matplotlib plots survive),
  text/html cleaned with nh3 (no script, handler, javascript:, iframe, form, style, svg, id;
  classes only `dataframe` and the course's `tfs-*`; a few style properties), text/markdown
  checked as above (reduced to text/plain when it fails). Everything else (application/
  javascript, image/svg+xml, widget views, any other MIME type) is reduced to text/plain.
  Output metadata keeps only numeric image width/height (no `isolated` iframe, no filenames).
* execution counts are integers or nothing, cell ids match nbformat's pattern, stream names
  are stdout/stderr, cell metadata keeps only known keys (nbgrader's with checked types, tags,
  the grader's own `tfsgrade`), notebook metadata only kernelspec and language_info with
  plain-text values (no title, no widget state).

Entry points:
    notebook(nb) -> (clean copy, notes)        what merge writes into submitted/
    markdown(source, attachments=None, reserved=()) -> (source, note or None)
    markdown_problem(source, attachments=None, reserved=()) -> str or None
    html_fragment(html) -> str                 nh3 with the strict allowlist
    page(path)                                 sanitise a written feedback page in place
"""
from __future__ import annotations

import base64
import binascii
import copy
import functools
import html
import json
import re
from html.parser import HTMLParser

import nh3

# --------------------------------------------------------------------------- URLs
_CTRL = re.compile(r"[\x00-\x20\x7f-\x9f]+")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*):", re.I)
_B64 = re.compile(r"^[A-Za-z0-9+/=\s]*$")
_DATA_IMAGE = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp);base64,[A-Za-z0-9+/=\s]*$", re.I)
_IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif")


def safe_url(url: str, *, image: bool = False) -> bool:
    """http(s), mailto (links only), relative and #anchors; base64 raster images for images."""
    u = _CTRL.sub("", html.unescape(str(url)))
    m = _SCHEME.match(u)
    if not m:
        return True   # relative: resolved against the page's own origin, runs nothing
    scheme = m.group(1).lower()
    if scheme in ("http", "https"):
        return True
    if scheme == "mailto":
        return not image
    return image and bool(_DATA_IMAGE.match(u))


# --------------------------------------------------------------------------- raw HTML tags
# the formatting tags a markdown cell may carry as raw HTML, with their plain attributes
_RAW_TAGS = {"b", "i", "em", "strong", "u", "s", "strike", "del", "ins", "sub", "sup", "small",
             "big", "mark", "code", "kbd", "samp", "var", "tt", "pre", "blockquote", "p", "br",
             "hr", "wbr", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tfoot",
             "tr", "th", "td", "caption", "div", "span", "center", "h1", "h2", "h3", "h4", "h5",
             "h6", "details", "summary", "q", "cite", "abbr", "font", "img", "a", "figure",
             "figcaption"}
_VOID = {"br", "hr", "wbr", "img", "input", "col"}
# every element name HTML knows (current and obsolete, with the SVG and MathML roots): a name
# outside this list and without a hyphen (`<eos>`, `<pad>` in a tokenizer answer) is an inert
# unknown element when it has no attribute, and is allowed as such
_KNOWN = set("""a abbr acronym address applet area article aside audio b base basefont bdi bdo
bgsound big blink blockquote body br button canvas caption center cite code col colgroup data
datalist dd del details dfn dialog dir div dl dt em embed fencedframe fieldset figcaption figure
font footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html i iframe image img
input ins isindex kbd keygen label legend li link listing main map mark marquee math menu
menuitem meta meter multicol nav nextid nobr noembed noframes noscript object ol optgroup option
output p param picture plaintext portal pre progress q rb rp rt rtc ruby s samp script search
section select selectedcontent slot small source spacer span strike strong style sub summary sup
svg table tbody td template textarea tfoot th thead time title tr track tt u ul var video wbr
xmp""".split())




def _inert_unknown(tag: str, has_attrs: bool) -> bool:
    return not has_attrs and tag not in _KNOWN and "-" not in tag and ":" not in tag


_ALIGN = re.compile(r"^(left|right|center|justify|top|middle|bottom)$", re.I)
_NUM = re.compile(r"^\d{1,5}(%|px)?$")
_COLOR = re.compile(r"^#?[A-Za-z0-9]{1,20}$")
_PLAIN = re.compile(r"^[^<>&\"'`=]*$")
_URL_CHARS = re.compile(r"^[^<>&\"'`\s\\]*$")


def _attr_ok(tag: str, name: str, value: str | None) -> bool:
    v = "" if value is None else value
    if name == "align":
        return bool(_ALIGN.match(v))
    if name in ("width", "height", "colspan", "rowspan", "start", "border"):
        return bool(_NUM.match(v))
    if name == "color":
        return tag == "font" and bool(_COLOR.match(v))
    if name in ("alt", "title"):
        return bool(_PLAIN.match(v))
    if name == "href":
        return tag == "a" and bool(_URL_CHARS.match(v)) and safe_url(v)
    if name == "src":
        return tag == "img" and bool(_URL_CHARS.match(v)) and safe_url(v, image=True)
    return False


_RAW_TAG = re.compile(
    r"<(/?)([A-Za-z][A-Za-z0-9]*)"
    r"((?:\s+[A-Za-z][A-Za-z-]*(?:\s*=\s*(?:\"[^\"<>&`]*\"|'[^'<>&`]*'|[^\s\"'=<>`&]+))?)*)"
    r"\s*(/?)>")
_RAW_ATTR = re.compile(r"([A-Za-z][A-Za-z-]*)(?:\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'=<>`]+)))?")


def _raw_problem(raw: str) -> str | None:
    """Why a piece of raw HTML that the markdown parser passes through is not allowed."""
    pos = 0
    while True:
        at = raw.find("<", pos)
        if at < 0:
            return None
        m = _RAW_TAG.match(raw, at)
        if not m:
            return f"raw HTML {raw[at:at + 40]!r}"
        tag = m.group(2).lower()
        if _inert_unknown(tag, bool(m.group(3).strip())):
            pos = m.end()
            continue
        if tag not in _RAW_TAGS:
            return f"raw HTML tag <{tag}>"
        if m.group(1) and m.group(3).strip():
            return f"raw HTML end tag with attributes </{tag} ...>"
        for a in _RAW_ATTR.finditer(m.group(3)):
            name = a.group(1).lower()
            value = next((g for g in a.group(2, 3, 4) if g is not None), None)
            if not _attr_ok(tag, name, value):
                return f"raw HTML attribute {name}= on <{tag}>"
        pos = m.end()


# --------------------------------------------------------------------------- rendered markdown
_RENDER_TAGS = _RAW_TAGS | {"input"}
_TEXT_ALIGN = re.compile(r"^\s*text-align\s*:\s*(left|right|center)\s*;?\s*$", re.I)
_CLASS = re.compile(r"^[A-Za-z0-9_\- ]*$")
# what nbgrader's formgrade page and its script look up by id
_PAGE_IDS = {"notebook", "notebook-container", "statusmessage", "toc"}
# TeX that MathJax turns into links, styles, ids or extension loads (the page loads MathJax
# with its Safe extension; this keeps such math out of the page even without it)
_TEX_ACTIVE = re.compile(r"\\(href|url|style|class|cssId|require|unicode|data|html[A-Za-z]*|"
                         r"mmlToken|bbox|toggle|texttip|mathtip|action)(?![A-Za-z])")


class _Scan(HTMLParser):
    """Every element and attribute of a rendered fragment, checked against the allowlist."""

    def __init__(self, reserved):
        super().__init__(convert_charrefs=True)
        self.reserved, self.stack, self.problems = reserved, [], []

    def _tag(self, tag, attrs, closed):
        if _inert_unknown(tag, bool(attrs)):
            return
        if tag not in _RENDER_TAGS:
            self.problems.append(f"<{tag}>")
            return
        for name, value in attrs:
            v = "" if value is None else value
            if name == "id":
                ok = v.strip() not in self.reserved
            elif name == "class":
                ok = bool(_CLASS.match(v))
            elif name == "style":
                ok = tag in ("th", "td") and bool(_TEXT_ALIGN.match(v))
            elif name in ("type", "disabled", "checked"):
                ok = tag == "input" and (name != "type" or v == "checkbox")
            elif name == "href":
                ok = tag == "a" and safe_url(v)
            elif name == "src":
                ok = tag == "img" and safe_url(v, image=True)
            elif name in ("alt", "title"):
                ok = True   # attribute text, escaped by the parser that produced it
            else:
                ok = _attr_ok(tag, name, v)
            if not ok:
                self.problems.append(f"{name}= on <{tag}>")
        if tag not in _VOID and not closed:
            self.stack.append(tag)

    def handle_starttag(self, tag, attrs):
        self._tag(tag, attrs, False)

    def handle_startendtag(self, tag, attrs):
        self._tag(tag, attrs, True)

    def handle_endtag(self, tag):
        if tag in _VOID or _inert_unknown(tag, False):
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"unbalanced </{tag}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        # MathJax typesets text outside <pre> and <code>
        if "pre" not in self.stack and "code" not in self.stack and _TEX_ACTIVE.search(data):
            self.problems.append(f"TeX {_TEX_ACTIVE.search(data).group(0)}")

    def handle_comment(self, data):
        self.problems.append("an HTML comment")

    def handle_decl(self, decl):
        self.problems.append("an HTML declaration")

    def unknown_decl(self, data):
        self.problems.append("an HTML declaration")

    def handle_pi(self, data):
        self.problems.append("an HTML processing instruction")


def _reserved_ids(grade_ids) -> frozenset:
    out = set(_PAGE_IDS)
    for g in grade_ids:
        out |= {g, f"{g}-comment", f"{g}_extra_credit"}
    return frozenset(out)


def _render(source: str, attachments: dict | None, raw: list) -> str:
    """The cell as the formgrader renders it (nbconvert's markdown2html), recording the raw
    HTML the parser passes through."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class Recording(IPythonRenderer):
        def block_html(self, text):
            raw.append(text)
            return super().block_html(text)

        def inline_html(self, text):
            raw.append(text)
            return super().inline_html(text)

    return MarkdownWithMath(renderer=Recording(escape=False, attachments=attachments or {})).render(source)


@functools.lru_cache(maxsize=4096)
def _problem_cached(source: str, attachments_json: str, reserved: frozenset) -> str | None:
    raw: list = []
    try:
        out = _render(source, json.loads(attachments_json) if attachments_json else None, raw)
    except Exception as e:  # noqa: BLE001 - e.g. a missing attachment: the page would fail
        return f"the cell cannot be rendered ({type(e).__name__})"
    for r in raw:
        why = _raw_problem(r)
        if why:
            return why
    scan = _Scan(reserved)
    try:
        scan.feed(out)
        scan.close()
    except Exception as e:  # noqa: BLE001
        return f"unparsable HTML ({type(e).__name__})"
    if scan.problems:
        return scan.problems[0]
    if scan.stack:
        return f"unclosed <{scan.stack[-1]}>"
    return None


def markdown_problem(source: str, attachments: dict | None = None, reserved=()) -> str | None:
    """Why this markdown would put something active into the page, or None."""
    att = json.dumps(attachments, sort_keys=True) if attachments else ""
    return _problem_cached(str(source), att, frozenset(reserved))


_FENCE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})[^\n]*\n(?:.*?\n)??[ ]{0,3}\1[`~]*[ \t]*$", re.M | re.S)
_BLANK = re.compile(r"(\n[ \t]*\n)")
_TAGLIKE = re.compile(r"<(?=[A-Za-z/!?])")


@functools.lru_cache(maxsize=1)
def _inline_protected():
    """Code spans and nbconvert's own math delimiters (its regexes: what it renders as math)."""
    from nbconvert.filters.markdown_mistune import MathInlineParser
    math = [getattr(MathInlineParser, k) for k in ("BLOCK_MATH_TEX", "BLOCK_MATH_LATEX",
                                                   "INLINE_MATH_TEX", "INLINE_MATH_LATEX",
                                                   "LATEX_ENVIRONMENT") if hasattr(MathInlineParser, k)]
    return re.compile("|".join([r"(`+)(?:.+?)(?<!`)\1(?!`)"] + [f"(?:{p})" for p in math]), re.S)


def _defang(source: str) -> str:
    """Raw HTML, link syntax and MathJax's active commands as visible text; fenced code, code
    spans and math otherwise untouched (found within a paragraph, as the parser does)."""
    source = _TEX_ACTIVE.sub(lambda m: "\\\u200b" + m.group(0)[1:], source)
    out, pos = [], 0
    for f in _FENCE.finditer(source):
        out.append(_defang_blocks(source[pos:f.start()]))
        out.append(_plain_fence(f.group(0)))
        pos = f.end()
    out.append(_defang_blocks(source[pos:]))
    return "".join(out)


def _plain_fence(block: str) -> str:
    """A fenced block with a plain language name, or none: nbconvert pastes a `mermaid`
    block's text into the page as it is, and the info string becomes a class."""
    first, _, rest = block.partition("\n")
    m = re.match(r"^([ ]{0,3}(?:`{3,}|~{3,}))(.*)$", first)
    info = m.group(2).strip() if m else ""
    if m and info and (not re.match(r"^[A-Za-z0-9_+\-]{1,30}$", info) or info.startswith("mermaid")):
        first = m.group(1) + "\n" + info    # the info string shown as the block's first line
    return first + "\n" + rest


def _defang_blocks(text: str) -> str:
    out = []
    for k, chunk in enumerate(_BLANK.split(text)):
        if k % 2:             # a blank-line separator
            out.append(chunk)
            continue
        pos = 0
        for m in _inline_protected().finditer(chunk):
            out.append(_defang_text(chunk[pos:m.start()]))
            out.append(m.group(0))
            pos = m.end()
        out.append(_defang_text(chunk[pos:]))
    return "".join(out)


_HEADING = re.compile(r"^([ ]{0,3})(#{1,6}(?:[ \t]|$)|=+[ \t]*$|-+[ \t]*$)", re.M)


def _defang_text(text: str) -> str:
    text = _TAGLIKE.sub("&lt;", text)
    text = re.sub(r"(?<!\\)\[", r"\\[", text)
    # headings as text: their generated ids could shadow the formgrader's score inputs
    return _HEADING.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def _fence(source: str) -> str:
    longest = max((len(r) for r in re.findall(r"`+", source)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{source}\n{fence}"


NOT_SHOWN = "*[This cell could not be shown safely; its text is in the student's submission.]*"


def markdown(source: str, attachments: dict | None = None, reserved=()) -> tuple[str, str | None]:
    """(markdown safe to render, None) when unchanged, or (rewritten markdown, what was done)."""
    source = _text(source)
    why = markdown_problem(source, attachments, reserved)
    if why is None:
        return source, None
    defanged = _defang(source)
    if markdown_problem(defanged, attachments, reserved) is None:
        return defanged, f"its HTML and links are shown as text ({why})"
    fenced = _fence(source)
    if markdown_problem(fenced, None, reserved) is None:
        return fenced, f"it is shown as plain text ({why})"
    return NOT_SHOWN, f"it was removed ({why})"    # never seen: a fence always renders as text


# --------------------------------------------------------------------------- HTML outputs
_HTML_TAGS = (_RAW_TAGS | {"col", "colgroup", "section", "article", "header", "footer",
                           "figure", "ruby", "rt", "rp", "bdi", "bdo", "dfn", "time"})
_HTML_ATTRS = {t: {"title", "align", "style", "class"} for t in _HTML_TAGS}
_HTML_ATTRS["a"] |= {"href"}
_HTML_ATTRS["img"] |= {"src", "alt", "width", "height"}
for _t in ("td", "th"):
    _HTML_ATTRS[_t] |= {"colspan", "rowspan", "valign", "width"}
_HTML_ATTRS["table"] |= {"border", "cellpadding", "cellspacing", "width"}
_HTML_ATTRS["ol"] |= {"start"}
_HTML_ATTRS["font"] |= {"color"}
_HTML_ATTRS["col"] |= {"span", "width"}
_STYLE = {"color", "background-color", "font-weight", "font-style", "font-family", "font-size",
          "text-align", "text-decoration", "vertical-align", "white-space", "width", "max-width",
          "min-width", "padding", "padding-top", "padding-bottom", "padding-left",
          "padding-right", "margin", "margin-top", "margin-bottom", "margin-left", "margin-right",
          "border", "border-collapse", "border-bottom", "border-top", "border-spacing"}
_DROP_WITH_CONTENT = {"script", "style", "noscript", "template", "iframe", "object", "embed",
                      "textarea", "select", "title", "xmp", "noembed", "noframes", "svg", "math",
                      "frameset", "frame", "applet"}
_CLASS_TOKEN = re.compile(r"^(dataframe|tfs-[A-Za-z0-9_-]+)$")


_DECL_VALUE = re.compile(r"^[\w\s#%.,+\-]*$")


def _html_attr(tag, attr, value):
    if attr == "style":    # declarations with plain values only: no url(), expression(), escapes
        kept = [d.strip() for d in value.split(";")
                if ":" in d and _DECL_VALUE.match(d.split(":", 1)[1])]
        return "; ".join(kept) or None
    if attr == "class":
        kept = [t for t in value.split() if _CLASS_TOKEN.match(t)]
        return " ".join(kept) or None
    if attr == "href":
        return value if safe_url(value) else None
    if attr == "src":
        return value if safe_url(value, image=True) else None
    if attr in ("width", "height", "colspan", "rowspan", "span", "start", "border",
                "cellpadding", "cellspacing"):
        return value if _NUM.match(value.strip()) else None
    if attr in ("align", "valign"):
        return value if _ALIGN.match(value.strip()) else None
    if attr == "color":
        return value if _COLOR.match(value.strip()) else None
    return value


def html_fragment(fragment: str) -> str:
    """A student's HTML (a text/html output, a raw cell) with nothing active left: no script,
    event handler, javascript:/data: link, frame, form, style sheet, SVG or MathML, element id
    or name; formatting, tables (pandas), links and base64 images stay."""
    return nh3.clean(str(fragment), tags=_HTML_TAGS, clean_content_tags=_DROP_WITH_CONTENT,
                     attributes=_HTML_ATTRS, attribute_filter=_html_attr,
                     url_schemes={"http", "https", "mailto", "data"},
                     filter_style_properties=_STYLE, strip_comments=True)


# --------------------------------------------------------------------------- notebook
_KEEP_MIMES = ("text/plain", "text/html", "text/markdown", "text/latex") + _IMAGE_MIMES
_CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_GRADE_ID = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")
_SAFE_STR = re.compile(r"^[^<>&\"'`\x00-\x1f]{0,200}$")
_NBGRADER_TYPES = {"grade": bool, "solution": bool, "locked": bool, "task": bool,
                   "schema_version": int, "points": (int, float), "grade_id": str,
                   "checksum": str, "cell_type": str}
_CELL_META = ("nbgrader", "tags", "deletable", "editable", "collapsed", "scrolled", "jupyter",
              "tfsgrade", "tfsgrade_demo", "execution", "trusted")


def _text(v) -> str:
    if isinstance(v, list):
        return "".join(str(x) for x in v)
    return "" if v is None else str(v)


def _plain_json(v, depth=0):
    """Metadata values the templates never render as markup: plain strings, numbers, lists
    and dicts of those."""
    if depth > 4:
        return None
    if isinstance(v, bool) or v is None or isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        return v if _SAFE_STR.match(v) else None
    if isinstance(v, list):
        return [x for x in (_plain_json(x, depth + 1) for x in v[:50]) if x is not None]
    if isinstance(v, dict):
        out = {}
        for k, x in list(v.items())[:50]:
            x = _plain_json(x, depth + 1)
            if isinstance(k, str) and _SAFE_STR.match(k) and x is not None:
                out[k] = x
        return out
    return None


def _nbgrader_meta(m):
    """nbgrader's cell metadata with its known keys of the right types (the formgrade template
    pastes `grade_id` and `points` into the page), other plain values kept; None when a known
    key is malformed."""
    if not isinstance(m, dict):
        return None
    out = {}
    for k, v in m.items():
        want = _NBGRADER_TYPES.get(k)
        if want is None:
            v = _plain_json(v) if isinstance(k, str) and _SAFE_STR.match(k) else None
            if v is not None:
                out[k] = v
            continue
        if not isinstance(v, want) or (want is int and isinstance(v, bool)) \
                or (k == "points" and isinstance(v, bool)):
            return None
        if k == "grade_id" and not _GRADE_ID.match(v):
            return None
        if k in ("checksum", "cell_type") and not _SAFE_STR.match(v):
            return None
        out[k] = v
    return out


def _cell_metadata(meta, where, notes):
    meta = meta if isinstance(meta, dict) else {}
    out = {}
    own = [k for k in meta if isinstance(k, str) and k.startswith("tfsgrade") and k not in _CELL_META]
    for k in (*_CELL_META, *own):
        if k not in meta:
            continue
        v = meta[k]
        if k == "nbgrader":
            v = _nbgrader_meta(v)
            if v is None:
                notes.append(f"{where}: malformed nbgrader metadata removed")
                continue
        elif k == "tags":
            v = list(dict.fromkeys(t for t in v if isinstance(t, str) and _GRADE_ID.match(t))) \
                if isinstance(v, list) else None
        elif k in ("deletable", "editable", "collapsed", "trusted", "tfsgrade_demo"):
            v = v if isinstance(v, bool) else None
        elif k == "scrolled":
            v = v if isinstance(v, bool) or v == "auto" else None
        elif k == "jupyter":
            v = {a: b for a, b in v.items() if a in ("source_hidden", "outputs_hidden")
                 and isinstance(b, bool)} if isinstance(v, dict) else None
        elif k == "execution":
            v = {a: b for a, b in v.items() if isinstance(a, str) and isinstance(b, str)
                 and _SAFE_STR.match(a) and _SAFE_STR.match(b)} if isinstance(v, dict) else None
        else:   # the grader's own (tfsgrade, tfsgrade_*): plain values only, never rendered
            v = _plain_json(v)
        if v is not None:
            out[k] = v
    return out


def _plain_str(v) -> str:
    return re.sub(r"[<>&\"'`\x00-\x1f]", "", str(v))[:200]


def _nb_metadata(meta):
    """kernelspec and language_info with plain-text values; nothing else (no title, no widget
    state, no authors)."""
    meta = meta if isinstance(meta, dict) else {}
    out = {}
    ks = meta.get("kernelspec") if isinstance(meta.get("kernelspec"), dict) else {}
    out["kernelspec"] = {k: _plain_str(ks[k]) for k in ("name", "display_name", "language")
                         if isinstance(ks.get(k), str)}
    out["kernelspec"].setdefault("name", "python3")
    out["kernelspec"].setdefault("display_name", "Python 3")
    li = meta.get("language_info") if isinstance(meta.get("language_info"), dict) else {}
    info = {k: _plain_str(li[k]) for k in ("name", "version", "mimetype", "file_extension",
                                           "pygments_lexer", "nbconvert_exporter")
            if isinstance(li.get(k), str)}
    cm = li.get("codemirror_mode")
    if isinstance(cm, str):
        info["codemirror_mode"] = _plain_str(cm)
    elif isinstance(cm, dict):
        info["codemirror_mode"] = {k: (_plain_str(v) if isinstance(v, str) else v) for k, v in cm.items()
                                   if k in ("name", "version") and isinstance(v, (str, int))
                                   and not isinstance(v, bool)}
    info.setdefault("name", "python")
    out["language_info"] = info
    return out


def _image_ok(v) -> bool:
    s = _text(v)
    if not _B64.match(s):
        return False
    try:
        base64.b64decode("".join(s.split()), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _attachments(att, where, notes):
    if not isinstance(att, dict) or not att:
        return None
    out = {}
    for name, bundle in att.items():
        if not (isinstance(name, str) and re.match(r"^[\w.\- ]{1,200}$", name) and isinstance(bundle, dict)):
            notes.append(f"{where}: an attachment with an unusable name was removed")
            continue
        kept = {m: _text(d) for m, d in bundle.items() if m in _IMAGE_MIMES and _image_ok(d)}
        if len(kept) < len(bundle):
            notes.append(f"{where}: attachment {name!r} kept only its PNG/JPEG/GIF image "
                         f"(removed: {', '.join(sorted(set(bundle) - set(kept)))})")
        if kept:
            out[name] = kept
    return out


def _removed(mime) -> str:
    return f"[{mime} output removed by the grader: it could run in a browser]"


def _output(o, reserved):
    """One output made inert, or None to drop it."""
    if not isinstance(o, dict):
        return None
    kind = o.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": "stderr" if o.get("name") == "stderr" else "stdout",
                "text": _text(o.get("text"))}
    if kind == "error":
        tb = o.get("traceback")
        return {"output_type": "error", "ename": _text(o.get("ename")), "evalue": _text(o.get("evalue")),
                "traceback": [_text(x) for x in tb] if isinstance(tb, list) else []}
    if kind not in ("display_data", "execute_result"):
        return None
    data = o.get("data") if isinstance(o.get("data"), dict) else {}
    clean, dropped = {}, []
    for mime, v in data.items():
        if mime not in _KEEP_MIMES or (mime in _IMAGE_MIMES and not _image_ok(v)):
            dropped.append(str(mime))
        elif mime in ("text/html", "text/latex") and _TEX_ACTIVE.search(html.unescape(_text(v))):
            dropped.append(mime)     # MathJax would typeset a link, a style or a load
        elif mime == "text/html":
            clean[mime] = html_fragment(_text(v))
        elif mime == "text/markdown":
            if markdown_problem(_text(v), None, reserved) is None:
                clean[mime] = _text(v)
            else:
                dropped.append(mime)
                clean.setdefault("text/plain", _text(v))
        else:
            clean[mime] = _text(v)
    if dropped and "text/plain" not in clean:
        clean["text/plain"] = "\n".join(_removed(m) for m in dropped)
    meta = {}
    raw_meta = o.get("metadata") if isinstance(o.get("metadata"), dict) else {}
    for mime in _IMAGE_MIMES:
        m = raw_meta.get(mime)
        if mime in clean and isinstance(m, dict):
            dims = {k: m[k] for k in ("width", "height")
                    if isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool)}
            if dims:
                meta[mime] = dims
    out = {"output_type": kind, "data": clean, "metadata": meta}
    if kind == "execute_result":
        n = o.get("execution_count")
        out["execution_count"] = n if isinstance(n, int) and not isinstance(n, bool) else None
    return out


def _grade_id(c):
    m = c.get("metadata") if isinstance(c, dict) else None
    m = m.get("nbgrader") if isinstance(m, dict) else None
    g = m.get("grade_id") if isinstance(m, dict) else None
    return g if isinstance(g, str) and _GRADE_ID.match(g) else None


def _cell(c, i, reserved, notes):
    """One cell made inert (a plain dict)."""
    kind = c.get("cell_type") if isinstance(c, dict) else None
    c = c if isinstance(c, dict) else {}
    gid = _grade_id(c)
    where = f"cell {i + 1}" + (f" ({gid})" if gid else "")
    meta = _cell_metadata(c.get("metadata"), where, notes)
    source = _text(c.get("source"))
    if kind == "markdown":
        att = _attachments(c.get("attachments"), where, notes)
        new, why = markdown(source, att, reserved)
        if why:
            notes.append(f"{where}: {why}")
        cell = {"cell_type": "markdown", "metadata": meta, "source": new}
        if att:
            cell["attachments"] = att
        return cell
    if kind == "code":
        outs = c.get("outputs") if isinstance(c.get("outputs"), list) else []
        n = c.get("execution_count")
        return {"cell_type": "code", "metadata": meta, "source": source,
                "execution_count": n if isinstance(n, int) and not isinstance(n, bool) else None,
                "outputs": [o for o in (_output(o, reserved) for o in outs) if o is not None]}
    # a raw cell is pasted into the page as HTML when its MIME type is empty or HTML
    fmt = c.get("metadata", {}).get("raw_mimetype") if isinstance(c.get("metadata"), dict) else None
    if kind == "raw" and isinstance(fmt, str) and re.match(r"^[\w.+\-/]{1,100}$", fmt):
        meta["raw_mimetype"] = fmt
    if kind != "raw" or meta.get("raw_mimetype", "").lower() in ("", "text/html", "html"):
        cleaned = html_fragment(source) if re.search(r"[<&]", source) else source
        if kind != "raw":
            notes.append(f"{where}: a cell of unknown type {str(kind)[:40]!r} kept as a raw cell")
        elif cleaned != source:
            notes.append(f"{where}: raw cell cleaned of HTML that could run in a browser")
        source = cleaned
    return {"cell_type": "raw", "metadata": meta, "source": source}


def notebook(nb):
    """(a copy of `nb` that renders inert in nbconvert's and nbgrader's templates, notes for
    the instructor about what was changed in text the student wrote). Never raises on a
    malformed cell: what cannot be checked is emptied, with a note."""
    import nbformat
    cells_in = nb.get("cells") if isinstance(nb.get("cells"), list) else []
    found: list[str] = []
    reserved = _reserved_ids(g for g in (_grade_id(c) for c in cells_in) if g)
    cells, seen = [], set()
    for i, c in enumerate(cells_in):
        try:
            cell = _cell(c, i, reserved, found)
        except Exception as e:  # noqa: BLE001 - a cell this module cannot read: shown empty
            found.append(f"cell {i + 1}: could not be checked ({type(e).__name__}); emptied")
            cell = {"cell_type": "raw", "metadata": {}, "source": ""}
        cid = c.get("id") if isinstance(c, dict) else None
        if not (isinstance(cid, str) and _CELL_ID.match(cid)) or cid in seen:
            cid = f"tfs-cell-{i}"
        seen.add(cid)
        cell["id"] = cid
        cells.append(cell)
    minor = nb.get("nbformat_minor")
    out = nbformat.from_dict({"nbformat": 4,
                              "nbformat_minor": max(minor, 5) if isinstance(minor, int) else 5,
                              "metadata": _nb_metadata(nb.get("metadata")), "cells": cells})
    # the notes quote what was found; they go into grades.csv and report.md as they are
    return out, [n.replace("<", "\u2039").replace(">", "\u203a") for n in found]
