"""What the ensure_* tools share: whether this run may install a Debian package, and the
install itself (apt-get, without recommends; `apt-get update` and once more when the first try
fails). Nothing is installed unless we are root on a machine with apt-get and the tool's
TFS_NO_*_INSTALL variable is unset; otherwise the reason goes to stderr and the caller exits 1
(the Makefile goes on, and the tests that need the part skip and say why)."""
import os
import shutil
import subprocess
import sys


def may_install(tool: str, missing: str, no_install_env: str, packages: list[str],
                elsewhere: str = "") -> bool:
    def say(why: str) -> bool:
        print(f"{tool}: no {missing}; {why}", file=sys.stderr)
        return False
    if os.environ.get(no_install_env):
        return say(f"{no_install_env} is set")
    if not shutil.which("apt-get"):
        return say(f"no apt-get here: install it yourself{elsewhere}")
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return say(f"run `sudo apt-get install {' '.join(packages)}` (this script installs only as root)")
    return True


def install(tool: str, packages: list[str]) -> bool:
    print(f"{tool}: installing Debian's {', '.join(packages)} (apt-get install) ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode == 0:
        return True
    subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
    return subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode == 0
