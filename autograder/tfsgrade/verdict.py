"""The coordinator's verdict: every graded cell of a notebook with exercise specs
(`tfscratch.specs`) is scored here, outside the student's process.

- `prepare(assignment, seed)` / `reference_wants(plans)`: what goes into the sandbox with the
  notebook, and what the reference gives on it. For each exercise, its public part (the grade
  ids it backs and the plan's head: the forbidden groups, nothing drawn for the submission)
  and its plan, whose inputs are drawn from the task's own seed (`Settings.item_seed`: per
  student and per submission, from the instructor's secret); with them, the probe machine's
  text (`VM_SOURCE`: `tfscratch/specs/fixtures.py` then `vm.py`, run as one fresh module in the
  check's own process, so nothing the student patched in the course package is used); and the
  reference's captures on the same plan. Both run in the Dask worker (`dispatch.run_task`),
  outside the sandbox, so a class's reference runs are spread over the workers like its
  notebooks. The plans reach the runner through a pipe, never a file in the sandbox; the
  runner checks each exercise in a process of its own (tfsgrade.check_process) that runs the
  student's cells above the exercise's first graded test cell, so it sees exactly what the
  test cells see, and returns what it captured (npz, never pickle).
- `decode(...)`: the captures back, checked before anything is decompressed: exactly one
  capture per probe of the plan, in the plan's order, naming only that probe's keys, with
  declared sizes (base64 length, the zip's central directory, each array's npy header) within
  what the probe can produce (the reference's captures plus slack) and a hard cap per item.
  Anything else is "a capture the probe did not make": the item is flagged and the forged
  capture never counts.
- `verdict_judge(items, settings, gradebook)`: compares with the reference's captures, and
  writes each graded cell's score through nbgrader's Gradebook API (`auto_score`). Where the
  notebook's own test cell disagrees (passed in the kernel but not here, or the reverse), the
  submission is flagged for review, naming the cell. An item that cannot be judged (any
  exception) scores 0 on the cells the check backs and is flagged; the class run goes on.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from tfscratch.specs import engine, fixtures, vm

# The probe machine's text: its stand-ins and drivers first, then the machine, in one fresh
# module; the machine's lines marked PACKAGE_ONLY (its import of fixtures) are not in it.
PACKAGE_ONLY = "# PACKAGE_ONLY"


def _probe_source() -> str:
    text = Path(vm.__file__).read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [ln for ln in text if not ln.rstrip().endswith(PACKAGE_ONLY)]
    assert len(text) - len(kept) == 1, "vm.py marks one line PACKAGE_ONLY: its import of fixtures"
    return Path(fixtures.__file__).read_text(encoding="utf-8") + "\n\n" + "".join(kept)


VM_SOURCE = _probe_source()
FORGED = "a capture the probe did not make"
# the runner's reasons that already say, in plain words, what happened (tfsgrade.sandbox_runner)
PLAIN = engine.GRADER_REASONS   # reasons of the grader, said as they are

# What a capture may hold, checked before decompression. The reference's captures of every
# notebook total under 1 MB; a probe's own recorders (`.shapes`) stay under 1 MB.
KEY_SLACK, KEY_FLOOR = 16, 2**20           # one array: 16 x the reference's, plus 1 MB
ITEM_CAP = 64 * 2**20                      # everything one submission's probes decompress to
B64_CAP = 6 * 2**20                        # one capture's text (the runner keeps 4 MB a cell)
MAX_MEMBERS = 4096                         # arrays in one capture

def dask_setup(worker=None) -> None:
    """Dask's preload hook (run._local_cluster): a worker imports every spec while it starts,
    not on its first task."""
    engine.modules()
    import tfscratch.reference  # noqa: F401 - the worker runs the reference too (reference_wants)
    try:                        # and PyTorch's first operations (about 0.5 s, once)
        reference_wants(prepare(sorted(engine.modules())[0], 0)[1])
    except Exception:  # noqa: BLE001 - a warm-up only
        pass


def prepare(assignment: str, seed: int) -> tuple[list, list]:
    """([{"public": ..., "plan": ...}], plans) for one task: each exercise's plan built once, for
    its check (public: the exercise, the grade ids it backs, the plan's head; plan: the whole
    plan, its inputs packed) and for the reference's run (`wants`)."""
    plans = [(ex, *engine.build_plan(ex, seed)) for ex in engine.specs_for(assignment)]
    checks = [{"public": {"exercise": ex.name, "cells": sorted(ex.cells()), "head": vm.head(plan)},
               "plan": dict(plan, tensors=vm.pack(tensors))}
              for ex, plan, tensors in plans]
    return checks, plans


def reference_wants(plans) -> dict:
    """{exercise: the reference's captures (packed) and meta} on the plans `prepare` built."""
    out = {}
    for ex, plan, tensors in plans:
        res = vm.run_plan(plan, engine._namespace(ex), tensors=tensors)
        errors = {k: v for k, v in res["meta"].items() if k.endswith(".error")}
        if errors:
            raise RuntimeError(f"the spec of {ex.name} fails on the reference: {errors}")
        out[ex.name] = {"caps": vm.pack(res["caps"]), "meta": res["meta"]}
    return out


def reference(ex, seed: int) -> dict:
    """The reference's captures for one exercise and seed, computed here (uncached: with a seed
    per submission nothing would be reused)."""
    plan, tensors = engine.build_plan(ex, seed)
    res = vm.run_plan(plan, engine._namespace(ex), tensors=tensors)
    errors = {k: v for k, v in res["meta"].items() if k.endswith(".error")}
    if errors:
        raise RuntimeError(f"the spec of {ex.name} fails on the reference: {errors}")
    return res


# -- captures, checked ----------------------------------------------------------------------

class Rejected(ValueError):
    """A capture that the probe machine cannot have made; `too_big`: one larger than this
    probe's results can be (checked before it is decompressed)."""

    def __init__(self, msg, too_big=False):
        super().__init__(msg)
        self.too_big = too_big


def _bound(key: str, probe: str, want_caps: dict) -> int:
    w = want_caps.get(key)
    if w is None:       # a key the reference has not (another structure): the probe's largest
        w = max((v for k, v in want_caps.items() if k.startswith(probe + ".")),
                key=lambda v: v.nbytes, default=None)
    return KEY_FLOOR + KEY_SLACK * (0 if w is None else int(w.nbytes))


def unpack_checked(text, probe: str, want_caps: dict, budget: list) -> dict:
    """vm.unpack with every size checked before it is decompressed. `budget` = [bytes left of
    the item's cap]; raises Rejected."""
    if not isinstance(text, str):
        raise Rejected("not text")
    if not text:
        return {}
    limit = sum(_bound(k, probe, want_caps) for k in want_caps if k.startswith(probe + ".")) \
        + 4 * KEY_FLOOR
    if len(text) > min(4 * (min(limit, budget[0]) // 3 + 1) + 4096, B64_CAP):
        raise Rejected(f"{len(text)} characters of base64, more than the probe can produce", True)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Rejected(f"not base64 ({e})") from None
    try:
        z = zipfile.ZipFile(io.BytesIO(raw))
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise Rejected(f"not an npz ({type(e).__name__})") from None
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS or len({i.filename for i in infos}) != len(infos):
        raise Rejected(f"{len(infos)} arrays, or one twice")
    declared = 0
    for info in infos:
        key = info.filename[:-4] if info.filename.endswith(".npy") else None
        if key is None or not key.startswith(probe + ".") or info.flag_bits & 0x1:
            raise Rejected(f"an array {info.filename[:80]!r} this probe does not capture")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise Rejected("an unknown compression")
        if info.file_size > _bound(key, probe, want_caps):
            raise Rejected(f"{key} declares {info.file_size} bytes, more than the probe can produce", True)
        declared += info.file_size
    if declared > budget[0]:
        raise Rejected(f"{declared} bytes in all, past the cap of {ITEM_CAP} bytes per submission", True)
    out = {}
    for info in infos:
        try:
            out[info.filename[:-4]] = _member(z, info)
        except Rejected:
            raise
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError) as e:
            raise Rejected(f"{info.filename[:80]!r} is damaged ({type(e).__name__})") from None
    budget[0] -= declared
    return out


def _member(z, info) -> np.ndarray:
    """One array, its npy header checked against the member's declared size before the data
    is read (np.load would allocate what the header says)."""
    key = info.filename[:-4]
    fmt = np.lib.format
    with z.open(info) as f:     # yields at most the declared size (zipfile stops there)
        try:
            version = fmt.read_magic(f)
            read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}[version]
            shape, fortran, dtype = read(f, max_header_size=10000)
        except (KeyError, ValueError, TypeError, SyntaxError, EOFError) as e:
            raise Rejected(f"{key} is not an npy array ({type(e).__name__})") from None
        if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
            raise Rejected(f"{key} has dtype {dtype}")
        n = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if n > info.file_size:
            raise Rejected(f"{key} declares {n} bytes in a {info.file_size}-byte member")
        data = f.read(n + 1)
        if len(data) != n:
            raise Rejected(f"{key} holds {len(data)} bytes, its header says {n}")
    a = np.frombuffer(data, dtype=dtype)
    return (a.reshape(shape[::-1]).T if fortran else a.reshape(shape)).copy()


def decode(probes: dict | None, assignment: str | None = None, wants: dict | None = None,
           problems: list | None = None) -> dict:
    """The sandbox's probe outputs -> {exercise: {"caps", "meta", "error"}}.

    With `assignment`, each exercise's captures are held to its plan: one capture document
    per probe, in the plan's order, each naming its own probe's keys only, within the sizes
    `wants` (the reference's captures) allows. A document that breaks this is not used, the
    probe it claims fails, and a line goes to `problems` (the item is flagged): a forged or
    duplicated capture never counts, whichever comes first. Without `assignment` (tests), the
    documents are only read, each within the hard cap."""
    problems = [] if problems is None else problems
    probes = dict(probes or {})
    specs = {ex.name: ex for ex in engine.specs_for(assignment)} if assignment else {}
    budget = [ITEM_CAP]
    out = {}
    for ex_name, doc in probes.items():
        if specs and ex_name not in specs:
            problems.append(f"{FORGED}: results for {str(ex_name)[:60]!r}, which this notebook "
                            "does not check")
            continue
        doc = doc if isinstance(doc, dict) else {}
        docs = doc.get("docs") if isinstance(doc.get("docs"), list) else []
        ex = specs.get(ex_name)
        order = [p.name for p in ex.probes] if ex is not None else None
        want_caps = (wants or {}).get(ex_name, {}).get("caps", {})
        caps, meta = _decode_exercise(ex_name, docs, order, want_caps, budget, problems)
        out[ex_name] = {"caps": caps, "meta": meta, "error": doc.get("error")}
    return out


def _out_of_order(d: dict, ex_name: str, name: str, order: list, seen: dict, bad: dict, nxt: int):
    """Why a capture document breaks the plan (None when it is the next one expected)."""
    if d.get("exercise") != ex_name or name not in order:
        return f"a capture for {str(d.get('exercise'))[:40]}/{str(name)[:40]}"
    if name in seen or name in bad:
        return f"a second capture for {name}"
    if order.index(name) != nxt:
        return f"a capture for {name} out of the plan's order"
    return None


def _decode_exercise(ex_name, docs, order, want_caps, budget, problems) -> tuple[dict, dict]:
    """One exercise's capture documents -> (caps, meta); `order`: the plan's probe names (None:
    only read them). A document that breaks the plan is not used and its probe fails."""
    caps, meta, bad, seen, nxt = {}, {}, {}, {}, 0
    for d in docs:
        d = d if isinstance(d, dict) else {}
        name = d.get("probe") if isinstance(d.get("probe"), str) else repr(d.get("probe"))[:40]
        why = _out_of_order(d, ex_name, name, order, seen, bad, nxt) if order is not None else None
        if why:         # a real sequence is the plan's order, or a prefix of it
            problems.append(f"{FORGED} in the check of {ex_name}: {why}; not used")
            if d.get("exercise") == ex_name and name in order:
                bad[name] = why                 # which of the two is the probe's is unknown
                seen.pop(name, None)
            continue
        if order is not None:
            nxt += 1
        try:
            c = unpack_checked(d.get("caps", ""), name, want_caps, budget)
            m = d.get("meta") or {}
            if not isinstance(m, dict) or any(not str(k).startswith(f"{name}.") for k in m):
                raise Rejected("meta for another probe")
        except Rejected as e:
            what = "a result too large to judge" if e.too_big else FORGED
            problems.append(f"{what} in the check of {ex_name}/{name}: {str(e)[:200]}; not used")
            if order is not None:
                bad[name] = f"{what}: {str(e)[:200]}"
            else:
                meta[f"{name}.error"] = f"unreadable capture ({e})"
            continue
        seen[name] = (c, m)
    for name, (c, m) in seen.items():
        if name not in bad:
            caps.update(c)
            meta.update(m)
    for name, why in bad.items():
        meta[f"{name}.error"] = f"CheckNotRun: the independent check's result was not used ({why})"
    return caps, meta


def _want(ex, seed: int, wants: dict | None) -> dict:
    w = (wants or {}).get(ex.name)
    if w is not None:
        return {"caps": vm.unpack(w["caps"]), "meta": w["meta"]}
    return reference(ex, seed)


def judge_item(assignment: str, seed: int, probes: dict | None, wants: dict | None = None,
               problems: list | None = None) -> dict:
    """{grade_id: Verdict} for one submission of one notebook. `wants`: the reference's
    captures packed by `reference_wants` (in the worker); computed here where absent. `problems`
    receives what makes the item suspicious (a capture the probe did not make)."""
    wants = wants or {}
    unpacked = {ex.name: _want(ex, seed, wants) for ex in engine.specs_for(assignment)}
    results = decode(probes, assignment, unpacked, problems)
    verdicts = {}
    for ex in engine.specs_for(assignment):
        got = results.get(ex.name)
        if got is None:
            got = {"caps": {}, "meta": {}, "error": "the check did not run"}
        for p in ex.probes:
            if not any(k.startswith(f"{p.name}.") for k in list(got["caps"]) + list(got["meta"])):
                why = got.get("error") or "no result came back"
                got["meta"][f"{p.name}.error"] = (
                    why if why.startswith(PLAIN) else
                    f"CheckNotRun: the independent check could not run this exercise ({why})")
        verdicts.update(engine.judge(ex, seed, got, want=unpacked[ex.name]))
    return verdicts


def verdict_judge(items, s, gb) -> None:
    for it in items:
        if it.status != "pending" or not it.result or not engine.has_spec(it.assignment):
            continue
        problems: list = []
        try:
            verdicts = judge_item(it.assignment, s.item_seed(it), it.result.get("probes"),
                                  it.result.get("want"), problems)
        except Exception as e:  # noqa: BLE001 - MemoryError too: this item only
            why = (f"the independent check could not judge this notebook "
                   f"({type(e).__name__}: {str(e)[:200]}); its cells score 0 until reviewed")
            verdicts = {g: engine.Verdict(False, why)
                        for ex in engine.specs_for(it.assignment) for g in ex.cells()}
            problems.append(why)
        it.verdicts = {g: (v.passed, v.message) for g, v in verdicts.items()}
        differ = []
        for gid, v in verdicts.items():
            try:
                grade = gb.find_grade(gid, it.assignment, it.assignment, it.student)
            except Exception:  # noqa: BLE001 - nbgrader has no such cell for this submission
                continue
            top = float(grade.max_score or 0)
            kernel_passed = grade.auto_score is not None and float(grade.auto_score) >= top > 0
            grade.auto_score = top if v.passed else 0.0
            if kernel_passed != v.passed:
                differ.append(f"{gid} (notebook: {'passed' if kernel_passed else 'failed'}; "
                              f"independent check: {'passed' if v.passed else 'failed: ' + v.message[:200]})")
        gb.db.commit()
        for msg in dict.fromkeys(problems):
            it.flags.append(msg)
            it.reasons.append(msg)
        if differ:
            msg = ("results differ between the notebook and the independent check in "
                   + "; ".join(differ) + "; the independent check's verdict counts")
            it.flags.append(msg)
            it.reasons.append(msg)
