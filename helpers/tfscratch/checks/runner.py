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
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import replace

import torch

from .core import CheckFailed, NotDone, no_shortcuts, passed

PUBLIC_SEED = 0


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
            return check(self._cells[cell], cell, obj, seed, sys._getframe(1).f_globals)
        run.__name__ = cell
        return run


def notebook(assignment: str) -> Notebook:
    return Notebook(assignment)


def check(ex, cell: str, obj, seed: int = PUBLIC_SEED, namespace: dict | None = None) -> None:
    """Run the probes of `ex` that back `cell` on `obj` and judge them (see the module doc)."""
    from ..specs import engine
    sub = replace(ex, probes=[p for p in ex.probes if cell in p.cells])
    from ..specs import vm
    ns = dict(namespace or {})
    ns[ex.name] = obj
    vm.last_exception = None
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore")
        with no_shortcuts(*ex.shortcuts):
            got = engine.student_run(sub, seed, ns)
        verdict = engine.judge(sub, seed, got)[cell]
    if verdict.passed:
        passed(f"{cell}: " + "; ".join(p.what or p.name for p in sub.probes))
        return None
    errors = [got["meta"].get(f"{p.name}.error", "") for p in sub.probes]
    if errors and all(e.startswith("NotImplementedError") for e in errors):
        raise NotDone(ex.name)
    exc = CheckFailed(f"{ex.name}: {verdict.message}")
    exc.title = f"{cell}: " + "; ".join(p.what or p.name for p in sub.probes)
    raise exc from vm.last_exception
