"""The damage corpus (issue 15): hostile submissions graded in one class between honest
fixtures, then the honest fixtures graded again in a later run. Every attack must leave
the honest grades, notes and files exactly as they are without it, and no process a
submission starts may outlive its task. Also: a kernel death or an uninterruptible loop
in exercise 2 keeps the points of exercise 1 (per-exercise isolation).

Needs bubblewrap (tools/ensure_sandbox.py installs it); skipped with the reason otherwise."""
import csv
import hashlib
import os
import site
import uuid
from pathlib import Path

import nbformat
import pytest

from nbtools import A01, REPO, points, solution_sources, student_notebook, write
from tfsgrade.grade import grade

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]

TOKEN = uuid.uuid4().hex[:10]
SOFTMAX_POINTS = sum(p for g, p in points(A01).items() if g.startswith("test_softmax"))
TOTAL = sum(points(A01).values())


def _attacks(out: Path, subs: Path) -> dict:
    """name -> code; each prints 'BLOCKED name' when the sandbox stopped it."""
    import tfscratch
    helper = Path(tfscratch.__file__).parent / "checks" / "core.py"
    gb = out / "course" / "gradebook.db"
    venv_site = site.getsitepackages()[0]
    home = os.path.expanduser("~")
    def tries(name, body):
        return (f"hits = []\nfor target in {body}:\n    try:\n        target()\n        hits.append(target.__doc__)\n"
                f"    except Exception as e:\n        pass\nprint(('DAMAGE' if hits else 'BLOCKED'), {name!r}, hits)\n")
    return {
        "gradebook": "import sqlite3\n"
        f"def a():\n    'gradebook rw'\n    c = sqlite3.connect('file:{gb}?mode=rw', uri=True)\n"
        "    c.execute('update grade set manual_score = 0'); c.commit()\n"
        "def b():\n    'relative gradebook'\n    c = sqlite3.connect('file:../../../gradebook.db?mode=rw', uri=True)\n"
        "    c.execute('update grade set manual_score = 0'); c.commit()\n" + tries("gradebook", "[a, b]"),
        "submissions": f"def a():\n    'original'\n    open({str(subs / 'ada' / (A01 + '.ipynb'))!r}, 'w').write('x')\n"
        f"def b():\n    'course copy'\n    open({str(out / 'course' / 'submitted' / 'ada' / A01 / (A01 + '.ipynb'))!r}, 'w').write('x')\n"
        f"def c():\n    'task cache'\n    open({str(out / 'tasks' / 'ada' / (A01 + '.json'))!r}, 'w').write('x')\n"
        + tries("submissions", "[a, b, c]"),
        "helpers": f"def a():\n    'helpers'\n    open({str(helper)!r}, 'a').write('\\nraise SystemExit')\n"
        "def b():\n    'helpers via import'\n    import tfscratch.checks.core as m\n    open(m.__file__, 'a').write('\\n#x')\n"
        + tries("helpers", "[a, b]"),
        "ipython": f"import os\ndef a():\n    'host startup'\n    d = {home!r} + '/.ipython/profile_default/startup'\n"
        f"    os.makedirs(d, exist_ok=True); open(d + '/00-{TOKEN}.py', 'w').write('import os')\n"
        + tries("ipython", "[a]"),
        "pth": f"def a():\n    'venv pth'\n    open({venv_site!r} + '/{TOKEN}.pth', 'w').write('import os')\n"
        + tries("pth", "[a]"),
        "course_files": "import os\n"
        f"def a():\n    'source pkg'\n    d = {str(out / 'course' / 'source' / A01 / 'tfscratch')!r}\n"
        "    os.mkdir(d); open(d + '/__init__.py', 'w').write('')  # the real course, not a private /tmp\n"
        "def b():\n    'relative course'\n    open('../../source/x.py', 'w').write('')\n"
        f"def c():\n    'repo'\n    open({str(REPO / 'solutions' / (TOKEN + '.py'))!r}, 'w').write('')\n"
        + tries("course_files", "[a, b, c]"),
        "read_source": f"def a():\n    'course source'\n    open({str(out / 'course' / 'source' / A01 / (A01 + '.ipynb'))!r}).read()\n"
        f"def b():\n    'solutions'\n    open({str(REPO / 'solutions' / (A01 + '.ipynb'))!r}).read()\n"
        f"def c():\n    'relative'\n    open('../source/{A01}/{A01}.ipynb').read()\n"
        f"def d():\n    'sources'\n    open({str(REPO / 'solutions' / 'src' / (A01 + '.py'))!r}).read()\n"
        + tries("read_source", "[a, b, c, d]"),
        "network": "import socket\n"
        "def a():\n    'outside'\n    socket.create_connection(('1.1.1.1', 53), timeout=3).close()\n"
        "def b():\n    'dns'\n    socket.getaddrinfo('pypi.org', 443)\n" + tries("network", "[a, b]"),
        "disk": "import glob, os\n"
        "def a():\n    'fill the disk'\n    for i in range(40):\n"
        "        open(f'fill{i}', 'wb').write(b'0' * (16 * 2**20 - 1))\n"
        + tries("disk", "[a]") + "for f in glob.glob('fill*'):\n    os.remove(f)\n",
        "log_injection": "import sys\n"
        "print(\"[AutogradeApp | INFO] Creating/updating student with ID 'cleo': {}\")\n"
        "print('Timeout waiting for execute reply (120s). Kernel died', file=sys.stderr)\n"
        "print('BLOCKED log_injection []')\n",
    }


DAEMON = ("import subprocess, sys\n"
          f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # TFSDAEMON{TOKEN}'],"
          " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
          "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
          f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)  # TFSDAEMON{TOKEN}'])\n"
          "    os._exit(0)\nprint('started')\n")
HOG = ("import subprocess, sys\n"
       # a short sleep: the four only need to live together while they allocate, and a slow
       # machine must not turn the cap's kill into the cell's timeout
       "ps = [subprocess.Popen([sys.executable, '-c', 'b = bytearray(900 * 2**20); import time; time.sleep(4)']) "
       "for _ in range(4)]\n"
       "print([p.wait() for p in ps])\n")
EXIT = "def scaled_dot_product_attention(q, k, v):\n    pass\nimport os\nos._exit(1)\n"
STUCK = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
         "def scaled_dot_product_attention(q, k, v):\n    pass\nwhile True:\n    pass\n")


def _honest(subs: Path):
    sols = solution_sources(A01)
    write(student_notebook(A01, sols), subs / "ada" / f"{A01}.ipynb")
    write(student_notebook(A01, {"softmax": sols["softmax"]}), subs / "cleo" / f"{A01}.ipynb")


def _with_cells(cells: list[str]):
    nb = student_notebook(A01, solution_sources(A01))
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def _rows(out):
    with (out / "grades.csv").open() as f:
        return {r["student_id"]: r for r in csv.DictReader(f)}


def _snapshot():
    import tfscratch
    pkg = Path(tfscratch.__file__).parent
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(pkg.rglob("*.py"))}


def _daemons():
    import psutil
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(f"TFSDAEMON{TOKEN}" in (a or "") for a in (p.info["cmdline"] or [])):
            found.append(p.pid)
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("damage")
    subs, out = base / "subs", base / "out"
    _honest(subs)
    sols = solution_sources(A01)
    write(_with_cells(list(_attacks(out, subs).values())), subs / "mallory" / f"{A01}.ipynb")
    write(_with_cells([DAEMON]), subs / "daemon" / f"{A01}.ipynb")
    write(_with_cells([HOG]), subs / "hog" / f"{A01}.ipynb")
    write(student_notebook(A01, dict(sols, scaled_dot_product_attention=EXIT)), subs / "exit" / f"{A01}.ipynb")
    write(student_notebook(A01, dict(sols, scaled_dot_product_attention=STUCK)), subs / "deaf" / f"{A01}.ipynb")  # deaf to SIGINT
    before = _snapshot()
    ada_bytes = (subs / "ada" / f"{A01}.ipynb").read_bytes()
    opts = dict(names=[A01], timeout=20, mem_gb=2.5, workers=2, log=lambda *a: None)
    grade(subs, out, **opts)
    first = _rows(out)
    after_files = _snapshot()
    daemons = _daemons()
    honest = base / "honest"
    _honest(honest)
    grade(honest, base / "out2", **opts)
    return dict(out=out, first=first, second=_rows(base / "out2"), before=before, after=after_files,
                daemons=daemons, ada_bytes=ada_bytes, subs=subs)


def test_honest_fixtures_exact_in_both_runs(runs):
    for rows in (runs["first"], runs["second"]):
        assert float(rows["ada"][A01]) == TOTAL and rows["ada"]["notes"] == ""
        assert float(rows["cleo"][A01]) == SOFTMAX_POINTS and rows["cleo"]["notes"] == ""
        assert rows["ada"]["status"] == rows["cleo"]["status"] == "graded"
    for s in ("ada", "cleo"):
        # every column but the hand-in time (the fixtures are written again for the second run)
        assert {k: v for k, v in runs["first"][s].items() if k != "submitted_at"} == \
            {k: v for k, v in runs["second"][s].items() if k != "submitted_at"}


def test_attacks_were_blocked(runs):
    nb = nbformat.read(runs["out"] / "course" / "autograded" / "mallory" / A01 / f"{A01}.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "DAMAGE" not in text, text[-3000:]
    for name in _attacks(runs["out"], runs["subs"]):
        assert f"BLOCKED {name!r}" in text or f"BLOCKED {name}" in text, name
    assert float(runs["first"]["mallory"][A01]) == TOTAL   # its own code still graded in full
    assert "cleo" not in runs["first"]["cleo"]["notes"] and "Kernel died" not in runs["first"]["mallory"]["notes"]


def test_host_files_untouched(runs):
    assert runs["before"] == runs["after"], "the helpers package changed"
    assert (runs["subs"] / "ada" / f"{A01}.ipynb").read_bytes() == runs["ada_bytes"]
    assert not list(Path(site.getsitepackages()[0]).glob(f"{TOKEN}*"))
    assert not list(Path(os.path.expanduser("~/.ipython")).rglob(f"*{TOKEN}*"))
    assert not (runs["out"] / "course" / "source" / A01 / "tfscratch").exists()
    assert not list((REPO / "solutions").glob(f"{TOKEN}*"))


def test_no_process_outlives_its_task(runs):
    assert runs["daemons"] == [], "a submission's daemon outlived grading"
    assert runs["first"]["daemon"]["status"] == "graded"
    assert float(runs["first"]["daemon"][A01]) == TOTAL


def test_memory_hog_children_are_capped(runs):
    row = runs["first"]["hog"]
    assert row["status"] == "graded", row["notes"]
    nb = nbformat.read(runs["out"] / "course" / "autograded" / "hog" / A01 / f"{A01}.ipynb", as_version=4)
    last = nb.cells[-1]
    # the children together (3.5 GB) cannot all live under the 2.5 GB cap: some were killed,
    # or the kernel itself was (then the cell records a kernel death)
    text = str(last.get("outputs", []))
    assert "-9" in text or "KernelDied" in text, text[:500]
    assert float(row[A01]) == TOTAL


def test_a_crash_in_exercise_2_keeps_exercise_1(runs):
    for s, word in (("exit", "kernel died"), ("deaf", "could not be interrupted")):
        row = runs["first"][s]
        assert row["status"] == "graded", row["notes"]
        assert float(row[A01]) == SOFTMAX_POINTS, (s, row[A01], row["notes"])
        assert word in row["notes"] and "scaled_dot_product_attention" in row["notes"], row["notes"]
        assert " graded" not in row["notes"].split(word)[0][-40:]
