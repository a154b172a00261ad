"""Make sure Debian's PostgreSQL server binaries are here for the gradebook test
(tests/test_grading_postgres.py starts its own server from them in a temporary directory):
installed with apt-get when missing and we are root. Exit 0 when `initdb` can be found, 1
otherwise (the Makefile goes on: that test then skips and says why).
TFS_NO_POSTGRES_INSTALL=1: never install anything."""
import glob
import os
import shutil
import subprocess
import sys


def found() -> bool:
    return bool(shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def main() -> int:
    if found():
        return 0
    if os.environ.get("TFS_NO_POSTGRES_INSTALL"):
        print("ensure_postgres: no PostgreSQL and TFS_NO_POSTGRES_INSTALL is set", file=sys.stderr)
        return 1
    if not shutil.which("apt-get") or os.geteuid() != 0:
        print("ensure_postgres: no PostgreSQL server binaries; run `sudo apt-get install "
              "postgresql` to run the PostgreSQL gradebook test", file=sys.stderr)
        return 1
    print("ensure_postgres: installing Debian's postgresql (apt-get install postgresql) ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
    return 0 if found() else 1


if __name__ == "__main__":
    sys.exit(main())
