"""Fixtures for the browser tests: one JupyterLab (with an nbgrader course directory as its
working directory, so the formgrader has a course), one headless Chromium, one lab page, and a
cache that runs each notebook once and keeps it open while its tests look at it.

The notebooks are copied into test-artifacts/browser/run-<pid>/ (inside the lab's root) before
they are opened: running, Validate (which saves) and checkpoints never touch notebooks/ or
solutions/. Screenshots and timings stay in test-artifacts/browser/.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from labdriver import (ARTIFACTS, NOTEBOOKS, REPO, SHOTS, TIMINGS, Lab, LabServer,  # noqa: E402
                       find_chromium, launch_chromium)

# --------------------------------------------------------------------------- ordering

def pytest_collection_modifyitems(config, items):
    """Keep the tests of one notebook together (it is run once and kept open while they look
    at it), running first, nbgrader's Validate last; the self-test of the slider check goes
    first and the formgrader (which waits for the course directory) last."""
    here = Path(__file__).resolve().parent
    mine = [i for i, it in enumerate(items) if here in Path(str(it.fspath)).resolve().parents]
    order = {nb.id: k for k, nb in enumerate(NOTEBOOKS)}
    files = ["test_browser_explorer_check.py", "test_browser_notebooks.py", "test_browser_nbgrader.py"]

    def key(pos):
        it = items[pos]
        nb = getattr(it, "callspec", None) and it.callspec.params.get("nb")
        name = Path(str(it.fspath)).name
        rank = files.index(name) if name in files else len(files)
        if nb is None:
            return (0 if rank == 0 else 2, 0, rank, pos)
        return (1, order.get(str(nb), 0), rank, pos)

    ordered = [items[p] for p in sorted(mine, key=key)]
    for slot, it in zip(mine, ordered):
        items[slot] = it


# --------------------------------------------------------------------------- session fixtures

@pytest.fixture(scope="session")
def chromium():
    if os.environ.get("TFS_SKIP_BROWSER"):
        pytest.skip("browser tests skipped: TFS_SKIP_BROWSER is set")
    pytest.importorskip("playwright.sync_api",
                        reason="browser tests skipped: the playwright package is not installed "
                               "(pip install -e '.[test]')")
    exe = find_chromium()
    if not exe and os.environ.get("TFS_CHROMIUM"):
        pytest.skip(f"browser tests skipped: TFS_CHROMIUM={os.environ['TFS_CHROMIUM']} does not exist")
    if not exe:
        pytest.skip("browser tests skipped: no Chromium on PATH (run `python tools/ensure_browser.py` "
                    "as root, or `apt-get install chromium`, or set TFS_CHROMIUM=/path/to/chrome)")
    return exe


@pytest.fixture(scope="session")
def workdir(chromium):
    d = ARTIFACTS / f"run-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(SHOTS, ignore_errors=True)  # no stale screenshots from an earlier run
    d.mkdir(parents=True)
    for nb in NOTEBOOKS:
        dst = d / nb.id
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(nb.src, dst.with_suffix(".ipynb"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class CourseDir:
    """An instructor course directory made by the course's own command, `tfs-grade course`.
    It runs in the background (nbgrader's generate step takes a while); the lab needs only its
    nbgrader_config.py, which the command writes first; the formgrader test waits for the rest."""

    def __init__(self, path: Path):
        self.path = path
        self.t0 = time.monotonic()
        tfs = Path(sys.executable).parent / "tfs-grade"
        self.log = path.parent / "tfs-grade-course.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([str(tfs), "course", str(path)], cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.seconds = None
        threading.Thread(target=self._time, daemon=True).start()

    def _time(self):
        self.proc.wait()
        self.seconds = round(time.monotonic() - self.t0, 1)
        TIMINGS["session"]["course_dir_s"] = self.seconds

    def wait_config(self, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while not (self.path / "nbgrader_config.py").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.wait()
                raise AssertionError(f"tfs-grade course wrote no nbgrader_config.py in {self.path}")
            time.sleep(0.1)

    def wait(self, timeout: float = 600) -> Path:
        rc = self.proc.wait(timeout=timeout)
        assert rc == 0, f"tfs-grade course failed ({rc}):\n{self.log.read_text(errors='replace')[-3000:]}"
        return self.path


@pytest.fixture(scope="session")
def course(workdir):
    c = CourseDir(workdir / "course")
    yield c
    if c.proc.poll() is None:
        c.proc.kill()
        c.proc.wait()


@pytest.fixture(scope="session")
def course_dir(course) -> Path:
    return course.wait()


@pytest.fixture(scope="session")
def lab_server(workdir, course):
    # cwd = the course directory: nbgrader's formgrader and validator read nbgrader_config.py
    # from the server's working directory; the root is the repository, as with `make lab`.
    course.wait_config()
    server = LabServer(root_dir=REPO, cwd=course.path, workdir=workdir / "lab")
    server.start()
    TIMINGS["session"]["lab_start_s"] = round(server.start_seconds, 1)
    yield server
    t0 = time.monotonic()
    server.stop()
    TIMINGS["session"]["lab_stop_s"] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="session")
def browser(chromium):
    from playwright.sync_api import sync_playwright
    t0 = time.monotonic()
    pw = sync_playwright().start()
    b = launch_chromium(pw, chromium)
    TIMINGS["session"]["browser_start_s"] = round(time.monotonic() - t0, 1)
    yield b
    b.close()
    pw.stop()


@pytest.fixture(scope="session")
def lab(browser, lab_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    lab = Lab(page, lab_server).load()
    TIMINGS["session"]["lab_page_load_s"] = round(lab.load_seconds, 1)
    yield lab
    context.close()


# --------------------------------------------------------------------------- notebook runs

@dataclass
class Run:
    nb: object
    relpath: str
    notebook: object = None
    cells: list = field(default_factory=list)
    error: BaseException | None = None
    screenshot: Path | None = None
    shots: list = field(default_factory=list)  # every part of the whole-notebook screenshot
    timings: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)

    def where(self) -> str:
        return f"(screenshot: {self.screenshot}; all screenshots in {SHOTS})"


class Runs:
    """Runs a notebook the first time a test asks for it and keeps it open (one at a time).
    Once a notebook has run, the next one in `plan` is opened in a background tab so that
    its kernel is started and warm by the time the tests ask for it."""

    def __init__(self, lab: Lab, workdir: Path, plan: list[str]):
        self.lab = lab
        self.workdir = workdir
        self.plan = plan
        self.current: Run | None = None
        self.done: set[str] = set()

    def relpath(self, nb_id: str) -> str:
        return f"{self.workdir.relative_to(REPO)}/{nb_id}.ipynb"

    def get(self, nb, relpath: str | None = None) -> Run:
        relpath = relpath or self.relpath(nb.id)
        if self.current and self.current.relpath == relpath:
            run = self.current
        else:
            self.close()
            run = self.current = self._run(nb, relpath)
            self.done.add(str(nb))
            nxt = next((p for p in self.plan if p not in self.done), None)
            if nxt:
                t0 = time.monotonic()
                self.lab.prefetch(self.relpath(nxt))
                run.timings["prefetch_s"] = round(time.monotonic() - t0, 1)
        if run.error:
            raise AssertionError(f"{nb}: running the notebook in JupyterLab failed: {run.error} "
                                 f"{run.where()}") from run.error
        return run

    def _run(self, nb, relpath: str) -> Run:
        run = Run(nb, relpath)
        key = str(nb)
        t0 = time.monotonic()
        try:
            run.notebook = self.lab.open_notebook(relpath)
            t1 = time.monotonic()
            run.timings["open_s"] = round(t1 - t0, 1)
            rounds = run.notebook.run_all()
            t2 = time.monotonic()
            run.timings["run_all_s"] = round(t2 - t1, 1)
            run.timings["cells_run_after_error"] = rounds
            if rounds:
                run.timings["not_run_by_run_all"] = run.notebook.run_after_error_at
            if run.notebook.retried:
                run.timings["aborted_retried"] = run.notebook.retried
            run.cells = run.notebook.cells()
            run.timings["read_cells_s"] = round(time.monotonic() - t2, 1)
        except BaseException as e:  # noqa: BLE001 - reported by every test of this notebook
            run.error = e
        finally:
            run.screenshot = SHOTS / (key.replace("/", "__") + ".jpg")
            try:
                if run.notebook:
                    t3 = time.monotonic()
                    # the top of the notebook (a 16000 px picture of each costs about 40 s
                    # a run); TFS_BROWSER_FULL_SHOTS=1, or an error, photographs all of it
                    full = bool(os.environ.get("TFS_BROWSER_FULL_SHOTS")) or run.error is not None
                    run.shots = run.notebook.screenshot(run.screenshot, max_height=16000 if full else 5000,
                                                        first_only=not full)
                    run.timings["shot"] = run.notebook.shot_geometry
                    run.timings["screenshot_s"] = round(time.monotonic() - t3, 1)
            except Exception:  # noqa: BLE001
                run.screenshot = None
        TIMINGS["notebooks"][key] = run.timings
        return run

    def close(self):
        if self.current and self.current.notebook:
            t0 = time.monotonic()
            self.current.notebook.close()
            self.current.timings["close_s"] = round(time.monotonic() - t0, 1)
        self.current = None


@pytest.fixture(scope="session")
def runs(lab, workdir, request):
    plan = []  # the notebooks the selected tests will ask for, in order
    for item in request.session.items:
        nb = getattr(item, "callspec", None) and item.callspec.params.get("nb")
        if nb is not None and str(nb) not in plan:
            plan.append(str(nb))
    r = Runs(lab, workdir, plan)
    yield r
    r.close()


def pytest_terminal_summary(terminalreporter):
    if not (TIMINGS["session"] or TIMINGS["notebooks"]):
        return
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "timings.json").write_text(json.dumps(TIMINGS, indent=1))
    tr = terminalreporter
    tr.section("browser tests: seconds")
    tr.write_line("  " + ", ".join(f"{k}={v}" for k, v in TIMINGS["session"].items()))
    for nb, t in TIMINGS["notebooks"].items():
        tr.write_line(f"  {nb:40s} " + ", ".join(f"{k}={v}" for k, v in t.items()))
    tr.write_line(f"  screenshots: {SHOTS}   timings: {ARTIFACTS / 'timings.json'}")
