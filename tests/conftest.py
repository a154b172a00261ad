import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
os.environ.setdefault("MPLBACKEND", "Agg")

# Test lanes (markers registered in pyproject.toml; README "Tests: which lane when"):
#   make test-fast   -m "not slow and not nbgrader and not browser": under a minute
#   make test        everything, what CI runs
# A test file or test listed here gets its markers without editing the file; a test can also
# carry them itself (@pytest.mark.slow). Catalogue entries beyond the first mistake and the
# first variant of each exercise are marked slow in tests/test_catalogue.py.
LANES = {
    "test_grading_class.py": ("nbgrader", "slow"),  # nbgrader autograde on a fixture class
    "test_grading_roundtrip.py": ("nbgrader", "slow"),  # every notebook through nbgrader
    "test_grading_manual.py": ("nbgrader", "slow"),  # grade, score by hand, export
    "test_grading_damage.py": ("nbgrader", "slow"),  # a hostile class, graded twice
    "test_grading_cheats.py": ("nbgrader", "slow"),  # cheats beside honest students
    "test_grading_cluster.py": ("nbgrader", "slow"),  # LocalCluster vs dask scheduler + workers
    "test_grading_postgres.py": ("nbgrader", "slow"),  # a real PostgreSQL gradebook
    "test_grading_lms.py": ("nbgrader", "slow"),  # a Canvas zip and a roster, end to end
    "test_grading_stages.py::test_watchdog_caps_children_together_without_a_cgroup": ("slow",),
    "test_grading_stages.py::test_runner_isolates_a_kernel_death_unsandboxed": ("slow",),
    "test_grading_stages.py::test_generated_course_is_reused_only_for_the_same_inputs": ("nbgrader", "slow"),
    "test_grading_demos.py::test_the_runner_leaves_out_marked_cells_and_says_they_ran_nowhere": ("slow",),
    "test_scan.py::test_catalogue_raises_no_flag_except_real_shortcuts": ("slow",),  # ~25 s
    "test_lab.py": ("slow",),  # starts a JupyterLab server
    "test_notebooks.py::test_solution_executes_headless": ("slow",),  # runs every notebook
    "test_layout.py::test_generated_notebooks_are_current": ("nbgrader", "slow"),  # release
}


# `make test` runs two xdist workers. Each group of tests runs on one worker, so a module's
# (or the browser tests' session) fixtures are built once: a test's group is its file, except
# that the browser test files share one (one JupyterLab, one Chromium). Groups are handed out
# longest first as workers free up, so that no long group starts last while the other worker
# idles. (xdist's own --dist loadgroup cannot do this under pytest 9: it renames node ids,
# which pytest 9 no longer allows; the scheduler below is xdist's loadscope keyed by group.)
GROUPS_LONGEST_FIRST = ["browser", "test_grading_roundtrip.py", "test_grading_damage.py",
                        "test_grading_cluster.py", "test_grading_class.py", "class01_shared",
                        "class_trust", "test_catalogue.py", "test_specs.py", "test_scan.py",
                        "test_grading_postgres.py"]


SHARED = {"test_grading_cheats.py": "class01_shared", "test_grading_manual.py": "class01_shared"}


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
    for item in items:
        path = Path(str(item.fspath))
        if "browser" in path.relative_to(TESTS).parts[:-1]:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
        if path.name.startswith("test_trust_"):
            item.add_marker(pytest.mark.nbgrader)
            item.add_marker(pytest.mark.slow)
        for key in (path.name, f"{path.name}::{item.originalname or item.name}"):
            for mark in LANES.get(key, ()):
                item.add_marker(getattr(pytest.mark, mark))
    rank = {g: i for i, g in enumerate(GROUPS_LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(_group(it.nodeid), len(rank)))  # stable


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
