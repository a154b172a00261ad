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
    (`p["cells"]`, the spec's grade ids), so it sees exactly what those test cells see (a
    helper the student defined below the solution cell, a name a later cell rebinds); without
    that list, the first test cell named test_<exercise> or test_<exercise>_*, the longest
    exercise name winning (06: Encoder and EncoderLayer); without a test cell, right after the
    solution cell; else at the end."""
    cells = p.get("cells")
    if cells is not None:
        want = set(cells)
        mine = lambda gid: gid in want  # noqa: E731
    else:
        names = sorted(set(p.get("exercises", [])) | {p["exercise"]}, key=len, reverse=True)

        def mine(gid):
            name = gid[5:] if gid.startswith("test_") else ""
            return next((e for e in names if name == e or name.startswith(e + "_")), None) == p["exercise"]
    for i, c in enumerate(nb.cells):
        if _graded_test(c) and mine(str(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))):
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
    names = [p["exercise"] for p in probes]
    for p in probes:
        cell = nbformat.v4.new_code_cell(p["source"])
        nonce = os.urandom(12).hex()
        cell.metadata["tfsgrade_probe"] = nonce
        nb.cells.insert(_probe_place(nb, dict(p, exercises=names)), cell)
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
        docs, error = [], None
        for o in c.get("outputs", []):
            data = o.get("data", {}) if o.get("output_type") in ("display_data", "execute_result") else {}
            if PROBE_MIME in data and isinstance(data[PROBE_MIME], dict):
                docs.append(data[PROBE_MIME])
            elif o.get("output_type") == "error":
                error = f"{o.get('ename')}: {str(o.get('evalue'))[:300]}"
        probes[ex] = {"docs": docs, "error": error}
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


def main():
    cfg = json.load(open(sys.argv[1]))
    out_fd = int(sys.argv[2])
    os.set_inheritable(out_fd, False)
    started = time.time()
    _limit(cfg)
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    lim = cfg["limits"]
    cap = int(cfg.get("cell_output_bytes", 4 * 2**20))  # feedback trims further
    nb = nbformat.read(cfg["source"], as_version=4)
    try:                                               # the task's own copy, in its scratch
        nbformat.write(nb, cfg["notebook"])
    except OSError:
        pass
    probe_cells = insert_probes(nb, cfg.get("probes", []))
    watch = bool(cfg.get("pid_namespace"))   # a namespace of its own: every process in /proc is the task's
    cells = nb.cells
    # the grading fast path: demonstration cells that the coordinator (tfsgrade.demos) found
    # nothing else needs are left out, unless the grader says run_demos
    demo = {k for k, c in enumerate(cells) if c.get("metadata", {}).pop("tfsgrade_demo", None)
            and c.cell_type == "code" and not cfg.get("run_demos")}
    events, seconds = [], {}
    deadline = time.monotonic() + lim["notebook_timeout"]

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

    def client():
        return Client(nb, timeout=lim["cell_timeout"], allow_errors=True, interrupt_on_timeout=True,
                      error_on_timeout={"ename": "CellTimeoutError", "evalue": "",
                                        "traceback": ["CellTimeoutError: the cell ran past the "
                                                      f"{lim['cell_timeout']}s limit"]},
                      raise_on_iopub_timeout=True, iopub_timeout=5, kernel_name="python3",
                      startup_timeout=120, record_timing=False,
                      extra_arguments=["--HistoryManager.hist_file=:memory:"],
                      resources={"metadata": {"path": cfg["cwd"]}})

    def fail(i, ename, evalue):
        c = cells[i]
        c.outputs = list(c.get("outputs", [])) + [nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                            traceback=[f"{ename}: {evalue}"])]
        c.metadata["tfsgrade"] = {"ran": sha(c.source)}

    def not_run(start, why):
        idx = [k for k in range(start, len(cells)) if cells[k].cell_type == "code"]
        for k in idx:
            fail(k, "CellNotRun", f"not run: {why}")
        if idx:
            events.append({"cell": idx[0], "kind": "not_run", "cells": idx, "why": why})

    exercises = sorted({p["exercise"] for p in cfg.get("probes", [])}, key=len, reverse=True)
    looping = set()   # exercises whose code ran past the cell limit: their later checks would too

    def exercise_of(c):
        ex = _probe_of(c, probe_cells)
        if ex:
            return ex
        gid = str(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", ""))
        name = gid[5:] if gid.startswith("test_") else gid
        return next((e for e in exercises if name == e or name.startswith(e + "_")), None)

    def skip_looping(k) -> bool:
        """A check of an exercise whose code already ran past the limit, or a demo cell (the
        progress table too) that calls it, would loop again: not run, and said so."""
        if not looping:
            return False
        c = cells[k]
        ex = exercise_of(c)
        meta = c.get("metadata", {}).get("nbgrader", {})
        gid = str(meta.get("grade_id", ""))
        if ex not in looping or not (gid.startswith("test_") or _probe_of(c, probe_cells)):
            if meta.get("solution") or _probe_of(c, probe_cells):
                return False
            ex = next((e for e in looping if re.search(rf"\b{re.escape(e)}\b", c.source)), None)
            if ex is None:
                return False
        fail(k, "CellNotRun", f"not run: {ex} ran past the {lim['cell_timeout']}s limit in an "
                              "earlier cell, so this cell would too"
                              + (" (the exercise scores 0)" if gid.startswith("test_") else ""))
        events.append({"cell": k, "kind": "skipped", "why": f"{ex} ran past the time limit in an earlier cell"})
        return True

    def timed_out(k):
        ex = exercise_of(cells[k])
        if ex:
            looping.add(ex)

    def quiet(k) -> bool:
        """Probe cells and graded test cells (hidden tests) run silently and without history."""
        return _probe_of(cells[k], probe_cells) is not None or _graded_test(cells[k])

    def run_quiet(c0, cell, k, count=None):
        """Execute without entering In/Out/_ih/%history, nor the student's pre/post_run_cell
        hooks (ipykernel's silent execution); `count` is the prompt number the cell shows."""
        kc = c0.kc
        kc.execute = functools.partial(type(kc).execute, kc, silent=True)
        try:
            c0.execute_cell(cell, k, execution_count=count, store_history=False)
        finally:
            del kc.execute

    def forget(c0, k, sources, bump):
        """The quiet cells' text out of linecache; `bump`: the kernel's counter past the number
        the test cell showed. (nbclient puts the cell it ran at index k of the notebook: the
        notebook's own cell goes back there.)"""
        own = c0.nb.cells[k]
        try:
            run_quiet(c0, nbformat.v4.new_code_cell(forget_source(sources, bump)), k)
        finally:
            c0.nb.cells[k] = own

    done, i, restarts = [], 0, 0
    while i < len(cells):
        crash = None
        try:
            c0 = client()
            with c0.setup_kernel():
                replayed = []
                for k in done:                            # replay, silently, after a restart
                    if time.monotonic() > deadline:
                        raise BudgetSpent()
                    if quiet(k):
                        run_quiet(c0, copy.deepcopy(cells[k]), k)
                        replayed.append(cells[k].source)
                    else:
                        c0.execute_cell(copy.deepcopy(cells[k]), k, store_history=False)
                if replayed:
                    forget(c0, done[-1], replayed, 0)
                count = 1                                  # the prompt number of the next cell
                while i < len(cells):
                    c = cells[i]
                    if c.cell_type != "code":
                        i += 1
                        continue
                    if time.monotonic() > deadline:
                        raise BudgetSpent()
                    if i in demo:                         # never replayed; says so in the feedback
                        c.outputs, c.execution_count = [nbformat.v4.new_output(
                            "stream", name="stdout", text=LEFT_OUT)], None
                        c.metadata["tfsgrade"] = {"ran": sha(c.source), "demo": True}
                        i += 1
                        continue
                    if skip_looping(i):
                        i += 1
                        continue
                    t = time.monotonic()
                    try:
                        if _probe_of(c, probe_cells) is not None:
                            kernel = getattr(c0.km.provisioner, "pid", None) if watch else None
                            found = strays(kernel) if kernel else []
                            run_quiet(c0, c, i)           # it drops its own text from linecache
                            found = found or (strays(kernel) if kernel else [])
                            if found:                     # its captures are void: never used
                                pids = ", ".join(map(str, found[:3]))
                                c.outputs = [nbformat.v4.new_output(
                                    "error", ename="ChildProcess", evalue=STRAY_MESSAGE.format(pids=pids)[14:],
                                    traceback=[STRAY_MESSAGE.format(pids=pids)])]
                                events.append({"cell": i, "kind": "stray_process", "pids": found[:8]})
                        elif quiet(i):
                            run_quiet(c0, c, i, count)
                            forget(c0, i, [c.source], 1)
                            count += 1
                        else:
                            c0.execute_cell(c, i)
                            if isinstance(c.get("execution_count"), int):
                                count = c.execution_count + 1
                    except (DeadKernelError, CellTimeoutError) as e:
                        crash = (i, e)
                        raise
                    seconds[i] = round(time.monotonic() - t, 3)
                    c.metadata["tfsgrade"] = {"ran": sha(c.source)}
                    if any(o.get("ename") == "CellTimeoutError" or
                           (o.get("ename") == "KeyboardInterrupt" and seconds[i] >= lim["cell_timeout"])
                           for o in c.outputs):
                        events.append({"cell": i, "kind": "timeout"})
                        timed_out(i)
                    done.append(i)
                    i += 1
        except BudgetSpent:
            not_run(i, f"the notebook's {lim['notebook_timeout']}s time budget was spent")
            break
        except Exception as e:  # noqa: BLE001
            if crash is None:
                if done and i < len(cells):
                    not_run(i, "the kernel could not be restored after a crash "
                               f"({type(e).__name__})")
                else:
                    not_run(i, f"the kernel could not start ({type(e).__name__}: {e})")
                break
        if crash is not None:
            k, e = crash
            dead = isinstance(crash[1], DeadKernelError)
            fail(k, "KernelDied" if dead else "CellTimeoutError",
                 "the kernel died while running this cell (os._exit, a crash or the memory cap)"
                 if dead else f"the cell ran past the {lim['cell_timeout']}s limit and could not "
                              "be interrupted; the kernel was restarted")
            events.append({"cell": k, "kind": "died" if dead else "stuck"})
            if not dead:
                timed_out(k)
            restarts += 1
            i = k + 1
            if restarts > lim["max_restarts"]:
                not_run(i, f"more than {lim['max_restarts']} kernel restarts")
                break
    nb.metadata.pop("widgets", None)
    probes, events, seconds = strip_probes(nb, probe_cells, events, seconds)
    doc = json.dumps({"notebook": nbformat.writes(nb), "events": events,
                      "seconds": seconds, "restarts": restarts, "started": started,
                      "demos_left_out": len(demo),
                      "uid": os.getuid(), "probes": probes})
    with os.fdopen(out_fd, "w") as f:
        f.write(doc)


if __name__ == "__main__":
    main()
