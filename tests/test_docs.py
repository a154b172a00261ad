"""The docs say true things about the code (issue 28): every backticked repository path and
every backticked `tfsgrade.*` / `tfscratch.*` name in README.md, helpers/README.md and docs/
exists. A rename that leaves a doc behind fails here."""
from __future__ import annotations

import importlib
import re

import pytest

from nbtools import REPO

DOCS = [REPO / "README.md", REPO / "helpers" / "README.md"] + sorted((REPO / "docs").glob("*.md"))
TOP = ("autograder", "helpers", "tests", "tools", "solutions", "notebooks", "docs", ".ci")
TICKS = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"^(tfsgrade|tfscratch)(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _paths(text):
    for t in TICKS.findall(text):
        t = t.strip().split()[0] if t.strip() else ""
        t = t.rstrip(".,:;)")
        if "/" in t and t.split("/")[0] in TOP and not any(c in t for c in "*<>{}$") \
                and not re.search(r"NN|\bX\b", t):       # a template: NN_name, nbNN_name
            yield t


def _names(text):
    for t in TICKS.findall(text):
        t = re.sub(r"\(.*$", "", t.strip())      # `tfsgrade.lms.convert(...)` -> the name
        if NAME.match(t):
            yield t


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):        # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for a in parts[i:]:
            if not hasattr(obj, a):
                return False
            obj = getattr(obj, a)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_backticked_paths_and_names_exist(doc):
    text = doc.read_text(encoding="utf-8")
    missing = sorted({p for p in _paths(text) if not (REPO / p).exists()})
    unknown = sorted({n for n in _names(text) if not _resolves(n)})
    assert not missing and not unknown, f"{doc.name}: paths {missing}; names {unknown}"


def test_the_readmes_counts_are_the_courses():
    """The README's counts of notebooks and points are the manifest's: a row that still says
    "8 notebooks" or "189/189" after notebooks were added fails here."""
    from tfsgrade import manifest
    m = manifest.load()
    n, auto = len(m.names()), sum(e.points for nb in m for e in nb.exercises)
    text = (REPO / "README.md").read_text(encoding="utf-8")
    said = {int(x) for x in re.findall(r"\b(?:all|x) (\d+) notebooks\b", text)}
    assert said == {n}, f"the README counts {sorted(said)} notebooks; the course has {n}"
    scores = set(re.findall(r"\| (\d+)/(\d+) \|", text))
    assert scores and all(int(a) == int(b) == auto for a, b in scores), (scores, auto)
    rows = [ln for ln in text.splitlines() if re.match(r"\| `\d\d_\w+` \|", ln)]
    assert len(rows) == n, f"the notebook table has {len(rows)} rows; the course has {n}"
