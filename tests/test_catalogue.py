"""COURSE_SPEC section 5: every catalogued mistake fails a graded test of its exercise, and the
first failing test (notebook order) has a message that points at it (one diagnosis per failing
exercise); every valid variant earns every point."""
import pytest

import catalogue
from catalogue import Mistake, check_mistake, check_variant, modules, run_exercise

MODS = modules()
MISTAKES = [(m.ASSIGNMENT, x) for m in MODS for x in m.MISTAKES]
VARIANTS = [(m.ASSIGNMENT, x) for m in MODS for x in m.VARIANTS]
EXERCISES = [(m.ASSIGNMENT, e) for m in MODS for e in m.EXERCISES]


def lanes(entries):
    """The first mistake (variant) of each exercise runs in every lane, `make test-fast`
    included; the others are marked slow and run in `make test`."""
    seen, out = set(), []
    for a, x in entries:
        key = (a, x.exercise)
        out.append(pytest.param(a, x, id=f"{a}:{x.exercise}:{x.description[:50]}",
                                marks=[pytest.mark.slow] if key in seen else []))
        seen.add(key)
    return out


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


@pytest.mark.parametrize("assignment,m", lanes(MISTAKES))
def test_mistake_is_caught(assignment, m):
    problem = check_mistake(assignment, m)
    assert problem is None, problem


@pytest.mark.parametrize("assignment,v", lanes(VARIANTS))
def test_variant_earns_full_marks(assignment, v):
    problem = check_variant(assignment, v)
    assert problem is None, problem


def test_first_failure_must_name_the_mistake(monkeypatch):
    """The runner's rule itself: a right diagnosis in a later cell does not excuse a first
    failing cell that says something else."""
    m = Mistake("softmax", "demo", r"whole tensor", "")
    wrong_first = [catalogue.TestResult("test_softmax_rows", False, "rows do not sum to 1", "", ""),
                   catalogue.TestResult("test_softmax_dim", False, "normalised over the whole tensor", "", "")]
    monkeypatch.setattr(catalogue, "run_exercise", lambda *a, **k: wrong_first)
    problem = check_mistake("01_attention", m)
    assert problem and "first failing test (test_softmax_rows)" in problem
    monkeypatch.setattr(catalogue, "run_exercise", lambda *a, **k: wrong_first[::-1])
    assert check_mistake("01_attention", m) is None
    monkeypatch.setattr(catalogue, "run_exercise",
                        lambda *a, **k: [catalogue.TestResult("test_softmax_rows", True, "", "", "")])
    assert "no graded test" in check_mistake("01_attention", m)


def test_the_kernel_lane_runs_without_the_notebooks_reference():
    """The catalogues' kernel lane is the student's kernel of a grading sandbox or a student
    bundle: the graded notebook's reference and every later one cannot be imported, and the
    checks still judge (from the stored expectations) and name the mistakes above."""
    import importlib
    import tfscratch.reference  # noqa: F401  (loaded before, as in a worker that ran other tests)
    with catalogue.without_reference("03_multihead"):
        for mod in ("multihead", "norm", "efficient_attention"):
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(f"tfscratch.reference.{mod}")
        import tfscratch.reference as R
        assert "make_causal_mask" in R.__all__ and "MultiHeadAttention" not in R.__all__
        assert not hasattr(R, "MultiHeadAttention")
    from tfscratch.reference import MultiHeadAttention  # noqa: F401  (back again outside)
    from tfscratch import reference as R           # the package attribute too, not the partial one
    assert hasattr(R, "Transformer") and "MultiHeadAttention" in R.__all__
