"""`tfs-grade formgrader OUT`: nbgrader's formgrader on a grading folder's course (issue 29,
item 8), where instructors run it: as root in a container too (--allow-root), on a machine
without a browser (it prints the address with its token), with the course's gradebook.

It runs a plain Jupyter server (the formgrader is a server extension) whose root is OUT/course,
from that folder, so that nbgrader reads the course's nbgrader_config.py (the gradebook URL a
grading run used, SQLite or PostgreSQL).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from . import course, manual


def server_command(out: Path, *, port: int = 8890, ip: str = "127.0.0.1", token: str) -> list[str]:
    root = manual.course_root(out)
    cmd = [sys.executable, "-m", "jupyter", "server", f"--ServerApp.root_dir={root}",
           f"--ServerApp.port={port}", f"--ServerApp.ip={ip}", "--ServerApp.open_browser=False",
           f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"]
    if os.getuid() == 0:       # a container's usual user; Jupyter refuses root without it
        cmd.append("--allow-root")
    return cmd


def url(port: int, token: str, ip: str = "127.0.0.1") -> str:
    host = "127.0.0.1" if ip in ("0.0.0.0", "") else ip
    return f"http://{host}:{port}/formgrader?token={token}"


def start(out: Path, *, port: int = 8890, ip: str = "127.0.0.1", token: str | None = None,
          **popen) -> tuple[subprocess.Popen, str]:
    """Start the server in the background; return it and the formgrader's address."""
    out = Path(out).resolve()
    root = manual.course_root(out)
    if not (root / "nbgrader_config.py").exists():
        raise FileNotFoundError(f"{root} is not a graded course: run `tfs-grade grade ... --out {out}` first")
    token = token or secrets.token_hex(16)
    proc = subprocess.Popen(server_command(out, port=port, ip=ip, token=token), cwd=root,
                            env=course.nbgrader_env(), **popen)
    return proc, url(port, token, ip)


def main(out: Path, *, port: int = 8890, ip: str = "127.0.0.1") -> int:
    """Run in the foreground until Ctrl-C."""
    log = Path(out).resolve() / "formgrader.log"
    with log.open("ab") as f:
        proc, address = start(out, port=port, ip=ip, stdout=f, stderr=subprocess.STDOUT)
    print(f"formgrader for {manual.course_root(out)} (server log: {log}):\n    {address}\n"
          f"grade by hand under Manual Grading; then run `{manual.command('export', out)}`.\n"
          "Ctrl-C stops it.", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return 0
