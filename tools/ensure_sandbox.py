"""Make sure the grader's sandbox (bubblewrap) is here: Debian's `bubblewrap` package,
installed with apt-get when it is missing and we are root. Exit 0 when `bwrap` starts a
sandbox, 1 otherwise (the Makefile goes on: the sandbox tests then skip and say why).
TFS_NO_SANDBOX_INSTALL=1: never install anything."""
import os
import shutil
import subprocess
import sys


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
    if os.environ.get("TFS_NO_SANDBOX_INSTALL"):
        print("ensure_sandbox: no bwrap and TFS_NO_SANDBOX_INSTALL is set", file=sys.stderr)
        return 1
    if not shutil.which("apt-get"):
        print("ensure_sandbox: no bwrap and no apt-get: install bubblewrap yourself (Linux only; "
              "on macOS grade with --no-sandbox or on a Linux Dask cluster)", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("ensure_sandbox: no bwrap; run `sudo apt-get install bubblewrap`", file=sys.stderr)
        return 1
    print("ensure_sandbox: installing Debian's bubblewrap (apt-get install bubblewrap) ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-qq", "bubblewrap"], env=env, stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "bubblewrap"], env=env, stdout=subprocess.DEVNULL)
    return 0 if works() else 1


if __name__ == "__main__":
    sys.exit(main())
