"""Checks for notebook 05_positional_encoding: `sinusoidal_positional_encoding`,
`pe_shift_matrix` and `PositionalEncoding`.

References are computed here in float64 from the closed form (PyTorch has no sinusoidal
encoding of its own). A float32 table computed the usual way loses about 1e-7 * pos in the
angle, so table comparisons allow atol = 1e-5 + 4e-7 * pos (about 2e-3 at position 5000): far
below any real mistake, which moves values by O(1) or by a whole frequency step.
"""
from __future__ import annotations

import copy
import math
import re

import torch
from torch import nn

from .core import CheckFailed, ShortcutUsed, call, check_shape, check_true, fail, passed, seeded

# ------------------------------------------------------------------ float64 closed forms


def _freqs(d_model, base=10000.0, rule="2i"):
    """Angular frequencies w_i, i = 0 .. d/2 - 1, in float64. `rule` builds wrong variants."""
    half = (d_model + 1) // 2
    i = torch.arange(half, dtype=torch.float64)
    if rule == "2i":  # the right one: base^(-2i/d)
        return base ** (-2 * i / d_model)
    if rule == "i":  # exponent i/d instead of 2i/d
        return base ** (-i / d_model)
    if rule == "sign":  # pos * base^(+2i/d)
        return base ** (2 * i / d_model)
    if rule == "one":  # integer division 2i // d == 0: every frequency is 1
        return torch.ones(half, dtype=torch.float64)
    if rule == "log10":  # exp(-log10(base) * 2i / d)
        return torch.exp(-math.log10(base) * 2 * i / d_model)
    raise ValueError(rule)


def _pe64(positions, d_model, base=10000.0, *, rule="2i", layout="interleave", swap=False,
          shift=0, per_column=False):
    """Closed-form table rows for the given positions, (len(positions), d_model) float64.
    The keyword arguments build the wrong-but-plausible tables used to name mistakes."""
    pos = torch.as_tensor(positions, dtype=torch.float64).reshape(-1, 1) + shift
    n = d_model // 2
    if per_column:  # every column j its own frequency base^(-j/d)
        w = base ** (-torch.arange(d_model, dtype=torch.float64) / d_model)
        ang = pos * w
        out = torch.empty(pos.shape[0], d_model, dtype=torch.float64)
        out[:, 0::2] = torch.sin(ang[:, 0::2])
        out[:, 1::2] = torch.cos(ang[:, 1::2])
        return out
    ang = pos * _freqs(d_model, base, rule)
    s, c = torch.sin(ang), torch.cos(ang)
    if swap:
        s, c = c, s
    if layout == "concat":  # [sin ... sin | cos ... cos]
        return torch.cat([s[:, :n], c[:, :n]], dim=1)
    out = torch.empty(pos.shape[0], d_model, dtype=torch.float64)
    out[:, 0::2] = s
    out[:, 1::2] = c[:, :n]
    return out


def _shift64(offset, d_model, base=10000.0, *, rule="2i", transpose=False, no_freq=False,
             halves=False):
    """The rotation matrix M with pe[pos + offset] = M @ pe[pos], float64, and wrong variants."""
    theta = offset * _freqs(d_model, base, rule)[: d_model // 2]
    if no_freq:
        theta = torch.full_like(theta, float(offset))
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    n = d_model // 2
    for i, t in enumerate(theta.tolist()):
        c, s = math.cos(t), math.sin(t)
        a, b = (i, i + n) if halves else (2 * i, 2 * i + 1)
        M[a, a], M[a, b], M[b, a], M[b, b] = c, s, -s, c
    return M.T.contiguous() if transpose else M


def _tol(positions, n_cols, atol=1e-5, per_pos=4e-7):
    pos = torch.as_tensor(positions, dtype=torch.float64).reshape(-1, 1)
    return (atol + per_pos * pos).expand(-1, n_cols)


def _close(actual, expected, tol, rtol=1e-4):
    a = actual.detach().to(torch.float64)
    diff = (a - expected).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return bool((diff <= tol + rtol * expected.abs()).all())


def _fail_rows(actual, expected, positions, tol, what, hint):
    a = actual.detach().to(torch.float64)
    diff = (a - expected).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    over = diff - tol - 1e-4 * expected.abs()
    r, c = (int(j) for j in torch.nonzero(over == over.max())[0])
    pos = positions[r] if positions is not None else r
    fail(f"{what} does not match the closed form.\n"
         f"  worst element at position {pos}, dimension {c}: actual {a[r, c].item():.6g}, "
         f"expected {expected[r, c].item():.6g} ({int((over > 0).sum())} of {diff.numel()} "
         f"elements off)\n" + hint)


def _match(actual, candidates, tol):
    """Name of the first wrong-but-plausible table that `actual` equals, or None."""
    for hint, cand in candidates.items():
        if cand is not None and actual.shape == cand.shape and _close(actual, cand, tol):
            return hint
    return None


def _as_tensor(x, what):
    if not isinstance(x, torch.Tensor):
        fail(f"{what} must return a torch.Tensor, got {type(x).__name__}. Build the table with "
             "torch operations (torch.from_numpy(...) works if you used numpy).")
    return x


# ------------------------------------------------------------------ sinusoidal table

_PE_HINT = ("PE[pos, 2i] = sin(pos * w_i) and PE[pos, 2i+1] = cos(pos * w_i) with "
            "w_i = base^(-2i/d_model), i = 0 .. d_model/2 - 1: even columns sin, odd columns cos.")


def _pe_candidates(positions, d, base):
    cands = {
        "sin and cos are swapped: even columns (0, 2, 4, ...) hold sin, odd columns cos.":
            _pe64(positions, d, base, swap=True),
        "the table is [all sines | all cosines] (concatenated halves); the encoding interleaves "
        "them: column 2i is sin, column 2i+1 is cos of the same frequency.":
            _pe64(positions, d, base, layout="concat"),
        "the exponent uses i/d_model where it should be 2i/d_model (with i the pair index; "
        "torch.arange(0, d_model, 2) already gives the 2i values).":
            _pe64(positions, d, base, rule="i"),
        "every column got its own frequency base^(-j/d_model) (j = the column index): a sin/cos "
        "pair 2i, 2i+1 must share one frequency, base^(-2i/d_model).":
            _pe64(positions, d, base, per_column=True),
        "the frequencies grow instead of shrinking: multiply pos by base^(-2i/d_model) "
        "(or divide by base^(2i/d_model)), not by base^(+2i/d_model).":
            _pe64(positions, d, base, rule="sign"),
        "every frequency is 1: an integer division (2*i // d_model is 0) or a lost exponent; "
        "use float division, 2*i / d_model.":
            _pe64(positions, d, base, rule="one"),
        "positions start at 1; the first position is 0 (torch.arange(max_len)), so row 0 is "
        "[0, 1, 0, 1, ...].":
            _pe64(positions, d, base, shift=1),
        "you used log10 in exp(-log(base) * 2i / d_model); the exp/log form needs the natural "
        "log, math.log(base).":
            _pe64(positions, d, base, rule="log10"),
    }
    if base != 10000.0:
        cands["the base argument is ignored: the table was built with 10000 although base="
              f"{base:g} was passed."] = _pe64(positions, d, 10000.0)
    return cands


def _check_table(positions, rows, d, base, what):
    """Compare rows of a returned table with the closed form, naming the likely mistake."""
    expected = _pe64(positions, d, base)
    tol = _tol(positions, d)
    if _close(rows, expected, tol):
        return
    why = _match(rows, _pe_candidates(positions, d, base), tol)
    if why:
        fail(f"{what} is not the sinusoidal encoding: {why}")
    _fail_rows(rows, expected, positions, tol, what, _PE_HINT)


def check_pe_shape(fn):
    """(max_len, d_model) float32; row 0 is [0, 1, 0, 1, ...]; small sizes work."""
    pe = _as_tensor(call(fn, 7, 6, what="sinusoidal_positional_encoding(7, 6)"),
                    "sinusoidal_positional_encoding")
    if tuple(pe.shape) == (6, 7):
        fail("sinusoidal_positional_encoding(7, 6) has shape (6, 7) = (d_model, max_len): it is "
             "transposed. One row per position, one column per dimension: (max_len, d_model).")
    check_shape(pe, (7, 6), "sinusoidal_positional_encoding(max_len=7, d_model=6)",
                "One row per position, one column per dimension: (max_len, d_model).")
    if pe.dtype != torch.float32:
        fail(f"sinusoidal_positional_encoding returned dtype {pe.dtype}; return float32 (the "
             "dtype of the activations it is added to): compute in float64 if you like, then "
             ".float().")
    row0 = pe[0].detach().double()
    zero = torch.tensor([0.0, 1.0] * 3, dtype=torch.float64)
    if not torch.allclose(row0, zero, atol=1e-6):
        if torch.allclose(row0, torch.tensor([1.0, 0.0] * 3, dtype=torch.float64), atol=1e-6):
            fail("row 0 is [1, 0, 1, 0, ...]: sin and cos are swapped. Position 0 has every "
                 "angle 0, so even columns (sin) are 0 and odd columns (cos) are 1.")
        if torch.allclose(row0, torch.tensor([0.0] * 3 + [1.0] * 3, dtype=torch.float64), atol=1e-6):
            fail("row 0 is [0, 0, 0, 1, 1, 1]: the sines and cosines are concatenated as two "
                 "halves, [sin | cos]. The table interleaves them: even columns 2i hold "
                 "sin(pos * w_i), odd columns 2i+1 hold cos(pos * w_i), so row 0 is "
                 "[0, 1, 0, 1, 0, 1].")
        fail(f"row 0 (position 0) should be [0, 1, 0, 1, 0, 1]: every angle is 0 there, sin 0 = 0, "
             f"cos 0 = 1. Got {[round(v, 4) for v in row0.tolist()]}. Positions start at 0: "
             "torch.arange(max_len).")
    check_true(not pe.requires_grad, "the table requires grad: it is a fixed function of the "
               "position, not something to train.")
    for L, d in ((1, 2), (3, 2), (1, 8)):
        t = _as_tensor(call(fn, L, d, what=f"sinusoidal_positional_encoding({L}, {d})"),
                       "sinusoidal_positional_encoding")
        check_shape(t, (L, d), f"sinusoidal_positional_encoding({L}, {d})")
    passed("sinusoidal_positional_encoding: shape (max_len, d_model), float32, row 0 = [0, 1, 0, 1, ...]")


def check_pe_closed_form(fn, seed=0, cases=((50, 16, None),), n_positions=12):
    """Random positions of tables of the given (max_len, d_model, base) sizes, compared with
    the closed form. base=None calls without the argument (the default, 10000)."""
    with seeded(seed):
        picks = []
        for max_len, d, base in cases:
            k = min(n_positions, max_len)
            pos = torch.randperm(max_len)[:k].sort().values.tolist()
            pos = sorted(set(pos) | {0, max_len - 1})
            picks.append(pos)
    for (max_len, d, base), pos in zip(cases, picks):
        args = f"{max_len}, {d}" + ("" if base is None else f", base={base:g}")
        kw = {} if base is None else {"base": base}
        pe = _as_tensor(call(fn, max_len, d, what=f"sinusoidal_positional_encoding({args})", **kw),
                        "sinusoidal_positional_encoding")
        check_shape(pe, (max_len, d), f"sinusoidal_positional_encoding({args})",
                    "One row per position, one column per dimension: (max_len, d_model).")
        b = 10000.0 if base is None else float(base)
        _check_table(pos, pe[pos], d, b, f"sinusoidal_positional_encoding({args})")
    passed(f"sinusoidal_positional_encoding: matches the closed form at random positions "
           f"({len(cases)} table{'s' if len(cases) > 1 else ''})")


# The table printed in the study notes for PositionEncoding(seq_len=4, d_model=4, n=100).
_SEED_TABLE = torch.tensor([
    [0.0, 1.0, 0.0, 1.0],
    [0.84147098, 0.54030231, 0.09983342, 0.99500417],
    [0.90929743, -0.41614684, 0.19866933, 0.98006658],
    [0.14112001, -0.9899925, 0.29552021, 0.95533649]], dtype=torch.float64)


def check_pe_base(fn):
    """The base argument is used: base=100 reproduces the study notes' printed table."""
    pe = _as_tensor(call(fn, 4, 4, base=100.0, what="sinusoidal_positional_encoding(4, 4, base=100)"),
                    "sinusoidal_positional_encoding")
    check_shape(pe, (4, 4), "sinusoidal_positional_encoding(4, 4, base=100)")
    if _close(pe, _pe64(range(4), 4, 10000.0), _tol(range(4), 4)):
        fail("sinusoidal_positional_encoding(4, 4, base=100) equals the base-10000 table: the base "
             "argument is ignored. Use it in place of the constant 10000.")
    _check_table(list(range(4)), pe, 4, 100.0, "sinusoidal_positional_encoding(4, 4, base=100)")
    check_true(_close(pe, _SEED_TABLE, _tol(range(4), 4)),
               "base=100 does not reproduce the study notes' table.")
    pe = _as_tensor(call(fn, 30, 10, base=1000.0,
                         what="sinusoidal_positional_encoding(30, 10, base=1000)"),
                    "sinusoidal_positional_encoding")
    check_shape(pe, (30, 10), "sinusoidal_positional_encoding(30, 10, base=1000)")
    _check_table(list(range(30)), pe, 10, 1000.0, "sinusoidal_positional_encoding(30, 10, base=1000)")
    passed("sinusoidal_positional_encoding: the base argument works (base=100 gives the notes' table)")


# ------------------------------------------------------------------ shift matrix

_SHIFT_HINT = ("Each (sin, cos) pair (columns 2i, 2i+1) turns by the angle offset * w_i: "
               "rows 2i and 2i+1 of M hold [cos, sin] and [-sin, cos] in columns 2i, 2i+1 "
               "(sin(a+b) = sin a cos b + cos a sin b, cos(a+b) = cos a cos b - sin a sin b); "
               "everything else is 0.")


def _shift_call(fn, offset, d, base):
    args = f"{offset}, {d}" + ("" if base is None else f", base={base:g}")
    kw = {} if base is None else {"base": base}
    M = _as_tensor(call(fn, offset, d, what=f"pe_shift_matrix({args})", **kw), "pe_shift_matrix")
    check_shape(M, (d, d), f"pe_shift_matrix({args})", "M is (d_model, d_model).")
    return M, f"pe_shift_matrix({args})"


def _shift_candidates(offset, d, base):
    c = {
        "M turns each pair the wrong way, giving pe[pos - offset]: with the pair ordered "
        "(sin, cos) the block is [[cos, sin], [-sin, cos]], the transpose of the textbook "
        "rotation [[cos, -sin], [sin, cos]].": _shift64(offset, d, base, transpose=True),
        "every pair turns by the same angle `offset`: the angle of pair i is offset * w_i, "
        "with its own frequency w_i = base^(-2i/d_model).": _shift64(offset, d, base, no_freq=True),
        "the blocks pair dimension i with i + d_model/2 (a concatenated [sin | cos] layout); "
        "here the pairs are the neighbours 2i, 2i+1.": _shift64(offset, d, base, halves=True),
        "the angles use w_i = base^(-i/d_model); the frequency of pair i is base^(-2i/d_model).":
            _shift64(offset, d, base, rule="i"),
        "M is the identity: it must move pe[pos] to pe[pos + offset].":
            torch.eye(d, dtype=torch.float64) if offset else None,
    }
    if base != 10000.0:
        c[f"the base argument is ignored (M was built with 10000, base={base:g} was passed)."] = \
            _shift64(offset, d, 10000.0)
    return c


def check_shift_shape(fn):
    """(d, d) float32; offset 0 gives the identity."""
    M, what = _shift_call(fn, 3, 8, None)
    if M.dtype != torch.float32:
        fail(f"{what} returned dtype {M.dtype}; return float32 (.float()).")
    I, what = _shift_call(fn, 0, 8, None)
    if not torch.allclose(I.detach().double(), torch.eye(8, dtype=torch.float64), atol=1e-6):
        pe = _pe64(range(64), 8)
        err = (pe @ I.detach().double().T - pe).abs().amax(-1)  # per position
        good = [p for p in range(64) if err[p] < 1e-4]
        if good and len(good) < 64:
            fail(f"{what} is not the identity, and pe[pos + offset] = M @ pe[pos] holds only "
                 f"at positions {good[:6]}{' ...' if len(good) > 6 else ''}, not at every pos: M "
                 "was fitted to a few positions (a least-squares fit on fewer positions than "
                 "dimensions does not determine M). Build it from the 2x2 rotation blocks, one "
                 "per frequency, angle offset * w_i.")
        fail(f"{what} is not the identity: a shift by 0 positions changes nothing, every "
             "angle offset * w_i is 0, cos 0 = 1, sin 0 = 0.")
    passed("pe_shift_matrix: (d_model, d_model) float32, and the identity for offset 0")


def check_shift_property(fn, cases=((1, 8, None), (5, 16, None), (12, 6, 100.0)), n_pos=64):
    """pe[pos + offset] = M @ pe[pos] for every pos, for each (offset, d_model, base)."""
    for offset, d, base in cases:
        M, what = _shift_call(fn, offset, d, base)
        b = 10000.0 if base is None else float(base)
        Md = M.detach().double()
        pos = torch.arange(n_pos)
        pe = _pe64(pos, d, b)
        target = _pe64(pos + offset, d, b)
        predicted = pe @ Md.T  # row p: M @ pe[p]
        tol = _tol(pos, d, atol=2e-5)
        if _close(predicted, target, tol):
            continue
        why = _match(Md, _shift_candidates(offset, d, b), torch.full((d, d), 1e-5, dtype=torch.float64))
        if why:
            fail(f"{what} is wrong: {why}")
        _fail_rows(predicted, target, (pos + offset).tolist(), tol,
                   f"M @ pe[pos] for {what}", "M @ pe[pos] should be pe[pos + offset] for every "
                   "pos. " + _SHIFT_HINT)
    passed(f"pe_shift_matrix: M @ pe[pos] = pe[pos + offset] at every position ({len(cases)} cases)")


def check_shift_structure(fn):
    """Block-diagonal 2x2 rotations; M(a) @ M(b) = M(a + b); M(k) = M(1)^k."""
    d = 12
    M, what = _shift_call(fn, 5, d, None)
    Md = M.detach().double()
    block = torch.zeros(d, d, dtype=torch.bool)
    for i in range(0, d, 2):
        block[i:i + 2, i:i + 2] = True
    off = Md.masked_fill(block, 0.0).abs().max().item()
    if off > 1e-6:
        fail(f"{what} has non-zero entries outside the 2x2 diagonal blocks (largest {off:.3g}): "
             "each (sin, cos) pair only mixes with itself. " + _SHIFT_HINT)
    orth = (Md @ Md.T - torch.eye(d, dtype=torch.float64)).abs().max().item()
    if orth > 1e-5:
        fail(f"{what} is not a rotation (M @ M^T differs from I by {orth:.3g}): each block must be "
             "[[cos t, sin t], [-sin t, cos t]] with the same angle t in all four entries.")
    Ma, _ = _shift_call(fn, 2, d, None)
    Mb, _ = _shift_call(fn, 7, d, None)
    Mab, _ = _shift_call(fn, 9, d, None)
    comp = (Ma.detach().double() @ Mb.detach().double() - Mab.detach().double()).abs().max().item()
    if comp > 1e-5:
        fail("pe_shift_matrix(2) @ pe_shift_matrix(7) should equal pe_shift_matrix(9) (shifting by "
             f"2 then by 7 is shifting by 9); they differ by {comp:.3g}. " + _SHIFT_HINT)
    passed("pe_shift_matrix: 2x2 rotation blocks on the diagonal, and M(2) @ M(7) = M(9)")


# ------------------------------------------------------------------ the module

def _make(cls, d, max_len, dropout=None):
    args = f"{d}, max_len={max_len}" + ("" if dropout is None else f", dropout={dropout}")
    kw = {"max_len": max_len} if dropout is None else {"max_len": max_len, "dropout": dropout}
    m = call(cls, d, what=f"PositionalEncoding({args})", **kw)
    if not isinstance(m, nn.Module):
        fail(f"PositionalEncoding({args}) is a {type(m).__name__}, not an nn.Module: subclass "
             "nn.Module and call super().__init__() first.")
    return m, f"PositionalEncoding({args})"


def _table(m, d, max_len, what):
    pe = getattr(m, "pe", None)
    if not isinstance(pe, torch.Tensor):
        fail(f"{what} has no tensor attribute `pe`: register the table with "
             "self.register_buffer('pe', table).")
    shape = tuple(pe.shape)
    if shape == (d, max_len) or shape == (1, d, max_len):
        fail(f"{what}.pe has shape {shape}: transposed. Keep (max_len, d_model): one row per position.")
    if shape not in ((max_len, d), (1, max_len, d), (max_len, 1, d)):
        fail(f"{what}.pe has shape {shape}; expected (max_len, d_model) = {(max_len, d)}, "
             f"(1, max_len, d_model) = {(1, max_len, d)} or the sequence-first "
             f"(max_len, 1, d_model) = {(max_len, 1, d)}.")
    return pe.reshape(max_len, d)


_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def _forward(m, x, what, copy=True):
    try:
        # a copy: an in-place forward is charged once (test_PositionalEncoding_adds_table), not
        # misread as "x returned unchanged" by every later comparison with x
        return call(m, x.clone() if copy else x, what=f"{what} forward on x {tuple(x.shape)}")
    except CheckFailed as e:
        found = _BROADCAST.search(str(e))
        if found is None or isinstance(e.__cause__, CheckFailed):
            raise
        B, L = x.shape[:2]
        sizes = {int(found.group(1)), int(found.group(2))}
        pe = getattr(m, "pe", None)
        rows = max(pe.shape[:2]) if isinstance(pe, torch.Tensor) and pe.dim() >= 2 else None
        if sizes == {L, B} and B != L:
            fail(f"{e}\nThe table was sliced with the batch size: x is (B, L, D) = "
                 f"{tuple(x.shape)}, so x.size(0) = {B} is the batch size and x.size(1) = {L} "
                 "the sequence length. Slice the table on the sequence axis, pe[:x.size(1)] (the "
                 "study notes' pe[:x.size(0)] is written for unbatched (L, D) input).")
        if rows is not None and sizes == {L, rows} and rows != L:
            fail(f"{e}\nAll {rows} rows of the table were added to {L} positions: a "
                 "(1, max_len, d_model) table sliced pe[:n] slices its leading axis of size 1 "
                 "(whether n is x.size(0), the batch size, or x.size(1)) and keeps every row. "
                 "Slice the sequence axis: pe[:, :x.size(1)].")
        raise


def _check_out(out, x, L, d, what, ctx=""):
    check_shape(out, x.shape, f"{what}(x){ctx} for x of shape {tuple(x.shape)}",
                "The output has the shape of the input: the table is added, not concatenated.")
    if out.dtype != x.dtype:
        fail(f"{what}(x){ctx} has dtype {out.dtype} for a float32 x: keep the table float32, or the "
             "whole model downstream silently runs in float64.")
    B = x.shape[0]
    pos = list(range(L))
    expected = x.detach().double() + _pe64(pos, d)  # (B, L, D)
    tol = _tol(pos, d).unsqueeze(0).expand(B, -1, -1) + 1e-5 * x.detach().double().abs()
    a = out.detach().double()
    if _close(a, expected, tol):
        return
    pe = _pe64(pos, d)
    xd = x.detach().double()
    cands = {
        "x was multiplied by sqrt(d_model) inside the module. The forward adds the table and "
        "nothing else; the sqrt(d_model) scaling belongs to the embedding, before the "
        "positional encoding (notebook 07 does it there).": xd * math.sqrt(d) + pe,
        "the output is the table alone: add it to x, x + pe[:L].": pe.expand(B, -1, -1),
        "every position got the code of position 0: the table was sliced with the batch size, "
        "x.size(0), not the sequence length x.size(1) (the study notes' size(0) trap, written "
        "for unbatched (L, D) input).": xd + _pe64([0], d),
        "x is returned unchanged: add the table.": xd,
        "sequence b of the batch got the code of position b at every position: the "
        "sequence-first table (max_len, 1, d_model) of PyTorch's tutorial was sliced with "
        "x.size(0), which is the batch size for batch-first input (B, L, D). Slice "
        "pe[:x.size(1)] and move its axes to (1, L, d_model), e.g. .transpose(0, 1).":
            xd + _pe64(range(B), d).unsqueeze(1),
        "the table was subtracted: add it.": xd - pe,
    }
    why = _match(a, cands, tol)
    if why:
        fail(f"{what}(x){ctx} is wrong: {why}")
    diff = (a - expected).abs()
    b, l, c = (int(j) for j in torch.nonzero(diff == diff.max())[0])
    fail(f"{what}(x){ctx} is not x + pe[:L].\n  worst element at batch {b}, position {l}, dimension "
         f"{c}: actual {a[b, l, c].item():.6g}, expected {expected[b, l, c].item():.6g}\n"
         "forward(x) returns dropout(x + pe[:L]) with L = x.size(1), the sequence axis.")


def check_pe_module_adds_table(cls):
    """forward(x) = x + pe[:L] for (B, L, D) input; x not modified; gradient reaches x."""
    m, what = _make(cls, 16, 50)
    with seeded(10):
        x = torch.randn(2, 7, 16)
    xin = x.clone()
    out = _forward(m, xin, what, copy=False)  # no copy here, so that an in-place add shows
    if not isinstance(out, torch.Tensor):
        fail(f"{what} forward returned {type(out).__name__}: return the tensor x + pe[:L].")
    check_true(torch.equal(xin, x), f"{what} modified its input in place (x += ... or "
               "x.add_(...)): the caller's tensor changed. Return a new tensor, x + pe[:L].")
    _check_out(out, x, 7, 16, what)
    xa = x.clone().requires_grad_(True)
    out = _forward(m, xa, what)
    check_true(out.requires_grad, f"{what}(x) is cut off from autograd: no gradient reaches x "
               "(no torch.no_grad(), .detach() or .data in forward; only the table is fixed).")
    out.sum().backward()
    check_true(xa.grad is not None and torch.allclose(xa.grad, torch.ones_like(xa)),
               "the gradient of sum(PositionalEncoding(x)) with respect to x should be all ones "
               "(adding a constant table passes gradients through unchanged).")
    passed("PositionalEncoding: forward(x) = x + pe[:L] on (B, L, D), and gradients reach x")


def check_pe_module_buffer(cls):
    """`pe` is a registered buffer: not a parameter, no gradient, moves with .to(), values right."""
    d, max_len = 8, 30
    m, what = _make(cls, d, max_len)
    params = dict(m.named_parameters())
    buffers = dict(m.named_buffers())
    if "pe" in params:
        fail(f"{what}.pe is an nn.Parameter: it appears in model.parameters(), so an optimizer "
             "would train it and the table would stop being sinusoidal. Register it with "
             "self.register_buffer('pe', table): saved in state_dict, moved by .to(device), "
             "never trained.")
    if "pe" not in buffers:
        if isinstance(getattr(m, "pe", None), torch.Tensor):
            fail(f"{what}.pe is a plain tensor attribute, not a registered buffer: it is missing "
                 "from state_dict() and stays behind when the model moves with .to(device) "
                 "(a device-mismatch error on the GPU). Use self.register_buffer('pe', table).")
        fail(f"{what} has no buffer named `pe`: build the table in __init__ and register it with "
             "self.register_buffer('pe', table).")
    if params:
        fail(f"{what} has trainable parameters {sorted(params)}; the sinusoidal encoding has "
             "none (the table is fixed).")
    pe = buffers["pe"]
    check_true(not pe.requires_grad, f"{what}.pe requires grad: the fixed table needs no "
               "gradient (build it outside autograd, or .detach() it before registering).")
    table = _table(m, d, max_len, what)
    pos = list(range(max_len))
    _check_table(pos, table, d, 10000.0, f"{what}.pe")
    if "pe" not in m._non_persistent_buffers_set:
        check_true("pe" in m.state_dict(), f"{what}.pe is not in state_dict().")
    # it follows the module: a dtype cast and a device move go through the same Module._apply
    m64 = copy.deepcopy(m).double()
    check_true(m64.pe.dtype == torch.float64, f"{what}.pe did not follow model.double(): "
               "register it as a buffer so the module converts and moves it.")
    meta = copy.deepcopy(m).to("meta")
    check_true(meta.pe.device.type == "meta", f"{what}.pe did not move with model.to(device).")
    # a training step changes nothing in the table
    m.train()
    xa = torch.randn(3, 5, d, generator=torch.Generator().manual_seed(3), requires_grad=True)
    before = table.detach().clone()
    out = _forward(m, xa, what)
    if isinstance(out, torch.Tensor) and out.requires_grad:  # else adds_table charges it
        out.pow(2).sum().backward()
    check_true(getattr(m.pe, "grad", None) is None, f"{what}.pe received a gradient.")
    check_true(torch.equal(_table(m, d, max_len, what).detach(), before),
               f"{what}.pe changed during forward/backward: the table must stay fixed.")
    passed("PositionalEncoding: `pe` is a buffer (in state_dict, follows .to(), no gradient, "
           "no parameters) holding the sinusoidal table")


def check_pe_module_batch_invariance(cls, d=8, L=4, max_len=20, batches=(1, 3, 4, 6)):
    """Each sequence gets x[b] + pe[:L] whatever the batch size: the table is sliced on the
    sequence axis. Batch size 1 and B == L are included (the size(0) trap)."""
    m, what = _make(cls, d, max_len)
    m.eval()
    with seeded(21):
        seqs = torch.randn(max(batches), L, d)
    reference = seqs[:1].double() + _pe64(range(L), d)
    for B in batches:
        x = seqs[:B].clone()
        try:
            out = _forward(m, x, what)
        except CheckFailed as e:
            fail(f"{e}\nThe forward fails for batch size B={B} with L={L}: slice the table on "
                 "the SEQUENCE axis, pe[:x.size(1)] (or pe[:, :x.size(1)] for a (1, max_len, D) "
                 "table). Slicing with x.size(0), the batch size, only works when B == L.")
        _check_out(out, x, L, d, what, f" at batch size {B}")
        check_true(torch.allclose(out[:1].detach().double(), reference, atol=1e-5),
                   f"the first sequence gives a different output at batch size {B}.")
    passed(f"PositionalEncoding: the same sequence gets the same output at batch sizes {list(batches)}")


def check_pe_module_max_len(cls, d=6, max_len=10):
    """L == max_len works; L == max_len + 1 raises (any exception type and message: a length
    check of one's own, an IndexError or a broadcasting error all say the same thing). This is
    the one test cell that charges the rule."""
    m, what = _make(cls, d, max_len)
    m.eval()
    x = torch.randn(2, max_len, d, generator=torch.Generator().manual_seed(4))
    out = _forward(m, x, what)
    _check_out(out, x, max_len, d, what, " at L = max_len")
    x = torch.randn(2, max_len + 1, d, generator=torch.Generator().manual_seed(5))
    try:
        out = call(m, x, what=f"{what} forward on x {tuple(x.shape)}")
    except CheckFailed as e:
        if isinstance(e, ShortcutUsed) or isinstance(e.__cause__, CheckFailed):
            raise
    else:
        fail(f"{what} accepted a sequence of length {max_len + 1} > max_len = {max_len} "
             f"(output shape {tuple(out.shape) if isinstance(out, torch.Tensor) else out}): "
             "there is no table row for the extra positions, so the result cannot be right. "
             "Raise an error, e.g. ValueError(f\"sequence length {L} exceeds max_len\").")
    passed("PositionalEncoding: L = max_len works, L > max_len raises an error")


def check_pe_module_dropout(cls, d=16, L=12, p=0.5):
    """eval(): no dropout, exactly x + pe. train(): dropout on the sum, inverted scaling."""
    m, what = _make(cls, d, 40, dropout=p)
    with seeded(7):
        x = torch.randn(3, L, d)
    m.eval()
    out = _forward(m, x, f"{what} in eval mode")
    zeros = (out == 0).float().mean().item() if isinstance(out, torch.Tensor) else 0.0
    if zeros > 0.1:
        fail(f"{what}: in eval mode {zeros:.0%} of the outputs are 0: dropout is still active. "
             "Use an nn.Dropout submodule (it follows model.eval()), or "
             "F.dropout(..., training=self.training).")
    _check_out(out, x, L, d, what, " in eval mode")
    m.train()
    with seeded(8):
        out = _forward(m, x, f"{what} in train mode")
    check_shape(out, x.shape, f"{what} in train mode")
    a = out.detach().double()
    summed = x.double() + _pe64(range(L), d)
    kept = a != 0
    frac = 1 - kept.double().mean().item()
    pe = _pe64(range(L), d).expand_as(summed)
    r = a - x.double()  # what was added to x
    tol = 1e-4 + 1e-4 * summed.abs()
    on_table = ((r.abs() <= tol) | ((r - pe / (1 - p)).abs() <= tol)).all()
    dropped = ((r.abs() <= tol) & (pe.abs() > 0.1)).double().mean() / (pe.abs() > 0.1).double().mean()
    if bool(on_table) and dropped.item() > 0.2:
        fail(f"{what}: dropout was applied to the table only, x + dropout(pe[:L]); apply it to "
             "the sum, dropout(x + pe[:L]), as the original Transformer does.")
    if frac < 0.2:
        fail(f"{what} in train mode zeroes {frac:.0%} of the outputs; with dropout={p} about "
             f"{p:.0%} should be 0. The dropout argument is not used: self.dropout = "
             "nn.Dropout(dropout) and return self.dropout(x + pe[:L]).")
    scaled = summed / (1 - p)
    tol = 1e-4 + 1e-4 * scaled.abs()
    if not bool(((a - scaled).abs() <= tol)[kept].all()):
        fail(f"{what} in train mode: the kept outputs should be (x + pe[:L]) / (1 - p), "
             "inverted dropout as nn.Dropout does.")
    passed("PositionalEncoding: dropout acts on x + pe in train mode and is off in eval mode")


def check_pe_module_random(cls, seed=0, cases=((32, 64, 2, 9, 0.0),)):
    """Random (d_model, max_len, B, L, dropout) cases in eval mode: table values and forward."""
    for i, (d, max_len, B, L, p) in enumerate(cases):
        m, what = _make(cls, d, max_len, dropout=p)
        m.eval()
        table = _table(m, d, max_len, what)
        with seeded(seed + i):
            x = torch.randn(B, L, d) * 3
            pos = sorted(set(torch.randint(0, max_len, (10,)).tolist()) | {0, max_len - 1})
        _check_table(pos, table[pos], d, 10000.0, f"{what}.pe")
        out = _forward(m, x, what)
        _check_out(out, x, L, d, what)
    passed(f"PositionalEncoding: matches x + pe[:L] on {len(cases)} random case"
           f"{'s' if len(cases) > 1 else ''}")
