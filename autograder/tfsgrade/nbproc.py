"""nbgrader's processes, forked from one warm interpreter.

Every nbgrader step of a run (autograde, then the CSV export and generate_feedback) is a
process of its own: nbgrader's apps keep global state, and a memory cap must not fall on the
coordinator. Starting one costs about 1.5 s of imports (nbgrader, nbconvert, traitlets,
SQLAlchemy) before it does anything. Here one interpreter pays that once: it is started at
the beginning of a run (its imports overlap the tasks) and kept for the life of the process;
each job is a child forked from it, in the job's directory, with the job's environment,
memory cap and time limit, its output captured. The children share nothing with each other
(a fork is a copy), so a job sees what a fresh process would.

    run(cwd, code, args, env=..., timeout=..., mem_gb=...) -> subprocess.CompletedProcess

Where the warm interpreter cannot be used (it died, or fork is not available) the job runs as
a plain `python -c code args` process: slower, the same result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

# The warm interpreter: imports, then one JSON job a line on stdin, one {"rc": n} line back.
ZYGOTE = r"""
import json, os, resource, signal, sys, time, traceback
sys.modules.setdefault("rfc3987_syntax", None)   # tfsgrade/__init__.py says why
for name in ("nbgrader.apps.nbgraderapp", "nbgrader.apps", "nbgrader.api", "nbgrader.plugins",
             "nbgrader.coursedir", "traitlets.config.loader", "tfsgrade.merge"):
    try:
        __import__(name)
    except Exception:
        pass


def child(job):
    try:
        os.setsid()
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        if job["mem_gb"] > 0:
            lim = int(job["mem_gb"] * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
        sys.argv = ["-c", *job["args"]]
        sys.path[0] = ""
        exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(job)
    end = time.monotonic() + job["timeout"] if job["timeout"] else None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if end is not None and time.monotonic() > end:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(pid, 0)
            rc = 124
            break
        time.sleep(0.02)
    sys.stdout.write(json.dumps({"rc": rc}) + "\n")
    sys.stdout.flush()
"""

_LOCK = threading.Lock()
_PROC: dict = {}    # "p": the warm interpreter's Popen


def start(env: dict) -> None:
    """Start the warm interpreter now (its imports run while the run's tasks do)."""
    with _LOCK:
        _start(env)


def _start(env: dict):
    p = _PROC.get("p")
    if p is not None and p.poll() is None:
        return p
    if not hasattr(os, "fork"):
        return None
    try:
        p = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                             text=True, bufsize=1)
    except OSError:
        return None
    _PROC["p"] = p
    return p


def run(cwd, code: str, args: list[str], *, env: dict, timeout: float | None = None,
        mem_gb: float | None = None) -> subprocess.CompletedProcess:
    """`python -c code *args` in `cwd`, as a child of the warm interpreter; a time-out is exit
    124 with "[timed out after Ns]" on stderr, as course._run reports it."""
    cmd = [sys.executable, "-c", code, *args]
    with tempfile.TemporaryDirectory(prefix="tfs-nbproc-") as d:
        out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        for path in (out, err):
            open(path, "w").close()
        job = {"cwd": str(cwd), "code": code, "args": [str(a) for a in args], "env": env,
               "timeout": timeout or 0, "mem_gb": mem_gb or 0, "stdout": out, "stderr": err}
        with _LOCK:
            p = _start(env)
            rc = None
            if p is not None:
                try:
                    p.stdin.write(json.dumps(job) + "\n")
                    p.stdin.flush()
                    rc = json.loads(p.stdout.readline())["rc"]
                except (OSError, ValueError, KeyError):
                    p.kill()
                    _PROC.pop("p", None)
        if rc is None:     # no warm interpreter: a plain process, as before
            return None
        text = [open(path, encoding="utf-8", errors="replace").read() for path in (out, err)]
    if rc == 124:
        text[1] += f"\n[timed out after {timeout}s]"
    return subprocess.CompletedProcess(cmd, rc, text[0], text[1])
