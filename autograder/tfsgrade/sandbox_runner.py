"""Executes one notebook cell by cell; runs INSIDE the sandbox (bubblewrap), started by
tfsgrade.sandbox. Standalone on purpose: it imports nbclient and nbformat only, never the
grader or the reference, and what it knows comes from one JSON file.

Each exercise is judged on its own: when a cell kills the kernel (os._exit, a crash, the
memory cap) or will not stop when interrupted, that cell gets an error output, a fresh
kernel is started, the cells before it are replayed silently, and execution goes on with
the next cell. Cells never run (budget spent, too many restarts) get an error output too,
so nothing counts as passed that did not run.

The independent check is not in the kernel: before the kernel starts, the runner starts the
check server (tfsgrade.check_process, `python -I`), and after the notebook has run, each
exercise is checked in a child of that server, with the guard on before the student's cells
run there and the plan's inputs sent last (`Checks`). Processes beside a guarded check are
seen from here, outside the check's process: what the kernel left running is ended before
the inputs go out, and a process that runs while they are being used voids the check.

Protocol: argv[1] = config JSON path; argv[2] = the number of a pipe to write the result
to (one JSON document: the executed notebook, events and the checks' captures); argv[3] =
the number of a pipe the plans (the checks' inputs, secret) are read from, once, before
anything else starts. Neither pipe is inherited by the kernel or the check's process, and
this process's memory cannot be read from them (it is made non-dumpable), so student code
can neither read the inputs ahead nor forge the result.
"""
import ast
import copy
import ctypes
import functools
import hashlib
import json
import os
import queue
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_T0 = time.monotonic()   # the runner's start: PHASES counts from here

sys.path.insert(0, str(Path(__file__).resolve().parent))   # check_process, beside this file
import check_process as wire  # noqa: E402

# jsonschema's optional IRI checker builds a Lark grammar at import: 1.2 s of every task's
# start for a format no notebook has (tfsgrade/__init__.py)
sys.modules.setdefault("rfc3987_syntax", None)


PHASES: dict = {}     # seconds since the runner started at which each step of the task ended


def _since() -> float:
    return round(time.monotonic() - _T0, 3)


def _limit(cfg):
    lim = cfg["limits"]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a too-big write fails, no kill
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_CPU", lim["cpu_s"]),
                        ("RLIMIT_FSIZE", int(lim["output_mb"] * 2**20)),
                        ("RLIMIT_AS", int(lim["mem_gb"] * 2**30) if lim["mem_gb"] > 0 else -1),
                        ("RLIMIT_NPROC", lim["max_procs"] if cfg.get("nproc") else -1)):
        if value is not None and value >= 0:
            resource.setrlimit(getattr(resource, name), (value, value))
    uid = cfg.get("drop_to")
    if uid is not None and os.getuid() == 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    try:                                               # no ptrace / /proc/PID/mem from the kernel
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)         # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001
        pass


class BudgetSpent(Exception):
    """The notebook's time budget is spent (not a TimeoutError: nbclient's CellTimeoutError is one)."""


# Run after a graded test cell (executed silently, without history: hidden tests never enter
# In, Out, _ih, %history nor a later cell's reach through linecache): drops the cell's text
# from linecache and gives the kernel's counter the number the cell showed, with a blank in
# the input history, so In[n] and the prompts of the student's cells stay aligned. Only the
# builtins module and its own imports are used, never a name of the student's namespace.
_FORGET_CODE = """import hashlib, linecache, sys
me = sys._getframe(0).f_back.f_code.co_filename
for k, v in list(linecache.cache.items()):
    try:
        text = "".join(v[2]).strip()
    except Exception:
        continue
    if k == me or hashlib.sha256(text.encode()).hexdigest() in hashes or ("BEGIN " + "HIDDEN TESTS") in text:
        linecache.cache.pop(k, None)
if bump:
    import IPython
    ip = IPython.get_ipython()
    if ip is not None:
        ip.history_manager.input_hist_parsed.extend([""] * bump)
        ip.history_manager.input_hist_raw.extend([""] * bump)
        ip.execution_count += bump
"""
_FORGET = """import builtins as __tfs_b
try:
    __tfs_b.exec({code!r}, {{"__builtins__": __tfs_b, "hashes": {hashes!r}, "bump": {bump!r}}})
finally:
    del __tfs_b
"""


def forget_source(sources, bump: int) -> str:
    hashes = sorted({hashlib.sha256(s.strip().encode()).hexdigest() for s in sources})
    return _FORGET.format(code=_FORGET_CODE, hashes=hashes, bump=int(bump))
LEFT_OUT = "[not run when grading: a demonstration you did not change, which nothing graded reads]\n"


def _graded_test(c) -> bool:
    g = c.get("metadata", {}).get("nbgrader", {})
    return c.get("cell_type") == "code" and bool(g.get("grade")) and not g.get("solution")


def check_place(nb, p) -> int:
    """Where exercise p is checked: right before the first graded test cell it backs (`p["cells"]`,
    the grade ids its spec declares), so the check sees exactly what those test cells see (a
    helper the student defined below the solution cell, a name a later cell rebinds); without
    a test cell, right after the solution cell; else at the end."""
    want = set(p.get("cells", ()))
    for i, c in enumerate(nb.cells):
        if _graded_test(c) and str(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")) in want:
            return i
    for i, c in enumerate(nb.cells):
        g = c.get("metadata", {}).get("nbgrader", {})
        if g.get("grade_id") == p["exercise"] and g.get("solution"):
            return i + 1
    return len(nb.cells)


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def python_text(src: str) -> str:
    """A cell's IPython syntax as Python (`%time`, `!ls`: get_ipython() calls, which the
    check's process answers with nothing)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - no IPython here, or a cell it cannot read
        return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines())


def setup_imports(cells) -> list:
    """The modules the course's locked cells import (warmed up in the check server)."""
    names = []
    for c in cells:
        g = c.get("metadata", {}).get("nbgrader", {})
        if c.get("cell_type") != "code" or not g.get("locked") or g.get("grade"):
            continue
        try:
            tree = ast.parse(python_text(c.source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return list(dict.fromkeys(n for n in names if not n.startswith("__")))


def _stat(pid: int):
    """(state, parent pid, the command line's first words) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2:].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
        return fields[0].decode(), int(fields[1]), cmd
    except (OSError, ValueError, IndexError):
        return None


def others(mine) -> dict:
    """{pid: command} of the live processes of this PID namespace other than `mine` and pid 1
    (zombies have ended: they are nobody's business)."""
    found = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return found
    for pid in pids:
        st = None if pid == 1 or pid in mine else _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            found[pid] = st[2] or "?"
    return found


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _end(pids, mine, wait_s: float = 5.0) -> None:
    """Kill `pids` and wait until none of them is alive any more (a killed process takes a
    moment to die; only then do the check's inputs go out)."""
    pids = set(pids)
    until = time.monotonic() + wait_s
    while pids and time.monotonic() < until:
        _kill(pids)
        time.sleep(0.01)
        pids &= set(others(mine))


CHECK_PROCESS = str(Path(__file__).resolve().with_name("check_process.py"))
BESIDE = ("ChildProcess: another process ran while the independent check of {what} did "
          "(pid {pid}: {cmd}), so the check cannot vouch for this result. An exercise must "
          "compute its answer in its own code: start no process inside it")


class Checks:
    """The independent checks of one notebook, each exercise in a child of the check server
    (tfsgrade.check_process), which is started before the kernel (`start`); `run(run)` after
    the notebook has run gives {exercise: {"docs": [capture, ...], "error": str | None}}."""

    def __init__(self, cfg: dict, plans: dict):
        self.cfg, self.plans, self.lim = cfg, plans, cfg["limits"]
        self.watch = bool(cfg.get("pid_namespace"))   # every process in /proc is the task's
        self.sock, self.server, self.problem = None, None, None
        self.events: list = []
        self.timings = {"ready_wait_s": 0.0, "checks_s": 0.0, "per_check_s": []}

    def start(self, nb) -> None:
        if not self.cfg.get("probes"):
            return
        ours, theirs = socket.socketpair()
        env = dict(os.environ, MPLBACKEND="Agg")
        try:
            self.server = subprocess.Popen(
                [sys.executable, "-I", CHECK_PROCESS, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=env, cwd=self.cfg["cwd"], close_fds=True)
        except OSError as e:
            self.problem = f"the check's process could not start ({e})"
            return
        finally:
            theirs.close()
        self.sock = ours
        names = " ".join(c.source for c in nb.cells if c.get("cell_type") == "code")
        wire.send(ours, {"vm": self.cfg.get("vm", ""), "preload": setup_imports(nb.cells),
                         "path": [p for p in sys.path[1:] if p],
                         "compile": "compile" in names})

    def _ready(self) -> bool:
        if self.problem is None and self.sock is not None and not hasattr(self, "_said"):
            t = time.monotonic()       # the server warmed up while the kernel ran: what is left
            msg, _ = wire.recv(self.sock)
            self.timings["ready_wait_s"] = round(time.monotonic() - t, 3)
            self.timings["server_warm_s"] = (msg or {}).get("warm_s")
            self._said = msg
            if not msg or not msg.get("ready"):
                self.problem = "the check's process could not start" + (
                    f" ({msg.get('error')})" if msg else "")
        return self.problem is None and self.sock is not None

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.server is not None:    # nothing of it is kept: no need to wait for its exit
            self.server.kill()
            self.server.wait()

    def run(self, run) -> dict:
        out, end = {}, time.monotonic() + self.lim["notebook_timeout"]
        for p in self.cfg.get("probes", []):
            ex = p["exercise"]
            if ex in run.looping:
                why = f"not run: {run.loop_reason(ex)}, so its independent check was not run either"
            elif time.monotonic() > end:
                why = f"not run: the checks' {self.lim['notebook_timeout']}s time budget was spent"
            elif ex not in self.plans:
                why = "not run: the grader sent no plan for it"
            elif not self._ready():
                why = self.problem
            else:
                t = time.monotonic()
                out[ex] = self.one(p, run.cells_for(check_place(run.nb, p)), run, end)
                self.timings["per_check_s"].append(round(time.monotonic() - t, 3))
                continue
            out[ex] = {"docs": [], "error": why}
        self.stop()
        self.timings["checks_s"] = round(sum(self.timings["per_check_s"]) + self.timings["ready_wait_s"], 3)
        return out

    def one(self, p: dict, cells: list, run, end: float) -> dict:
        """One exercise in a fresh child: its cells, then its plan; what came back."""
        ex, guarded = p["exercise"], bool(p.get("head", {}).get("guarded"))
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        wire.send(self.sock, {"head": p.get("head", {})}, [in_r, out_w])
        os.close(in_r)
        os.close(out_w)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_read_lines, args=(out_r, lines), daemon=True).start()
        msg, _ = wire.recv(self.sock)
        pid = (msg or {}).get("pid")
        mine = {os.getpid(), self.server.pid, pid}
        docs, error, to_child = [], None, _Writer(in_w)
        t0, steps = time.monotonic(), {}
        try:
            to_child.send({"cells": [[k, python_text(run.cells[k].source)] for k in cells]})
            spent = sum(run.seconds.get(k, 0.0) for k in cells)
            kind, got = _wait(lines, DEFINED_KINDS, min(end, time.monotonic() + self.lim["cell_timeout"]
                                                      + 2 * spent + 10))
            steps["cells_s"] = round(time.monotonic() - t0, 3)
            if kind is None:
                error = got
            else:
                if self.watch:          # what the kernel or the cells left running ends here
                    _end(others(mine), mine)
                steps["others_ended_s"] = round(time.monotonic() - t0, 3)
                to_child.send({"plan": self.plans[ex]})
                docs, error = self._captures(lines, ex, pid, mine, guarded, end)
                steps["probes_done_s"] = round(time.monotonic() - t0, 3)
            self.timings.setdefault("steps", []).append(steps)
        finally:
            _kill([pid] if pid else [])
            to_child.close()
            if msg is not None:
                wire.recv(self.sock)       # the server's word that the child has ended
        if error and error.startswith("ChildProcess"):
            docs = []
        return {"docs": docs, "error": error}

    def _captures(self, lines, ex, pid, mine, guarded, end):
        """The child's capture lines until it says it has ended; a process beside it voids them."""
        docs, limit = [], min(end, time.monotonic() + self.lim["cell_timeout"])
        while True:
            if self.watch and guarded:
                seen = others(mine)
                if seen:
                    _kill(seen)
                    first = min(seen)
                    self.events.append({"kind": "beside_check", "exercise": ex, "pids": sorted(seen)[:8]})
                    return [], BESIDE.format(what=ex, pid=first, cmd=seen[first][:80])
            try:
                doc = lines.get(timeout=0.025 if self.watch and guarded else 0.5)
            except queue.Empty:
                if time.monotonic() > limit:
                    return docs, (f"CheckTimeout: {ex} did not return within "
                                  f"{self.lim['cell_timeout']}s during the independent check "
                                  "(an endless loop, or far too slow)")
                continue
            if doc is None or doc.get("kind") == wire.END:
                return docs, None if doc else (
                    "KernelDied: the check's process ended while your code ran (os._exit, a crash "
                    "or the memory cap)")
            if doc.get("kind") == wire.CAPTURE:
                docs.append({k: v for k, v in doc.items() if k != "kind"})


DEFINED_KINDS = (wire.DEFINED,)


class _Writer:
    """JSON lines to the child from a thread of their own (a child that stops reading cannot
    stop the runner), which alone closes the pipe, once all is written or the child is gone."""

    def __init__(self, fd):
        self.todo: queue.Queue = queue.Queue()
        threading.Thread(target=self._go, args=(fd,), daemon=True).start()

    def send(self, obj) -> None:
        self.todo.put((json.dumps(obj) + "\n").encode())

    def close(self) -> None:
        self.todo.put(None)

    def _go(self, fd) -> None:
        try:
            while (data := self.todo.get()) is not None:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
        except OSError:
            pass
        finally:
            os.close(fd)


def _read_lines(fd, lines) -> None:
    """The child's lines as documents into `lines` (None at the end); at most CAPTURE_BYTES,
    and a line that is not a JSON object is dropped."""
    total = 0
    with os.fdopen(fd, "rb") as f:
        for raw in f:
            total += len(raw)
            if total > wire.CAPTURE_BYTES:
                break
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
                lines.put(doc)
    lines.put(None)


def _wait(lines, kinds, until: float):
    """(kind, document) of the first line of one of `kinds`, or (None, why)."""
    while True:
        try:
            doc = lines.get(timeout=max(0.01, until - time.monotonic()))
        except queue.Empty:
            return None, ("CheckTimeout: your notebook's cells did not finish in the independent "
                          "check's process in time (an endless loop at the top of a cell?)")
        if doc is None:
            return None, ("KernelDied: the check's process ended while running your cells (os._exit, "
                          "a crash or the memory cap)")
        if doc.get("kind") in kinds:
            return doc.get("kind"), doc


def _client_class(nbformat, NotebookClient, cap: int):
    class Client(NotebookClient):
        """nbclient with a cap on how much output one cell may keep."""
        sizes: dict = {}

        def output(self, outs, msg, display_id, cell_index):
            size = len(json.dumps(msg.get("content", {})))
            total = self.sizes.get(cell_index, 0) + size
            self.sizes[cell_index] = total
            if total > cap:
                if self.sizes.get(("noted", cell_index)) is None:
                    self.sizes[("noted", cell_index)] = True
                    outs.append(nbformat.v4.new_output(
                        "stream", name="stdout",
                        text=f"\n[output truncated: more than {cap} characters]\n"))
                return None
            return super().output(outs, msg, display_id, cell_index)
    return Client


class Run:
    """One notebook, cell by cell, in kernels started by nbclient (see the module's docstring).
    `execute()` runs it; `result()` is the JSON document the coordinator reads."""

    def __init__(self, cfg: dict, nbformat, NotebookClient, errors):
        self.cfg, self.lim, self.nbf = cfg, cfg["limits"], nbformat
        self.CellTimeoutError, self.DeadKernelError = errors
        self.Client = _client_class(nbformat, NotebookClient, int(cfg.get("cell_output_bytes", 4 * 2**20)))
        self.started = time.time()
        self.nb = nbformat.read(cfg["source"], as_version=4)
        try:                                           # the task's own copy, in its scratch
            nbformat.write(self.nb, cfg["notebook"])
        except OSError:
            pass
        self.cells = self.nb.cells
        # the grading fast path: demonstration cells that the coordinator (tfsgrade.demos) found
        # nothing else needs are left out, unless the grader says run_demos
        self.demo = {k for k, c in enumerate(self.cells)
                     if c.get("metadata", {}).pop("tfsgrade_demo", None)
                     and c.cell_type == "code" and not cfg.get("run_demos")}
        self.events, self.seconds = [], {}
        self.deadline = time.monotonic() + self.lim["notebook_timeout"]
        # {graded cell: its exercise}, as the specs declare them (the probes' cells)
        self.owners = {g: p["exercise"] for p in cfg.get("probes", []) for g in p.get("cells", ())}
        self.looping = set()   # exercises whose code ran past the cell limit: their later checks would too
        self.calls = {}        # exercise -> the looping exercise its own code calls (see limit_of)
        self.broken = set()    # cells that ran past the limit, killed the kernel or never ran
        self.done, self.restarts = [], 0
        self.checks: dict = {}

    def client(self):
        lim = self.lim
        return self.Client(self.nb, timeout=lim["cell_timeout"], timeout_func=self.limit_of, allow_errors=True, interrupt_on_timeout=True,
                           error_on_timeout={"ename": "CellTimeoutError", "evalue": "",
                                             "traceback": ["CellTimeoutError: the cell ran past its "
                                                           "time limit"]},
                           raise_on_iopub_timeout=True, iopub_timeout=5, kernel_name="python3",
                           startup_timeout=120, record_timing=False, shutdown_kernel="immediate",
                           extra_arguments=["--HistoryManager.hist_file=:memory:"],
                           resources={"metadata": {"path": self.cfg["cwd"]}})

    # -- marking cells ------------------------------------------------------------------------
    def fail(self, i, ename, evalue):
        self.broken.add(i)
        c = self.cells[i]
        c.outputs = list(c.get("outputs", [])) + [self.nbf.v4.new_output(
            "error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])]
        c.metadata["tfsgrade"] = {"ran": sha(c.source)}

    def not_run(self, start, why):
        idx = [k for k in range(start, len(self.cells)) if self.cells[k].cell_type == "code"]
        for k in idx:
            self.fail(k, "CellNotRun", f"not run: {why}")
        if idx:
            self.events.append({"cell": idx[0], "kind": "not_run", "cells": idx, "why": why})

    def exercise_of(self, c):
        gid = str(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
        return self.owners.get(gid) or (gid if gid in self.owners.values() else None)

    def skip_looping(self, k) -> bool:
        """A check of an exercise whose code already ran past the limit, or a demo cell (the
        progress table too) that calls it, would loop again: not run, and said so."""
        if not self.looping:
            return False
        c = self.cells[k]
        ex = self.exercise_of(c)
        meta = c.get("metadata", {}).get("nbgrader", {})
        gid = str(meta.get("grade_id", ""))
        if ex not in self.looping or not gid.startswith("test_"):
            if meta.get("solution"):
                return False
            ex = next((e for e in self.looping if re.search(rf"\b{re.escape(e)}\b", c.source)), None)
            if ex is None:
                return False
        self.fail(k, "CellNotRun", f"not run: {self.loop_reason(ex)}, so this cell would not either"
                                   + (" (it scores 0)" if gid.startswith("test_") else ""))
        self.events.append({"cell": k, "kind": "skipped", "exercise": ex,
                            "why": f"{ex} ran past the time limit in an earlier cell"})
        return True

    def timed_out(self, k):
        self.broken.add(k)
        ex = self.exercise_of(self.cells[k])
        if ex:
            self.looping.add(ex)
        return ex

    def loop_reason(self, ex) -> str:
        """Why exercise `ex` is taken as looping, in plain words."""
        limit = int(self.lim["cell_timeout"])
        if ex in self.calls:
            return (f"{ex} calls {self.calls[ex]}, which did not return within {limit} s, and it did "
                    f"not return within {min(limit, max(10, limit // 6))} s either")
        return f"{ex} did not return within {limit} s in the notebook (an endless loop, or far too slow)"

    def limit_of(self, c) -> int:
        """A cell's time limit: the run's, except for the test cells of an exercise whose own
        code calls an exercise that already ran past it. Those would most likely loop too, and
        a correct one answers in well under a second: they get a sixth of the limit (at least
        10 s), so that one endless loop costs a class one limit, not one per exercise built on
        it. The check of such an exercise, when its cells finish, runs with the full limit."""
        full = int(self.lim["cell_timeout"])
        ex = self.exercise_of(c)
        if not self.looping or ex is None or ex in self.looping or not _graded_test(c):
            return full
        called = self.calls.get(ex) or self.calls_looping(ex)
        if called is None:
            return full
        self.calls[ex] = called
        return min(full, max(10, full // 6))

    def calls_looping(self, ex) -> str | None:
        """The looping exercise that exercise `ex`'s own cell calls by its bare name."""
        own = next((c for c in self.cells if c.cell_type == "code"
                    and c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == ex), None)
        try:
            tree = ast.parse(own.source) if own is not None else None
        except SyntaxError:
            return None
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name)} if tree else set()
        return next((e for e in sorted(self.looping) if e in called), None)

    # -- executing ----------------------------------------------------------------------------
    def quiet(self, k) -> bool:
        """Graded test cells (hidden tests) run silently and without history."""
        return _graded_test(self.cells[k])

    def cells_for(self, place: int) -> list:
        """The cells above `place` that the check's process runs: every code cell the kernel ran
        to its end (demonstrations left out, graded test cells and cells that looped, killed
        the kernel or never ran are not)."""
        ran = set(self.done)
        return [k for k in range(place) if self.cells[k].cell_type == "code" and k in ran
                and k not in self.broken and k not in self.demo and not _graded_test(self.cells[k])]

    @staticmethod
    def run_quiet(c0, cell, k, count=None):
        """Execute without entering In/Out/_ih/%history, nor the student's pre/post_run_cell
        hooks (ipykernel's silent execution); `count` is the prompt number the cell shows."""
        kc = c0.kc
        kc.execute = functools.partial(type(kc).execute, kc, silent=True)
        try:
            c0.execute_cell(cell, k, execution_count=count, store_history=False)
        finally:
            del kc.execute
            # a quiet cell's outputs are final: a later cell's update_display_data (a display_id
            # the student's code showed in it) must not rewrite the check's captures or a result
            c0.clear_display_id_mapping(k)

    def forget(self, c0, k, sources, bump):
        """The quiet cells' text out of linecache; `bump`: the kernel's counter past the number
        the test cell showed. (nbclient puts the cell it ran at index k of the notebook: the
        notebook's own cell goes back there.)"""
        own = c0.nb.cells[k]
        try:
            self.run_quiet(c0, self.nbf.v4.new_code_cell(forget_source(sources, bump)), k)
        finally:
            c0.nb.cells[k] = own

    def replay(self, c0):
        """After a restart: the cells done so far, again, silently, to restore the kernel's
        state. A replay never changes a result: every cell keeps the outputs of its first run
        (nbclient would put the replayed copy in its place)."""
        replayed = []
        for k in self.done:
            if time.monotonic() > self.deadline:
                raise BudgetSpent()
            own = self.cells[k]
            try:
                if self.quiet(k):
                    self.run_quiet(c0, copy.deepcopy(own), k)
                    replayed.append(own.source)
                else:
                    c0.execute_cell(copy.deepcopy(own), k, store_history=False)
            finally:
                c0.nb.cells[k] = own
                c0.clear_display_id_mapping(k)   # its displays were in the copy, not in `own`
        if replayed:
            self.forget(c0, self.done[-1], replayed, 0)

    def run_cell(self, c0, i, count) -> int:
        """Cell i in kernel c0; returns the prompt number of the next cell."""
        c = self.cells[i]
        t = time.monotonic()
        if self.quiet(i):
            self.run_quiet(c0, c, i, count)
            self.forget(c0, i, [c.source], 1)
            count += 1
        else:
            c0.execute_cell(c, i)
            if isinstance(c.get("execution_count"), int):
                count = c.execution_count + 1
        self.seconds[i] = round(time.monotonic() - t, 3)
        c.metadata["tfsgrade"] = {"ran": sha(c.source)}
        limit = self.limit_of(c)
        if any(o.get("ename") == "CellTimeoutError" or
               (o.get("ename") == "KeyboardInterrupt" and self.seconds[i] >= limit)
               for o in c.outputs):
            ex = self.timed_out(i)
            self.events.append({"cell": i, "kind": "timeout", "exercise": ex, "limit": limit,
                                "calls": self.calls.get(ex)})
            for o in c.outputs:     # the limit this cell had, in the words the student reads
                if o.get("ename") == "CellTimeoutError":
                    o["evalue"] = f"the cell did not finish within {limit} s (an endless loop?)"
                    o["traceback"] = [f"CellTimeoutError: {o['evalue']}"]
        self.done.append(i)
        return count

    def leave_out(self, c):
        c.outputs, c.execution_count = [self.nbf.v4.new_output("stream", name="stdout", text=LEFT_OUT)], None
        c.metadata["tfsgrade"] = {"ran": sha(c.source), "demo": True}

    def run_from_cursor(self):
        """A fresh kernel: replay what was done, then run the cells from `self.i` on, moving
        it. Raises (DeadKernelError, CellTimeoutError) with `self.crash` set to the cell."""
        c0 = self.client()
        with c0.setup_kernel():
            PHASES.setdefault("kernel_ready_s", _since())
            self.replay(c0)
            count = 1                                  # the prompt number of the next cell
            while self.i < len(self.cells):
                i, c = self.i, self.cells[self.i]
                if c.cell_type == "code":
                    if time.monotonic() > self.deadline:
                        raise BudgetSpent()
                    if i in self.demo:                 # never replayed; says so in the feedback
                        self.leave_out(c)
                    elif not self.skip_looping(i):
                        try:
                            count = self.run_cell(c0, i, count)
                        except (self.DeadKernelError, self.CellTimeoutError) as e:
                            self.crash = (i, e)
                            raise
                self.i += 1

    def after_crash(self) -> int | None:
        """Mark the cell that killed or stuck the kernel; the index to go on from (None: stop)."""
        k, e = self.crash
        dead = isinstance(e, self.DeadKernelError)
        self.fail(k, "KernelDied" if dead else "CellTimeoutError",
                  "the kernel died while running this cell (os._exit, a crash or the memory cap)"
                  if dead else f"the cell ran past the {self.lim['cell_timeout']}s limit and could not "
                               "be interrupted; the kernel was restarted")
        self.events.append({"cell": k, "kind": "died" if dead else "stuck"})
        if not dead:
            self.timed_out(k)
        self.restarts += 1
        if self.restarts > self.lim["max_restarts"]:
            self.not_run(k + 1, f"more than {self.lim['max_restarts']} kernel restarts")
            return None
        return k + 1

    def execute(self):
        self.i = 0                                     # the cursor: the next cell to run
        while self.i < len(self.cells):
            self.crash = None
            try:
                self.run_from_cursor()
            except BudgetSpent:
                self.not_run(self.i, f"the notebook's {self.lim['notebook_timeout']}s time budget was spent")
                return
            except Exception as e:  # noqa: BLE001
                if self.crash is None:
                    why = (f"the kernel could not be restored after a crash ({type(e).__name__})"
                           if self.done and self.i < len(self.cells) else
                           f"the kernel could not start ({type(e).__name__}: {e})")
                    self.not_run(self.i, why)
                    return
                self.i = self.after_crash()
                if self.i is None:
                    return

    def result(self, checks: dict, events=(), check_timings=None) -> str:
        self.nb.metadata.pop("widgets", None)
        return json.dumps({"notebook": self.nbf.writes(self.nb), "events": self.events + list(events),
                           "seconds": self.seconds, "restarts": self.restarts, "started": self.started,
                           "demos_left_out": len(self.demo),
                           "uid": os.getuid(), "probes": checks, "check_timings": check_timings or {}})


def read_plans(fd: int) -> dict:
    """{exercise: plan} from the coordinator's pipe, read whole, before anything starts."""
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    return json.loads(data) if data else {}


def main():
    cfg = json.load(open(sys.argv[1]))
    out_fd = int(sys.argv[2])
    os.set_inheritable(out_fd, False)
    plans = read_plans(int(sys.argv[3])) if len(sys.argv) > 3 else {}
    _limit(cfg)
    import nbformat                                    # after the limits and the uid drop
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    run = Run(cfg, nbformat, NotebookClient, (CellTimeoutError, DeadKernelError))
    checks = Checks(cfg, plans)
    PHASES["runner_ready_s"] = _since()
    checks.start(run.nb)                               # before the kernel: no student code yet
    run.execute()
    PHASES["cells_done_s"] = _since()
    results = checks.run(run)
    PHASES["checks_done_s"] = _since()
    checks.timings["phases"] = PHASES
    with os.fdopen(out_fd, "w") as f:
        f.write(run.result(results, checks.events, checks.timings))

if __name__ == "__main__":
    main()
