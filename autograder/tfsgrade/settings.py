"""One settings object for a grading run, built once: paths, the gradebook URL, limits,
sandbox on/off and where the work runs (a local Dask cluster or a scheduler's address).
Every stage reads it; nothing else builds paths or URLs."""
from __future__ import annotations

import hashlib
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
    course: Path                   # OUT/course: made fresh every run
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
    probe_seed: int = 0            # the independent check's inputs (OUT/probe_seed.txt)
    run_demos: bool | tuple = False  # demonstration cells run too: for everyone, or these students
    log: object = print

    @classmethod
    def build(cls, out, *, db_url=None, names=None, students=None, timeout=120,
              notebook_timeout=900, mem_gb=6.0, sandbox=True, scheduler=None, workers=0,
              progress=None, reveal_hidden=False, probe_seed=None, run_demos=False, log=print,
              **limits) -> "Settings":
        out = Path(out).resolve()
        course = out / "course"
        return cls(out=out, course=course, tasks=out / "tasks",
                   db_url=db_url or f"sqlite:///{course / 'gradebook.db'}",
                   names=tuple(names or ()), students=tuple(students or ()),
                   limits=Limits(cell_timeout=int(timeout), notebook_timeout=int(notebook_timeout),
                                 mem_gb=float(mem_gb), **limits),
                   sandbox=bool(sandbox), scheduler=scheduler,
                   workers=int(workers or os.cpu_count() or 1), progress=progress,
                   reveal_hidden=bool(reveal_hidden), probe_seed=_probe_seed(out, probe_seed),
                   run_demos=run_demos if isinstance(run_demos, bool) else tuple(run_demos),
                   log=log)

    def with_names(self, names) -> "Settings":
        from dataclasses import replace
        return replace(self, names=tuple(names))

    def runs_demos(self, student: str) -> bool:
        """Whether this student's demonstration cells run (tfsgrade.demos: by default the
        sandbox leaves out the unchanged ones nothing graded needs)."""
        return self.run_demos is True or (not isinstance(self.run_demos, bool) and student in self.run_demos)

    def fingerprint(self) -> str:
        """What, besides the notebook, changes a task's result (part of the cache key)."""
        d = {"limits": asdict(self.limits), "sandbox": self.sandbox, "probe_seed": self.probe_seed}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _probe_seed(out: Path, given: int | None) -> int:
    """The seed of the independent check's inputs: given, or the one this output folder
    already used, or a fresh one drawn now and kept (a rerun into OUT gives the same grades)."""
    path = out / "probe_seed.txt"
    if given is None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            import secrets
            given = secrets.randbelow(2**31)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{given}\n")
    return int(given)
