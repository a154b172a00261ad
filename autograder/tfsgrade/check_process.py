"""The independent check's own process. Runs INSIDE the sandbox, started by the runner
(tfsgrade.sandbox_runner) with `python -I` before the student's kernel; standalone on purpose:
the standard library, then torch and numpy, and the probe machine's text the runner hands it.

    runner ──socket──> check server (this file; torch imported, never any student code)
                            │ fork, one per exercise
                            v
                       check child: the guard on for good (vm.lock_guard)
                                    -> the student's cells, as the student wrote them
                                    -> "defined"; the plan and its inputs arrive
                                    -> the probes; each capture a line to the runner

Why a process of its own: the check's guard and inputs must be in a process whose builtins,
hooks, threads and objects the student's code has not owned first. The server is started
before the kernel and runs no code of the student's; each child is forked from it, puts the
guard on (its own references to `exec`, `compile`, `os.read`, `os.write` and `json` taken
before), and only then runs the student's cells. The inputs are sent after those cells have
run, and never enter the student's kernel. The guard cannot be taken off: the kernels that
refuse are registered through a dispatcher handle no Python object holds, and the refused
functions' own code is not kept (tfscratch.specs.vm, `lock_guard`).

The wire (every message one JSON line; the runner reads at most CAPTURE_BYTES of a child):

    runner -> server  (socket, length-prefixed; the first one carries no file descriptors)
        {"vm": text, "path": [...], "preload": [...], "compile": bool}      once
                                      (answered {"ready": true}, or {"ready": false, "error"})
        {"head": plan head}  + 2 fds (the child's input and output pipes)  one per exercise
    server -> runner  {"pid": n}  when a child starts, {"pid": n, "status": s} when it ends
    runner -> child   {"cells": [[index, python text], ...]}, later {"plan": ...} (the plan)
    child -> runner   {"kind": "defined", "errors": [...]}, {"kind": "capture", ...} per probe,
                      {"kind": "end"}

What the child's output may claim is held to the plan by the coordinator (tfsgrade.verdict:
one capture per probe, in order, within sizes), and processes beside it are the runner's to
see: the child cannot vouch for either.
"""
import builtins
import json
import linecache
import os
import socket
import struct
import sys
import types
import time

DEFINED, CAPTURE, END = "defined", "capture", "end"   # the kinds of a child's lines
CAPTURE_BYTES = 32 * 2**20                             # what the runner reads of one child
MAGIC_BODIES = ("time", "capture", "timeit")           # cell magics whose body is run


# -- framing on the runner's socket -------------------------------------------------------

def send(sock, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    socket.send_fds(sock, [struct.pack("!I", len(data))], list(fds))
    sock.sendall(data)


def recv(sock):
    """(message, fds), or (None, []) when the other end has gone."""
    head, fds, _, _ = socket.recv_fds(sock, 4, 4)
    while head and len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            return None, fds
        head += more
    if len(head) < 4:
        return None, fds
    n, data = struct.unpack("!I", head)[0], b""
    while len(data) < n:
        more = sock.recv(min(1 << 20, n - len(data)))
        if not more:
            return None, fds
        data += more
    return json.loads(data), fds


def read_line(fd, read=os.read) -> bytes:
    """One line from a pipe (b"" at its end), with the reader given (the child's own)."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


# -- the server ----------------------------------------------------------------------------

def _non_dumpable() -> None:
    """No ptrace, no /proc/PID/mem or fd from another process of the same uid."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001
        pass


def _machine(cfg) -> types.ModuleType:
    """Warm up: torch, numpy, what the course's setup cells import, and the probe machine."""
    sys.path[:0] = [p for p in cfg.get("path", []) if p not in sys.path]
    os.environ["MPLBACKEND"] = "Agg"
    import numpy  # noqa: F401
    import torch  # noqa: F401
    for name in cfg.get("preload", []):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a warm-up only: the cell imports it again
            pass
    if cfg.get("compile"):      # torch.compile loaded before the guard: its stance is eager
        try:
            __import__("torch._dynamo")
        except Exception:  # noqa: BLE001
            pass
    m = types.ModuleType("tfs_check_vm")
    m.__dict__["__builtins__"] = builtins
    exec(compile(cfg["vm"], "tfs_check_vm", "exec"), m.__dict__)
    return m


def serve(sock) -> None:
    _non_dumpable()
    cfg, _ = recv(sock)
    if cfg is None:
        return
    t = time.monotonic()
    try:
        m = _machine(cfg)
    except Exception as e:  # noqa: BLE001 - said to the runner, which says it per exercise
        send(sock, {"ready": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        return
    send(sock, {"ready": True, "warm_s": round(time.monotonic() - t, 3)})
    while True:
        req, fds = recv(sock)
        if req is None or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:                       # the child: never talks to the runner's socket
            try:
                sock.close()
                check(m, req["head"], fds[0], fds[1])
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        send(sock, {"pid": pid, "status": status})


# -- the child -----------------------------------------------------------------------------

class _Shell:
    """What `get_ipython()` gives a cell here: magics do nothing (a line magic, `!cmd`), except
    the cell magics that only time or capture their body, which is run."""

    def __init__(self, ns, run):
        self.user_ns, self._run = ns, run

    def run_line_magic(self, *args, **kwargs):
        return None

    def run_cell_magic(self, name, line, cell):
        if name in MAGIC_BODIES:
            self._run(cell, "<magic>")

    def system(self, *args, **kwargs):
        return None

    def getoutput(self, *args, **kwargs):
        return ""


def _reap() -> None:
    """Children of this process that have already ended (zombies) are waited for, so that they
    are nobody's business during the check."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def check(m, head, rfd, wfd) -> None:
    """One exercise: the guard on, the student's cells, then the plan (see the module)."""
    write, read, dumps, loads = os.write, os.read, json.dumps, json.loads
    run_code, make_code, error = builtins.exec, builtins.compile, m._error
    guard = m.lock_guard(head.get("forbid"))         # before any code of the student's
    cells = loads(read_line(rfd, read) or b"{}").get("cells", [])

    main = types.ModuleType("__main__")
    ns = main.__dict__
    ns["__builtins__"] = builtins
    sys.modules["__main__"] = main

    def run(text, name):
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)  # inspect, jit
        run_code(make_code(text, name, "exec"), ns)

    ns["get_ipython"] = lambda: shell
    ns["display"] = lambda *args, **kwargs: None
    shell = _Shell(ns, run)
    errors = []
    for index, text in cells:
        try:
            run(text, f"<cell {index}>")
        except BaseException as e:  # noqa: BLE001 - SystemExit too: the next cell runs
            errors.append([index, error(e)[:300]])
    _reap()
    write(wfd, (dumps({"kind": DEFINED, "errors": errors}) + "\n").encode())
    plan = loads(read_line(rfd, read) or b"{}").get("plan")
    if not plan:
        return

    def emit(doc):
        write(wfd, (dumps(dict(doc, kind=CAPTURE)) + "\n").encode())
    guard.start()             # what the cells tripped before the inputs came is theirs to keep
    m.run_probes(plan, ns, None, emit, guard)
    write(wfd, (dumps({"kind": END}) + "\n").encode())


def main():
    serve(socket.socket(fileno=int(sys.argv[1])))


if __name__ == "__main__":
    main()
