"""nbgrader course directories: made fresh for each release or grading run.

We drive nbgrader's own apps (generate_assignment, autograde, generate_feedback, export) and
read its gradebook; this module only lays out the folders nbgrader expects and runs it.
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"
SOURCES = SOLUTIONS / "src"
CONFIG = REPO / "autograder" / "nbgrader_config.py"
REFERENCE = REPO / "helpers" / "tfscratch" / "reference"


def assignments() -> list[str]:
    """Assignment ids: one per notebook source, named after it (the course manifest)."""
    from . import manifest
    return manifest.load().names()


def nbgrader_env() -> dict:
    """nbgrader runs `alembic` and `jupyter` by name: put this interpreter's bin/ first."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


EXECUTED_ELSEWHERE = """
# Grading run: the notebooks were executed in the sandbox (tfsgrade.runner); nbgrader's
# own preprocessors still restore locked cells, score, and write the gradebook, but the
# outputs are kept (no ClearOutput) and nothing executes here (no Execute).
from nbgrader.preprocessors import (DeduplicateIds, OverwriteKernelspec, OverwriteCells,
    CheckCellMetadata, IgnorePattern, LimitOutput, SaveAutoGrades, AssignLatePenalties)
from nbconvert.preprocessors import ClearMetadataPreprocessor
from tfsgrade.merge import RanInSandbox
c.Autograde.sanitize_preprocessors = [DeduplicateIds, OverwriteKernelspec, OverwriteCells,
                                      CheckCellMetadata]
c.Autograde.autograde_preprocessors = [RanInSandbox, IgnorePattern, ClearMetadataPreprocessor,
                                       LimitOutput, SaveAutoGrades, AssignLatePenalties,
                                       CheckCellMetadata]
"""


def make_course(root: Path, names: list[str], *, db_url: str | None = None,
                timeout: int | None = None, executed_elsewhere: bool = False) -> Path:
    """Create an nbgrader course directory with source/<a>/<a>.ipynb for each assignment."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    cfg = CONFIG.read_text()
    cfg += (f"\nc.CourseDirectory.root = {str(root)!r}\nc.CourseDirectory.db_url = {db_url!r}\n"
            f"c.Exchange.root = {str(root / 'exchange')!r}\n")
    (root / "exchange").mkdir(exist_ok=True)
    if timeout:
        cfg += f"c.Execute.timeout = {int(timeout)}\n"
    if executed_elsewhere:
        cfg += EXECUTED_ELSEWHERE
    (root / "nbgrader_config.py").write_text(cfg)
    for a in names:
        src = SOLUTIONS / f"{a}.ipynb"
        if not src.exists():
            raise FileNotFoundError(f"no solution notebook {src}")
        dst = root / "source" / a
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst / f"{a}.ipynb")
    return root


def _limit_memory(gb: float):
    def apply():
        if gb and gb > 0:
            lim = int(gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        os.setsid()
    return apply


def run_nbgrader(root: Path, args: list[str], *, timeout: float | None = None,
                 mem_gb: float | None = None) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` in the course directory; never raises on a non-zero exit."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    try:
        return subprocess.run(cmd, cwd=root, env=nbgrader_env(), capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limit_memory(mem_gb or 0))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[timed out after {timeout}s]")


GENERATE = """
import sys
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from traitlets.config.loader import PyFileConfigLoader
cfg = PyFileConfigLoader("nbgrader_config.py", path=".").load_config()
api = NbGraderAPI(CourseDirectory(config=cfg), config=cfg)
for a in sys.argv[1:]:
    r = api.generate_assignment(a, force=True)
    if not r["success"]:
        print(r.get("log", ""), r.get("error", ""))
        sys.exit(1)
"""


def generate(root: Path, names: list[str]) -> None:
    """nbgrader generate_assignment for each assignment (also records it in the gradebook),
    through nbgrader's API in one process so that start-up is paid once."""
    r = subprocess.run([sys.executable, "-c", GENERATE, *names], cwd=root, env=nbgrader_env(),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment failed:\n{r.stdout}\n{r.stderr}")
