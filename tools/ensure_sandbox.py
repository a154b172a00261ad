"""Make sure the grader's sandbox (bubblewrap) is here: Debian's `bubblewrap` package,
installed with apt-get when it is missing and we are root. Exit 0 when `bwrap` starts a
sandbox, 1 otherwise (the Makefile goes on: the sandbox tests then skip and say why).
TFS_NO_SANDBOX_INSTALL=1: never install anything."""
import shutil
import subprocess
import sys

import apt


def works():
    if not shutil.which("bwrap"):
        return False
    r = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"ensure_sandbox: bwrap is installed but cannot start a sandbox here: "
              f"{r.stderr.strip()[:300]}", file=sys.stderr)
    return r.returncode == 0


def main():
    if works():
        return 0
    if shutil.which("bwrap"):
        return 1
    if not apt.may_install("ensure_sandbox", "bwrap", "TFS_NO_SANDBOX_INSTALL", ["bubblewrap"],
                           " (Linux only; on macOS grade with --no-sandbox or on a Linux Dask cluster)"):
        return 1
    apt.install("ensure_sandbox", ["bubblewrap"])
    return 0 if works() else 1


if __name__ == "__main__":
    sys.exit(main())
