"""The independent check's own process (tfsgrade.check_process, driven by the runner's
`Checks`): the guard is on before the first line of the student's code, nothing of the plan
can be read while the student's cells run, a cell that fails does not stop the next, an
endless loop costs its exercise with a plain reason; and, in the sandbox, the plan's inputs
are nowhere the kernel can read."""
import json
import tempfile
from dataclasses import asdict
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest

from nbtools import A01, solution_sources, student_notebook
from tfscratch import shortcuts
from tfscratch.specs import vm
from tfsgrade import sandbox_runner as runner
from tfsgrade import verdict
from tfsgrade.settings import Limits

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def _plan(forbid=("softmax",)):
    call = {"args": [{"$t": "t0"}], "kwargs": {}}
    return {"exercise": "f", "target": "f", "probes": [{"name": "p", "calls": [call]}],
            "forbid": shortcuts.plan_rows(forbid) if forbid else None,
            "tensors": vm.pack({"t0": X})}


def _check(cells: list[str], plan=None, cell_timeout=30) -> dict:
    """The runner's Checks on one exercise `f` whose cells are `cells`, outside the sandbox:
    {"docs", "error"} and the first capture's arrays."""
    plan = plan or _plan()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    cfg = {"probes": [{"exercise": "f", "cells": [], "head": vm.head(plan)}], "vm": verdict.VM_SOURCE,
           "cwd": tempfile.mkdtemp(prefix="tfs-check-"), "pid_namespace": False,
           "limits": asdict(Limits(cell_timeout=cell_timeout, notebook_timeout=120))}
    checks = runner.Checks(cfg, {"f": plan})
    checks.start(nb)
    fake = SimpleNamespace(looping=set(), nb=nb, cells=nb.cells, seconds={},
                           cells_for=lambda place: list(range(len(cells))))
    got = checks.run(fake)["f"]
    caps = vm.unpack(got["docs"][0]["caps"]) if got["docs"] else {}
    return got, caps


def test_the_guard_is_on_before_the_first_line_of_the_students_code():
    first = """seen = sorted(k for k in globals() if not k.startswith("__"))
import torch, torch.nn.functional as F
try:
    F.softmax(torch.ones(2), 0)
    refused = 0.0
except Exception as e:
    refused = 1.0 if type(e).__name__ == "ShortcutUsed" else 0.5
kernel = torch.library.get_kernel("aten::_softmax", "CPU")
def f(x):
    try:
        kernel.call_boxed(torch._C._dispatch_keyset_full(), x, -1, False)
        held = 0.0
    except Exception:
        held = 1.0
    return torch.tensor([refused, held, float(len(seen))])
"""
    got, caps = _check([first])
    assert got["error"] is None, got
    refused, held, names = caps["p.0.out"]
    assert refused == 1.0, "F.softmax ran in the student's first line"
    assert held == 1.0, "a kernel handle taken before the exercise reached the real kernel"
    assert names == 2.0         # get_ipython and display: nothing else of anyone's
    # the probe's own check saw the refused calls: a shortcut, not a pass
    assert got["docs"][0]["meta"]["p.error"].startswith("ShortcutUsed")


def test_nothing_of_the_plan_can_be_read_while_the_cells_run():
    """Every pipe the child holds, read while the student's cells run, gives nothing: the plan
    is sent only after they have all run."""
    spy = """import os, select, torch
got = b""
for fd in range(3, 256):
    try:
        if select.select([fd], [], [], 0)[0]:
            os.set_blocking(fd, False)
            got += os.read(fd, 1 << 20)
    except (OSError, ValueError):
        pass
def f(x):
    return torch.tensor([float(len(got)), float(b"tensors" in got)])
"""
    got, caps = _check([spy], plan=_plan(forbid=None))
    assert got["error"] is None, got
    assert list(caps["p.0.out"]) == [0.0, 0.0]


def test_a_failing_cell_does_not_stop_the_next_and_stderr_goes_nowhere():
    cells = ["import sys\nprint('x' * 10**6, file=sys.stderr)\nraise SystemExit(3)",
             "%matplotlib inline\n!ls\ndef f(x):\n    return x * 2"]
    got, caps = _check(cells, plan=_plan(forbid=None))
    assert got["error"] is None, got
    np.testing.assert_array_equal(caps["p.0.out"], X * 2)


def test_an_endless_loop_costs_its_exercise_with_a_plain_reason():
    got, _ = _check(["def f(x):\n    while True:\n        pass"], plan=_plan(forbid=None), cell_timeout=2)
    assert got["docs"] == [] and got["error"].startswith("CheckTimeout: f did not return within 2s"), got


def test_a_child_that_exits_reports_a_death_not_a_pass():
    got, _ = _check(["import os\ndef f(x):\n    os._exit(0)"], plan=_plan(forbid=None))
    assert got["docs"] == [] and got["error"].startswith("KernelDied"), got


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_plans_inputs_never_reach_the_kernel():
    """An honest 01 whose last cell reads everything the kernel can reach (its control folder,
    scratch, /tmp, HOME, every process's command line and environment): none of the check's
    packed inputs is there, and the checks still pass."""
    seed = 4242
    checks, _ = verdict.prepare(A01, seed)
    nb = student_notebook(A01, solution_sources(A01))
    nb.cells.append(nbformat.v4.new_code_cell("""import os
found = []
for root in ("/control", "/submission", "/tmp", os.path.expanduser("~")):
    for d, _, files in os.walk(root):
        for n in files:
            try:
                found.append(open(os.path.join(d, n), "rb").read().decode("latin-1"))
            except OSError:
                pass
for pid in os.listdir("/proc"):
    for part in ("cmdline", "environ"):
        try:
            found.append(open(f"/proc/{pid}/{part}", "rb").read().decode("latin-1"))
        except OSError:
            pass
print("\\n".join(found))
"""))
    from tfsgrade.sandbox import execute_task
    r = execute_task({"student": "s", "assignment": A01, "notebook": nbformat.writes(nb).encode(),
                      "limits": asdict(Limits(cell_timeout=60, notebook_timeout=300)), "sandbox": True,
                      "probes": [c["public"] for c in checks], "vm": verdict.VM_SOURCE,
                      "plans": {c["public"]["exercise"]: c["plan"] for c in checks}})
    seen = json.dumps(nbformat.reads(r["notebook"], as_version=4).cells[-1].outputs)
    for c in checks:
        packed = c["plan"]["tensors"]
        assert len(packed) > 100 and packed[40:120] not in seen, c["public"]["exercise"]
    assert all(not v["error"] and v["docs"] for v in r["probes"].values()), r["probes"]
