"""The channel between the check and the grader, unit by unit: the captures the grader accepts
(forged, duplicated, oversized, zip bombs), the seed each submission gets, where each exercise
is checked, and a check that no name of the student's namespace can bend.
End to end, in the trust class: tests/test_trust_channel.py."""
import base64
import copy
import io
import json
import os
import stat
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest

from nbtools import A01, NOTEBOOKS, read, solution_sources
from tfscratch.specs import engine, vm
from tfsgrade import sandbox_runner, verdict
from tfsgrade.settings import Settings, derive_seed

SEED = 77


@pytest.fixture(scope="module")
def honest():
    """(probes as the runner returns them, the reference's captures packed) for 01 on SEED,
    the probes made by the probe machine itself on the reference."""
    cells, plans = verdict.prepare(A01, SEED)
    probes = {}
    for ex, plan, tensors in plans:
        docs = []
        vm.run_plan(plan, engine._namespace(ex), tensors=tensors, emit=docs.append)
        probes[ex.name] = {"docs": docs, "error": None}
    return probes, verdict.reference_wants(plans)


def _judge(probes, wants):
    problems = []
    v = verdict.judge_item(A01, SEED, probes, wants, problems)
    return {g for g, x in v.items() if not x.passed}, problems


def _npz(arrays: dict) -> str:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return base64.b64encode(buf.getvalue()).decode()


def _doc(probe, caps: str, exercise="softmax", meta=None):
    return {"exercise": exercise, "probe": probe, "caps": caps, "meta": meta or {}}


def test_the_probes_own_captures_pass(honest):
    failed, problems = _judge(*honest)
    assert failed == set() and problems == []


def test_a_duplicate_or_later_capture_never_overrides_the_real_one(honest):
    """The probe's real capture of wrong code, then a forged one with the right answer (a
    post_execute hook's): before issue 26 the last one won. Now the item is flagged and the
    probe fails: which of the two is the probe's cannot be told, so neither counts."""
    probes, wants = copy.deepcopy(honest)
    docs = probes["softmax"]["docs"]
    real = docs[0]
    wrong = {k: v + 1 for k, v in vm.unpack(real["caps"]).items()}
    docs[0] = dict(real, caps=_npz(wrong))                      # the probe's, of wrong code
    docs.append(real)                                           # forged: the right answer, later
    failed, problems = _judge(probes, wants)
    assert any(verdict.FORGED in p and "second capture" in p for p in problems), problems
    rows = next(p for p in engine.specs_for(A01)[0].probes if p.name == real["probe"])
    assert set(rows.cells) <= failed


def test_unknown_out_of_order_and_foreign_captures_are_flagged(honest):
    probes, wants = copy.deepcopy(honest)
    real = probes["softmax"]["docs"]
    probes["softmax"]["docs"] = ([_doc(real[1]["probe"], real[1]["caps"]),   # probe 2's, first
                                  _doc("no_such_probe", real[0]["caps"])]    # an unknown probe
                                 + real + [_doc("rows", real[0]["caps"], exercise="other")])
    probes["not_an_exercise"] = {"docs": [], "error": None}
    failed, problems = _judge(probes, wants)
    text = "\n".join(problems)
    assert "out of the plan's order" in text and "no_such_probe" in text and "other/rows" in text
    assert "not_an_exercise" in text
    first, second = engine.specs_for(A01)[0].probes[:2]
    assert set(second.cells) <= failed                    # which of its two is real: unknown
    assert not set(first.cells) - set(second.cells) & failed   # the others did not count


def test_meta_for_another_probe_and_object_arrays_are_refused(honest):
    probes, wants = copy.deepcopy(honest)
    d = probes["softmax"]["docs"][0]
    d["meta"] = {"dim.error": "forged"}
    failed, problems = _judge(probes, wants)
    assert any("meta for another probe" in p for p in problems)
    probes, wants = copy.deepcopy(honest)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        with z.open(f"{d['probe']}.0.out.npy", "w") as f:
            np.lib.format.write_array(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    probes["softmax"]["docs"][0]["caps"] = base64.b64encode(buf.getvalue()).decode()
    _, problems = _judge(probes, wants)
    assert any("dtype object" in p for p in problems), problems


def _bomb(name: str, n_bytes: int, header_shape=None, lie: int | None = None) -> str:
    """A deflated npz member of n_bytes zeros; `header_shape`: what the npy header claims;
    `lie`: the uncompressed size the central directory declares."""
    header = io.BytesIO()
    shape = header_shape or (n_bytes // 4,)
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": shape})
    buf = io.BytesIO()
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buf, "w") as z:
        with z.open(info, "w", force_zip64=True) as f:
            f.write(header.getvalue())
            for _ in range(n_bytes // 2**20):
                f.write(bytes(2**20))
    raw = buf.getvalue()
    if lie is not None:          # rewrite the central directory's uncompressed size (zip64 extra)
        true = (n_bytes + len(header.getvalue())).to_bytes(8, "little")
        at = raw.rfind(true)
        raw = raw[:at] + lie.to_bytes(8, "little") + raw[at + 8:]
    return base64.b64encode(raw).decode()


def test_a_zip_bomb_is_refused_on_its_declared_size_without_opening_it(honest):
    import tracemalloc
    probes, wants = copy.deepcopy(honest)
    name = probes["softmax"]["docs"][0]["probe"]
    bomb = _bomb(f"{name}.0.out.npy", 256 * 2**20)
    assert len(bomb) < 400_000
    probes["softmax"]["docs"][0]["caps"] = bomb
    tracemalloc.start()
    try:
        failed, problems = _judge(probes, wants)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, peak
    assert any("too large to judge" in p and "declares" in p for p in problems), problems
    first = engine.specs_for(A01)[0].probes[0]
    assert set(first.cells) <= failed


def test_a_zip_that_lies_about_its_sizes_is_refused_without_a_big_allocation(honest):
    """The central directory declares a small member and the npy header a huge array; or the
    header claims more than the member holds: never allocated, never decompressed past the
    declared size."""
    import tracemalloc
    probes, wants = copy.deepcopy(honest)
    name = probes["softmax"]["docs"][0]["probe"]
    tracemalloc.start()
    try:
        for caps in (_bomb(f"{name}.0.out.npy", 64 * 2**20, lie=1000),           # 64 MB said 1 KB
                     _bomb(f"{name}.0.out.npy", 2**20, header_shape=(2**40,)),   # 4 TB header
                     "not base64 at all!", base64.b64encode(b"PK junk").decode()):
            p = copy.deepcopy(probes)
            p["softmax"]["docs"][0]["caps"] = caps
            failed, problems = _judge(p, wants)
            assert problems and any(verdict.FORGED in x or "too large" in x for x in problems), problems
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, peak


def test_base64_longer_than_the_probe_can_produce_is_not_decoded(honest, monkeypatch):
    probes, wants = copy.deepcopy(honest)
    probes["softmax"]["docs"][0]["caps"] = "A" * (8 * 2**20)
    real = base64.b64decode
    monkeypatch.setattr(base64, "b64decode", lambda t, *a, **k: pytest.fail("decoded")
                        if len(t) > 2**20 else real(t, *a, **k))
    _, problems = _judge(probes, wants)
    assert any("characters of base64" in p for p in problems), problems


def test_an_exception_while_judging_flags_that_item_and_the_run_goes_on(honest, monkeypatch):
    probes, wants = honest

    class Grade:
        max_score, auto_score = 1.0, 1.0

    grades = {}
    gb = SimpleNamespace(find_grade=lambda gid, *a: grades.setdefault((a[-1], gid), Grade()),
                         db=SimpleNamespace(commit=lambda: None))
    s = SimpleNamespace(item_seed=lambda it: SEED)
    items = [SimpleNamespace(student=sid, assignment=A01, status="pending", flags=[], reasons=[],
                             verdicts={}, result={"probes": probes, "want": wants})
             for sid in ("boom", "fine")]
    orig = verdict.judge_item

    def judge_item(assignment, seed, probes, wants=None, problems=None):
        if probes is items[0].result["probes"]:
            raise MemoryError("judging blew up")
        return orig(assignment, seed, probes, wants, problems)
    monkeypatch.setattr(verdict, "judge_item", judge_item)
    items[0].result = {"probes": copy.deepcopy(probes), "want": wants}
    verdict.verdict_judge(items, s, gb)
    boom, fine = items
    assert any("could not judge" in f and "MemoryError" in f for f in boom.flags), boom.flags
    assert all(not passed for passed, _ in boom.verdicts.values())
    assert all(g.auto_score == 0.0 for (sid, _), g in grades.items() if sid == "boom")
    assert fine.flags == [] and all(passed for passed, _ in fine.verdicts.values())


# -- seeds ----------------------------------------------------------------------------------

def test_seed_is_per_student_per_submission_and_stable():
    key = b"k" * 32
    nb = b'{"cells": []}'
    s = derive_seed(key, "ada", A01, nb)
    assert s == derive_seed(key, "ada", A01, nb) and 0 <= s < 2**63
    others = {derive_seed(key, "ben", A01, nb), derive_seed(key, "ada", "02_masks", nb),
              derive_seed(key, "ada", A01, nb + b" "), derive_seed(b"j" * 32, "ada", A01, nb)}
    assert s not in others and len(others) == 4


def test_the_secret_is_made_once_private_and_seeds_follow_it(tmp_path):
    out = tmp_path / "out"
    s1 = Settings.build(out, log=lambda *a: None)
    path = out / "probe_secret"
    assert s1.probe_secret == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    it = SimpleNamespace(student="ada", assignment=A01, notebook=b"{}")
    s2 = Settings.build(out, log=lambda *a: None)          # a regrade: the same inputs
    assert s2.item_seed(it) == s1.item_seed(it)
    other = Settings.build(tmp_path / "elsewhere", log=lambda *a: None)
    assert other.item_seed(it) != s1.item_seed(it)
    given = Settings.build(tmp_path / "x", probe_secret=path, log=lambda *a: None)
    assert given.item_seed(it) == s1.item_seed(it)
    fixed = Settings.build(out, probe_seed=31, log=lambda *a: None)
    assert fixed.item_seed(it) == 31 and fixed.item_seed(SimpleNamespace(
        student="ben", assignment=A01, notebook=b"[]")) == 31
    assert s1.probe_key.decode() not in repr(s1)
    assert s1.fingerprint() == fixed.fingerprint()           # the seed goes into dispatch._key


def test_the_task_carries_its_seed_never_the_secret(tmp_path):
    from tfsgrade import dispatch
    s = Settings.build(tmp_path / "out", log=lambda *a: None)
    it = SimpleNamespace(student="ada", assignment=A01, notebook=b"{}")
    task = dispatch.payload(it, s)
    assert task["seed"] == s.item_seed(it)
    assert s.probe_key.decode() not in json.dumps({k: v for k, v in task.items() if k != "notebook"})
    k1 = dispatch._key(it, s)
    assert k1 == dispatch._key(it, s)
    assert k1 != dispatch._key(SimpleNamespace(student="ben", assignment=A01, notebook=b"{}"), s)
    assert k1 != dispatch._key(it, Settings.build(tmp_path / "other", log=lambda *a: None))


def test_a_secret_inside_a_folder_the_sandbox_mounts_is_refused(tmp_path):
    from tfsgrade import sandbox
    inside = sandbox._ro_paths()[0]
    with pytest.raises(SystemExit, match="mounts"):
        Settings.build(tmp_path / "out", probe_secret=os.path.join(inside, "nope", "secret"),
                       log=lambda *a: None)


@pytest.mark.slow
def test_the_secret_cannot_be_read_inside_the_sandbox(tmp_path):
    from tfsgrade import sandbox
    try:
        sandbox.check()
    except sandbox.SandboxUnavailable as e:
        pytest.skip(f"no sandbox here: {e}")
    s = Settings.build(tmp_path / "out", log=lambda *a: None)
    code = f"open({str(s.probe_secret)!r}).read()"
    r = subprocess.run(sandbox._bwrap_args(None) + [sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "FileNotFoundError" in r.stderr, r.stderr[-500:]
    assert s.probe_key.decode() not in r.stdout + r.stderr


# -- where each exercise is checked ------------------------------------------------------------

def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    for src, meta in cells:
        c = nbformat.v4.new_code_cell(src)
        if meta:
            c.metadata["nbgrader"] = meta
        nb.cells.append(c)
    return nb


def _sol(g):
    return {"grade_id": g, "solution": True}


def _test(g):
    return {"grade_id": g, "grade": True}


def test_the_check_sees_a_helper_defined_below_the_solution():
    nb = _nb(("import torch", None), ("def softmax(x): return _h(x)", _sol("softmax")),
             ("def _h(x): ...", None), ("chk.test_softmax_rows(softmax)", _test("test_softmax_rows")))
    assert sandbox_runner.check_place(nb, {"exercise": "softmax", "cells": ["test_softmax_rows"]}) == 3


def test_exercise_names_that_prefix_others_get_their_own_place():
    """06: Encoder and EncoderLayer: each is checked before the test cells its spec declares,
    never by a prefix of the grade ids."""
    nb = _nb(("class EncoderLayer: ...", _sol("EncoderLayer")),
             ("t", _test("test_EncoderLayer_structure")),
             ("class Encoder: ...", _sol("Encoder")), ("t2", _test("test_Encoder_structure")))
    place = sandbox_runner.check_place
    assert place(nb, {"exercise": "Encoder", "cells": ["test_Encoder_structure"]}) == 3
    assert place(nb, {"exercise": "EncoderLayer", "cells": ["test_EncoderLayer_structure"]}) == 1


@pytest.mark.parametrize("assignment", ["01_attention", "02_masks", "06_blocks", "09_modern_decoder"])
def test_each_check_sees_the_cells_above_its_exercises_first_test_cell(assignment):
    """In the released notebooks (02 rebinds scaled_dot_product_attention, 06 has Encoder and
    EncoderLayer): each exercise is checked after its solution cell, right before the first
    graded test cell its probes back."""
    nb = read(NOTEBOOKS / f"{assignment}.ipynb")
    checks, _ = verdict.prepare(assignment, 1)
    gid = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    for c in checks:
        ex = next(e for e in engine.specs_for(assignment) if e.name == c["public"]["exercise"])
        at = sandbox_runner.check_place(nb, c["public"])
        assert at == min(gid.index(g) for g in ex.cells()), ex.name
        assert gid.index(ex.name) < at
        assert set(c["public"]) == {"exercise", "cells", "head"}     # nothing drawn for the submission
        assert "tensors" not in json.dumps(c["public"])


# -- a check the namespace cannot bend ----------------------------------------------------------

SHADOWS = """from torch import *
from numpy import *
import torch, math
import builtins as _b
print, max, sum, exec, globals = None, 3, 0, "fast", {"lr": 0.1}
types = json = linecache = sys = vm = os = None
"""


def test_the_check_ignores_every_name_the_student_rebound(honest):
    """The check's process after `from torch import *` and `from numpy import *` (torch.compile
    shadows compile) and print, max, sum, exec, globals, types, json, linecache, sys, os
    rebound: its captures are those of the honest run."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from tfsgrade.settings import Limits
    checks, _ = verdict.prepare(A01, SEED)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SHADOWS)] + [
        nbformat.v4.new_code_cell(src) for src in solution_sources(A01).values()]
    cfg = {"probes": [c["public"] for c in checks], "vm": verdict.VM_SOURCE, "cwd": "/tmp",
           "pid_namespace": False, "limits": asdict(Limits(cell_timeout=60, notebook_timeout=300))}
    run = sandbox_runner.Checks(cfg, {c["public"]["exercise"]: c["plan"] for c in checks})
    run.start(nb)
    fake = SimpleNamespace(looping=set(), nb=nb, cells=nb.cells, seconds={},
                           cells_for=lambda place: list(range(len(nb.cells))))
    probes = run.run(fake)
    failed, problems = _judge(probes, honest[1])
    assert failed == set() and problems == []
    assert [d["probe"] for d in probes["softmax"]["docs"]] == [p.name for p in engine.specs_for(A01)[0].probes]


@pytest.mark.slow
def test_quiet_cells_leave_no_trace_in_the_kernels_history(tmp_path):
    """Runner, unsandboxed: a graded test cell with hidden tests runs silently and without
    history; a last cell that prints In, _ih, Out, _oh, %history and linecache's cells shows
    none of it, and the prompt numbers stay one per cell, increasing."""
    from dataclasses import asdict

    from tfsgrade.sandbox import execute_task
    from tfsgrade.settings import Limits
    nb = _nb(("x = 41", None), ("def f(): return x + 1", _sol("f")),
             ("assert f() == 42\n### BEGIN HIDDEN TESTS\nSECRET_SEED = 9173\nassert f() == 42\n"
              "### END HIDDEN TESTS", _test("test_f_value")),
             ("y = 1\ny", None),
             ("import linecache\nprint(In, _ih, Out, _oh)\n%history\n"
              "print([''.join(v[2]) for k, v in linecache.cache.items() if len(v) > 2 and "
              "('ipykernel' in k or k.startswith('<'))])", None))
    r = execute_task({"student": "s", "assignment": "t", "notebook": nbformat.writes(nb).encode(),
                      "limits": asdict(Limits(cell_timeout=60, notebook_timeout=300)), "sandbox": False})
    out = nbformat.reads(r["notebook"], as_version=4)
    printed = "".join(o.get("text", "") for o in out.cells[-1].outputs)
    assert "y = 1" in printed and "def f()" in printed, printed
    for secret in ("9173", "HIDDEN", "SECRET", "__tfs_b"):
        assert secret not in printed, (secret, printed)
    assert [c.execution_count for c in out.cells] == [1, 2, 3, 4, 5]
    assert "Out[4]" not in printed and "{4: 1}" in printed, printed   # y's result, at its own number


@pytest.mark.slow
def test_a_later_cell_cannot_rewrite_a_test_cells_outputs_through_a_display_id():
    """Runner, unsandboxed: a display shown in a graded test cell under a display id, updated
    from a later cell, leaves the test cell's outputs as they were (final once it ran)."""
    from dataclasses import asdict

    from tfsgrade.sandbox import execute_task
    from tfsgrade.settings import Limits
    nb = _nb(("def f(): return 1", _sol("f")),
             ("from IPython.display import display\nassert f() == 1\n"
              "display({'text/plain': 'passed'}, raw=True, display_id='mine')", _test("test_f_value")),
             ("from IPython.display import update_display\n"
              "update_display({'text/plain': 'rewritten'}, raw=True, display_id='mine')", None))
    r = execute_task({"student": "s", "assignment": "t", "notebook": nbformat.writes(nb).encode(),
                      "limits": asdict(Limits(cell_timeout=60, notebook_timeout=300)), "sandbox": False})
    out = nbformat.reads(r["notebook"], as_version=4)
    assert "passed" in json.dumps(out.cells[1].outputs) and "rewritten" not in json.dumps(out.cells[1].outputs)
