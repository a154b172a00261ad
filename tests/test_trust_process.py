"""The check in a process of its own, end to end (`tfs-grade grade`, sandbox on, one class):
code the scan cannot read, kernel handles taken early and helper processes earn nothing they
did not compute and, where the scan cannot read them, the submission's status is `review`
with the lines; processes an earlier cell left behind, a Colab notebook, torch.jit.script,
torch.compile(backend="eager") and float64 by default keep every point, status `graded` and
empty notes. The cases are in tests/hostile/trust_process.py."""
import pytest
from hostile.trust_process import A01, EXPECT, HONEST
from nbtools import points
from tfsgrade import manifest

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # the trust class


def _cells(names):
    owners = manifest.owners(A01)
    return {g for g in points(A01) for n in names if g == n or owners.get(g) == n}


def _page(class_trust, sid):
    return (class_trust[A01]["out"] / "feedback" / sid / f"{A01}.html").read_text(encoding="utf-8")


def test_hostile_code_earns_nothing_it_did_not_compute(class_trust):
    rows, cells = class_trust[A01]["rows"], points(A01)
    for sid, (zeroed, words, review) in EXPECT.items():
        row = rows[sid]
        if zeroed is None:      # falls back to its own naive softmax: that one's score exactly
            assert float(row[A01]) == float(rows["proc_naive"][A01]), (sid, row)
        elif zeroed == "any":   # the points are not the guard's to decide: review says so
            pass
        else:
            lost = sum(cells[g] for g in _cells(zeroed))
            assert float(row[A01]) == sum(cells.values()) - lost, (sid, row)
        if words:
            assert words in _page(class_trust, sid), (sid, words)
        if review:
            assert row["status"] == "review", (sid, row)
            assert "line" in row["notes"], (sid, row)


def test_honest_processes_and_environments_keep_every_point(class_trust):
    rows, full = class_trust[A01]["rows"], sum(points(A01).values())
    for sid in HONEST:
        row = rows[sid]
        assert float(row[A01]) == full, (sid, row)
        assert row["status"] == "graded" and row["notes"] == "", (sid, row)
