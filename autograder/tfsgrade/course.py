"""nbgrader course directories: made fresh for each release, kept for a term of grading runs.

We drive nbgrader's own apps (generate_assignment, autograde, generate_feedback, export) and
read its gradebook; this module only lays out the folders nbgrader expects and runs it.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

from .paths import CONFIG, NOTEBOOKS, REFERENCE, REPO, SOLUTIONS, SOURCES  # noqa: F401 (re-exported)


def assignments() -> list[str]:
    """Assignment ids: one per notebook source, named after it (the course manifest)."""
    from . import manifest
    if not SOURCES.is_dir():
        raise SystemExit(f"no course sources in {SOURCES}: run tfs-grade from the course repository, "
                         "or set TFS_COURSE to it (an installed wheel holds the code, not the course)")
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
# Grading run: the notebooks were executed in the sandbox (tfsgrade.sandbox_runner); nbgrader's
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
                timeout: int | None = None, executed_elsewhere: bool = False,
                extra: str = "") -> Path:
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
    cfg += extra
    (root / "nbgrader_config.py").write_text(cfg)
    for a in names:
        src = SOLUTIONS / f"{a}.ipynb"
        if not src.exists():
            raise FileNotFoundError(f"no solution notebook {src}")
        dst = notebook_path(root, "source", a)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return root


def _limit_memory(gb: float):
    def apply():
        if gb and gb > 0:
            lim = int(gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        os.setsid()
    return apply


def notebook_path(root: Path, folder: str, assignment: str, student: str | None = None,
                  suffix: str = ".ipynb") -> Path:
    """A notebook of an nbgrader course directory: `folder`/<assignment>/<assignment>.ipynb for
    source/ and release/, `folder`/<student>/<assignment>/<assignment>.ipynb for submitted/,
    autograded/ and the like (suffix ".html" for feedback/). The one place these paths are
    spelled."""
    base = Path(root) / folder / student if student is not None else Path(root) / folder
    return base / assignment / f"{assignment}{suffix}"


def students_in(root: Path, folder: str) -> set[str]:
    """The students who have a folder in `folder` (submitted/, autograded/, feedback/)."""
    return {p.name for p in (Path(root) / folder).glob("*") if p.is_dir()}


def run_nbgrader(root: Path, args: list[str], *, timeout: float | None = None,
                 mem_gb: float | None = None) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` in the course directory; never raises on a non-zero exit."""
    return _run(root, [sys.executable, "-c", NBGRADER, *args], timeout, mem_gb)


# The first line of every nbgrader process we start (tfsgrade/__init__.py says why).
NO_IRI = "import sys; sys.modules.setdefault('rfc3987_syntax', None)\n"
NBGRADER = NO_IRI + "from nbgrader.apps.nbgraderapp import main\nsys.argv[0] = 'nbgrader'\nsys.exit(main())\n"


def _run(root: Path, cmd: list, timeout: float | None, mem_gb: float | None) -> subprocess.CompletedProcess:
    """One nbgrader process in the course directory, memory-capped; a time-out is exit 124.
    Forked from the warm interpreter where there is one (tfsgrade.nbproc), else started."""
    from . import nbproc
    if cmd[:2] == [sys.executable, "-c"]:
        r = nbproc.run(root, cmd[2], cmd[3:], env=nbgrader_env(), timeout=timeout, mem_gb=mem_gb)
        if r is not None:
            return r
    try:
        return subprocess.run(cmd, cwd=root, env=nbgrader_env(), capture_output=True, text=True,
                              timeout=timeout, preexec_fn=_limit_memory(mem_gb or 0))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return subprocess.CompletedProcess(cmd, 124, out, err + f"\n[timed out after {timeout}s]")


EXPORT_AND_FEEDBACK = NO_IRI + """
import json
import sys
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.plugins import CsvExportPlugin
from traitlets.config.loader import PyFileConfigLoader
job = json.loads(sys.argv[1])
cfg = PyFileConfigLoader("nbgrader_config.py", path=".").load_config()
failed = False
if job.get("export"):
    plugin = CsvExportPlugin(config=cfg)
    plugin.to = job["export"]
    coursedir = CourseDirectory(config=cfg)
    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        plugin.export(gb)
if job.get("feedback"):
    cfg.CourseDirectory.student_id_exclude = ",".join(job.get("exclude", []))
    api = NbGraderAPI(CourseDirectory(config=cfg), config=cfg)
    r = api.generate_feedback("*", force=True)
    if not r["success"]:
        print("generate_feedback:", r.get("log", ""), r.get("error", ""))
        failed = True
sys.exit(1 if failed else 0)
"""


def export_and_feedback(root: Path, *, export: Path | None, feedback: bool, exclude=(),
                        timeout: float = 600, mem_gb: float | None = None) -> subprocess.CompletedProcess:
    """nbgrader's CSV export and generate_feedback ("*", all but `exclude`) in ONE process:
    importing nbgrader's apps costs about 3 s, paid once instead of twice. Never raises on a
    failure; the caller reads the return code and the output."""
    job = {"export": str(export) if export else None, "feedback": feedback, "exclude": sorted(exclude)}
    return _run(root, [sys.executable, "-c", EXPORT_AND_FEEDBACK, json.dumps(job)], timeout, mem_gb)


GENERATE = NO_IRI + """
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


def generate(root: Path, names: list[str], *, reuse: bool = False) -> None:
    """nbgrader generate_assignment for each assignment (also records it in the gradebook),
    through nbgrader's API in one process so that start-up is paid once.

    reuse=True (grading runs): when the gradebook is the course's own SQLite file, what
    nbgrader generated for the same solutions, config and nbgrader version is kept in the user's
    cache and copied (release/ and the fresh gradebook). Generating costs about 6 s however
    few notebooks (nbgrader's import, and `alembic heads` in a subprocess for a new gradebook);
    a copy costs milliseconds and gives the same files."""
    root = Path(root)
    db = root / "gradebook.db"
    key = _generate_key(root, names) if reuse and not db.exists() and _own_sqlite(root) else None
    hit = _cache_dir() / key if key else None
    if hit is not None and (hit / "gradebook.db").exists():
        shutil.copytree(hit / "release", root / "release", dirs_exist_ok=True)
        shutil.copyfile(hit / "gradebook.db", db)
        return
    r = subprocess.run([sys.executable, "-c", GENERATE, *names], cwd=root, env=nbgrader_env(),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment failed:\n{r.stdout}\n{r.stderr}")
    if hit is not None:
        _store(hit, root)


GENERATED_VERSION = "1"   # bump when what make_course writes changes in a way the key misses


def _own_sqlite(root: Path) -> bool:
    """The gradebook is the course's own SQLite file (made fresh with the course)."""
    url = "sqlite:///" + str(root.resolve() / "gradebook.db")
    return f"c.CourseDirectory.db_url = {url!r}" in (root / "nbgrader_config.py").read_text()


def _generate_key(root: Path, names: list[str]) -> str:
    import hashlib

    import nbgrader
    h = hashlib.sha256(f"{GENERATED_VERSION} {nbgrader.__version__} {sys.version_info[:2]}".encode())
    # the config without its paths, the cell timeout and the grading run's autograde settings
    # (generate_assignment executes nothing and autogrades nothing)
    cfg = (root / "nbgrader_config.py").read_text().replace(str(root.resolve()), "<ROOT>")
    cfg = cfg.replace(EXECUTED_ELSEWHERE, "")
    h.update("\n".join(x for x in cfg.splitlines() if not x.startswith("c.Execute.timeout")).encode())
    for a in names:
        h.update(f"\0{a}\0".encode() + notebook_path(root, "source", a).read_bytes())
    return h.hexdigest()[:24]


def _cache_dir() -> Path:
    base = os.environ.get("TFS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfsgrade")
    return Path(base) / "generated"


def _store(hit: Path, root: Path) -> None:
    """Write the entry beside its place and rename it in: a reader sees all of it or none."""
    import tempfile
    try:
        hit.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=hit.parent))
        shutil.copytree(root / "release", tmp / "release")
        shutil.copyfile(root / "gradebook.db", tmp / "gradebook.db")
        try:
            os.rename(tmp, hit)
        except OSError:                # another run stored it first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:                    # no writable cache: generate again next time
        pass
