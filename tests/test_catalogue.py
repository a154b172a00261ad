"""COURSE_SPEC section 5: every catalogued mistake fails a graded test of its exercise with a
message that points at it; every valid variant earns every point."""
import pytest

from catalogue import check_mistake, check_variant, modules, run_exercise

MODS = modules()
MISTAKES = [(m.ASSIGNMENT, x) for m in MODS for x in m.MISTAKES]
VARIANTS = [(m.ASSIGNMENT, x) for m in MODS for x in m.VARIANTS]
EXERCISES = [(m.ASSIGNMENT, e) for m in MODS for e in m.EXERCISES]


@pytest.mark.parametrize("assignment,exercise", EXERCISES, ids=[f"{a}:{e}" for a, e in EXERCISES])
def test_catalogue_size_and_solution(assignment, exercise):
    mod = next(m for m in MODS if m.ASSIGNMENT == assignment)
    n_m = sum(x.exercise == exercise for x in mod.MISTAKES)
    n_v = sum(x.exercise == exercise for x in mod.VARIANTS)
    assert n_m >= 6, f"{assignment}:{exercise} has {n_m} catalogued mistakes; need 6"
    assert n_v >= 3, f"{assignment}:{exercise} has {n_v} valid variants; need 3"
    res = run_exercise(assignment, exercise)
    bad = [f"{r.grade_id}: {r.message or r.stderr}" for r in res if not r.passed or r.stderr]
    assert not bad, "the solution itself fails its tests:\n" + "\n".join(bad)


@pytest.mark.parametrize("assignment,m", MISTAKES,
                         ids=[f"{a}:{m.exercise}:{m.description[:50]}" for a, m in MISTAKES])
def test_mistake_is_caught(assignment, m):
    problem = check_mistake(assignment, m)
    assert problem is None, problem


@pytest.mark.parametrize("assignment,v", VARIANTS,
                         ids=[f"{a}:{v.exercise}:{v.description[:50]}" for a, v in VARIANTS])
def test_variant_earns_full_marks(assignment, v):
    problem = check_variant(assignment, v)
    assert problem is None, problem
