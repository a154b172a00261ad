"""The feedback page's equations, drawn offline: `$...$` and `$$...$$` in its text become
MathML, which every current browser draws by itself (no MathJax, no network).

nbgrader's feedback template loads MathJax from a CDN, so a student without the network, and
the formgrader on a machine without it, saw `$\\sqrt{d_k}$`. Here each formula of the page's
text (never inside <pre>, <code>, <script>, <style>, <textarea> or MathML already there) is
converted with latex2mathml and then cleaned with nh3 to the MathML presentation elements and
their layout attributes only (a converter follows `\\href`: a link is not kept). Only the
course's own formulas are drawn (`formulas_of` the source notebook's markdown): a student's
free-text answer is text of the page too, and stays text. A formula the converter cannot read
stays as it was written.
"""
from __future__ import annotations

import html
import re

# MathML presentation markup: elements and the attributes that only change the layout
TAGS = {"math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msub", "msup", "msubsup",
        "mfrac", "msqrt", "mroot", "mover", "munder", "munderover", "mtable", "mtr", "mtd",
        "mstyle", "mpadded", "mphantom", "menclose", "semantics", "annotation"}
ATTRIBUTES = {"math": {"xmlns", "display"},
              "*": {"mathvariant", "stretchy", "fence", "separator", "lspace", "rspace", "width",
                    "height", "depth", "accent", "accentunder", "displaystyle", "scriptlevel",
                    "columnalign", "rowspacing", "columnspacing", "notation", "linethickness",
                    "minsize", "maxsize", "movablelimits", "symmetric", "largeop", "form"}}
SKIP = {"pre", "code", "script", "style", "textarea", "math"}
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)[^>]*>")
_FORMULA = re.compile(r"\$\$(.+?)\$\$|(?<![\\$\w])\$(?!\s)([^$\n]+?)(?<!\s)\$(?![\w$])", re.S)


def formula(latex: str, block: bool = False) -> str | None:
    """One formula as cleaned MathML, or None where the converter cannot read it."""
    import nh3
    from latex2mathml.converter import convert
    try:
        out = convert(latex, display="block" if block else "inline")
    except Exception:  # noqa: BLE001 - a formula it cannot read stays as written
        return None
    return nh3.clean(out, tags=TAGS, attributes=ATTRIBUTES, link_rel=None)


def formulas_of(markdown_sources) -> frozenset:
    """The formulas written in these markdown texts (the course's own cells)."""
    return frozenset(m.group(1) if m.group(1) is not None else m.group(2)
                     for text in markdown_sources for m in _FORMULA.finditer(text))


def _text(segment: str, allowed) -> str:
    def one(m):
        block = m.group(1) is not None
        latex = html.unescape(m.group(1) if block else m.group(2))
        got = formula(latex, block) if latex in allowed else None
        return got if got is not None else m.group(0)
    return _FORMULA.sub(one, segment)


def render(page: str, allowed) -> str:
    """`page` (HTML) with the formulas of its text that are in `allowed` (the course's own,
    formulas_of) as MathML. A student's own formula stays text: MathML is foreign content to
    an HTML parser, and nothing a student wrote is let into it."""
    out, depth, at = [], 0, 0
    for m in _TAG.finditer(page):
        text = page[at:m.start()]
        out.append(_text(text, allowed) if depth == 0 and "$" in text else text)
        out.append(m.group(0))
        name = m.group(2).lower()
        if name in SKIP and not m.group(0).endswith("/>"):
            depth += -1 if m.group(1) else 1
            depth = max(depth, 0)
        at = m.end()
    tail = page[at:]
    out.append(_text(tail, allowed) if depth == 0 and "$" in tail else tail)
    return "".join(out)
