"""The mistake and valid-variant catalogues (COURSE_SPEC section 5) and their runner.

Each `nbNN_*.py` module here lists, for one notebook:
    ASSIGNMENT = "01_attention"              # optional: defaults to the module name less "nb"
    EXERCISES  = ["softmax", ...]            # optional: defaults to the manifest's exercises
    MISTAKES   = [Mistake(exercise, description, hint_regex, code), ...]
    VARIANTS   = [Variant(exercise, description, code), ...]

The runner executes the notebook's real cells from `solutions/<assignment>.ipynb` in order,
in one namespace: setup cells, every solution cell (the exercise under test replaced by the
catalogue's code), and that exercise's graded test cells. A mistake must fail at least one of
them, and the FIRST failing one (in notebook order) must say something matching its hint: one
diagnosis per failing exercise, the most specific first. A variant must pass all.

They run as they run in a student's kernel: the reference modules of this notebook and of every
later one cannot be imported (`without_reference`), as in the grading sandbox and a student
bundle (issue 26), so the checks judge from the stored expectations (tfscratch.specs.stored) and
the hidden parts of the test cells leave the verdict to the grader's independent check, which
tests/test_specs.py runs on the same catalogues.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import pkgutil
import re
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mistake:
    exercise: str
    description: str
    hint: str  # regex (case-insensitive) that a failing test's message must match
    code: str


@dataclass(frozen=True)
class Variant:
    exercise: str
    description: str
    code: str


@dataclass
class TestResult:
    grade_id: str
    passed: bool
    message: str
    stdout: str
    stderr: str


class _Absent:
    """A meta-path finder for which some modules do not exist (ModuleNotFoundError)."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@contextlib.contextmanager
def without_reference(assignment: str):
    """Inside: `tfscratch.reference` holds only the modules of the notebooks before
    `assignment`, as in its grading sandbox (tfsgrade.sandbox.course_package)."""
    import sys
    import tfscratch
    from tfsgrade import manifest
    course = manifest.load()
    n = course[assignment].number
    absent = _Absent(f"tfscratch.reference.{nb.module}" for nb in course if nb.module and nb.number >= n)
    ours = lambda k: k == "tfscratch.reference" or k.startswith("tfscratch.reference.")  # noqa: E731
    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    # `import tfscratch.reference` inside also binds the partial module as an attribute of the
    # package, which `from tfscratch import reference` reads before sys.modules: restore both
    bound = tfscratch.__dict__.get("reference")
    for k in saved:
        del sys.modules[k]
    sys.meta_path.insert(0, absent)
    try:
        yield
    finally:
        sys.meta_path.remove(absent)
        for k in [k for k in sys.modules if ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
        if bound is None:
            tfscratch.__dict__.pop("reference", None)
        else:
            tfscratch.reference = bound


def is_test_of(assignment: str, grade_id: str, exercise: str) -> bool:
    """Whether a test cell checks `exercise`, as its spec declares it (manifest.owners)."""
    from tfsgrade import manifest
    return manifest.owners(assignment).get(grade_id) == exercise


@lru_cache(maxsize=None)
def cells(assignment: str):
    nb = nbformat.read(REPO / "solutions" / f"{assignment}.ipynb", as_version=4)
    out = []
    for c in nb.cells:
        meta = c.metadata.get("nbgrader")
        if c.cell_type != "code" or not meta:
            continue
        gid = meta["grade_id"]
        if meta.get("solution"):
            kind = "solution"
        elif meta.get("grade"):
            kind = "test"
        elif gid.startswith("setup"):
            kind = "setup"
        else:
            continue
        out.append((kind, gid, _strip_magics(c.source)))
    return out


def _strip_magics(src: str) -> str:
    return "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))


def run_exercise(assignment: str, exercise: str, code: str | None = None,
                 fills: dict | None = None, sandboxed: bool = True) -> list[TestResult]:
    """Run the notebook's setup and solution cells, with `exercise` replaced by `code` (and
    any other solution cell named in `fills` by its code), and return the results of that
    exercise's graded test cells."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not sandboxed:      # the instructor's kernel: every reference importable
        return _run_exercise(assignment, exercise, code, fills, plt)
    with without_reference(assignment):
        return _run_exercise(assignment, exercise, code, fills, plt)


def _run_exercise(assignment, exercise, code, fills, plt) -> list[TestResult]:
    ns: dict = {"__name__": "__main__"}
    results = []
    found = False
    for kind, gid, src in cells(assignment):
        if kind == "setup":
            exec(compile(src, f"<{assignment}:{gid}>", "exec"), ns)
        elif kind == "solution":
            if fills and gid in fills:
                src = fills[gid]
            if gid == exercise:
                found = True
                src = code if code is not None else src
            try:
                exec(compile(src, f"<{assignment}:{gid}>", "exec"), ns)
            except Exception:  # a broken definition: its tests will report NameError etc.
                if gid != exercise:
                    raise
        elif kind == "test" and is_test_of(assignment, gid, exercise):
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    exec(compile(src, f"<{assignment}:{gid}>", "exec"), ns)
                results.append(TestResult(gid, True, "", out.getvalue(), err.getvalue()))
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {e}"
                if not str(e):
                    msg += "\n" + traceback.format_exc(limit=3)
                results.append(TestResult(gid, False, msg, out.getvalue(), err.getvalue()))
        plt.close("all")
    if not found:
        raise KeyError(f"{assignment} has no solution cell {exercise!r}")
    if not results:
        raise KeyError(f"{assignment} has no graded test cell for {exercise!r}")
    return results


def modules():
    """The catalogue modules; ASSIGNMENT defaults to the module name without `nb`
    (nb01_attention -> 01_attention) and EXERCISES to every exercise of that notebook in the
    course manifest (tfsgrade.manifest)."""
    from tfsgrade import manifest
    course = manifest.load()
    pkg = Path(__file__).parent
    mods = [importlib.import_module(f"{__name__}.{m.name}")
            for m in pkgutil.iter_modules([str(pkg)]) if m.name.startswith("nb")]
    for mod in mods:
        if not hasattr(mod, "ASSIGNMENT"):
            mod.ASSIGNMENT = mod.__name__.rpartition(".")[2][2:]
        if not hasattr(mod, "EXERCISES") and mod.ASSIGNMENT in course.names():
            mod.EXERCISES = [e.name for e in course[mod.ASSIGNMENT].exercises]
    return mods


def check_mistake(assignment: str, m: Mistake) -> str | None:
    """None when the mistake is caught with a pointing message, else why not."""
    res = run_exercise(assignment, m.exercise, m.code)
    failed = [r for r in res if not r.passed]
    if not failed:
        return f"no graded test of {m.exercise} failed for: {m.description}"
    # One diagnosis per failing exercise: the student reads the first failing test cell (in
    # notebook order) first, so that message must already name the mistake.
    if not re.search(m.hint, failed[0].message, re.I | re.S):
        msgs = "\n---\n".join(f"{r.grade_id}: {r.message}" for r in failed)
        later = any(re.search(m.hint, r.message, re.I | re.S) for r in failed[1:])
        return (f"the first failing test ({failed[0].grade_id}) does not match /{m.hint}/"
                f"{' (a later one does)' if later else ''} for: {m.description}\n{msgs}")
    return None


def check_variant(assignment: str, v: Variant) -> str | None:
    res = run_exercise(assignment, v.exercise, v.code)
    bad = [r for r in res if not r.passed or r.stderr]
    if bad:
        return "\n".join(f"{r.grade_id}: {r.message or 'wrote to stderr: ' + r.stderr}" for r in bad)
    return None


# ------------------------------------------------------------------ the independent check
SPEC_SEED = 20261126   # the run seed the catalogue tests use for the coordinator's probes


def namespace(assignment: str, exercise: str | None = None, code: str | None = None) -> dict:
    """The notebook's setup and solution cells executed in one namespace, with `exercise`
    replaced by `code`: what the probes of the grader see in a student's kernel."""
    import matplotlib
    matplotlib.use("Agg")
    ns: dict = {"__name__": "__main__"}
    for kind, gid, src in cells(assignment):
        if kind == "setup" or kind == "solution":
            if kind == "solution" and gid == exercise and code is not None:
                src = code
            try:
                exec(compile(src, f"<{assignment}:{gid}>", "exec"), ns)
            except Exception:  # noqa: BLE001 - a broken definition: its probes report it
                if kind == "setup" or gid != exercise:
                    raise
    return ns


def independent(assignment: str, exercise: str, code: str | None = None, seed: int = SPEC_SEED):
    """{grade_id: Verdict} of the coordinator's judgement of one exercise, run in-process
    (the grader runs the same plan in the sandbox and the same judgement outside it)."""
    return independent_run(assignment, exercise, code, seed)[2]


def independent_run(assignment: str, exercise: str, code: str | None = None, seed: int = SPEC_SEED):
    """(got, want, verdicts): the student's and the reference's captures on the coordinator's
    probes, and its judgement (tests/test_fair_credit.py reads the captures). Kept for the
    last few calls: test_specs and test_fair_credit judge each catalogued mistake one after the
    other (one xdist group, tests of one mistake side by side: conftest), so it runs once.
    Callers read the result and never change it."""
    return _independent_run(assignment, exercise, code, seed)


@lru_cache(maxsize=4)
def _independent_run(assignment: str, exercise: str, code: str | None, seed: int):
    from tfscratch.specs import engine
    ex = next(e for e in engine.specs_for(assignment) if e.name == exercise)
    ns = namespace(assignment, exercise, code)
    got, want = engine.student_run(ex, seed, ns), engine.reference_run(ex, seed)
    return got, want, engine.judge(ex, seed, got, want)


def shortcut_certain(assignment: str, exercise: str, code: str) -> bool:
    """Whether the grader's static scan zeroes this exercise for this code (a certain
    shortcut): the independent check need not catch what the scan already scores 0."""
    from tfsgrade import scan
    return exercise in scan.scan_code(code, exercise, assignment).zeroed()
