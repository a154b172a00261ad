"""Issue 26, class 7: nothing a student wrote runs in the instructor's browser.

`xss_answer` hands in the course's solution code (it earns every autograded point) with
payloads wherever a student controls text that reaches a page: the free-text answer cell,
a markdown cell and a raw cell of its own (one with an SVG attachment), printed and displayed
outputs of a cell of its own (HTML, JavaScript, SVG, Markdown, LaTeX, a widget view, an image
whose metadata tries to break out of its attribute), cell tags, the notebook's title, widget
state and kernel name, and a string constant inside a solution cell (which reaches
similarity.html). Every payload carries the marker `tfsxss`.

Also here, for tests/test_sanitise.py and tests/test_trust_html.py: `PAYLOADS` (XSS filter
evasion variants after the OWASP cheat sheet, plus markdown-only ones) and `active(page)`, the
active content a browser would find in a page, read with a browser-grade HTML5 parser
(html5lib, as vendored by bleach, an nbconvert dependency).
"""
from __future__ import annotations

import base64
import collections
import re

import nbformat

from nbtools import manual_points, solution_sources, student_notebook

A01 = "01_attention"
MARK = "tfsxss"
STUDENT = "xss_answer"

# --------------------------------------------------------------------------- payloads
HTML_PAYLOADS = [
    "<script>alert('tfsxss')</script>",
    "<SCRIPT SRC=http://tfsxss.example/xss.js></SCRIPT>",
    "<IMG SRC=\"javascript:alert('tfsxss');\">",
    "<IMG SRC=JaVaScRiPt:alert('tfsxss')>",
    "<IMG SRC=`javascript:alert(\"tfsxss\")`>",
    "<a onmouseover=\"alert('tfsxss')\">xxs link</a>",
    "<IMG \"\"\"><SCRIPT>alert(\"tfsxss\")</SCRIPT>\">",
    "<IMG SRC=# onmouseover=\"alert('tfsxss')\">",
    "<IMG SRC= onmouseover=\"alert('tfsxss')\">",
    "<IMG SRC=/ onerror=\"alert('tfsxss')\"></img>",
    "<img src=x onerror=alert('tfsxss')>",
    "<img src=x onerror=\"&#0000106&#0000097&#0000118&#0000097&#0000115&#0000099&#0000114"
    "&#0000105&#0000112&#0000116&#0000058alert('tfsxss')\">",
    "<IMG SRC=&#106;&#97;&#118;&#97;&#115;&#99;&#114;&#105;&#112;&#116;&#58;alert('tfsxss')>",
    "<IMG SRC=&#x6A&#x61&#x76&#x61&#x73&#x63&#x72&#x69&#x70&#x74&#x3A;alert('tfsxss')>",
    "<IMG SRC=\"jav\tascript:alert('tfsxss');\">",
    "<IMG SRC=\"jav&#x09;ascript:alert('tfsxss');\">",
    "<IMG SRC=\"jav&#x0A;ascript:alert('tfsxss');\">",
    "<IMG SRC=\" &#14;  javascript:alert('tfsxss');\">",
    "<SCRIPT/XSS SRC=\"http://tfsxss.example/xss.js\"></SCRIPT>",
    "<BODY onload!#$%&()*~+-_.,:;?@[/|\\]^`=alert('tfsxss')>",
    "<<SCRIPT>alert('tfsxss');//\\<</SCRIPT>",
    "<SCRIPT SRC=http://tfsxss.example/xss.js?< B >",
    "<iframe src=http://tfsxss.example/scriptlet.html <",
    "</TITLE><SCRIPT>alert('tfsxss');</SCRIPT>",
    "<INPUT TYPE=\"IMAGE\" SRC=\"javascript:alert('tfsxss');\">",
    "<BODY BACKGROUND=\"javascript:alert('tfsxss')\">",
    "<STYLE>li {list-style-image: url(\"javascript:alert('tfsxss')\");}</STYLE><UL><LI>x</br>",
    "<svg/onload=alert('tfsxss')>",
    "<svg onload=\"alert('tfsxss')\"><circle r=1 /></svg>",
    "<BGSOUND SRC=\"javascript:alert('tfsxss');\">",
    "<LINK REL=\"stylesheet\" HREF=\"javascript:alert('tfsxss');\">",
    "<META HTTP-EQUIV=\"refresh\" CONTENT=\"0;url=javascript:alert('tfsxss');\">",
    "<META HTTP-EQUIV=\"refresh\" CONTENT=\"0;url=data:text/html;base64,PHNjcmlwdD50ZnN4c3M8L3NjcmlwdD4=\">",
    "<IFRAME SRC=\"javascript:alert('tfsxss');\"></IFRAME>",
    "<iframe srcdoc=\"<script>alert('tfsxss')</script>\"></iframe>",
    "<FRAMESET><FRAME SRC=\"javascript:alert('tfsxss');\"></FRAMESET>",
    "<TABLE BACKGROUND=\"javascript:alert('tfsxss')\">",
    "<DIV STYLE=\"background-image: url(javascript:alert('tfsxss'))\">x</DIV>",
    "<DIV STYLE=\"width: expression(alert('tfsxss'));\">x</DIV>",
    "<BASE HREF=\"javascript:alert('tfsxss');//\">",
    "<base href=\"https://tfsxss.example/\">",
    "<OBJECT TYPE=\"text/x-scriptlet\" DATA=\"http://tfsxss.example/scriptlet.html\"></OBJECT>",
    "<EMBED SRC=\"data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoJ3Rmc3hzcycpPjwvc3ZnPg==\">",
    "<a href=\"javascript:alert('tfsxss')\">x</a>",
    "<a href=\"&#x6A;avascript:alert('tfsxss')\">x</a>",
    "<a href=\" javascript:alert('tfsxss')\">x</a>",
    "<a href=\"data:text/html;base64,PHNjcmlwdD50ZnN4c3M8L3NjcmlwdD4=\">tfsxss</a>",
    "<a href=\"vbscript:msgbox('tfsxss')\">x</a>",
    "<form action=\"javascript:alert('tfsxss')\"><button>x</button></form>",
    "<button formaction=\"javascript:alert('tfsxss')\">x</button>",
    "<details open ontoggle=alert('tfsxss')>",
    "<video><source onerror=\"alert('tfsxss')\"></video>",
    "<audio src=x onerror=alert('tfsxss')>",
    "<marquee onstart=alert('tfsxss')>",
    "<math><mtext><table><mglyph><style><img src=x onerror=alert('tfsxss')>",
    "<noscript><p title=\"</noscript><img src=x onerror=alert('tfsxss')>\">",
    "<svg><a xlink:href=\"javascript:alert('tfsxss')\"><text x=20 y=20>x</text></a></svg>",
    "<!--<img src=\"--><img src=x onerror=alert('tfsxss')//\">",
    "<template><script>alert('tfsxss')</script></template>",
    "<object data=\"javascript:alert('tfsxss')\">",
    "<isindex action=javascript:alert('tfsxss') type=image>",
    "<xmp><p title=\"</xmp><img src=x onerror=alert('tfsxss')>\">",
    "<style>@import 'http://tfsxss.example/xss.css';</style>",
    "<span id=\"q_scale_dk\" class=\"score tabbable\">tfsxss clobber</span>",
    "<textarea><script>alert('tfsxss')</script></textarea>",
    "<img src=\"x` `<script>alert('tfsxss')</script>\"` `>",
    "<div style=\"position:fixed;top:0;left:0;width:100%;height:100%\">tfsxss overlay</div>",
]

MARKDOWN_PAYLOADS = [
    "[x](javascript:alert('tfsxss'))",
    "[x](JAVASCRIPT:alert('tfsxss'))",
    "[x](java&#115;cript:alert('tfsxss'))",
    "[x](&#x6A;avascript:alert('tfsxss'))",
    "[x](<javascript:alert('tfsxss')>)",
    "[x](  javascript:alert('tfsxss') \"title\")",
    "<javascript:alert('tfsxss')>",
    "[x][r]\n\n[r]: javascript:alert('tfsxss')",
    "![x](javascript:alert('tfsxss'))",
    "![x](data:text/html;base64,PHNjcmlwdD50ZnN4c3M8L3NjcmlwdD4=)",
    "[x](vbscript:msgbox('tfsxss'))",
    "[x](data:text/html,<script>alert('tfsxss')</script>)",
    "$\\href{javascript:alert('tfsxss')}{click}$",
    "$$\\unicode{<img src=x onerror=alert('tfsxss')>}$$",
    "> <script>\n> alert('tfsxss')\n> </script>",
    "- item <img src=x onerror=alert('tfsxss')>",
    "| a | b |\n|---|---|\n| <script>alert('tfsxss')</script> | <img src=x onerror=alert('tfsxss')> |",
    "```\n```\n<script>alert('tfsxss')</script>",
    "`code` <img src=x onerror=alert('tfsxss')> `more`",
    "<div>\n<script>alert('tfsxss')</script>\n</div>",
    # nbconvert pastes a mermaid block's text into the page unescaped
    "```mermaid\n<img src=x onerror=alert('tfsxss')>\n```",
    "```python\" onmouseover=\"alert('tfsxss')\nx = 1\n```",
    "<details open ontoggle=alert('tfsxss')>\n\n*x*\n\n</details>",
]
# an image of an attachment the cell does not have: nbconvert raises, the formgrader page fails
MISSING_ATTACHMENT = "![x](attachment:missing.png) tfsxss"

PAYLOADS = HTML_PAYLOADS + MARKDOWN_PAYLOADS

HONEST_ANSWER = (
    "Subtracting a constant $c$ multiplies top and bottom by $e^{-c}$, so $a<b$ still holds "
    "and $x_i - \\max_j x_j \\le 0$ keeps every $e^{x}$ at most 1.\n\n"
    "| x | softmax |\n|---|---|\n| 1 | 0.27 |\n\n"
    "```python\nsoftmax(x - x.max())\n```\n\n"
    "H<sub>2</sub>O and the <eos> token; see [the docs](https://pytorch.org/docs).")
HONEST_BITS = ["$a&lt;b$", "$x_i - \\max_j x_j \\le 0$", "<sub>2</sub>", "0.27",
               "softmax", "https://pytorch.org/docs", "multiplies top and bottom"]

# --------------------------------------------------------------------------- a browser's view
_ACTIVE_TAGS = {"script", "iframe", "frame", "frameset", "object", "embed", "applet", "base",
                "form", "meta", "link", "style", "template", "noscript", "xmp", "plaintext",
                "noembed", "noframes", "isindex", "bgsound", "portal", "fencedframe", "button",
                "input", "textarea", "select"}
_URL_ATTRS = {"href", "src", "action", "formaction", "data", "background", "dynsrc", "lowsrc",
              "poster", "codebase", "cite", "ping", "xlink:href", "{http://www.w3.org/1999/xlink}href"}
_SAFE_DATA = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,", re.I)


def _html5lib():
    """A browser-grade HTML5 parser: html5lib, or the copy bleach (an nbconvert dependency)
    vendors."""
    try:
        import html5lib
    except ImportError:
        from bleach._vendor import html5lib
    return html5lib


def _bad_url(v: str) -> bool:
    u = re.sub(r"[\x00-\x20\x7f-\x9f]+", "", v).lower()
    return u.startswith(("javascript:", "vbscript:", "livescript:")) or \
        (u.startswith("data:") and not _SAFE_DATA.match(u))


def active(page: str, *, fragment: bool = False) -> list[tuple[str, str]]:
    """What could run (or act) in a browser showing `page`: script-like elements, event
    handlers, javascript:/vbscript:/data: URLs, srcdoc, SVG or MathML, forms and inputs,
    meta refresh, CSS url()/expression(), MathJax links. [(kind, detail)] in document order."""
    html5lib = _html5lib()
    parse = html5lib.parseFragment if fragment else html5lib.parse
    doc = parse(page, namespaceHTMLElements=False)
    found = []
    for el in doc.iter():
        if not isinstance(el.tag, str):
            continue
        ns, _, name = el.tag.rpartition("}")
        name = name.lower()
        text = "".join(el.itertext())
        if ns:
            found.append(("foreign", f"<{name}> {text[:80]}"))
        elif name in _ACTIVE_TAGS and not (name == "meta" and set(el.attrib) <= {"charset"}):
            found.append((name, f"{sorted(el.attrib.items())} {text[:200]}"))
        for k, v in el.attrib.items():
            k = k.lower()
            if k.startswith("on"):
                found.append(("handler", f"<{name} {k}={v[:80]}>"))
            elif k == "srcdoc":
                found.append(("srcdoc", v[:80]))
            elif k in _URL_ATTRS and _bad_url(v):
                found.append(("url", f"<{name} {k}={v[:80]}>"))
            elif k == "style" and re.search(r"url\s*\(|expression\s*\(|position\s*:", v, re.I):
                found.append(("style", f"<{name} style={v[:80]}>"))
        if name not in ("pre", "code", "script", "style", "textarea") and \
                re.search(r"\\(href|url|unicode|require|class|cssId|style)\b", el.text or ""):
            found.append(("mathjax", (el.text or "")[:80]))
    return found


def ids(page: str) -> collections.Counter:
    """How many elements carry each id (the formgrader's script finds score inputs by id)."""
    doc = _html5lib().parse(page, namespaceHTMLElements=False)
    return collections.Counter(el.attrib["id"] for el in doc.iter()
                               if isinstance(el.tag, str) and "id" in el.attrib)


def marked(found) -> list:
    return [f for f in found if MARK in f[1].lower()]


# --------------------------------------------------------------------------- the student
def _png() -> str:
    """A valid one-pixel PNG, base64 (what matplotlib's inline backend sends, only smaller)."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


PNG = _png()

OUTPUT_CELL = f'''from IPython.display import display, HTML, Javascript, SVG, Markdown, Latex
payloads = {HTML_PAYLOADS!r}
print("\\n".join(payloads))
display(HTML("".join(payloads)))
display(Javascript("alert('tfsxss')"))
display(SVG("<svg xmlns='http://www.w3.org/2000/svg' onload=\\"alert('tfsxss')\\"><script>alert('tfsxss')</script></svg>"))
display(Markdown("[click](javascript:alert('tfsxss')) <img src=x onerror=alert('tfsxss')>"))
display(Latex("$\\\\href{{javascript:alert('tfsxss')}}{{x}}$"))
display({{"application/vnd.jupyter.widget-view+json": {{"model_id": "</script><script>alert('tfsxss')</script>", "version_major": 2, "version_minor": 0}},
         "text/plain": "a widget"}}, raw=True)
display({{"image/png": "{PNG}"}}, metadata={{"image/png": {{"width": "1 onerror=alert('tfsxss')", "height": 1}}}}, raw=True)
display({{"image/png": "AAAA\\" onerror=\\"alert('tfsxss')"}}, raw=True)
display({{"text/html": "<b>tfsxss isolated</b><script>alert('tfsxss')</script>"}}, metadata={{"text/html": {{"isolated": True}}}}, raw=True)
display({{"image/png": "{PNG}"}}, raw=True)
"payload <script>alert('tfsxss')</script>"
'''


def outputs():
    """What OUTPUT_CELL displays, as the kernel records it (for tests that execute nothing)."""
    out = nbformat.v4.new_output
    svg = ("<svg xmlns='http://www.w3.org/2000/svg' onload=\"alert('tfsxss')\">"
           "<script>alert('tfsxss')</script></svg>")
    return [
        out("stream", name="stdout", text="\n".join(HTML_PAYLOADS) + "\n"),
        out("display_data", data={"text/html": "".join(HTML_PAYLOADS), "text/plain": "<HTML>"}),
        out("display_data", data={"application/javascript": "alert('tfsxss')",
                                  "text/plain": "<Javascript>"}),
        out("display_data", data={"image/svg+xml": svg, "text/plain": "<SVG>"}),
        out("display_data", data={"text/markdown": "[click](javascript:alert('tfsxss')) "
                                                   "<img src=x onerror=alert('tfsxss')>",
                                  "text/plain": "<Markdown>"}),
        out("display_data", data={"text/latex": "$\\href{javascript:alert('tfsxss')}{x}$",
                                  "text/plain": "<Latex>"}),
        out("display_data", data={"application/vnd.jupyter.widget-view+json": {
            "model_id": "</script><script>alert('tfsxss')</script>", "version_major": 2,
            "version_minor": 0}, "text/plain": "a widget"}),
        out("display_data", data={"image/png": PNG},
            metadata={"image/png": {"width": "1 onerror=alert('tfsxss')", "height": 1}}),
        out("display_data", data={"image/png": "AAAA\" onerror=\"alert('tfsxss')"}),
        out("display_data", data={"text/html": "<b>tfsxss isolated</b><script>alert('tfsxss')</script>"},
            metadata={"text/html": {"isolated": True}}),
        out("display_data", data={"image/png": PNG}),
        out("execute_result", data={"text/plain": "\"payload <script>alert('tfsxss')</script>\""},
            execution_count=3),
    ]


def answer_cell_id() -> str:
    return sorted(manual_points(A01))[0]


def hostile_notebook(missing_attachment: bool = True):
    src = solution_sources(A01)
    # a string constant in a solution cell: similarity.html shows solution cells side by side
    first = next(iter(src))
    src[first] = f"_why = \"</pre><script>alert('tfsxss')</script>\"\n" + src[first]
    answer = HONEST_ANSWER + "\n\n" + "\n\n".join(
        PAYLOADS + [f"# {answer_cell_id()}\n\ntfsxss: a heading whose id is a grade input's"]
        + [MISSING_ATTACHMENT] * missing_attachment)
    nb = student_notebook(A01, dict(src, **{answer_cell_id(): answer}))
    extra_md = nbformat.v4.new_markdown_cell(
        "My own notes ![chart](attachment:chart.svg) ![ok](attachment:ok.png)\n\n" + "\n\n".join(HTML_PAYLOADS[:10]))
    svg = "<svg xmlns='http://www.w3.org/2000/svg' onload=\"alert('tfsxss')\"></svg>"
    extra_md["attachments"] = {"chart.svg": {"image/svg+xml": base64.b64encode(svg.encode()).decode()},
                               "ok.png": {"image/png": PNG}}
    extra_md.metadata["tags"] = ["\"><script>alert('tfsxss')</script>"]
    raw = nbformat.v4.new_raw_cell("<script>alert('tfsxss')</script><img src=x onerror=alert('tfsxss')>")
    raw_html = nbformat.v4.new_raw_cell("<iframe src=\"javascript:alert('tfsxss')\"></iframe>",
                                        metadata={"raw_mimetype": "text/html"})
    code = nbformat.v4.new_code_cell(OUTPUT_CELL)
    code.metadata["tags"] = ["</div><script>alert('tfsxss')</script>"]
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == answer_cell_id())
    nb.cells[at:at] = [extra_md, raw, raw_html, code]
    nb.metadata["title"] = "</title><script>alert('tfsxss')</script>"
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {"</script><script>alert('tfsxss')</script>": {}}, "version_major": 2, "version_minor": 0}}
    nb.metadata["kernelspec"]["display_name"] = "<img src=x onerror=alert('tfsxss')>"
    return nb


def students():
    return [(STUDENT, A01, hostile_notebook())]
