import os
import sys
from pathlib import Path

import pytest

import tfsgrade  # noqa: F401 - first: notebooks are read without the 1.2 s IRI checker (its __init__)

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
os.environ.setdefault("MPLBACKEND", "Agg")

# One pytest process grades dozens of classes: it keeps its two local Dask workers between
# runs instead of starting and closing them each time (about 10 s a run; tfsgrade.dispatch).
from tfsgrade import dispatch  # noqa: E402

dispatch.keep_workers()

# Test lanes: each test file says its own with markers (registered in pyproject.toml; README
# "Tests: which lane when"), as `pytestmark = [...]` or on a test:
#   slow, nbgrader, browser   left out of `make test-fast` (under a minute)
#   sandbox                   needs bubblewrap: skipped, with the reason, where it cannot start
#                             (checked once, when the first such test is set up, not at import)
# Catalogue entries beyond the first mistake and the first variant of each exercise are marked
# slow in tests/test_catalogue.py.


# `make test` runs two xdist workers. Each group of tests runs on one worker, so a module's
# (or the browser tests' session) fixtures are built once: a test's group is its file, except
# that the browser test files share one (one JupyterLab, one Chromium). Groups are handed out
# longest first as workers free up, so that no long group starts last while the other worker
# idles. (xdist's own --dist loadgroup cannot do this under pytest 9: it renames node ids,
# which pytest 9 no longer allows; the scheduler below is xdist's loadscope keyed by group.)
# (measured order tried at 2ea3525: the damage class then ran beside the trust class and its
# memory-cap fixture timed out under the load; this order passed at c132782)
GROUPS_LONGEST_FIRST = ["class_trust", "browser", "test_grading_roundtrip.py", "test_grading_damage.py",
                        "test_grading_cluster.py", "test_grading_class.py", "class01_shared",
                        "test_term.py", "test_scaffold.py", "test_catalogue.py", "test_specs.py",
                        "test_wheel.py", "test_scan.py", "test_grading_postgres.py"]


SHARED = {"test_grading_cheats.py": "class01_shared", "test_grading_manual.py": "class01_shared",
          # both judge every catalogued mistake with the coordinator's probes: one run each
          # (catalogue.independent_run keeps the last few), the tests of one mistake side by side
          "test_fair_credit.py": "test_specs.py"}
SIDE_BY_SIDE = {"test_specs.py"}


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if name.startswith("test_trust_"):      # every trust test file reads one graded class
        return "class_trust"
    return "browser" if "/browser/" in f"/{path}" else SHARED.get(name, name)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":   # make test-fast: xdist's per-test load
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _group(nodeid)

    config.option.loadscopereorder = False   # keep the order below, not "most tests first"
    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
    rank = {g: i for i, g in enumerate(GROUPS_LONGEST_FIRST)}

    def key(it):
        g = _group(it.nodeid)
        params = it.nodeid.partition("[")[2] if g in SIDE_BY_SIDE else ""
        return rank.get(g, len(rank)), params
    items.sort(key=key)  # stable: otherwise the files' own order


_GROUP_SECONDS: dict = {}   # what each group cost (setup, call and teardown of its tests)


def pytest_runtest_logreport(report):
    g = _group(report.nodeid)
    _GROUP_SECONDS[g] = _GROUP_SECONDS.get(g, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The longest groups and their seconds, so that GROUPS_LONGEST_FIRST can follow them."""
    top = sorted(_GROUP_SECONDS.items(), key=lambda kv: -kv[1])[:16]
    if top and len(_GROUP_SECONDS) > 1:
        terminalreporter.write_line("test groups by time (s): " + ", ".join(
            f"{g} {sec:.0f}" for g, sec in top))


_SANDBOX: list = []   # [None] when bubblewrap starts a sandbox here, else [the reason]


def pytest_runtest_setup(item):
    if item.get_closest_marker("sandbox") is None:
        return
    if not _SANDBOX:
        from tfsgrade.sandbox import SandboxUnavailable, check
        try:
            check()
            _SANDBOX.append(None)
        except SandboxUnavailable as e:
            _SANDBOX.append(str(e))
    if _SANDBOX[0] is not None:
        pytest.skip(f"no sandbox here: {_SANDBOX[0]}")


@pytest.fixture(scope="session")
def class01_shared(tmp_path_factory):
    """One graded class of 01 for test_grading_cheats (cheats beside honest students) and
    test_grading_manual (answers graded by hand, which it changes last): one grading run, not
    two. Both files are one xdist group (SHARED), so it is built once."""
    import test_grading_cheats
    import test_grading_manual
    from nbtools import A01
    from tfsgrade.grade import grade
    base = tmp_path_factory.mktemp("class01_shared")
    subs, out = base / "subs", base / "out"
    test_grading_cheats.students(subs)
    manual = test_grading_manual.students(subs)
    grade(subs, out, names=[A01], timeout=30, log=lambda *a: None)
    return {"out": out, "manual": manual}


def trust_modules():
    """tests/hostile/trust_*.py: each adds hostile students to the trust class (issue 26)."""
    import importlib
    import pkgutil
    return [importlib.import_module(f"hostile.{m.name}")
            for m in sorted(pkgutil.iter_modules([str(TESTS / "hostile")]), key=lambda m: m.name)
            if m.name.startswith("trust_")]


HONEST = ("honest", "untouched")     # in every notebook of the trust class


@pytest.fixture(scope="session")
def class_trust(tmp_path_factory):
    """The trust class (issue 26): one grading run per notebook that any
    tests/hostile/trust_*.py module adds students to, each beside two honest fixtures:
    "honest" (the course's solution) and "untouched" (the released notebook). A module's
    `students()` returns [(student id, assignment, notebook)]. Returns {assignment: {"out":
    folder, "rows": {student: grades.csv row}, "subs": folder}}. All test_trust_*.py files
    are one xdist group, so the class is graded once."""
    import csv
    from nbtools import solution_sources, student_notebook, write
    from tfsgrade.grade import grade
    base = tmp_path_factory.mktemp("class_trust")
    by_nb: dict = {}
    for mod in trust_modules():
        for sid, assignment, nb in mod.students():
            assert sid not in HONEST and sid not in by_nb.get(assignment, {}), sid
            by_nb.setdefault(assignment, {})[sid] = nb
    runs = {}
    for a, studs in sorted(by_nb.items()):
        subs, out = base / a / "subs", base / a / "out"
        write(student_notebook(a, solution_sources(a)), subs / "honest" / f"{a}.ipynb")
        write(student_notebook(a), subs / "untouched" / f"{a}.ipynb")
        for sid, nb in studs.items():
            write(nb, subs / sid / f"{a}.ipynb")
        grade(subs, out, names=[a], timeout=30, log=lambda *x: None)
        with (out / "grades.csv").open() as f:
            rows = {r["student_id"]: r for r in csv.DictReader(f)}
        runs[a] = {"out": out, "rows": rows, "subs": subs}
    return runs
