"""nbgrader's processes forked from one warm interpreter (tfsgrade.nbproc) behave as plain
`python -c` processes: the job's directory, environment, arguments, exit status, output,
time limit and memory cap, and nothing left over from one job to the next."""
import os

from tfsgrade import nbproc

CODE = """import os, sys
print("out", os.getcwd(), os.environ.get("TFS_NBPROC_TEST"), sys.argv[1:])
print("err", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_job_runs_where_and_as_asked(tmp_path):
    env = dict(os.environ, TFS_NBPROC_TEST="yes")
    r = nbproc.run(tmp_path, CODE, ["3", "x y"], env=env)
    assert r.returncode == 3
    assert r.stdout.strip() == f"out {tmp_path} yes ['3', 'x y']"
    assert r.stderr.strip() == "err"
    r = nbproc.run(tmp_path, CODE, ["0"], env=dict(os.environ))
    assert r.returncode == 0 and "None" in r.stdout      # the last job's environment is gone


def test_jobs_share_nothing(tmp_path):
    env = dict(os.environ)
    nbproc.run(tmp_path, "import builtins; builtins.LEFT = 1", [], env=env)
    r = nbproc.run(tmp_path, "import builtins; print(hasattr(builtins, 'LEFT'))", [], env=env)
    assert r.stdout.strip() == "False"


def test_time_limit_memory_cap_and_a_crash(tmp_path):
    env = dict(os.environ)
    r = nbproc.run(tmp_path, "import time; time.sleep(30)", [], env=env, timeout=1)
    assert r.returncode == 124 and "timed out after 1s" in r.stderr
    r = nbproc.run(tmp_path, "x = bytearray(3 * 2**30)", [], env=env, mem_gb=1)
    assert r.returncode == 1 and "MemoryError" in r.stderr
    r = nbproc.run(tmp_path, "import os; os._exit(7)", [], env=env)
    assert r.returncode == 7
    r = nbproc.run(tmp_path, "raise SystemExit('said why')", [], env=env)
    assert r.returncode == 1 and "said why" in r.stderr
    # and the warm interpreter is still there for the next job
    assert nbproc.run(tmp_path, "print('again')", [], env=env).stdout.strip() == "again"
