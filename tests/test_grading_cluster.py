"""Parallel grading on Dask: a LocalCluster run and a run on a separately started
`dask scheduler` + 2 `dask worker` processes give identical grades.csv; a second run is
idempotent and resumes (only missing tasks run; --student regrades one)."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbtools import A01, solution_sources, student_notebook, write
from tfsgrade.grade import grade

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]
BIN = Path(sys.executable).parent


def _class(subs: Path):
    sols = solution_sources(A01)
    write(student_notebook(A01, sols), subs / "ada" / f"{A01}.ipynb")
    write(student_notebook(A01, {"softmax": sols["softmax"]}), subs / "cleo" / f"{A01}.ipynb")
    write(student_notebook(A01), subs / "ben" / f"{A01}.ipynb")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Log(list):
    def __call__(self, *a):
        self.append(" ".join(map(str, a)))


@pytest.fixture(scope="module")
def cluster():
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    time.sleep(2)
    procs += [subprocess.Popen([str(BIN / "dask"), "worker", addr, "--nthreads", "1", "--nworkers", "1",
                                "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", "0"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    from distributed import Client
    with Client(addr, timeout="60s") as c:
        c.wait_for_workers(2, timeout=120)
    yield addr
    for p in procs[::-1]:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def test_local_cluster_and_external_cluster_agree_and_runs_resume(tmp_path, cluster):
    subs = tmp_path / "subs"
    _class(subs)
    opts = dict(names=[A01], timeout=60, probe_seed=31)   # one seed: the same hidden inputs in both
    grade(subs, tmp_path / "local", workers=2, log=lambda *a: None, **opts)
    grade(subs, tmp_path / "remote", scheduler=cluster, log=lambda *a: None, **opts)
    local = (tmp_path / "local" / "grades.csv").read_text()
    assert local == (tmp_path / "remote" / "grades.csv").read_text()
    assert "ada," in local and "cleo," in local

    # interrupted run: cleo's result lost; --student ada: regrade her. Only those two run (on
    # the cluster that is already up: a run resumes wherever its tasks execute)
    (tmp_path / "local" / "tasks" / "cleo" / f"{A01}.json").unlink()
    log = Log()
    grade(subs, tmp_path / "local", scheduler=cluster, students=["ada"], log=log, **opts)
    ran = [m for m in log if m.startswith("running")]
    assert ran and ran[0].startswith("running 2 task(s) (1 already done)"), log
    assert (tmp_path / "local" / "grades.csv").read_text() == local
