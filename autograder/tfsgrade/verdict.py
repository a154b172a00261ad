"""The coordinator's verdict: every graded cell of a notebook with exercise specs
(`tfscratch.specs`) is scored here, outside the student's process.

- `probe_cells(assignment, seed)`: what goes into the sandbox with the notebook: for each
  exercise, a probe cell holding the probe machine's text (`tfscratch/specs/vm.py`, run as
  a fresh module, so nothing the student patched in the course package is used) and the
  plan, whose inputs are drawn from this run's hidden seed. The runner puts each cell right
  after the exercise's solution cell and returns what it captured (npz, never pickle).
- `verdict_judge(items, settings, gradebook)`: runs the same plans on the reference, here in
  the coordinator, compares, and writes each graded cell's score through nbgrader's Gradebook
  API (`auto_score`). Where the notebook's own test cell disagrees (passed in the kernel but
  not here, or the reverse), the submission is flagged for review, naming the cell.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tfscratch.specs import engine, vm

VM_SOURCE = Path(vm.__file__).read_text(encoding="utf-8")

_CELL = '''def __tfs_probe(__vm={vm!r}, __plan={plan!r}):
    import types
    m = types.ModuleType("tfs_probe_vm")
    exec(compile(__vm, "tfs_probe_vm", "exec"), m.__dict__)
    m.kernel_main(__plan, globals())
__tfs_probe()
del __tfs_probe
'''


@lru_cache(maxsize=None)
def probe_cells(assignment: str, seed: int) -> tuple:
    return tuple({"exercise": ex.name,
                  "source": _CELL.format(vm=VM_SOURCE, plan=json.dumps(engine.plan_json(ex, seed)))}
                 for ex in engine.specs_for(assignment))


@lru_cache(maxsize=None)
def _wants(assignment: str, seed: int) -> dict:
    return {ex.name: engine.reference_run(ex, seed) for ex in engine.specs_for(assignment)}


def decode(probes: dict | None) -> dict:
    """The sandbox's probe outputs -> {exercise: {"caps", "meta"}}; a probe with no output
    (the kernel died or the cell timed out) gets the reason as its error."""
    out = {}
    for ex, doc in (probes or {}).items():
        caps, meta = {}, {}
        for d in doc.get("docs", []):
            try:
                caps.update(vm.unpack(d.get("caps", "")))
            except Exception as e:  # noqa: BLE001 - not an npz: the output was forged or cut
                meta[f"{d.get('probe')}.error"] = f"unreadable capture ({type(e).__name__})"
                continue
            meta.update({k: v for k, v in (d.get("meta") or {}).items()})
        out[ex] = {"caps": caps, "meta": meta, "error": doc.get("error")}
    return out


def judge_item(assignment: str, seed: int, probes: dict | None) -> dict:
    """{grade_id: Verdict} for one submission of one notebook."""
    results = decode(probes)
    verdicts = {}
    for ex in engine.specs_for(assignment):
        got = results.get(ex.name)
        if got is None:
            got = {"caps": {}, "meta": {}, "error": "the check did not run"}
        for p in ex.probes:
            if not any(k.startswith(f"{p.name}.") for k in list(got["caps"]) + list(got["meta"])):
                why = got.get("error") or "no result came back"
                got["meta"][f"{p.name}.error"] = (
                    f"CheckNotRun: the independent check could not run this exercise ({why}: "
                    "an endless loop, a crash or the kernel dying in your code)")
        verdicts.update(engine.judge(ex, seed, got, want=_wants(assignment, seed)[ex.name]))
    return verdicts


def verdict_judge(items, s, gb) -> None:
    for it in items:
        if it.status != "pending" or not it.result or not engine.has_spec(it.assignment):
            continue
        verdicts = judge_item(it.assignment, s.probe_seed, it.result.get("probes"))
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
        if differ:
            msg = ("results differ between the notebook and the independent check in "
                   + "; ".join(differ) + "; the independent check's verdict counts")
            it.flags.append(msg)
            it.reasons.append(msg)
