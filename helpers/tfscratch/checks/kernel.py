"""The notebooks' test cells run the exercise specs (`tfscratch.specs`) in the kernel.

    chk = checks.notebook("01_attention")     # in the setup cell
    chk.test_softmax_rows(softmax)             # a graded test cell: its grade id, the object

runs the probes of the spec that back that cell on the student's object (inputs from a fixed,
public seed; hidden tests pass `seed=` a number the student never saw), runs the same probes on
the reference, and judges with the same engine the grader uses outside the student's process:
the same verdict and the same message, on other inputs. A pass prints one green line; a
failure raises `CheckFailed` whose message names the mistake where a diagnosis recognises it;
an exercise that still raises NotImplementedError raises `NotDone`.

While the student's code runs, the exercise's PyTorch shortcuts raise (COURSE_SPEC section 4),
warnings stay off stderr, and the global RNG is restored afterwards.

No answer key here: on the public seed the plan and the expected captures come from the files
`make release` stores (tfscratch.specs.stored), never from the graded notebook's reference,
which a grading sandbox and a student bundle do not hold. Other seeds (the hidden tests of the
instructor's notebook) are computed from the reference where this process has it; where it
does not (a grading sandbox), the hidden part says that the grader runs it, and the grader's
independent check, on inputs drawn for this student, decides the cell's score.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import replace

import torch

from .core import CheckFailed, NotDone, no_shortcuts, passed

from ..specs.stored import PUBLIC_SEED  # noqa: E402


class Notebook:
    """The checks of one notebook: `chk.<grade_id>(obj, seed=...)` for every graded cell."""

    def __init__(self, assignment: str):
        from ..specs import engine
        self.assignment = assignment
        self._cells = {c: ex for ex in engine.specs_for(assignment) for c in ex.cells()}
        if not self._cells:
            raise KeyError(f"no exercise spec for notebook {assignment!r}")

    def __dir__(self):
        return sorted(self._cells)

    def __getattr__(self, cell: str):
        if cell.startswith("_") or cell not in self.__dict__.get("_cells", {}):
            raise AttributeError(f"{self.assignment} has no graded test {cell!r}; "
                                 f"its tests: {sorted(self.__dict__.get('_cells', {}))}")

        def run(obj, seed: int = PUBLIC_SEED):
            return check(self._cells[cell], cell, obj, seed, sys._getframe(1).f_globals,
                         assignment=self.assignment)
        run.__name__ = cell
        return run


def notebook(assignment: str) -> Notebook:
    return Notebook(assignment)


def check(ex, cell: str, obj, seed: int = PUBLIC_SEED, namespace: dict | None = None,
          assignment: str | None = None) -> None:
    """Run the probes of `ex` that back `cell` on `obj` and judge them (see the module doc)."""
    from ..specs import engine, stored, vm
    probes = ex.probes_of(cell)
    backed = {str(c) for p in probes for c in p.cells}
    sub = replace(ex, probes=probes, graded=tuple(g for g in ex.graded if g.id in backed))
    found = stored.public(assignment, ex.name) if assignment and seed == PUBLIC_SEED else None
    if found is None and not engine.reference_available(ex):
        if seed != PUBLIC_SEED:
            print(f"\u2026 {cell}: the hidden part of this check runs in the grader, on inputs "
                  "drawn for you")
            return None
        raise CheckFailed(f"{ex.name}: the expected results of this check are missing from the "
                          "course package (reinstall it, or ask your instructor)")
    ns = dict(namespace or {})
    ns[ex.name] = obj
    vm.last_exception = None
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        if found is None:
            with no_shortcuts(*ex.shortcuts):
                got = engine.student_run(sub, seed, ns)
            verdict = engine.judge(sub, seed, got)[cell]
        else:
            plan, tensors, want = found
            names = {p.name for p in sub.probes}
            plan["probes"] = [d for d in plan["probes"] if d["name"] in names]
            with no_shortcuts(*ex.shortcuts):
                got = vm.run_plan(plan, ns, tensors=tensors)
            got["target"] = obj        # for the diagnoses, where the reference is absent
            verdict = engine.judge(sub, seed, got, want=want, plan=(plan, tensors))[cell]
    if verdict.passed:
        passed(f"{cell}: " + "; ".join(p.what or p.name for p in sub.probes)
               + (f" ({verdict.note})" if verdict.note else ""))
        return None
    errors = [got["meta"].get(f"{p.name}.error", "") for p in sub.probes]
    if errors and all(e.startswith("NotImplementedError") for e in errors):
        raise NotDone(ex.name)
    exc = CheckFailed(f"{ex.name}: {verdict.message}")
    exc.title = f"{cell}: " + "; ".join(p.what or p.name for p in sub.probes)
    raise exc from vm.last_exception
