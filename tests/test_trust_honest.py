"""The trust class (issue 26): the honest fixtures graded beside every hostile case of
tests/hostile/trust_*.py keep their exact scores and carry no flag and no note (the honest
student hands in the course's solution verbatim, so the similarity report may name it: that
is a signal for review, not a finding against her code)."""
import pytest
from nbtools import points

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]   # the trust class


def _flags(row):
    return [f for f in row["flags"].split("; ") if f and "similar to" not in f]


def test_honest_fixtures_keep_exact_scores_and_no_flags(class_trust):
    assert class_trust, "no tests/hostile/trust_*.py module adds a student"
    for a, run in class_trust.items():
        rows = run["rows"]
        full = sum(points(a).values())
        assert float(rows["honest"][a]) == full, (a, rows["honest"])
        assert not _flags(rows["honest"]) and rows["honest"]["status"] == "graded", (a, rows["honest"])
        assert rows["honest"]["notes"] == "", (a, rows["honest"])
        assert float(rows["untouched"][a]) == 0, (a, rows["untouched"])
        assert not _flags(rows["untouched"]), (a, rows["untouched"])
