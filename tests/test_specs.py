"""The coordinator's verdict (issue 14): the exercise specs of `tfscratch.specs`, run as the
grader runs them (the probe plan on the student's object, the judgement against the reference)
but in-process. Every graded cell of a notebook with a spec is backed by a probe; the solution
passes every cell; every catalogued mistake fails at least one cell of its exercise (or is a
certain shortcut the scan scores 0); every valid variant passes every cell."""
import re

import pytest

import catalogue
from catalogue import independent, shortcut_certain
from nbtools import points
from test_catalogue import lanes
from tfscratch.specs import engine
from tfsgrade import manifest

SPECCED = [m for m in catalogue.modules() if engine.has_spec(m.ASSIGNMENT)]
MISTAKES = [(m.ASSIGNMENT, x) for m in SPECCED for x in m.MISTAKES]
VARIANTS = [(m.ASSIGNMENT, x) for m in SPECCED for x in m.VARIANTS]
EXERCISES = [(m.ASSIGNMENT, e) for m in SPECCED for e in m.EXERCISES]


@pytest.mark.parametrize("assignment", [m.ASSIGNMENT for m in SPECCED])
def test_every_graded_cell_is_backed_by_a_probe(assignment):
    graded = {g for g in points(assignment) if g.startswith("test_")}
    backed = {c for ex in engine.specs_for(assignment) for c in ex.cells()}
    assert graded - backed == set(), f"graded cells no probe backs: {sorted(graded - backed)}"
    assert backed - graded == set(), f"probes name cells that do not exist: {sorted(backed - graded)}"
    owners = manifest.owners(assignment)
    for ex in engine.specs_for(assignment):     # the notebook's cells are the spec's, in its order
        assert [g for g, e in owners.items() if e == ex.name] == [g.id for g in ex.graded], ex.name
        assert {g: p for g, p in points(assignment).items() if owners[g] == ex.name} \
            == {g.id: g.points for g in ex.graded}, ex.name


@pytest.mark.parametrize("assignment,exercise", EXERCISES, ids=[f"{a}:{e}" for a, e in EXERCISES])
def test_solution_passes_the_independent_check(assignment, exercise):
    for seed in (catalogue.SPEC_SEED, 7):
        bad = {g: v.message for g, v in independent(assignment, exercise, seed=seed).items()
               if not v.passed}
        assert not bad, f"seed {seed}: {bad}"


@pytest.mark.parametrize("assignment,m", lanes(MISTAKES))
def test_mistake_fails_the_independent_check(assignment, m):
    """Through the coordinator, on the grading run's inputs: the mistake fails a cell of its
    exercise, and the first failing cell (notebook order) names it, as in the kernel."""
    verdicts = independent(assignment, m.exercise, m.code)
    order = [gid for kind, gid, _ in catalogue.cells(assignment) if kind == "test"]
    failed = [(g, verdicts[g]) for g in order if g in verdicts and not verdicts[g].passed]
    if shortcut_certain(assignment, m.exercise, m.code):
        return   # the scan scores it 0 whatever the probes say
    assert failed, f"no cell of {m.exercise} fails the independent check for: {m.description}"
    gid, v = failed[0]
    assert re.search(m.hint, v.message, re.I | re.S), \
        f"{gid} fails but does not name /{m.hint}/ for: {m.description}\n{v.message}"


@pytest.mark.parametrize("assignment,v", lanes(VARIANTS))
def test_variant_passes_the_independent_check(assignment, v):
    bad = {g: x.message for g, x in independent(assignment, v.exercise, v.code).items()
           if not x.passed}
    assert not bad, f"{v.description}: {bad}"


def test_untouched_exercise_fails_every_cell_without_a_crash():
    verdicts = independent("01_attention", "softmax", "def softmax(x, dim=-1):\n    raise NotImplementedError()\n")
    assert verdicts and not any(v.passed for v in verdicts.values())
    assert all("not implemented yet" in v.message for v in verdicts.values())


def test_every_notebook_has_a_spec():
    """No graded cell is left to the student's kernel: every notebook of the course has its
    spec module (found by its ASSIGNMENT)."""
    from tfsgrade import manifest
    missing = [a for a in manifest.load().names() if not engine.has_spec(a)]
    assert not missing, f"notebooks without a spec in tfscratch/specs: {missing}"
