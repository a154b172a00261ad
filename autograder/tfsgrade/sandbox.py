"""Stage 2 worker side: run one task (one student's notebook) in a bubblewrap sandbox.

What the sandbox guarantees (bwrap, one per task):
- read-only: the system (/usr, /etc), the Python install, the venv, the course package as
  the graded notebook may see it (`course_package`: the reference modules of the notebooks
  before it, never its own or a later one's);
  nothing else of the host is visible: no source/, solutions/, gradebook, other
  submissions, instructor HOME (a tmpfs HOME instead), grader code;
- writable: only a fresh scratch folder holding this task's own copy of the notebook,
  plus /tmp and HOME: each a tmpfs capped at SCRATCH_MB, all gone with the task;
- no network (--unshare-all: own net namespace with only loopback), own PID namespace
  (--die-with-parent: when the task ends every process it started is killed);
- caps: memory for the whole sandbox, process count, CPU seconds per process, file size,
  output read back, wall time.

Memory cap, children included. A cgroup where one can be had (cgroup v2 with the memory
and pids controllers delegated to us, or a writable cgroup v1 hierarchy when running as
root): memory.max / pids.max cover every process of the sandbox together. Otherwise
RLIMIT_AS (per process) + RLIMIT_NPROC (set inside the sandbox's own user namespace, so
it counts only this sandbox's processes) bound the total to AS x NPROC, and a watchdog
here sums the resident memory of every process of the sandbox four times a second and,
past the cap, kills the largest one (as the OOM killer would in a cgroup): RLIMIT_AS alone
is per process, so children could otherwise add up past it.

Running as root, the sandbox drops to uid 65534 (nobody) before student code runs: a
uid-0 process without capabilities could still write root-owned files such as sysctls.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

RUNNER = Path(__file__).with_name("sandbox_runner.py")
CHECK = Path(__file__).with_name("check_process.py")      # the runner imports it from beside itself
INSIDE_RUNNER = "/opt/tfsgrade/sandbox_runner.py"
INSIDE_CHECK = "/opt/tfsgrade/check_process.py"
INSIDE_WORK = "/submission"
NOBODY = 65534
SCRATCH_MB = 512       # size of each tmpfs the sandbox may write (scratch, /tmp, HOME)


class SandboxUnavailable(RuntimeError):
    pass


WAYS_OUT = ("bubblewrap (bwrap) cannot run here{why}. Ways out: install it "
            "(`apt-get install bubblewrap` on Debian/Ubuntu) on a Linux machine whose kernel "
            "allows user namespaces (sysctl kernel.unprivileged_userns_clone=1; in Docker, "
            "--security-opt seccomp=unconfined or a privileged container); grade on a Linux "
            "Dask cluster (`--scheduler tcp://HOST:8786`); or grade WITHOUT isolation with "
            "`--no-sandbox` (student code then runs as you; the report says so).")


def check() -> float:
    """Start an empty sandbox once; return its cost in ms or raise SandboxUnavailable."""
    if not shutil.which("bwrap"):
        raise SandboxUnavailable(WAYS_OUT.format(why=" (not installed; on macOS it does not exist)"))
    t = time.perf_counter()
    r = subprocess.run(_bwrap_args(None) + ["true"], capture_output=True, text=True,
                       preexec_fn=_preexec(None))
    if r.returncode != 0:
        raise SandboxUnavailable(WAYS_OUT.format(why=f" ({r.stderr.strip()[:200]})"))
    return (time.perf_counter() - t) * 1000


def start_cost(n: int = 20) -> float:
    """Median ms to start and end an empty sandbox (the per-task overhead of isolation)."""
    check()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(_bwrap_args(None) + ["true"], capture_output=True, preexec_fn=_preexec(None))
        ts.append((time.perf_counter() - t) * 1000)
    return sorted(ts)[len(ts) // 2]


def _package_dirs() -> list[str]:
    import importlib.util
    spec = importlib.util.find_spec("tfscratch")
    return [str(Path(p).resolve()) for p in (spec.submodule_search_locations or [])] if spec else []


def course_package(closed: list[str], assignment: str) -> Path:
    """A read-only copy of the course package for one graded notebook: its reference holds
    only `closed`, the modules of the notebooks before it (what it may import), and its
    expected captures only those of this notebook and earlier ones, so no answer key of the
    graded notebook or a later one is inside the sandbox. Built once per package content and
    module list, on the machine that runs the task (a Dask worker may be another host)."""
    src = Path(_package_dirs()[0])
    files = [(rel, p) for rel, p in package_files(src, closed)
             if not (rel.parts[0] == "expected" and rel.name.split(".")[0] > assignment)]
    h = hashlib.sha256(assignment.encode())
    for rel, p in files:
        st = p.stat()
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    dest = Path(tempfile.gettempdir()) / f"tfs-course-{os.getuid()}" / h.hexdigest()[:24] / "tfscratch"
    if dest.is_dir():
        return dest
    tmp = dest.parent.with_name(dest.parent.name + f".tmp-{uuid.uuid4().hex[:8]}") / "tfscratch"
    for rel, p in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, tmp / rel)
    try:
        os.rename(tmp.parent, dest.parent)
    except OSError:                    # another worker made it first: same content
        shutil.rmtree(tmp.parent, ignore_errors=True)
    return dest


def package_files(src: Path, closed: list[str]) -> list[tuple[Path, Path]]:
    """(relative path, file) of the course package at `src` with only the reference modules
    named in `closed` (and no compiled files, which could hold the others)."""
    keep = {f"{m}.py" for m in closed} | {"__init__.py"}
    files = []
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if not p.is_file() or "__pycache__" in rel.parts or p.suffix in (".pyc", ".pyo"):
            continue
        if rel.parts[0] == "reference" and rel.name not in keep:
            continue                   # an open notebook's reference: its answer key
        files.append((rel, p))
    return files


def _site_dirs() -> list[str]:
    """Installed-package folders on sys.path outside the interpreter's prefix (a venv that
    borrows another's packages through a .pth file): the kernel imports torch from there."""
    return [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]


def _ro_paths() -> list[str]:
    paths = ["/usr", "/etc", sys.base_prefix, sys.prefix, *_site_dirs(), *_package_dirs()]
    out = []
    for p in paths:
        p = str(Path(p).resolve())
        if os.path.exists(p) and not any(p == q or p.startswith(q + "/") for q in out):
            out = [q for q in out if not q.startswith(p + "/")] + [p]
    return out


def _bwrap_args(scratch: Path | None, package: Path | None = None) -> list[str]:
    a = ["bwrap", "--die-with-parent", "--new-session",
         "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if os.getuid() != 0:
        a.append("--unshare-user")
    size = str(SCRATCH_MB * 2**20)                 # every writable place is a capped tmpfs
    a += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/tmp",
          "--size", size, "--perms", "0755", "--tmpfs", "/home",
          "--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", "/opt/tfsgrade"]
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(link):
            a += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            a += ["--ro-bind", link, link]
    made = {"/", "/tmp", "/home", "/opt", "/opt/tfsgrade", "/proc", "/dev"}
    for p in _ro_paths():
        for anc in reversed(Path(p).parents):     # bwrap would make them 0700
            if str(anc) not in made and not str(anc).startswith("/usr"):
                a += ["--perms", "0755", "--dir", str(anc)]
                made.add(str(anc))
        a += ["--ro-bind", p, p]
        made.add(p)
    if package is not None:            # over the whole package: only what this notebook may see
        for p in _package_dirs():
            a += ["--ro-bind", str(package), p]
    a += ["--ro-bind", str(RUNNER), INSIDE_RUNNER, "--ro-bind", str(CHECK), INSIDE_CHECK]
    if scratch is not None:
        a += ["--size", size, "--perms", "0777", "--tmpfs", INSIDE_WORK, "--ro-bind", str(scratch / "ctl"), "/control"]
    a += ["--chdir", INSIDE_WORK if scratch is not None else "/", "--clearenv"]
    env = {"HOME": "/home/student", "USER": "student", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline", "MPLCONFIGDIR": "/tmp/mpl",
           "IPYTHONDIR": "/home/student/.ipython", "JUPYTER_RUNTIME_DIR": "/tmp/jupyter",
           "JUPYTER_PLATFORM_DIRS": "1", "NBGRADER_EXECUTION": "autograde", "PYTHONDONTWRITEBYTECODE": "1"}
    if package is not None:    # the package bound above is importable whatever the venv's own
        env["PYTHONPATH"] = ":".join(str(Path(p).parent) for p in _package_dirs())  # finder says
    for k, v in env.items():
        a += ["--setenv", k, v]
    a += ["--perms", "0777", "--dir", "/home/student"]
    return a


# ---------------------------------------------------------------- cgroups
def _cgroup_new(limits) -> list[Path]:
    """Make a cgroup for one sandbox with memory and pids caps; [] where none can be had."""
    name = f"tfs-{uuid.uuid4().hex[:12]}"
    made = []
    if os.environ.get("TFS_NO_CGROUP"):          # tests: exercise the rlimit + watchdog path
        return []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        root2 = Path("/sys/fs/cgroup")
        if v2 is not None and (root2 / "cgroup.controllers").exists():
            base = root2 / v2.lstrip("/")
            ctl = (base / "cgroup.subtree_control").read_text().split()
            if "memory" in ctl and "pids" in ctl:
                d = base / name
                d.mkdir()
                made = [d]
                (d / "memory.max").write_text(str(int(limits.mem_gb * 2**30)))
                (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
                (d / "pids.max").write_text(str(limits.max_procs))
                return made
        if os.getuid() == 0:                      # cgroup v1 hierarchies, writable by root
            v1 = {ln.split(":", 2)[1]: ln.split(":", 2)[2] for ln in lines if not ln.startswith("0::")}
            for ctrl, fname, value in (("memory", "memory.limit_in_bytes", int(limits.mem_gb * 2**30)),
                                       ("pids", "pids.max", limits.max_procs)):
                d = Path("/sys/fs/cgroup") / ctrl / v1.get(ctrl, "/").lstrip("/") / name
                d.mkdir()
                made.append(d)
                (d / fname).write_text(str(value))
                if ctrl == "memory" and (d / "memory.memsw.limit_in_bytes").exists():
                    (d / "memory.memsw.limit_in_bytes").write_text(str(value))   # no swap either
            return made
    except OSError:
        _cgroup_end(made)
    return []


def _cgroup_end(dirs: list[Path]):
    for d in dirs:
        for _ in range(50):
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)
        try:
            d.rmdir()
        except OSError:
            pass


def _preexec(cgroups: list[Path] | None):
    def run():
        os.setsid()
        for d in cgroups or []:
            (d / "cgroup.procs").write_text("0")
    return run


# ---------------------------------------------------------------- one task
def execute_task(task: dict) -> dict:
    """Pure: {student, assignment, notebook (bytes), limits (dict), sandbox (bool)} ->
    {notebook (str|None), events, seconds, status, error, sandbox verdict, timings}."""
    from .settings import Limits
    limits = Limits(**task["limits"])
    a = task["assignment"]
    scratch = Path(tempfile.mkdtemp(prefix="tfs-task-"))
    cgroups: list[Path] = []
    res = {"student": task["student"], "assignment": a, "notebook": None, "events": [],
           "seconds": {}, "status": "ok", "error": None, "host": os.uname().nodename,
           "sandbox": {"isolated": bool(task["sandbox"])}}
    t0 = time.time()
    try:
        cmd, env = _prepare(task, scratch)
        if task["sandbox"]:
            cgroups = _cgroup_new(limits)
            cmd = _bwrap_args(scratch, course_package(task.get("closed", []), a)) + cmd
        res["sandbox"]["memory_cap"] = ("cgroup" if cgroups else "rlimit+watchdog") if task["sandbox"] else "rlimit"
        launched = time.time()
        killed, code, data = _launch(cmd, env, scratch, limits, cgroups, task.get("plans") or {})
        res["timings"] = {"total_s": round(time.time() - t0, 3)}
        _read_result(res, killed, code, data, scratch, limits, launched)
    finally:
        _cgroup_end(cgroups)
        shutil.rmtree(scratch, ignore_errors=True)
    return res


def _prepare(task: dict, scratch: Path):
    """The runner's folders and config in `scratch`; (command, environment) to start it."""
    a = task["assignment"]
    (scratch / "work").mkdir()
    (scratch / "ctl").mkdir()
    (scratch / "ctl" / f"{a}.ipynb").write_bytes(task["notebook"])
    root_mode = os.getuid() == 0
    if task["sandbox"]:    # the notebook comes in read-only; the runner copies it to a tmpfs
        cwd, src, runner, ctl = INSIDE_WORK, f"/control/{a}.ipynb", INSIDE_RUNNER, "/control"
    else:
        cwd, src, runner, ctl = str(scratch / "work"), str(scratch / "ctl" / f"{a}.ipynb"), \
            str(RUNNER), str(scratch / "ctl")
    cfg = {"source": src, "notebook": f"{cwd}/{a}.ipynb", "cwd": cwd, "limits": task["limits"],
           "run_demos": bool(task.get("run_demos")),
           "drop_to": NOBODY if (task["sandbox"] and root_mode) else None,
           "nproc": bool(task["sandbox"]) and not root_mode, "probes": task.get("probes", []),
           "vm": task.get("vm", ""), "pid_namespace": bool(task["sandbox"])}
    (scratch / "ctl" / "run.json").write_text(json.dumps(cfg))
    env = None if task["sandbox"] else dict(
        os.environ, NBGRADER_EXECUTION="autograde", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
        MPLBACKEND="module://matplotlib_inline.backend_inline")
    return [sys.executable, runner, f"{ctl}/run.json"], env


def _launch(cmd, env, scratch: Path, limits, cgroups, plans: dict):
    """Start the runner with the write end of a pipe for its result and the read end of one
    that brings the checks' plans (secret: never in a file the sandbox can read), read at most
    output_mb (+1 byte) of the result while the watch enforces the limits; (why it was killed
    or None, exit code, the bytes)."""
    rfd, wfd = os.pipe()
    pr, pw = os.pipe()
    log = open(scratch / "runner.log", "wb")
    proc = subprocess.Popen(cmd + [str(wfd), str(pr)], pass_fds=(wfd, pr), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(scratch / "work"),
                            preexec_fn=_preexec(cgroups))
    os.close(wfd)
    os.close(pr)

    def send_plans():
        try:
            with os.fdopen(pw, "wb") as f:
                f.write(json.dumps(plans).encode())
        except OSError:
            pass
    threading.Thread(target=send_plans, daemon=True).start()
    data = bytearray()
    cap = int(limits.output_mb * 2**20)

    def reader():
        with os.fdopen(rfd, "rb") as f:
            while chunk := f.read(1 << 16):
                if len(data) <= cap:
                    data.extend(chunk[: cap + 1 - len(data)])
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    killed = _watch(proc, limits, use_watchdog=not cgroups)
    th.join(timeout=10)
    log.close()
    return killed, proc.returncode, data


def _read_result(res: dict, killed, code, data, scratch: Path, limits, launched: float) -> None:
    cap = int(limits.output_mb * 2**20)
    if killed:
        res["status"], res["error"] = "killed", killed
    elif len(data) > cap:
        res["status"], res["error"] = "too_big", f"the executed notebook is larger than {limits.output_mb:g} MB"
    elif not data:
        tail = (scratch / "runner.log").read_bytes()[-2000:].decode(errors="replace")
        res["status"], res["error"] = "no_result", f"the sandbox returned no result (exit {code}): {tail.strip()[-400:]}"
    else:
        doc = json.loads(bytes(data))
        res.update(notebook=doc["notebook"], events=doc["events"], seconds=doc["seconds"],
                   restarts=doc["restarts"], probes=doc.get("probes", {}),
                   demos_left_out=doc.get("demos_left_out", 0))
        res["timings"]["checks"] = doc.get("check_timings", {})
        res["sandbox"]["start_ms"] = round((doc["started"] - launched) * 1000, 1)
        res["sandbox"]["uid"] = doc["uid"]


def _reap_largest_over(pid: int, cap: float) -> None:
    """Without a cgroup: when the sandbox's processes together hold more than the cap, kill
    the largest of them, as the kernel's OOM killer does inside a cgroup (the runner then
    records a kernel death for that cell and goes on with a fresh kernel)."""
    import psutil
    try:
        procs = psutil.Process(pid).children(recursive=True)
        sizes = []
        for q in procs:
            try:
                sizes.append((q.memory_info().rss, q))
            except psutil.Error:
                pass
        if sum(r for r, _ in sizes) > cap and sizes:
            max(sizes, key=lambda t: t[0])[1].kill()
    except psutil.Error:
        pass


def _watch(proc, limits, use_watchdog: bool) -> str | None:
    """Wait for the sandbox; kill it past the wall budget or (without a cgroup) past the
    memory cap summed over all its processes. Returns why it was killed, or None."""
    # the notebook's budget, the checks' own (as long), kernel start-ups and replays on top
    wall = 2 * limits.notebook_timeout + 120
    end = time.monotonic() + wall
    cap = limits.mem_gb * 2**30
    why = None
    while proc.poll() is None:
        if time.monotonic() > end:
            why = f"the notebook ran past its wall-time limit ({wall}s) and was stopped"
        elif use_watchdog and cap > 0:
            _reap_largest_over(proc.pid, cap)
        if why:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait()
            return why
        time.sleep(0.25)
    return None
