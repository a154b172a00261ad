"""Issue 26, classes 3 and 4, end to end (`tfs-grade grade`, sandbox on): a forbidden shortcut
reached by a name assembled at run time, in the calling thread, a pool's thread or a thread
waiting on a queue, and naive attention computed in another thread, each lose the points the
cheat would have earned (and no others), and the student's feedback says why. The cases are
in tests/hostile/trust_guard.py; tests/test_vm_guard.py proves the probe machine alone."""
import pytest
from hostile.trust_guard import EXPECT
from nbtools import points
from tfsgrade import manifest

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # the trust class


def _zeroed(assignment, names):
    """The graded cells of `names`: a cell's grade id, or an exercise (all its cells)."""
    owners = manifest.owners(assignment)
    return {g for g in points(assignment) for n in names if g == n or owners.get(g) == n}


def test_each_cheat_loses_its_exercises_points_and_says_why(class_trust):
    for (a, sid), (names, why) in EXPECT.items():
        row = class_trust[a]["rows"][sid]
        cells = points(a)
        lost = sum(cells[g] for g in _zeroed(a, names))
        assert lost > 0, (a, names)
        assert float(row[a]) == sum(cells.values()) - lost, (sid, row)
        page = (class_trust[a]["out"] / "feedback" / sid / f"{a}.html").read_text(encoding="utf-8")
        assert why is None or why in page, (sid, why)
