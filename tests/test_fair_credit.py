"""Fair partial credit (issue 29, point 10): a graded cell checks what its name promises.

A cell named for shapes, structure, a device or a call that runs (or must raise) is judged on
what the calls return without their values; one named for batch axes on the shapes and on
the student's own consistency (one element of a batch alone gives what the whole batch gives
there); one named for memory on the memory it takes. `engine.shapes(...)`, `batch(...)` and
`memory(...)` mark them in the spec tables.

Two tests keep it so:
- the names: every cell whose name promises one of these is marked so in every probe that
  backs it, and no other cell is (PROMISES, one line per promise, not one per cell);
- the catalogues: for every catalogued mistake, read from its own outputs on the probes
  whether it breaks what each such cell promises: where every output has the reference's
  shape and dtype (and each batch element alone matches the batch), the cell passes; where a
  shape differs, the call raised or a must-raise call did not, the cell fails. No list of
  cells per mistake: the outputs decide.
"""
import re

import numpy as np
import pytest

import catalogue
from test_catalogue import lanes
from tfscratch.specs import engine

SPECCED = [m for m in catalogue.modules() if engine.has_spec(m.ASSIGNMENT)]
MISTAKES = [(m.ASSIGNMENT, x) for m in SPECCED for x in m.MISTAKES]

# what a cell's name promises (its grade id ends with `_<word>`) -> what its probes compare
PROMISES = {
    "shape": "shapes", "shapes": "shapes", "sizes": "shapes", "device": "shapes",
    "structure": "shapes", "parameters": "shapes", "max_len": "shapes",
    "batch_axes": "batch", "batch_invariance": "batch",
    "flash_attention_memory": "memory", "FlashAttention_memory": "memory",   # 06's `_memory` cells are the encoder's memory: values
}
_MEMORY_KEYS = (".shapes", ".reduced", ".memory")


def promised(cell: str) -> str:
    return next((a for word, a in PROMISES.items() if cell.endswith(f"_{word}")), "values")


def test_every_cell_compares_what_its_name_promises():
    wrong = [f"{a}: probe {p.name!r} compares {p.aspects[c]} for {c}, its name promises {promised(c)}"
             for a in (m.ASSIGNMENT for m in SPECCED) for ex in engine.specs_for(a)
             for p in ex.probes for c in p.cells if p.aspects[c] != promised(c)]
    assert not wrong, "\n".join(wrong)


def test_a_wrong_scale_costs_the_value_cells_only():
    """The reviewer's case: dividing by d_k fails the weights, the output and the random
    cells (6 points), not the shapes and batch axes cells (2 points)."""
    code = ("def scaled_dot_product_attention(q, k, v):\n"
            "    w = softmax(q @ k.transpose(-2, -1) / q.size(-1))\n"
            "    return w @ v, w\n")
    verdicts = catalogue.independent("01_attention", "scaled_dot_product_attention", code)
    failed = sorted(g for g, v in verdicts.items() if not v.passed)
    t = "test_scaled_dot_product_attention_"
    assert failed == [t + "output", t + "random", t + "weights"], failed
    assert all(re.search("divided by d_k", verdicts[g].message) for g in failed)


def test_a_batch_cell_fails_when_batch_elements_mix():
    """Right shapes, right values on one batch axis, but two batch axes mixed: only the
    batch axes cell says so."""
    code = ("def scaled_dot_product_attention(q, k, v):\n"
            "    w = softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5)\n"
            "    if w.dim() > 3:\n"
            "        w = w.flatten(0, -3).flip(0).reshape(w.shape)\n"
            "    return w @ v, w\n")
    verdicts = catalogue.independent("01_attention", "scaled_dot_product_attention", code)
    failed = [g for g, v in verdicts.items() if not v.passed]
    assert failed == ["test_scaled_dot_product_attention_batch_axes"], failed
    assert "on its own" in verdicts[failed[0]].message


def _keys(p, caps):
    return {k for k in caps if k.startswith(f"{p.name}.") and not k.endswith(_MEMORY_KEYS)}


def _outputs_broken(p, got, want) -> bool | None:
    """From the outputs alone: True when a call raised, a must-raise call returned, an output
    is missing or has another shape, or the parameters' names and shapes differ; False when
    every output, gradient and attribute has the reference's shape and dtype; None when only
    a float width differs (float64 for float32: the probe's own rule decides)."""
    gc, wc, gm, wm = got["caps"], want["caps"], got["meta"], want["meta"]
    if gm.get(f"{p.name}.error"):
        return True
    if p.params and gm.get(f"{p.name}.params") is not None:
        # the engine's rule: every specified name with its shape (aliases may add names), and as
        # many distinct tensors
        gs = {n: tuple(s) for n, s in gm[f"{p.name}.params"]}
        if any(gs.get(n) != tuple(s) for n, s in wm[f"{p.name}.params"]) \
                or gm.get(f"{p.name}.param_ids") != wm.get(f"{p.name}.param_ids"):
            return True
    widths = False
    for key in _keys(p, wc):
        g, w = gc.get(key), np.asarray(wc[key])
        if g is None:
            return True
        g = np.asarray(g)
        if key.endswith((".raised", ".shape")):
            if not np.array_equal(g, w):
                return True
        elif g.shape != w.shape or (w.dtype == np.bool_) != (g.dtype == np.bool_):
            return True
        elif g.dtype != w.dtype:
            widths = True
    return None if widths else False


def _consistent(p, got) -> bool:
    """Each call on one element of an earlier call's batch gives that call's output there."""
    caps = got["caps"]
    for ci, cj, index in engine.batch_slices(p):
        own = f"{p.name}.{ci}.out"
        for key in [k for k in caps if k == own or k.startswith(own + ".")]:
            whole = caps.get(f"{p.name}.{cj}.out" + key[len(own):])
            if whole is not None and not np.allclose(np.asarray(caps[key], dtype=float),
                                                     np.asarray(whole, dtype=float)[index],
                                                     atol=p.atol, rtol=p.rtol, equal_nan=True):
                return False
    return True


def breaks(ex, cell, got, want) -> bool | None:
    """Whether the mistake breaks what `cell` promises, read from its outputs (None: the
    outputs do not decide it, e.g. a memory property)."""
    probes = [p for p in ex.probes if cell in p.cells]
    aspect = probes[0].aspects[cell]
    if aspect == "memory":
        return None
    found = [_outputs_broken(p, got, want) for p in probes]
    if any(found):
        return True
    if None in found:
        return None
    return aspect == "batch" and not all(_consistent(p, got) for p in probes)


@pytest.mark.parametrize("assignment,m", lanes(MISTAKES))
def test_a_mistake_fails_only_the_cells_whose_promise_it_breaks(assignment, m):
    ex = next(e for e in engine.specs_for(assignment) if e.name == m.exercise)
    got, want, verdicts = catalogue.independent_run(assignment, m.exercise, m.code)
    unfair, lenient = [], []
    for cell in sorted(ex.cells()):
        if promised(cell) == "values":
            continue
        broken = breaks(ex, cell, got, want)
        if broken is False and not verdicts[cell].passed:
            unfair.append(f"{cell}: {verdicts[cell].message}")
        if broken is True and verdicts[cell].passed:
            lenient.append(cell)
    assert not unfair, f"{m.description}: its outputs keep these cells' promise, yet they fail:\n" + \
        "\n".join(unfair)
    assert not lenient, f"{m.description}: its outputs break these cells' promise, yet they pass: {lenient}"
