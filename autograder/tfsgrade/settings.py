"""One settings object for a grading run, built once: paths, the gradebook URL, limits,
sandbox on/off and where the work runs (a local Dask cluster or a scheduler's address).
Every stage reads it; nothing else builds paths or URLs."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    """What one task (one student's notebook) may use."""
    cell_timeout: int = 120        # seconds per cell before it is interrupted
    notebook_timeout: int = 900    # seconds of wall time for the whole notebook
    mem_gb: float = 6.0            # memory for the whole sandbox, children included
    max_procs: int = 256           # processes + threads in the sandbox
    cpu_s: int = 1800              # CPU seconds per process
    output_mb: float = 16.0        # executed notebook read back, and largest file written
    max_restarts: int = 3          # kernel restarts after a crash or an unstoppable cell


@dataclass(frozen=True)
class Settings:
    out: Path
    course: Path                   # OUT/course: the term's, kept from run to run
    tasks: Path                    # OUT/tasks: per-task results (the resume cache)
    db_url: str                    # the gradebook; SQLite in OUT/course by default
    names: tuple = ()              # assignments to grade (decided after intake)
    students: tuple = ()           # --student: regrade only these
    limits: Limits = field(default_factory=Limits)
    sandbox: bool = True
    scheduler: str | None = None   # tcp://host:8786, or None for a LocalCluster
    workers: int = 0               # LocalCluster workers (0: one per core)
    progress: bool | None = None   # None: only on a terminal
    reveal_hidden: bool = False    # feedback shows hidden tests' code (after the deadline)
    probe_seed: int | None = None  # a fixed seed for every task (--probe-seed: reproduction);
                                   # None: each task's own, from the secret (item_seed)
    probe_secret: Path | None = None  # the instructor's secret the seeds derive from (0600)
    probe_key: bytes = field(default=b"", repr=False, compare=False)   # its content
    run_demos: bool | tuple = False  # demonstration cells run too: for everyone, or these students
    roster: Path | None = None     # --roster: the class list (tfsgrade.lms.Roster)
    layout: str = "auto"           # --layout: folders, canvas, moodle, nbgrader (auto: detected)
    id_fields: tuple = ()          # --id-field: how the Canvas/Moodle files name students
    log: object = print

    @classmethod
    def build(cls, out, *, db_url=None, names=None, students=None, timeout=120,
              notebook_timeout=900, mem_gb=6.0, sandbox=True, scheduler=None, workers=0,
              progress=None, reveal_hidden=False, probe_seed=None, probe_secret=None,
              run_demos=False, roster=None, layout="auto", id_fields=(), log=print,
              **limits) -> "Settings":
        out = Path(out).resolve()
        course = out / "course"
        secret = Path(probe_secret).resolve() if probe_secret else out / SECRET_NAME
        if sandbox:
            _outside_sandbox(secret)
        return cls(out=out, course=course, tasks=out / "tasks",
                   db_url=db_url or f"sqlite:///{course / 'gradebook.db'}",
                   names=tuple(names or ()), students=tuple(students or ()),
                   limits=Limits(cell_timeout=int(timeout), notebook_timeout=int(notebook_timeout),
                                 mem_gb=float(mem_gb), **limits),
                   sandbox=bool(sandbox), scheduler=scheduler,
                   workers=int(workers or os.cpu_count() or 1), progress=progress,
                   reveal_hidden=bool(reveal_hidden),
                   probe_seed=None if probe_seed is None else int(probe_seed),
                   probe_secret=secret, probe_key=_secret(secret),
                   run_demos=run_demos if isinstance(run_demos, bool) else tuple(run_demos),
                   roster=Path(roster).resolve() if roster else None, layout=layout or "auto",
                   id_fields=tuple([id_fields] if isinstance(id_fields, str) else id_fields or ()),
                   log=log)

    def with_names(self, names) -> "Settings":
        from dataclasses import replace
        return replace(self, names=tuple(names))

    def runs_demos(self, student: str) -> bool:
        """Whether this student's demonstration cells run (tfsgrade.demos: by default the
        sandbox leaves out the unchanged ones nothing graded needs)."""
        return self.run_demos is True or (not isinstance(self.run_demos, bool) and student in self.run_demos)

    def fingerprint(self) -> str:
        """What, besides the notebook, changes a task's result (part of the cache key; the
        task's own seed is added by run._key)."""
        d = {"limits": asdict(self.limits), "sandbox": self.sandbox}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def item_seed(self, it) -> int:
        """The seed of the independent check's inputs for one submission: --probe-seed when
        given, else HMAC-SHA256(secret, student, assignment, the normalised notebook's bytes).
        One student cannot learn another's inputs, nor their own for a changed notebook, from
        anything a feedback shows; a regrade of the same bytes draws the same inputs."""
        if self.probe_seed is not None:
            return self.probe_seed
        return derive_seed(self.probe_key, it.student, it.assignment, it.notebook or b"")


SECRET_NAME = "probe_secret"


def derive_seed(key: bytes, student: str, assignment: str, notebook: bytes) -> int:
    msg = b"\0".join([b"tfs-probe-seed/1", student.encode(), assignment.encode(),
                      hashlib.sha256(notebook).digest()])
    return int.from_bytes(hmac.new(key, msg, hashlib.sha256).digest()[:8], "little") >> 1   # 63 bits


def _secret(path: Path) -> bytes:
    """The instructor's secret: read, or made once (32 random bytes, hex, mode 0600). It stays
    on the coordinator: neither a sandbox (which mounts no output folder) nor a worker sees it,
    only the seeds derived from it."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        import secrets
        path.parent.mkdir(parents=True, exist_ok=True)
        text = secrets.token_hex(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:          # another run made it first
            return _secret(path)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
    if len(text) < 16:
        raise SystemExit(f"the probe secret {path} is too short (at least 16 characters)")
    return text.encode()


def _outside_sandbox(path: Path) -> None:
    """Refuse a secret inside a folder that every sandbox mounts (the Python install, /etc,
    /usr, the course package): student code could read it there."""
    from .sandbox import _ro_paths
    p = str(path.resolve())
    for q in _ro_paths():
        if p == q or p.startswith(q.rstrip("/") + "/"):
            raise SystemExit(f"the probe secret {path} is inside {q}, which the grading sandbox "
                             "mounts: keep it elsewhere (--probe-secret FILE)")
