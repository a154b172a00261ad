"""Make sure Debian's PostgreSQL server binaries are here for the gradebook test
(tests/test_grading_postgres.py starts its own server from them in a temporary directory):
installed with apt-get when missing and we are root. Exit 0 when `initdb` can be found, 1
otherwise (the Makefile goes on: that test then skips and says why).
TFS_NO_POSTGRES_INSTALL=1: never install anything."""
import glob
import shutil
import sys

import apt


def found() -> bool:
    return bool(shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def main() -> int:
    if found():
        return 0
    if not apt.may_install("ensure_postgres", "PostgreSQL server binaries", "TFS_NO_POSTGRES_INSTALL",
                           ["postgresql"], " to run the PostgreSQL gradebook test"):
        return 1
    apt.install("ensure_postgres", ["postgresql"])
    return 0 if found() else 1


if __name__ == "__main__":
    sys.exit(main())
