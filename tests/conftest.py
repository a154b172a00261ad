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
    "test_grading_stages.py::test_watchdog_caps_children_together_without_a_cgroup": ("slow",),
    "test_grading_stages.py::test_runner_isolates_a_kernel_death_unsandboxed": ("slow",),
    "test_scan.py::test_catalogue_raises_no_flag_except_real_shortcuts": ("slow",),  # ~25 s
    "test_lab.py": ("slow",),  # starts a JupyterLab server
    "test_notebooks.py::test_solution_executes_headless": ("slow",),  # runs every notebook
    "test_layout.py::test_generated_notebooks_are_current": ("nbgrader", "slow"),  # release
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if "browser" in path.relative_to(TESTS).parts[:-1]:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
        for key in (path.name, f"{path.name}::{item.originalname or item.name}"):
            for mark in LANES.get(key, ()):
                item.add_marker(getattr(pytest.mark, mark))
