"""The trust class (issue 26): the honest fixtures graded beside every hostile case of
tests/hostile/trust_*.py keep their exact scores and carry no flag and no note."""
from nbtools import points


def test_honest_fixtures_keep_exact_scores_and_no_flags(class_trust):
    assert class_trust, "no tests/hostile/trust_*.py module adds a student"
    for a, run in class_trust.items():
        rows = run["rows"]
        full = sum(points(a).values())
        assert float(rows["honest"][a]) == full, (a, rows["honest"])
        assert rows["honest"]["flags"] == "" and rows["honest"]["status"] == "graded", (a, rows["honest"])
        assert float(rows["untouched"][a]) == 0, (a, rows["untouched"])
        assert rows["untouched"]["flags"] == "", (a, rows["untouched"])
