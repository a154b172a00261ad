"""Issue 26, classes 1 and 2, end to end: reaching for the graded notebook's reference (through
`chk`, `R`, or the package under another name) earns nothing in the sandbox; the student's
other exercises keep every point. The cases are in tests/hostile/trust_key.py."""
import pytest
from hostile.trust_key import EXPECT
from nbtools import exercise_points, points

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # the trust class


def _points(assignment, exercise):
    return exercise_points(assignment, exercise)


def test_the_reference_is_out_of_reach(class_trust):
    for (a, sid), zeroed in EXPECT.items():
        row = class_trust[a]["rows"][sid]
        full = sum(points(a).values())
        lost = sum(_points(a, e) for e in zeroed)
        assert float(row[a]) == full - lost, (sid, row)
