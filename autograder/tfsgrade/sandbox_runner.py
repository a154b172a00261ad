"""Executes one notebook cell by cell; runs INSIDE the sandbox (bubblewrap), started by
tfsgrade.sandbox. Standalone on purpose: it imports nbclient and nbformat only, never the
grader or the reference, and what it knows comes from one JSON file.

Each exercise is judged on its own: when a cell kills the kernel (os._exit, a crash, the
memory cap) or will not stop when interrupted, that cell gets an error output, a fresh
kernel is started, the cells before it are replayed silently, and execution goes on with
the next cell. Cells never run (budget spent, too many restarts) get an error output too,
so nothing counts as passed that did not run.

Protocol: argv[1] = config JSON path; argv[2] = the number of a pipe to write the result
to (one JSON document: the executed notebook and events). The kernel never inherits that
pipe and cannot read this process's memory (it is made non-dumpable), so student code
cannot forge the result.
"""
import copy
import ctypes
import functools
import hashlib
import json
import os
import re
import resource
import signal
import sys
import time

# jsonschema's optional IRI checker builds a Lark grammar at import: 1.2 s of every task's
# start for a format no notebook has (tfsgrade/__init__.py)
sys.modules.setdefault("rfc3987_syntax", None)


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


def strays(kernel_pid) -> list:
    """In the sandbox's own PID namespace: the processes that left the kernel, orphans of a
    double fork, which the kernel's child check (tfscratch.specs.vm) cannot see, since their
    parent is now this namespace's init (pid 1) or the runner. Pid 1, the runner and the kernel
    are ours; the kernel's own children are the kernel check's to name."""
    me, found = os.getpid(), []
    try:
        names = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []
    for pid in names:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue                   # ended meanwhile
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        if pid not in (1, me, kernel_pid) and ppid in (1, me):
            found.append(pid)
    return found


STRAY_MESSAGE = ("ChildProcess: a process your notebook started (and left running outside the "
                 "kernel, a double fork) ran while the independent check did (pid {pids}): the "
                 "check runs your code in the kernel alone, where its rules hold. Use no "
                 "subprocess, multiprocessing or os.fork in the notebook")


class BudgetSpent(Exception):
    """The notebook's time budget is spent (not a TimeoutError: nbclient's CellTimeoutError is one)."""


PROBE_MIME = "application/x-tfs-probe+json"
STRAY = "#stray"     # in the result's probes: probe-MIME outputs outside the probe cells

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


def _probe_place(nb, p) -> int:
    """Where exercise p's probe cell goes: right before the first graded test cell it backs
    (`p["cells"]`, the grade ids its spec declares), so it sees exactly what those test cells
    see (a helper the student defined below the solution cell, a name a later cell rebinds);
    without a test cell, right after the solution cell; else at the end."""
    want = set(p.get("cells", ()))
    for i, c in enumerate(nb.cells):
        if _graded_test(c) and str(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")) in want:
            return i
    for i, c in enumerate(nb.cells):
        g = c.get("metadata", {}).get("nbgrader", {})
        if g.get("grade_id") == p["exercise"] and g.get("solution"):
            return i + 1
    return len(nb.cells)


def insert_probes(nb, probes):
    """Put each exercise's probe cell (built by the grader) where `_probe_place` says; returns
    {nonce: exercise}. A probe cell is known by a nonce drawn here (nbclient replaces a cell
    object by its copy when it replays it after a restart, and a submitted cell cannot carry
    a nonce it never saw)."""
    import nbformat
    made = {}
    for c in nb.cells:
        c.get("metadata", {}).pop("tfsgrade_probe", None)
    for p in probes:
        at = _probe_place(nb, p)
        for source in (p.get("guard"), p["source"]):   # the guard cell, then the probe cell
            if source is None:
                continue
            cell = nbformat.v4.new_code_cell(source)
            nonce = os.urandom(12).hex()
            cell.metadata["tfsgrade_probe"] = nonce
            nb.cells.insert(at, cell)
            at += 1
            made[nonce] = p["exercise"]
    return made


def _probe_of(cell, made):
    return made.get(cell.get("metadata", {}).get("tfsgrade_probe"))


def _no_capture(c) -> int:
    """Drop the probe's MIME type from a cell that is not a probe cell (the student's code
    displayed it); returns how many outputs had it."""
    n = 0
    for o in c.get("outputs", []) or []:
        data = o.get("data") if isinstance(o, dict) else None
        if isinstance(data, dict) and PROBE_MIME in data:
            data.pop(PROBE_MIME, None)
            data.setdefault("text/plain", "[removed: an output that claimed to be the grader's check]")
            n += 1
    return n


def strip_probes(nb, probe_cells, events, seconds):
    """Take the probe cells out again: their captures go back beside the notebook, and the
    events and timings are renumbered to the student's cells. An output with the probe's MIME
    type in any other cell is removed and reported under STRAY (the grader flags it)."""
    probes, keep, new_index, stray = {}, [], {}, []
    for i, c in enumerate(nb.cells):
        ex = _probe_of(c, probe_cells)
        if ex is None:
            new_index[i] = len(keep)
            if _no_capture(c):
                stray.append(len(keep))
            keep.append(c)
            continue
        got = probes.setdefault(ex, {"docs": [], "error": None})   # its guard cell, then itself
        for o in c.get("outputs", []):
            data = o.get("data", {}) if o.get("output_type") in ("display_data", "execute_result") else {}
            if PROBE_MIME in data and isinstance(data[PROBE_MIME], dict):
                got["docs"].append(data[PROBE_MIME])
            elif o.get("output_type") == "error" and got["error"] is None:
                got["error"] = f"{o.get('ename')}: {str(o.get('evalue'))[:300]}"
        if str(got["error"]).startswith("ChildProcess"):   # a stray process beside either cell
            got["docs"] = []
    out_events = []
    for e in events:
        e = dict(e)
        if "cells" in e:
            e["cells"] = [new_index[k] for k in e["cells"] if k in new_index]
            if not e["cells"]:
                continue
            e["cell"] = e["cells"][0]
        elif e.get("cell") in new_index:
            e["cell"] = new_index[e["cell"]]
        elif "cell" in e:
            e["probe"] = _probe_of(nb.cells[e.pop("cell")], probe_cells)
        out_events.append(e)
    nb.cells = keep
    if stray:
        probes[STRAY] = {"docs": [], "error": None, "cells": stray, "count": len(stray)}
    return probes, out_events, {new_index[k]: v for k, v in seconds.items() if k in new_index}


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
        self.probe_cells = insert_probes(self.nb, cfg.get("probes", []))
        self.watch = bool(cfg.get("pid_namespace"))   # a namespace of its own: every process in /proc is the task's
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
        self.done, self.restarts = [], 0

    def client(self):
        lim = self.lim
        return self.Client(self.nb, timeout=lim["cell_timeout"], allow_errors=True, interrupt_on_timeout=True,
                           error_on_timeout={"ename": "CellTimeoutError", "evalue": "",
                                             "traceback": ["CellTimeoutError: the cell ran past the "
                                                           f"{lim['cell_timeout']}s limit"]},
                           raise_on_iopub_timeout=True, iopub_timeout=5, kernel_name="python3",
                           startup_timeout=120, record_timing=False,
                           extra_arguments=["--HistoryManager.hist_file=:memory:"],
                           resources={"metadata": {"path": self.cfg["cwd"]}})

    # -- marking cells ------------------------------------------------------------------------
    def fail(self, i, ename, evalue):
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
        ex = _probe_of(c, self.probe_cells)
        if ex:
            return ex
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
        probe = _probe_of(c, self.probe_cells)
        if ex not in self.looping or not (gid.startswith("test_") or probe):
            if meta.get("solution") or probe:
                return False
            ex = next((e for e in self.looping if re.search(rf"\b{re.escape(e)}\b", c.source)), None)
            if ex is None:
                return False
        self.fail(k, "CellNotRun", f"not run: {ex} ran past the {self.lim['cell_timeout']}s limit in an "
                                   "earlier cell, so this cell would too"
                                   + (" (the exercise scores 0)" if gid.startswith("test_") else ""))
        self.events.append({"cell": k, "kind": "skipped",
                            "why": f"{ex} ran past the time limit in an earlier cell"})
        return True

    def timed_out(self, k):
        ex = self.exercise_of(self.cells[k])
        if ex:
            self.looping.add(ex)

    # -- executing ----------------------------------------------------------------------------
    def quiet(self, k) -> bool:
        """Probe cells and graded test cells (hidden tests) run silently and without history."""
        return _probe_of(self.cells[k], self.probe_cells) is not None or _graded_test(self.cells[k])

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
        (nbclient would put the replayed copy in its place), and the probe's cells are not
        replayed (a submission that crashed its kernel on purpose would otherwise have its
        checks run again on answers it computed after seeing the first run's inputs; and a
        guard cell without its probe cell would leave its guard on)."""
        replayed = []
        for k in self.done:
            if time.monotonic() > self.deadline:
                raise BudgetSpent()
            own = self.cells[k]
            if _probe_of(own, self.probe_cells) is not None:
                continue
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

    def run_probe(self, c0, c, i):
        """A probe cell; a process of the task outside the kernel (a double fork), before or
        after it, voids its captures."""
        kernel = getattr(c0.km.provisioner, "pid", None) if self.watch else None
        found = strays(kernel) if kernel else []
        self.run_quiet(c0, c, i)                       # it drops its own text from linecache
        found = found or (strays(kernel) if kernel else [])
        if found:                                      # its captures are void: never used
            msg = STRAY_MESSAGE.format(pids=", ".join(map(str, found[:3])))
            c.outputs = [self.nbf.v4.new_output("error", ename="ChildProcess",
                                                evalue=msg.split(": ", 1)[1], traceback=[msg])]
            self.events.append({"cell": i, "kind": "stray_process", "pids": found[:8]})

    def run_cell(self, c0, i, count) -> int:
        """Cell i in kernel c0; returns the prompt number of the next cell."""
        c = self.cells[i]
        t = time.monotonic()
        if _probe_of(c, self.probe_cells) is not None:
            self.run_probe(c0, c, i)
        elif self.quiet(i):
            self.run_quiet(c0, c, i, count)
            self.forget(c0, i, [c.source], 1)
            count += 1
        else:
            c0.execute_cell(c, i)
            if isinstance(c.get("execution_count"), int):
                count = c.execution_count + 1
        self.seconds[i] = round(time.monotonic() - t, 3)
        c.metadata["tfsgrade"] = {"ran": sha(c.source)}
        if any(o.get("ename") == "CellTimeoutError" or
               (o.get("ename") == "KeyboardInterrupt" and self.seconds[i] >= self.lim["cell_timeout"])
               for o in c.outputs):
            self.events.append({"cell": i, "kind": "timeout"})
            self.timed_out(i)
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

    def result(self) -> str:
        self.nb.metadata.pop("widgets", None)
        probes, events, seconds = strip_probes(self.nb, self.probe_cells, self.events, self.seconds)
        return json.dumps({"notebook": self.nbf.writes(self.nb), "events": events,
                           "seconds": seconds, "restarts": self.restarts, "started": self.started,
                           "demos_left_out": len(self.demo),
                           "uid": os.getuid(), "probes": probes})


def main():
    cfg = json.load(open(sys.argv[1]))
    out_fd = int(sys.argv[2])
    os.set_inheritable(out_fd, False)
    _limit(cfg)
    import nbformat                                    # after the limits and the uid drop
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    run = Run(cfg, nbformat, NotebookClient, (CellTimeoutError, DeadKernelError))
    run.execute()
    with os.fdopen(out_fd, "w") as f:
        f.write(run.result())

if __name__ == "__main__":
    main()
