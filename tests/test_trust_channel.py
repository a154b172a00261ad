"""Issue 26, classes 5, 6 and 8, end to end in the trust class (tests/hostile/trust_channel.py):
honest code keeps its marks whatever it names and wherever its helpers are; the kernel's
history never shows the hidden tests or the check's plan; a forged capture or a decompression
bomb written to the check's own channel flags the item, never counts, and never ends the class
run."""
import pytest
import nbformat

from hostile.trust_channel import A01, SECRET_TEXT
from nbtools import points
from tfsgrade.verdict import FORGED

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # the trust class


def _strings(obj):
    """Every string in a JSON-like structure (outputs: texts, data, tracebacks)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def _full():
    return sum(points(A01).values())


def _pts(prefix):
    return sum(p for g, p in points(A01).items() if g.startswith(prefix))


def test_honest_code_keeps_its_marks(class_trust):
    """8: a helper defined below the solution cell; `from torch import *`, `from numpy import *`
    and print, max, sum, exec, globals rebound above every exercise: full marks, no flag."""
    rows = class_trust[A01]["rows"]
    for sid in ("chan_helper", "chan_shadow", "chan_history"):
        assert float(rows[sid][A01]) == _full(), rows[sid]
        assert rows[sid]["flags"] == "" and rows[sid]["status"] == "graded", rows[sid]


def test_history_shows_neither_hidden_tests_nor_the_plan(class_trust):
    """5: a last cell printing In, _ih, Out, _oh, %history and the cells in linecache: what it
    printed is in the executed notebook and the feedback, with no hidden test and no plan."""
    run = class_trust[A01]
    auto = run["out"] / "course" / "autograded" / "chan_history" / A01 / f"{A01}.ipynb"
    nb = nbformat.read(auto, as_version=4)
    printed = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    assert "_ih:" in printed and "def softmax" in printed, printed[:500]
    outputs = "\n".join(_strings([c.get("outputs", []) for c in nb.cells]))
    feedback = (run["out"] / "feedback" / "chan_history" / f"{A01}.html").read_text()
    for text in SECRET_TEXT:
        assert text not in outputs, text
        assert text not in feedback, text
    # the prompt numbers the student sees: one per executed cell, increasing
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"
              and c.get("execution_count") is not None]
    assert counts == sorted(set(counts)), counts


def test_forged_captures_are_flagged_and_never_count(class_trust):
    """6: wrong softmax that writes captures of the right answer to the check's own channel,
    ahead of the probe's own: flagged, and the forged captures earn nothing (softmax's
    large-logit check fails as the code does); its frame walk puts it to review."""
    row = class_trust[A01]["rows"]["chan_forge"]
    assert FORGED in row["flags"], row
    assert row["status"] == "review"
    assert float(row[A01]) <= _full() - _pts("test_softmax_stable"), row


def test_a_decompression_bomb_is_refused_before_it_is_opened(class_trust):
    """6: 512 MB of zeros in a 0.7 MB capture, written to the check's channel while the probe
    runs: refused on its declared size, the item flagged, the class graded."""
    rows = class_trust[A01]["rows"]
    row = rows["chan_bomb"]
    assert "too large to judge" in row["flags"] and FORGED in row["flags"], row
    assert row["status"] == "review" and float(row[A01]) >= _pts("test_softmax"), row
    assert all(r["status"] in ("graded", "review") for r in rows.values()), rows   # none flagged
