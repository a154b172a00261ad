"""Stage 2, run: execute every pending (student, notebook) task in its sandbox, in
parallel on Dask distributed, resuming from the task results already on disk.

- A LocalCluster (one single-threaded worker process per core, bound to 127.0.0.1) by
  default; `--scheduler tcp://host:8786` sends the same tasks to an existing cluster.
- Each task is pure (notebook bytes in, executed notebook + events + timings out); its
  result is written to OUT/tasks/<student>/<assignment>.json as soon as it arrives, under a
  key made of the notebook's bytes and the limits, so an interrupted run resumes with
  what is missing and a second run of the same class executes nothing.
- A worker that dies takes its task with it: Dask retries it on another worker; a task
  that kills workers again and again is flagged, never silently lost.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from functools import lru_cache

from .sandbox import execute_task

# What a task's result depends on besides its inputs: the code that runs it (hashed, so a
# changed runner invalidates cached results without a number bumped by hand)
RUNNER_FILES = ("sandbox.py", "sandbox_runner.py", "check_process.py", "dispatch.py", "verdict.py")


@lru_cache(maxsize=1)
def runner_fingerprint() -> str:
    from pathlib import Path
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in RUNNER_FILES:
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    return h.hexdigest()[:16]


def _key(it, s) -> str:
    """The task's cache key: the notebook, the settings, this task's own seed (never the
    secret it is derived from) and the course package (specs, probe machine, reference,
    checks), of which the plan and the reference's captures are functions."""
    h = hashlib.sha256(it.notebook)
    h.update(s.fingerprint().encode() + runner_fingerprint().encode() + str(s.runs_demos(it.student)).encode())
    h.update(f"seed={s.item_seed(it)};package={package_fingerprint()}".encode())
    return h.hexdigest()


@lru_cache(maxsize=1)
def package_fingerprint() -> str:
    """A hash of the course package's files (tfscratch: specs, vm, reference, checks, stored
    expectations) and the versions of torch and numpy; once per process."""
    import importlib.util
    from importlib.metadata import version
    from pathlib import Path
    h = hashlib.sha256(f"torch={version('torch')};numpy={version('numpy')}".encode())
    spec = importlib.util.find_spec("tfscratch")
    for root in spec.submodule_search_locations or []:
        root = Path(root)
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def run_task(task: dict) -> dict:
    """One task on a worker: build the probe cells from the task's seed, run the notebook in
    its sandbox (tfsgrade.sandbox), then, here, outside the sandbox, run the same plans on the
    course's reference (`want`), for the coordinator to judge against: a class's reference
    runs are spread over the workers, and nothing of them enters the student's process."""
    from . import verdict
    t = time.time()
    checks, plans = verdict.prepare(task["assignment"], task["seed"])
    res = execute_task(dict(task, probes=[c["public"] for c in checks], vm=verdict.VM_SOURCE,
                            plans={c["public"]["exercise"]: c["plan"] for c in checks}))
    res["seed"] = task["seed"]
    try:
        res["want"] = verdict.reference_wants(plans)
    except Exception as e:  # noqa: BLE001 - the coordinator computes it again and reports
        res["want_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    res.setdefault("timings", {})["grader_s"] = round(time.time() - t - res["timings"].get("total_s", 0), 3)
    return res


def _path(it, s):
    return s.tasks / it.student / f"{it.assignment}.json"


def cached(it, s) -> dict | None:
    p = _path(it, s)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return doc if doc.get("key") == _key(it, s) else None


def _store(it, s, res: dict):
    p = _path(it, s)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    os.replace(tmp, p)


def _local_cluster(s):
    from distributed import LocalCluster
    # each worker imports the probe machine, the specs and the reference while it starts (in
    # the background, while the coordinator makes the course): run_task needs them at once
    return LocalCluster(n_workers=s.workers, threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address="127.0.0.1:0", memory_limit=0,
                        silence_logs=logging.ERROR, preload=["tfsgrade.verdict"])


_WARM: dict = {}   # str(out) -> (thread, {"cluster": ...}): local workers started early
# A process that grades again and again (the test suite; a notebook server) may keep its
# local workers between runs (keep_workers()): starting two workers costs about 7 s of CPU and
# closing them 3 s. They hold no student state (every task runs in its own sandbox; a worker
# runs only the course's reference), as the workers of an external cluster do.
_KEPT: dict = {}   # number of workers -> LocalCluster
KEEP = {"on": False}


def keep_workers(on: bool = True) -> None:
    """Keep this process's local workers for its later runs (closed when it exits)."""
    KEEP["on"] = on


def _keep() -> bool:
    return KEEP["on"]


def _kept(n: int):
    c = _KEPT.get(n)
    if c is not None and getattr(c.status, "name", "") == "running":
        return c
    _KEPT.pop(n, None)
    return None


def _close_kept():
    for c in list(_KEPT.values()):
        try:
            c.close(timeout=10)
        except Exception:  # noqa: BLE001 - the process is ending
            pass
    _KEPT.clear()


@contextmanager
def workers(s):
    """Start the local workers in the background now (they take seconds to start, as long
    as making the course does) and shut them down at the end; run_all uses them."""
    if s.scheduler:
        yield
        return
    import threading
    box: dict = {}
    kept = _kept(s.workers) if _keep() else None

    def start():
        try:
            box["cluster"] = kept or _local_cluster(s)
        except Exception as e:  # noqa: BLE001 - run_all starts its own and reports
            box["error"] = e
    t = threading.Thread(target=start, name="tfs-workers", daemon=True)
    t.start()
    _WARM[str(s.out)] = (t, box)
    try:
        yield
    finally:
        _WARM.pop(str(s.out), None)
        t.join()
        if "cluster" in box:
            if _keep():
                if not _KEPT:
                    import atexit
                    atexit.register(_close_kept)
                _KEPT[s.workers] = box["cluster"]
            else:
                box["cluster"].close()


@contextmanager
def client_for(s):
    from distributed import Client
    if s.scheduler:
        with Client(s.scheduler, timeout="30s") as c:
            yield c
        return
    warm = _WARM.get(str(s.out))
    if warm is not None:
        warm[0].join()
        if "cluster" in warm[1]:
            with Client(warm[1]["cluster"]) as c:
                yield c
            return
    with _local_cluster(s) as cluster, Client(cluster) as c:
        yield c


def payload(it, s) -> dict:
    """What a worker gets: the task's seed, never the secret (the worker builds the plan)."""
    from dataclasses import asdict
    return {"student": it.student, "assignment": it.assignment, "notebook": it.notebook,
            "limits": asdict(s.limits), "sandbox": s.sandbox, "run_demos": s.runs_demos(it.student),
            "seed": s.item_seed(it), "closed": _closed(it.assignment)}


def _closed(assignment: str) -> list[str]:
    from . import manifest
    return manifest.load().modules_before(assignment)


def run_all(items, s) -> None:
    """Fill it.result for every pending item (from the cache or by running it)."""
    from distributed import as_completed
    pending = [it for it in items if it.status == "pending" and it.notebook is not None]
    todo = []
    for it in pending:
        res = None if it.student in s.students else cached(it, s)
        if res is not None:
            it.result = dict(res, from_cache=True)   # unchanged since a run before: not run again
        else:
            todo.append(it)
    if not todo:
        return
    s.log(f"running {len(todo)} task(s) ({len(pending) - len(todo)} already done) on "
          f"{s.scheduler or f'{s.workers} local worker(s)'}; sandbox {'on' if s.sandbox else 'OFF'}")
    bar = _bar(s, len(todo))
    flagged = 0
    with client_for(s) as client:
        futs = {}
        for it in todo:
            f = client.submit(run_task, payload(it, s), key=f"task-{it.student}-{it.assignment}-{_key(it, s)[:8]}",
                              retries=1, pure=False)
            futs[f] = it
        t_start = time.time()
        for f in as_completed(futs):
            it = futs[f]
            try:
                res = f.result()
                res["key"] = _key(it, s)
                _store(it, s, res)
            except Exception as e:  # noqa: BLE001 - KilledWorker, lost scheduler, ...
                res = {"status": "lost", "error": f"the grading worker failed on this task twice "
                       f"({type(e).__name__}: {str(e)[:200]}); it was not graded and will be "
                       "retried on the next run", "events": [], "seconds": {}, "notebook": None}
            it.result = res
            flagged += res.get("status") != "ok"
            if bar is not None:
                bar.set_postfix(flagged=flagged)
                bar.update(1)
        if bar is not None:
            bar.close()
        s.log(f"ran {len(todo)} task(s) in {time.time() - t_start:.1f}s")


def _bar(s, n):
    show = s.progress if s.progress is not None else sys.stderr.isatty()
    if not show:
        return None
    from tqdm import tqdm
    return tqdm(total=n, unit="notebook", desc="grading", file=sys.stderr)
