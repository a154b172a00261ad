"""Checks for notebook 09_modern_decoder: `rms_norm`, `RMSNorm`, `apply_rope`, `SwiGLU`,
`GroupedQueryAttention`, `ModernDecoderLM` and `top_p_filter`.

The references here are independent of the student's code: every check draws its own seeded
weights, copies them into the student's module by the names the exercise text fixes, and
computes the expected result from those weights with PyTorch's own operations
(`F.rms_norm`, `F.scaled_dot_product_attention(..., enable_gqa=True)`, `F.silu`) or, where
PyTorch has none, from the defining formula written differently (RoPE with complex numbers,
top-p with a plain loop). Known wrong variants are recomputed the same way so that a failure
can name the mistake.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .core import CheckFailed, _match, call, check_close, check_shape, fail, passed, seeded

RMS_SC = ("rms_norm",)
ATTN_SC = ("attention", "multihead")
LM_SC = ("attention", "multihead", "transformer")
LM_ATOL, LM_RTOL = 1e-4, 1e-4  # several float32 layers: a little looser than one op
ROPE_ATOL, ROPE_RTOL = 5e-5, 1e-4  # float32 angles at positions up to 64


def _m(actual, candidates, **kw):
    """core._match over the candidates that apply (None = not applicable here)."""
    if not isinstance(actual, torch.Tensor):
        return None
    return _match(actual, {k: v for k, v in candidates.items() if v is not None}, **kw)


def _tensor_result(res, what, shape, dtype=None, hint=""):
    if not isinstance(res, torch.Tensor):
        fail(f"{what} returned {type(res).__name__}; return a tensor of shape {tuple(shape)}. "
             + hint)
    check_shape(res, shape, what, hint)
    if dtype is not None and res.dtype != dtype:
        fail(f"{what} returned dtype {res.dtype}; expected {dtype}, the input's dtype. Compute "
             "in another dtype if you like, but cast the result back (.to(x.dtype)).")
    return res


# =========================================================================== rms_norm
def _rms_expected(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rms_candidates(x, weight, eps):
    w = 1.0 if weight is None else weight
    d = x.shape[-1]
    ms = x.pow(2).mean(-1, keepdim=True)
    xc = x - x.mean(-1, keepdim=True)
    cands = {
        "you subtracted the mean: that is LayerNorm (without its bias). RMSNorm divides x itself "
        "by sqrt(mean(x**2) + eps), with no centring.":
            xc / torch.sqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * w,
        "you divided by the standard deviation (x.std / x.var, which subtract the mean). RMSNorm "
        "uses the root mean square sqrt(mean(x**2) + eps) of x itself.":
            x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) * w,
        "you divided by the standard deviation (x.std / x.var, which subtract the mean, here "
        "even with d - 1). RMSNorm uses the root mean square sqrt(mean(x**2) + eps) of x itself.":
            (x / torch.sqrt(x.var(-1, keepdim=True) + eps) * w if d > 1 else None),
        "eps is outside the square root: use sqrt(mean(x**2) + eps), as nn.RMSNorm does, not "
        "sqrt(mean(x**2)) + eps.": x / (torch.sqrt(ms) + eps) * w,
        "eps is missing: use sqrt(mean(x**2) + eps), so that a row of zeros gives zeros and "
        "tiny inputs are not blown up.": x / torch.sqrt(ms) * w,
        "the square root is missing: divide by sqrt(mean(x**2) + eps), the ROOT mean square, not "
        "by the mean square itself.": x / (ms + eps) * w,
        "you divided by the L2 norm ||x|| instead of the root MEAN square ||x|| / sqrt(d): "
        "use mean, not sum, of x**2.": x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps) * w,
        "you averaged x**2 with d - 1 in the denominator; RMSNorm averages over d (a plain mean).":
            (x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / max(d - 1, 1) + eps) * w
             if d > 1 else None),
        "the mean of x**2 is taken over the wrong axis: normalise over the LAST axis (features), "
        "dim=-1 with keepdim=True.": x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps) * w,
        "the mean of x**2 is taken over every element at once: normalise each vector over the "
        "last axis only (dim=-1, keepdim=True).": x / torch.sqrt(x.pow(2).mean() + eps) * w,
    }
    if weight is not None:
        cands["the weight was not applied: multiply the normalised x by weight (the learnable "
              "gain, shape (d,))."] = x * torch.rsqrt(ms + eps)
        cands["the weight was ADDED; it is a gain: multiply by it."] = x * torch.rsqrt(ms + eps) + weight
    return cands


def _compare_rms(actual, x, weight, eps, what):
    expected = _rms_expected(x, weight, eps)
    atol = 1e-5 if x.dtype == torch.float32 else 1e-8
    rtol = 1e-4 if x.dtype == torch.float32 else 1e-6
    a = actual.detach().double()
    if torch.isnan(a).any() and not torch.isnan(expected).any():
        fail(f"{what} contains NaN where F.rms_norm gives finite values (a row of zeros?). "
             "Keep eps inside the square root: x / sqrt(mean(x**2) + eps).")
    if not torch.allclose(a, expected.double(), atol=atol, rtol=rtol):
        why = _m(actual, _rms_candidates(x, weight, eps), atol=atol, rtol=rtol)
        check_close(actual, expected, what, why or "RMSNorm(x) = x / sqrt(mean(x**2 over the last "
                    "axis) + eps) * weight.", atol=atol, rtol=rtol)


def check_rms_norm_basic(rms_norm):
    """Small hand-checkable rows, a row of zeros, a tiny row, with and without weight."""
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0],
                      [1e-3, -2e-3, 5e-4, 1e-3]])
    w = torch.tensor([0.5, 1.0, 2.0, -1.0])
    for weight, what in ((None, "rms_norm(x)"), (w, "rms_norm(x, weight)")):
        y = call(rms_norm, x.clone(), *(() if weight is None else (weight,)), shortcuts=RMS_SC,
                 what=what)
        _tensor_result(y, what, x.shape, torch.float32)
        _compare_rms(y, x, weight, 1e-6, f"{what} on rows [1, -2, 3, 0.5], zeros, [2, 2, 2, 2] and "
                     "a tiny row (eps=1e-6)")
    row = x[2:3]
    y = call(rms_norm, row, shortcuts=RMS_SC, what="rms_norm([2, 2, 2, 2])")
    if torch.allclose(y.detach(), torch.zeros_like(row), atol=1e-3):
        fail("rms_norm([2, 2, 2, 2]) gave zeros: you subtracted the mean. RMSNorm does not "
             "centre; a constant row normalises to ones.")
    passed("rms_norm: equals F.rms_norm on hand-made rows (zeros and a tiny row included), "
           "with and without weight")


def check_rms_norm_random(rms_norm, seed=0, cases=(((2, 3, 8), 1e-6, True, torch.float32, 1.0),)):
    """Random shapes, eps, dtypes and scales compared with F.rms_norm."""
    for i, (shape, eps, weighted, dtype, scale) in enumerate(cases):
        with seeded(seed + i):
            x = (torch.randn(*shape, dtype=dtype) * scale + 0.3 * scale)
            w = torch.randn(shape[-1], dtype=dtype) if weighted else None
        what = f"rms_norm for x {tuple(shape)} {dtype}, eps={eps}, weight={'yes' if weighted else 'None'}"
        args = (x.clone(),) if w is None else (x.clone(), w)
        y = call(rms_norm, *args, shortcuts=RMS_SC, what=what, eps=eps)
        _tensor_result(y, what, x.shape, dtype)
        _compare_rms(y, x, w, eps, what)
    passed(f"rms_norm: equals F.rms_norm on {len(cases)} random case(s)")


# =========================================================================== RMSNorm
def _new_rmsnorm(cls, d, eps=None):
    kw = {} if eps is None else {"eps": eps}
    m = call(cls, d, shortcuts=RMS_SC, what=f"RMSNorm({d}{'' if eps is None else f', eps={eps}'})", **kw)
    w = getattr(m, "weight", None)
    if not isinstance(w, nn.Parameter):
        fail("RMSNorm has no parameter `weight`: keep the gain as self.weight = "
             "nn.Parameter(torch.ones(d)), named like nn.RMSNorm's.")
    if tuple(w.shape) != (d,):
        fail(f"RMSNorm.weight has shape {tuple(w.shape)}; expected ({d},), one gain per feature.")
    extra = [n for n, _ in m.named_parameters() if n != "weight"]
    if extra:
        fail(f"RMSNorm has parameters {extra} besides `weight`; RMSNorm has no bias (that is one "
             "of the things it drops).")
    return m


def check_RMSNorm_module(RMSNorm):
    """Parameter `weight` initialised to ones, default eps, equality with nn.RMSNorm, gradients."""
    d = 6
    m = _new_rmsnorm(RMSNorm, d)
    if not torch.equal(m.weight.detach(), torch.ones(d)):
        fail(f"RMSNorm.weight starts as {m.weight.detach().tolist()}; initialise it to ones "
             "(the identity gain), as nn.RMSNorm does.")
    with seeded(11):
        x = torch.randn(3, 4, d) * 1e-3  # tiny: the default eps matters here
    ref = nn.RMSNorm(d, eps=1e-6)
    y = call(m, x, shortcuts=RMS_SC, what="RMSNorm(6)(x)")
    _tensor_result(y, "RMSNorm(6)(x)", x.shape, torch.float32)
    if not torch.allclose(y.detach(), ref(x).detach(), atol=1e-5, rtol=1e-4):
        other = {f"RMSNorm(d) used eps={e} by default; the default is eps=1e-6 (the signature "
                 "RMSNorm(d, eps=1e-6)).": F.rms_norm(x, (d,), None, e) for e in (1e-5, 1e-8, 1e-12)}
        why = _m(y, {**other, **_rms_candidates(x, None, 1e-6)}, atol=1e-5, rtol=1e-4)
        check_close(y, ref(x), "RMSNorm(6) with its default eps on a tiny input, against "
                    "nn.RMSNorm(6, eps=1e-6)", why or "forward(x) is rms_norm(x, self.weight, self.eps).")
    with seeded(12):
        w = torch.randn(d)
        x = torch.randn(2, 5, d)
    with torch.no_grad():
        m.weight.copy_(w)
        ref.weight.copy_(w)
    xa = x.clone().requires_grad_(True)
    y = call(m, xa, shortcuts=RMS_SC, what="RMSNorm(6)(x) with a random weight")
    if not torch.allclose(y.detach(), ref(x).detach(), atol=1e-5, rtol=1e-4):
        why = _m(y, _rms_candidates(x, w, 1e-6), atol=1e-5, rtol=1e-4)
        check_close(y, ref(x), "RMSNorm(6) with a random weight, against nn.RMSNorm",
                    why or "Multiply the normalised x by self.weight.")
    y.sum().backward()
    if m.weight.grad is None:
        fail("no gradient reached RMSNorm.weight: use the parameter itself in forward (not a "
             "copy, .data or a plain tensor).")
    xb = x.clone().requires_grad_(True)
    ref.weight.grad = None
    ref(xb).sum().backward()
    check_close(m.weight.grad, ref.weight.grad, "the gradient of RMSNorm.weight")
    check_close(xa.grad, xb.grad, "the gradient with respect to the input")
    passed("RMSNorm: weight starts at ones, default eps 1e-6, equals nn.RMSNorm, gradients included")


def check_RMSNorm_random(RMSNorm, seed=0, cases=(((4, 6, 16), 1e-6),)):
    for i, (shape, eps) in enumerate(cases):
        d = shape[-1]
        with seeded(seed + i):
            x = torch.randn(*shape) * (0.01 if i % 2 else 2.0)
            w = torch.randn(d)
        m = _new_rmsnorm(RMSNorm, d, eps)
        with torch.no_grad():
            m.weight.copy_(w)
        ref = nn.RMSNorm(d, eps=eps)
        with torch.no_grad():
            ref.weight.copy_(w)
        y = call(m, x, shortcuts=RMS_SC, what=f"RMSNorm({d}, eps={eps})(x)")
        _tensor_result(y, f"RMSNorm({d}, eps={eps})(x)", x.shape, torch.float32)
        if not torch.allclose(y.detach(), ref(x).detach(), atol=1e-5, rtol=1e-4):
            cands = _rms_candidates(x, w, eps)
            cands["the eps given to RMSNorm(d, eps) was not used: keep it (self.eps = eps) and pass "
                  "it to rms_norm."] = F.rms_norm(x, (d,), w, 1e-6)
            why = _m(y, cands, atol=1e-5, rtol=1e-4)
            check_close(y, ref(x), f"RMSNorm({d}, eps={eps}) on x {tuple(shape)} against nn.RMSNorm",
                        why or "forward(x) is rms_norm(x, self.weight, self.eps).")
    passed(f"RMSNorm: equals nn.RMSNorm on {len(cases)} random case(s)")


# =========================================================================== apply_rope
def _rope_ref(x, offset=0, base=10000.0):
    """RoPE written with complex numbers: pair (a, b) is a + ib, multiplied by e^{i t}."""
    L, D = x.shape[-2:]
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    theta = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)  # (L, D/2)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2).contiguous())
    out = torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).flatten(-2)
    return out.to(x.dtype)


def _rope_variant(x, offset=0, base=10000.0, layout="pairs", exponent=2.0, sign=1.0, start=0,
                  use_offset=True):
    L, D = x.shape[-2:]
    h = D // 2
    i = torch.arange(h, dtype=torch.float64)
    inv = base ** (-exponent * i / D)
    pos = torch.arange(L, dtype=torch.float64) + start + (offset if use_offset else 0)
    theta = sign * torch.outer(pos, inv)
    c, s = theta.cos(), theta.sin()
    xd = x.double()
    if layout == "pairs":
        a, b = xd[..., 0::2], xd[..., 1::2]
        return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
    if layout == "half":
        a, b = xd[..., :h], xd[..., h:]
        return torch.cat([a * c - b * s, a * s + b * c], -1)
    if layout == "sorted":  # rotated halves concatenated instead of re-interleaved
        a, b = xd[..., 0::2], xd[..., 1::2]
        return torch.cat([a * c - b * s, a * s + b * c], -1)
    raise ValueError(layout)


def _rope_candidates(x, offset, base):
    v = lambda **kw: _rope_variant(x, offset, base, **kw)  # noqa: E731
    return {
        "you used the half-split ('rotate half') layout, pairing feature i with i + D/2. This "
        "exercise pairs neighbours (2i, 2i+1): a, b = x[..., 0::2], x[..., 1::2].": v(layout="half"),
        "the rotated pairs are concatenated as [all first halves, all second halves]; put each "
        "rotated pair back at (2i, 2i+1) (stack on a new last axis, then flatten).": v(layout="sorted"),
        "wrong frequency exponent: pair i rotates with base**(-2i/D), and you used base**(-i/D) "
        "(i counts pairs, so the exponent is 2i/D, i.e. torch.arange(0, D, 2) / D).": v(exponent=1.0),
        "wrong frequency exponent: pair i rotates with base**(-2i/D), and you used base**(-4i/D) "
        "(arange(0, D, 2) divided by D/2 counts the 2 twice).": v(exponent=4.0),
        "the frequency exponent has the wrong sign: base**(-2i/D) (slower for later pairs), not "
        "base**(+2i/D).": v(exponent=-2.0),
        "the rotation goes the wrong way: (a, b) -> (a cos t - b sin t, a sin t + b cos t); you "
        "have the signs of the sin terms swapped (a rotation by -t).": v(sign=-1.0),
        "`offset` was ignored: row j sits at position offset + j (new tokens come after the "
        "cached ones).": v(use_offset=False) if offset else None,
        "positions start at 1: row j sits at position offset + j, so the first row of an "
        "offset-0 call is not rotated at all.": v(start=1),
    }


def _rope_call(apply_rope, x, offset, base, what):
    kw = {}
    if offset:
        kw["offset"] = offset
    if base != 10000.0:
        kw["base"] = base
    xin = x.clone()
    y = call(apply_rope, xin, what=what, **kw)
    _tensor_result(y, what, x.shape, x.dtype, "apply_rope keeps the shape (..., L, D).")
    if not torch.equal(xin, x):
        fail(f"{what} modified its input in place; return a new tensor.")
    return y


def _compare_rope(y, x, offset, base, what):
    expected = _rope_ref(x, offset, base)
    atol, rtol = ROPE_ATOL, ROPE_RTOL  # float32 angles are fine for float64 inputs too
    if not torch.allclose(y.detach().double(), expected.double(), atol=atol, rtol=rtol):
        why = _m(y, _rope_candidates(x, offset, base), atol=max(atol, 1e-5), rtol=rtol)
        check_close(y, expected, what, why or "Pair (2i, 2i+1) = (a, b) becomes (a cos t - b sin t, "
                    "a sin t + b cos t) with t = (offset + j) * base**(-2i/D) for row j.",
                    atol=atol, rtol=rtol)


def check_rope_basic(apply_rope):
    """Position 0 is the identity; position 1 of a unit pair; the 05 link; offset."""
    D = 8
    x = torch.zeros(3, D)
    x[:, 0] = 1.0  # pair 0 = (1, 0): rotated to (cos t, sin t)
    x[:, 6] = 1.0  # pair 3 = (1, 0) at the slowest frequency
    y = _rope_call(apply_rope, x, 0, 10000.0, "apply_rope(x) for x (3, 8)")
    if not torch.allclose(y[0].detach(), x[0], atol=1e-6):
        why = _m(y, _rope_candidates(x, 0, 10000.0))
        if why and why.startswith("positions start at 1"):
            why = "Positions start at 1 in your code: row j sits at position offset + j."
        fail(f"apply_rope changed row 0 (position 0): got {y[0].tolist()}, expected it unchanged "
             f"{x[0].tolist()}. At position 0 every angle is 0.\n" + (why or ""))
    _compare_rope(y, x, 0, 10000.0, "apply_rope(x) for a unit vector in pairs 0 and 3 at "
                  "positions 0, 1, 2")
    with seeded(21):
        x = torch.randn(2, 5, D)
    y = _rope_call(apply_rope, x, 7, 10000.0, "apply_rope(x, offset=7)")
    _compare_rope(y, x, 7, 10000.0, "apply_rope(x, offset=7) for x (2, 5, 8)")
    with seeded(22):
        v = torch.randn(1, 16)
    for m in (3, 20):
        y = _rope_call(apply_rope, v, m, 10000.0, f"apply_rope(v, offset={m})")
        ref = v[0].double() @ R_shift(m, 16)
        if not torch.allclose(y[0].detach().double(), ref, atol=1e-5):
            why = _m(y, _rope_candidates(v, m, 10000.0))
            fail(f"apply_rope(v, offset={m}) for one row v is not pe_shift_matrix({m}, 16).T @ v, "
                 f"the rotation of notebook 05.\n  actual:   {[round(t, 4) for t in y[0].tolist()[:6]]}"
                 f" ...\n  expected: {[round(t, 4) for t in ref.tolist()[:6]]} ...\n" + (why or ""))
    passed("apply_rope: position 0 unchanged, unit pairs rotate by pos * base**(-2i/D), offset "
           "respected, equal to notebook 05's shift matrix (transposed)")


def R_shift(offset, D, base=10000.0):
    """(D, D) float64: notebook 05's pe_shift_matrix(offset, D), whose transpose is RoPE's
    rotation for position `offset`, written out again here; returned transposed-ready so that
    v @ M == M.T @ v is the rotated row."""
    M = torch.zeros(D, D, dtype=torch.float64)
    for i in range(D // 2):
        t = offset * base ** (-2 * i / D)
        c, s = math.cos(t), math.sin(t)
        M[2 * i, 2 * i], M[2 * i, 2 * i + 1] = c, s
        M[2 * i + 1, 2 * i], M[2 * i + 1, 2 * i + 1] = -s, c
    return M


def check_rope_relative(apply_rope):
    """The defining property: <rope(q, m), rope(k, n)> depends on n - m only, and equals q.k when
    m == n; rotations keep norms; different offsets give different scores."""
    D = 16
    with seeded(31):
        q, k = torch.randn(1, D), torch.randn(1, D)
    rot = {}
    for pos in (0, 1, 3, 5, 9, 12, 20, 27, 40, 47):
        rot["q", pos] = _rope_call(apply_rope, q, pos, 10000.0, f"apply_rope(q, offset={pos})")[0].detach().double()
        rot["k", pos] = _rope_call(apply_rope, k, pos, 10000.0, f"apply_rope(k, offset={pos})")[0].detach().double()
    norm_q = q.double().norm()
    for pos in (3, 40):
        if not math.isclose(rot["q", pos].norm().item(), norm_q.item(), rel_tol=1e-4):
            fail(f"apply_rope changed the length of a vector: |q| = {norm_q.item():.5f}, |rope(q, "
                 f"offset={pos})| = {rot['q', pos].norm().item():.5f}. RoPE only ROTATES pairs: "
                 "(a cos t - b sin t, a sin t + b cos t) keeps a**2 + b**2.")
    score = lambda m, n: (rot["q", m] @ rot["k", n]).item()  # noqa: E731
    qk = (q.double() @ k.double().T).item()
    for m in (5, 27):
        if not math.isclose(score(m, m), qk, rel_tol=1e-4, abs_tol=1e-4):
            fail(f"a query and a key at the SAME position {m} should score q.k = {qk:.5f} (the "
                 f"rotations cancel); got {score(m, m):.5f}. Rotate q and k by the same angles at "
                 "the same position.")
    pairs = [((0, 3), (9, 12)), ((1, 5), (5, 9)), ((12, 3), (9, 0)), ((40, 20), (20, 0)),
             ((20, 27), (40, 47))]
    for (m, n), (m2, n2) in pairs:
        a, b = score(m, n), score(m2, n2)
        if not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4):
            fail(f"the score of a query at position m and a key at position n must depend on n - m "
                 f"only. Offset n - m = {n - m} in both cases, yet\n  score(m={m}, n={n}) = {a:.5f}"
                 f"\n  score(m={m2}, n={n2}) = {b:.5f}\nEvery pair (2i, 2i+1) must be a rotation by "
                 "pos * w_i with the SAME w_i for queries and keys.")
    distinct = {round(score(0, n), 4) for n in (1, 3, 5, 9, 12, 20)}
    if len(distinct) < 3:
        fail("the score q.k does not change with the distance between the query and the key: "
             "apply_rope must rotate row j by an angle that grows with its position offset + j.")
    passed("apply_rope: scores depend on n - m only (checked on 5 pairs of positions), equal q.k at "
           "the same position, and lengths are kept")


def check_rope_random(apply_rope, seed=0, cases=(((2, 3, 10, 8), 0, 10000.0, torch.float32),)):
    for i, (shape, offset, base, dtype) in enumerate(cases):
        with seeded(seed + i):
            x = torch.randn(*shape, dtype=dtype)
        what = f"apply_rope for x {tuple(shape)} {dtype}, offset={offset}, base={base}"
        y = _rope_call(apply_rope, x, offset, base, what)
        _compare_rope(y, x, offset, base, what)
    passed(f"apply_rope: matches RoPE on {len(cases)} random case(s)")


# =========================================================================== SwiGLU
def _linear_of(m, name, owner, fin, fout, bias):
    lin = getattr(m, name, None)
    if lin is None or not isinstance(getattr(lin, "weight", None), torch.Tensor):
        fail(f"{owner} has no `{name}` layer: keep it as nn.Linear, named as the exercise says, so "
             "the tests can read its weights.")
    if tuple(lin.weight.shape) != (fout, fin):
        fail(f"{owner}.{name}.weight has shape {tuple(lin.weight.shape)}; expected ({fout}, {fin}) "
             f"for nn.Linear({fin}, {fout}).")
    b = getattr(lin, "bias", None)
    if bias and b is None:
        fail(f"{owner}.{name} has no bias although bias=True was asked for: pass bias=bias to "
             "nn.Linear.")
    if not bias and b is not None:
        fail(f"{owner}.{name} has a bias although bias=False (the default): pass bias=bias to "
             "nn.Linear. LLaMA-style layers have no biases.")
    return lin


def check_swiglu_structure(SwiGLU):
    for bias in (False, True):
        kw = {"bias": True} if bias else {}
        m = call(SwiGLU, 16, 40, what=f"SwiGLU(16, 40{', bias=True' if bias else ''})", **kw)
        _linear_of(m, "gate", "SwiGLU", 16, 40, bias)
        _linear_of(m, "up", "SwiGLU", 16, 40, bias)
        _linear_of(m, "down", "SwiGLU", 40, 16, bias)
        n = sum(p.numel() for p in m.parameters())
        want = 3 * 16 * 40 + (2 * 40 + 16 if bias else 0)
        if n != want:
            fail(f"SwiGLU(16, 40{', bias=True' if bias else ''}) has {n} parameters; expected {want} "
                 "(gate, up and down only).")
    passed("SwiGLU: gate and up (d_model -> d_ff) and down (d_ff -> d_model), biases only when asked")


def check_swiglu_matches(SwiGLU, seed=0, cases=((2, 5, 16, 40, False),)):
    for i, (B, T, d, d_ff, bias) in enumerate(cases):
        with seeded(seed + i):
            W = {n: torch.randn(o, inp) / math.sqrt(inp) for n, (o, inp) in
                 (("gate", (d_ff, d)), ("up", (d_ff, d)), ("down", (d, d_ff)))}
            Bs = {n: torch.randn(o) * 0.1 for n, o in (("gate", d_ff), ("up", d_ff), ("down", d))}
            x = torch.randn(B, T, d)
        kw = {"bias": True} if bias else {}
        m = call(SwiGLU, d, d_ff, what=f"SwiGLU({d}, {d_ff})", **kw)
        for n in ("gate", "up", "down"):
            lin = _linear_of(m, n, "SwiGLU", *((d, d_ff) if n != "down" else (d_ff, d)), bias)
            with torch.no_grad():
                lin.weight.copy_(W[n])
                if bias:
                    lin.bias.copy_(Bs[n])
        lin = lambda n, t: F.linear(t, W[n], Bs[n] if bias else None)  # noqa: E731
        expected = lin("down", F.silu(lin("gate", x)) * lin("up", x))
        what = f"SwiGLU({d}, {d_ff}{', bias=True' if bias else ''}) on x ({B}, {T}, {d})"
        y = call(m, x, what=what)
        _tensor_result(y, what, (B, T, d))
        if not torch.allclose(y.detach(), expected, atol=1e-5, rtol=1e-4):
            g, u = lin("gate", x), lin("up", x)
            cands = {
                "the SiLU is on the wrong projection: silu(gate(x)) * up(x), not "
                "gate(x) * silu(up(x)).": lin("down", g * F.silu(u)),
                "you used a sigmoid where SwiGLU has silu(z) = z * sigmoid(z): sigmoid gating is "
                "the original GLU, not SwiGLU.": lin("down", torch.sigmoid(g) * u),
                "you used GELU; SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu).":
                    lin("down", F.gelu(g) * u),
                "you used ReLU; SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu).":
                    lin("down", F.relu(g) * u),
                "the gate is missing: down(silu(up(x))) is a plain FFN; multiply by "
                "silu(gate(x)).": lin("down", F.silu(u)),
                "the up projection is missing: down(silu(gate(x))) is a plain FFN; multiply "
                "silu(gate(x)) by up(x).": lin("down", F.silu(g)),
                "the SiLU is applied after the product: silu(gate(x)) * up(x), not "
                "silu(gate(x) * up(x)).": lin("down", F.silu(g * u)),
                "you added the two projections; SwiGLU MULTIPLIES silu(gate(x)) by up(x).":
                    lin("down", F.silu(g) + u),
            }
            why = _m(y, cands)
            check_close(y, expected, what, why or "forward(x) = down(silu(gate(x)) * up(x)).")
    passed(f"SwiGLU: equals down(silu(gate(x)) * up(x)) on {len(cases)} case(s)")


# =========================================================================== GQA
def _gqa_weights(d, H, Hkv, bias, seed):
    hd = d // H
    with seeded(seed):
        W = {"w_q.weight": torch.randn(d, d), "w_k.weight": torch.randn(Hkv * hd, d),
             "w_v.weight": torch.randn(Hkv * hd, d), "w_o.weight": torch.randn(d, d)}
        W = {k: v / math.sqrt(d) for k, v in W.items()}
        if bias:
            W.update({"w_q.bias": torch.randn(d) * 0.1, "w_k.bias": torch.randn(Hkv * hd) * 0.1,
                      "w_v.bias": torch.randn(Hkv * hd) * 0.1, "w_o.bias": torch.randn(d) * 0.1})
    return W


def _load(module, params, owner):
    """Copy `params` (name -> tensor) into `module`'s parameters of the same names."""
    own = dict(module.named_parameters(remove_duplicate=False))
    for name, value in params.items():
        p = own.get(name)
        if p is None:
            fail(f"{owner} has no parameter `{name}`: keep the names the exercise fixes so the tests "
                 "can copy their weights in.")
        if tuple(p.shape) != tuple(value.shape):
            fail(f"{owner}.{name} has shape {tuple(p.shape)}; expected {tuple(value.shape)}.")
        with torch.no_grad():
            p.copy_(value)
    extra = sorted(set(dict(module.named_parameters())) - set(params))
    if extra:
        fail(f"{owner} has parameters the exercise does not ask for: {extra}. (Biases? All layers "
             "here use bias=False unless asked otherwise.)")


def _heads(t, n, hd):
    B, T, _ = t.shape
    return t.view(B, T, n, hd).transpose(1, 2)


def _proj(W, name, x):
    return F.linear(x, W[f"{name}.weight"], W.get(f"{name}.bias"))


def _gqa_expected(W, x, H, Hkv, base=10000.0):
    """Full causal pass with PyTorch's own GQA: returns (out, (k, v))."""
    B, T, d = x.shape
    hd = d // H
    q = _rope_ref(_heads(_proj(W, "w_q", x), H, hd), 0, base)
    k = _rope_ref(_heads(_proj(W, "w_k", x), Hkv, hd), 0, base)
    v = _heads(_proj(W, "w_v", x), Hkv, hd)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return _proj(W, "w_o", o.transpose(1, 2).reshape(B, T, d)), (k, v)


def _gqa_variant(W, x, H, Hkv, base=10000.0, rep="interleave", rope_q=True, rope_k=True,
                 rope_v=False, rope_first=False, causal=True, scale=None, chunks=None,
                 offset=True, mask="offset"):
    """A hand-written GQA with the switches of known mistakes; with `chunks`, run through a
    cache chunk by chunk and return the concatenated outputs."""
    B, T, d = x.shape
    hd = d // H
    g = H // Hkv
    x = x.double()
    W = {k: v.double() for k, v in W.items()}
    out, ck, cv = [], None, None
    sizes = chunks or (T,)
    s0 = 0
    for n in sizes:
        xs = x[:, s0:s0 + n]
        P = 0 if ck is None else ck.size(2)
        pos = P if offset else 0
        qp, kp, vp = _proj(W, "w_q", xs), _proj(W, "w_k", xs), _proj(W, "w_v", xs)
        if rope_first:
            qp = _rope_ref(qp, pos, base) if rope_q else qp
            kp = _rope_ref(kp, pos, base) if rope_k else kp
        q, k, v = _heads(qp, H, hd), _heads(kp, Hkv, hd), _heads(vp, Hkv, hd)
        if not rope_first:
            q = _rope_ref(q, pos, base) if rope_q else q
            k = _rope_ref(k, pos, base) if rope_k else k
        if rope_v:
            v = _rope_ref(v, pos, base)
        ck = k if ck is None else torch.cat([ck, k], 2)
        cv = v if cv is None else torch.cat([cv, v], 2)
        if rep == "interleave":
            ka, va = ck.repeat_interleave(g, 1), cv.repeat_interleave(g, 1)
        else:
            ka, va = ck.repeat(1, g, 1, 1), cv.repeat(1, g, 1, 1)
        sc = (q @ ka.transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(hd))
        if causal:
            Lk = ka.size(2)
            m = torch.ones(n, Lk, dtype=torch.bool).tril(diagonal=P if mask == "offset" else 0)
            sc = sc.masked_fill(~m, float("-inf"))
        o = sc.softmax(-1) @ va
        out.append(_proj(W, "w_o", o.transpose(1, 2).reshape(B, n, d)))
        s0 += n
    return torch.cat(out, 1)


def _gqa_candidates(W, x, H, Hkv, base):
    d = x.size(-1)
    hd = d // H
    v = lambda **kw: _gqa_variant(W, x, H, Hkv, base, **kw)  # noqa: E731
    cands = {
        "query heads read the wrong K/V heads: query head h uses K/V head h // (n_heads // "
        "n_kv_heads), i.e. k.repeat_interleave(group, dim=1) (0,0,1,1), not k.repeat(1, group, 1, "
        "1) (0,1,0,1).": v(rep="tile") if 1 < Hkv < H else None,
        "RoPE is missing: rotate the queries and keys with apply_rope (per head, offset = number "
        "of cached tokens).": v(rope_q=False, rope_k=False),
        "RoPE is applied to the queries only: rotate the keys too (scores then depend on the "
        "distance).": v(rope_k=False),
        "RoPE is applied to the keys only: rotate the queries too.": v(rope_q=False),
        "RoPE was also applied to the values: rotate only the queries and keys.": v(rope_v=True),
        "RoPE was applied over all d_model features before splitting into heads: apply it per "
        "head, over head_dim (after view(B, T, H, head_dim).transpose(1, 2)).": v(rope_first=True),
        "the attention is not causal: query i may read keys 0..i only (a lower-triangular mask "
        "with the diagonal).": v(causal=False),
        "the scores are not scaled: divide them by sqrt(head_dim).": v(scale=1.0),
        "the scores are scaled by 1/sqrt(d_model); use 1/sqrt(head_dim), the size of one head.":
            v(scale=1 / math.sqrt(d)) if H > 1 else None,
    }
    return cands


def _new_gqa(cls, d, H, Hkv, bias=False, base=None):
    kw = {"bias": True} if bias else {}
    if base is not None:
        kw["base"] = base
    m = call(cls, d, H, Hkv, shortcuts=ATTN_SC,
             what=f"GroupedQueryAttention({d}, {H}, {Hkv}{', bias=True' if bias else ''})", **kw)
    hd = d // H
    owner = "GroupedQueryAttention"
    _linear_of(m, "w_q", owner, d, d, bias)
    _linear_of(m, "w_k", owner, d, Hkv * hd, bias)
    _linear_of(m, "w_v", owner, d, Hkv * hd, bias)
    _linear_of(m, "w_o", owner, d, d, bias)
    return m


def _unpack_attn(res, what):
    if not isinstance(res, (tuple, list)) or len(res) != 2 or not isinstance(res[1], (tuple, list)) \
            or len(res[1]) != 2:
        fail(f"{what} must return (out, (k, v)); got {type(res).__name__}"
             f"{' of length ' + str(len(res)) if isinstance(res, (tuple, list)) else ''}. Return the "
             "output and the cache pair.")
    return res[0], res[1]


def check_gqa_structure(cls):
    for (d, H, Hkv) in ((32, 8, 2), (16, 4, 1), (24, 3, 3)):
        _new_gqa(cls, d, H, Hkv)
    _new_gqa(cls, 32, 8, 4, bias=True)
    m = _new_gqa(cls, 32, 8, 2)
    x = torch.zeros(2, 3, 32)
    out, (k, v) = _unpack_attn(call(m, x, shortcuts=ATTN_SC, what="GroupedQueryAttention(32, 8, 2)(x)"),
                               "GroupedQueryAttention(32, 8, 2)(x)")
    check_shape(out, (2, 3, 32), "the output for x (2, 3, 32)")
    if isinstance(k, torch.Tensor) and tuple(k.shape) == (2, 8, 3, 4):
        fail("the cached keys have shape (2, 8, 3, 4): one copy per QUERY head. Cache the keys and "
             "values before repeating them for the groups, (B, n_kv_heads, T, head_dim) = (2, 2, 3, "
             "4): that is what makes the GQA cache small.")
    check_shape(k, (2, 2, 3, 4), "the cached keys k", "Expected (B, n_kv_heads, T, head_dim).")
    check_shape(v, (2, 2, 3, 4), "the cached values v", "Expected (B, n_kv_heads, T, head_dim).")
    passed("GroupedQueryAttention: w_q, w_o (d_model -> d_model), w_k, w_v (d_model -> n_kv_heads "
           "* head_dim), bias only when asked, returns (out, (k, v)) with one copy per K/V head")


def check_gqa_matches_torch(cls, seed=0, cases=((2, 6, 32, 8, 2),)):
    """Full pass against F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)."""
    for i, (B, T, d, H, Hkv) in enumerate(cases):
        bias = i % 2 == 1
        base = 10000.0 if i % 3 != 2 else 500.0
        W = _gqa_weights(d, H, Hkv, bias, seed + i)
        with seeded(seed + 100 + i):
            x = torch.randn(B, T, d)
        m = _new_gqa(cls, d, H, Hkv, bias, None if base == 10000.0 else base)
        _load(m, W, "GroupedQueryAttention")
        m.eval()
        what = f"GroupedQueryAttention({d}, {H}, {Hkv}{', bias=True' if bias else ''}" \
               f"{'' if base == 10000.0 else f', base={base}'}) on x ({B}, {T}, {d})"
        out, (k, v) = _unpack_attn(call(m, x, shortcuts=ATTN_SC, what=what), what)
        exp_out, (ek, ev) = _gqa_expected(W, x, H, Hkv, base)
        _tensor_result(out, what, (B, T, d))
        if not torch.allclose(out.detach(), exp_out, atol=LM_ATOL, rtol=LM_RTOL):
            why = _m(out, _gqa_candidates(W, x, H, Hkv, base))
            if why is None and base != 10000.0 and torch.allclose(
                    out.detach().double(), _gqa_variant(W, x, H, Hkv, 10000.0), atol=1e-4):
                why = "the `base` argument was not passed on to apply_rope (base=self.base)."
            check_close(out, exp_out, what + ", against F.scaled_dot_product_attention(q, k, v, "
                        "is_causal=True, enable_gqa=True)", why or "", atol=LM_ATOL, rtol=LM_RTOL)
        if isinstance(k, torch.Tensor) and k.dim() == 4 and k.size(1) == H and H != Hkv:
            fail(f"the cache holds {H} key heads, one per query head; keep one per K/V head, "
                 f"(B, {Hkv}, T, head_dim), and repeat them only for the attention.")
        check_shape(k, ek.shape, "the cached keys", "Expected (B, n_kv_heads, T, head_dim).")
        if not torch.allclose(k.detach(), ek, atol=LM_ATOL, rtol=LM_RTOL):
            pre = _heads(_proj(W, "w_k", x), Hkv, d // H)
            hint = ("the cache holds the keys BEFORE RoPE; cache them after the rotation."
                    if torch.allclose(k.detach(), pre, atol=1e-4) else
                    "The cache holds the keys after RoPE, heads split: (B, n_kv_heads, T, head_dim).")
            check_close(k, ek, "the cached keys", hint, atol=LM_ATOL, rtol=LM_RTOL)
        check_close(v, ev, "the cached values", "The values are not rotated: (B, n_kv_heads, T, "
                    "head_dim) straight from w_v.", atol=LM_ATOL, rtol=LM_RTOL)
    passed(f"GroupedQueryAttention: equals F.scaled_dot_product_attention(..., enable_gqa=True) with "
           f"RoPE on {len(cases)} case(s), cache included")


def check_gqa_cache(cls, seed=0, cases=((2, 9, 32, 8, 2, (4, 1, 4)),)):
    """Chunk by chunk through the cache: equal to the full pass, positions offset."""
    for i, (B, T, d, H, Hkv, chunks) in enumerate(cases):
        assert sum(chunks) == T
        W = _gqa_weights(d, H, Hkv, False, seed + i)
        with seeded(seed + 200 + i):
            x = torch.randn(B, T, d)
        m = _new_gqa(cls, d, H, Hkv)
        _load(m, W, "GroupedQueryAttention")
        m.eval()
        exp_out, (ek, ev) = _gqa_expected(W, x, H, Hkv)
        cache, outs, s0 = None, [], 0
        for j, n in enumerate(chunks):
            what = (f"GroupedQueryAttention({d}, {H}, {Hkv}) call {j + 1} with {n} new token(s) after "
                    f"{s0} cached")
            out, cache = _unpack_attn(call(m, x[:, s0:s0 + n], cache, shortcuts=ATTN_SC, what=what), what)
            _tensor_result(out, what, (B, n, d))
            k, v = cache
            if isinstance(k, torch.Tensor) and k.dim() == 4 and k.size(2) == n and s0 > 0:
                fail(f"after {s0} cached and {n} new tokens the returned keys cover only the {n} new "
                     "ones: concatenate the cached keys and values (old first) along the time axis "
                     "and return all of them.")
            check_shape(k, (B, Hkv, s0 + n, d // H), f"the cached keys after call {j + 1}",
                        "Expected (B, n_kv_heads, P + T, head_dim), old tokens first.")
            outs.append(out.detach())
            s0 += n
        got = torch.cat(outs, 1)
        if not torch.allclose(got, exp_out, atol=LM_ATOL, rtol=LM_RTOL):
            v_ = lambda **kw: _gqa_variant(W, x, H, Hkv, chunks=chunks, **kw)  # noqa: E731
            cands = {
                "the positions of the new tokens were not offset: with P cached tokens, the new "
                "ones sit at positions P, P+1, ... (apply_rope(..., offset=P)), not 0, 1, ...":
                    v_(offset=False),
                "the causal mask over (T, P + T) is a plain tril: new query i sits at position P + i "
                "and may read keys 0..P+i, tril(diagonal=P).": v_(mask="plain"),
            }
            cands.update(_gqa_candidates(W, x, H, Hkv, 10000.0))
            why = _m(got, cands)
            bad = next(j for j in range(T) if not torch.allclose(got[:, j], exp_out[:, j],
                                                                 atol=LM_ATOL, rtol=LM_RTOL))
            check_close(got, exp_out, f"the outputs of the cached calls (chunks {list(chunks)}), "
                        f"against one full pass (first wrong position: {bad})",
                        why or "A cached call must give what a full pass gives at the same positions.",
                        atol=LM_ATOL, rtol=LM_RTOL)
        check_close(cache[0], ek, "the final cached keys", "Keys after RoPE at their own positions, "
                    "old first.", atol=LM_ATOL, rtol=LM_RTOL)
        check_close(cache[1], ev, "the final cached values", atol=LM_ATOL, rtol=LM_RTOL)
    passed(f"GroupedQueryAttention: cached calls equal the full pass on {len(cases)} case(s), new "
           "positions offset by the cache")


# =========================================================================== ModernDecoderLM
def _lm_weights(V, d, L, H, Hkv, d_ff, tie, seed):
    hd = d // H
    W = {}
    with seeded(seed):
        W["tok_embed.weight"] = torch.randn(V, d)
        for i in range(L):
            p = f"layers.{i}."
            W[p + "norm1.weight"] = 1 + 0.2 * torch.randn(d)
            for n, (o, inp) in (("w_q", (d, d)), ("w_k", (Hkv * hd, d)), ("w_v", (Hkv * hd, d)),
                                ("w_o", (d, d))):
                W[p + f"self_attn.{n}.weight"] = torch.randn(o, inp) / math.sqrt(inp)
            W[p + "norm2.weight"] = 1 + 0.2 * torch.randn(d)
            for n, (o, inp) in (("gate", (d_ff, d)), ("up", (d_ff, d)), ("down", (d, d_ff))):
                W[p + f"ff.{n}.weight"] = torch.randn(o, inp) / math.sqrt(inp)
        W["norm.weight"] = 1 + 0.2 * torch.randn(d)
        W["lm_head.weight"] = W["tok_embed.weight"] if tie else torch.randn(V, d) / math.sqrt(d)
    return W


def _lm_expected(W, tokens, L, H, Hkv, final_norm=True, scale_embed=False, add_pe=False,
                 post_norm=False, eps=1e-6):
    x = F.embedding(tokens, W["tok_embed.weight"])
    d = x.size(-1)
    if scale_embed:
        x = x * math.sqrt(d)
    if add_pe:
        from ..reference import sinusoidal_positional_encoding
        x = x + sinusoidal_positional_encoding(tokens.size(1), d)
    rms = lambda t, w: F.rms_norm(t, (d,), w, eps)  # noqa: E731
    cache = []
    for i in range(L):
        p = f"layers.{i}."
        A = {k[len(p + "self_attn."):]: v for k, v in W.items() if k.startswith(p + "self_attn.")}
        if post_norm:
            a, kv = _gqa_expected(A, x, H, Hkv)
            x = rms(x + a, W[p + "norm1.weight"])
        else:
            a, kv = _gqa_expected(A, rms(x, W[p + "norm1.weight"]), H, Hkv)
            x = x + a
        cache.append(kv)
        h = x if post_norm else rms(x, W[p + "norm2.weight"])
        f = F.linear(F.silu(F.linear(h, W[p + "ff.gate.weight"])) * F.linear(h, W[p + "ff.up.weight"]),
                     W[p + "ff.down.weight"])
        x = rms(x + f, W[p + "norm2.weight"]) if post_norm else x + f
    if final_norm:
        x = rms(x, W["norm.weight"])
    return F.linear(x, W["lm_head.weight"]), cache


def _new_lm(cls, V, d, L, H, Hkv, d_ff, tie=True, max_len=None):
    kw = {} if tie else {"tie_weights": False}
    if max_len is not None:
        kw["max_len"] = max_len
    what = f"ModernDecoderLM({V}, {d}, {L}, {H}, {Hkv}, {d_ff}{'' if tie else ', tie_weights=False'})"
    m = call(cls, V, d, L, H, Hkv, d_ff, shortcuts=LM_SC, what=what, **kw)
    for name in ("tok_embed", "layers", "norm", "lm_head"):
        if not isinstance(getattr(m, name, None), nn.Module):
            fail(f"{what} has no `{name}` sub-module: keep tok_embed, layers, norm and lm_head as "
                 "the exercise names them.")
    if len(m.layers) != L:
        fail(f"{what} has {len(m.layers)} layers; expected {L}.")
    return m, what


def _lm_out(res, what):
    if not isinstance(res, (tuple, list)) or len(res) != 2:
        fail(f"{what} must return (logits, cache); got {type(res).__name__}. Return the logits and "
             "the list of (k, v) pairs, one per layer.")
    return res


def check_lm_structure(cls):
    V, d, L, H, Hkv, d_ff = 11, 16, 2, 4, 2, 24
    m, what = _new_lm(cls, V, d, L, H, Hkv, d_ff)
    if getattr(m.lm_head, "weight", None) is not getattr(m.tok_embed, "weight", 0):
        same = torch.equal(m.lm_head.weight.detach(), m.tok_embed.weight.detach()) \
            if m.lm_head.weight.shape == m.tok_embed.weight.shape else False
        fail(f"{what}: lm_head.weight is not tok_embed.weight. "
             + ("They hold the same numbers, but as two tensors: a copy, not a tie, and the two "
                "drift apart as soon as training starts. " if same else "")
             + "Tie them: self.lm_head.weight = self.tok_embed.weight.")
    if getattr(m.lm_head, "bias", None) is not None:
        fail(f"{what}: lm_head has a bias; use nn.Linear(d_model, vocab_size, bias=False).")
    hd = d // H
    per_layer = 2 * d + d * d * 2 + 2 * Hkv * hd * d + 3 * d * d_ff
    want = V * d + L * per_layer + d
    n = sum(p.numel() for p in m.parameters())
    if n != want:
        fail(f"{what} has {n} parameters; expected {want}: the embedding ({V * d}, shared with "
             f"lm_head), {L} x {per_layer} per layer (two RMSNorm gains, w_q and w_o {d}x{d}, w_k "
             f"and w_v {Hkv * hd}x{d}, SwiGLU 3 x {d}x{d_ff}, no biases) and the final RMSNorm ({d}).")
    for i, layer in enumerate(m.layers):
        for name in ("norm1", "self_attn", "norm2", "ff"):
            if not isinstance(getattr(layer, name, None), nn.Module):
                fail(f"layers[{i}] has no `{name}`: each block keeps norm1, self_attn, norm2 and ff.")
        if tuple(layer.self_attn.w_k.weight.shape) != (Hkv * hd, d):
            fail(f"layers[{i}].self_attn.w_k has shape {tuple(layer.self_attn.w_k.weight.shape)}; "
                 f"expected ({Hkv * hd}, {d}): pass n_kv_heads on to GroupedQueryAttention.")
    m2, what2 = _new_lm(cls, V, d, L, H, Hkv, d_ff, tie=False)
    if m2.lm_head.weight is m2.tok_embed.weight:
        fail(f"{what2}: lm_head.weight is tok_embed.weight although tie_weights=False: tie them only "
             "when asked.")
    n2 = sum(p.numel() for p in m2.parameters())
    if n2 != want + V * d:
        fail(f"{what2} has {n2} parameters; expected {want + V * d} (the untied lm_head adds "
             f"{V * d}).")
    passed(f"ModernDecoderLM: lm_head.weight is tok_embed.weight ({want} parameters, {V * d} fewer "
           "than untied), untied when tie_weights=False, blocks with norm1/self_attn/norm2/ff")


def check_lm_matches_torch(cls, seed=0, cases=((13, 32, 2, 4, 2, 48, 2, 7, True),)):
    for i, (V, d, L, H, Hkv, d_ff, B, T, tie) in enumerate(cases):
        W = _lm_weights(V, d, L, H, Hkv, d_ff, tie, seed + i)
        with seeded(seed + 300 + i):
            tokens = torch.randint(0, V, (B, T))
        m, what = _new_lm(cls, V, d, L, H, Hkv, d_ff, tie)
        if tie and getattr(m.lm_head, "weight", None) is not getattr(m.tok_embed, "weight", 0):
            fail(f"{what}: lm_head.weight is not tok_embed.weight, so the output layer does not "
                 "follow the embedding: tie them (self.lm_head.weight = self.tok_embed.weight).")
        load = {k: v for k, v in W.items() if not (tie and k == "lm_head.weight")}
        _load(m, load, "ModernDecoderLM")
        m.eval()
        expected, ecache = _lm_expected(W, tokens, L, H, Hkv)
        logits, cache = _lm_out(call(m, tokens, shortcuts=LM_SC, what=f"{what}(tokens {B}x{T})"), what)
        _tensor_result(logits, f"{what}: logits", (B, T, V))
        if not torch.allclose(logits.detach(), expected, atol=LM_ATOL, rtol=LM_RTOL):
            cands = {
                "the final RMSNorm is missing: logits = lm_head(norm(x)).":
                    _lm_expected(W, tokens, L, H, Hkv, final_norm=False)[0],
                "the embeddings are multiplied by sqrt(d_model) (notebook 08's convention); this "
                "model uses tok_embed(tokens) as it is.":
                    _lm_expected(W, tokens, L, H, Hkv, scale_embed=True)[0],
                "a sinusoidal positional encoding is added to the embeddings; with RoPE the "
                "positions enter only inside attention.":
                    _lm_expected(W, tokens, L, H, Hkv, add_pe=True)[0],
                "the blocks are post-norm (norm after the residual sum); use pre-norm: x = x + "
                "self_attn(norm1(x)), then x = x + ff(norm2(x)).":
                    _lm_expected(W, tokens, L, H, Hkv, post_norm=True)[0],
                "the logits come from the embedding matrix although tie_weights=False: use lm_head "
                "(its own weight when untied).": None if tie else _lm_expected(
                    {**W, "lm_head.weight": W["tok_embed.weight"]}, tokens, L, H, Hkv)[0],
            }
            why = _m(logits, cands)
            check_close(logits, expected, f"{what}: logits for tokens {B}x{T}, against PyTorch's "
                        "F.rms_norm, F.scaled_dot_product_attention(enable_gqa=True) and F.silu",
                        why or "Each block: x = x + self_attn(norm1(x)); x = x + ff(norm2(x)); then "
                        "logits = lm_head(norm(x)).", atol=LM_ATOL, rtol=LM_RTOL)
        if not isinstance(cache, (list, tuple)) or len(cache) != L:
            fail(f"{what}: the cache must be a list with one (k, v) pair per layer ({L}); got "
                 f"{type(cache).__name__}{' of length ' + str(len(cache)) if hasattr(cache, '__len__') else ''}.")
        for j in range(L):
            check_close(cache[j][0], ecache[j][0], f"the cached keys of layer {j}", atol=LM_ATOL,
                        rtol=LM_RTOL)
    passed(f"ModernDecoderLM: logits equal PyTorch's RMSNorm / GQA attention / SiLU on {len(cases)} "
           "case(s)")


def check_lm_cache(cls, seed=0, cases=((13, 32, 2, 4, 2, 48, 2, 10, (4, 1, 1, 4)),)):
    for i, (V, d, L, H, Hkv, d_ff, B, T, chunks) in enumerate(cases):
        W = _lm_weights(V, d, L, H, Hkv, d_ff, True, seed + i)
        with seeded(seed + 400 + i):
            tokens = torch.randint(0, V, (B, T))
        m, what = _new_lm(cls, V, d, L, H, Hkv, d_ff, max_len=T)
        if getattr(m.lm_head, "weight", None) is not getattr(m.tok_embed, "weight", 0):
            fail(f"{what}: lm_head.weight is not tok_embed.weight: tie them "
                 "(self.lm_head.weight = self.tok_embed.weight).")
        _load(m, {k: v for k, v in W.items() if k != "lm_head.weight"}, "ModernDecoderLM")
        m.eval()
        expected, _ = _lm_expected(W, tokens, L, H, Hkv)
        cache, s0 = None, 0
        for j, n in enumerate(chunks):
            call_what = f"{what} call {j + 1} with {n} new token(s) after {s0} cached"
            logits, cache = _lm_out(call(m, tokens[:, s0:s0 + n], cache, shortcuts=LM_SC,
                                         what=call_what), call_what)
            _tensor_result(logits, call_what, (B, n, V))
            if not isinstance(cache, (list, tuple)) or len(cache) != L:
                fail(f"{call_what}: the cache must be a list with one (k, v) pair per layer.")
            for li, kv in enumerate(cache):
                check_shape(kv[0], (B, Hkv, s0 + n, d // H), f"the cached keys of layer {li} after "
                            f"call {j + 1}", "Each layer keeps (B, n_kv_heads, P + T, head_dim); "
                            "pass cache[i] to layer i and collect what each layer returns.")
            if not torch.allclose(logits.detach(), expected[:, s0:s0 + n], atol=LM_ATOL, rtol=LM_RTOL):
                check_close(logits, expected[:, s0:s0 + n], f"{call_what}: logits against a full pass",
                            "A cached call must give the logits of a full pass at the same positions: "
                            "pass cache[i] to layer i (not the same pair to every layer) and let each "
                            "attention offset its RoPE positions by the cache length.",
                            atol=LM_ATOL, rtol=LM_RTOL)
            s0 += n
        try:
            call(m, tokens[:, :1], cache, shortcuts=LM_SC, what="one token past max_len")
        except CheckFailed:
            pass
        else:
            fail(f"{what} with max_len={T}: a call that goes past max_len positions (after {T} cached "
                 "tokens) did not raise. Check P + T <= max_len in forward.")
    passed(f"ModernDecoderLM: cached calls equal a full pass on {len(cases)} case(s); past max_len "
           "raises")


# =========================================================================== top_p_filter
def _top_p_expected(logits, p):
    """A plain loop: sort each row's probabilities, keep tokens while the mass before them < p."""
    flat = logits.reshape(-1, logits.size(-1)).double()
    out = torch.full_like(flat, float("-inf"))
    for r in range(flat.size(0)):
        probs = flat[r].softmax(-1)
        mass = 0.0
        for idx in sorted(range(flat.size(1)), key=lambda j: -probs[j].item()):
            if mass >= p:
                break
            out[r, idx] = flat[r, idx]
            mass += probs[idx].item()
    return out.reshape(logits.shape).to(logits.dtype)


def _top_p_candidates(logits, p):
    s, order = torch.sort(logits, -1, descending=True)
    probs = s.softmax(-1)
    cum = probs.cumsum(-1)
    back = lambda t: torch.empty_like(logits).scatter(-1, order, t)  # noqa: E731
    inf = float("-inf")
    asc_s, asc_o = torch.sort(logits, -1)
    asc_cum = asc_s.softmax(-1).cumsum(-1)
    return {
        "the token whose probability makes the total reach top_p was dropped (you kept cumsum <= "
        "top_p, or < top_p). Keep a token while the mass BEFORE it is below top_p: the set must "
        "reach top_p, and the top token is always kept.": back(s.masked_fill(cum > p, inf)),
        "the kept logits are returned in sorted order: scatter them back to their vocabulary "
        "positions (out.scatter(-1, sorted_indices, sorted_logits)).": s.masked_fill(cum - probs >= p, inf),
        "you returned probabilities; return the LOGITS of the kept tokens (and -inf elsewhere), so "
        "that softmax afterwards renormalises over the nucleus.":
            back(probs.masked_fill(cum - probs >= p, inf)),
        "the removed tokens were set to 0; set them to -inf (a logit of 0 still has probability "
        "after softmax).": back(s.masked_fill(cum - probs >= p, 0.0)),
        "you sorted in ascending order: the nucleus is the MOST probable tokens, "
        "torch.sort(..., descending=True).": torch.empty_like(logits).scatter(
            -1, asc_o, asc_s.masked_fill(asc_cum - asc_s.softmax(-1) >= p, inf)),
        "you summed the sorted LOGITS; the nucleus is defined by the softmax probabilities' "
        "cumulative sum.": back(s.masked_fill(s.cumsum(-1) - s >= p, inf)),
    }


def _top_p_call(fn, logits, p, what):
    x = logits.clone()
    y = call(fn, x, p, what=what)
    _tensor_result(y, what, logits.shape, None, "top_p_filter keeps the shape of the logits.")
    if not torch.equal(x, logits):
        fail(f"{what} modified the logits in place; return a new tensor.")
    return y


def _compare_top_p(y, logits, p, what):
    expected = _top_p_expected(logits, p)
    kept_y, kept_e = torch.isfinite(y), torch.isfinite(expected)
    same_vals = torch.allclose(torch.where(kept_e, y, torch.zeros_like(y)).double(),
                               torch.where(kept_e, expected, torch.zeros_like(expected)).double(),
                               atol=1e-6)
    if torch.equal(kept_y, kept_e) and same_vals:
        return
    why = None
    for hint, cand in _top_p_candidates(logits, p).items():
        if cand.shape == y.shape and torch.equal(torch.isfinite(cand), kept_y) and torch.allclose(
                torch.where(torch.isfinite(cand), y - cand, torch.zeros_like(y)).double().nan_to_num(),
                torch.zeros_like(y, dtype=torch.float64), atol=1e-5):
            why = hint
            break
    if why is None and (~kept_y.reshape(-1, y.size(-1))).all(-1).any():
        why = ("a row has no token left: the top token must always be kept, even when it alone "
               "exceeds top_p.")
    if why is None and torch.isnan(y).any():
        why = "the result has NaN: set removed tokens to -inf with masked_fill, do not multiply."
    rows = logits.reshape(-1, logits.size(-1))
    r = next(i for i in range(rows.size(0))
             if not torch.equal(torch.isfinite(y.reshape(rows.shape)[i]), torch.isfinite(
                 expected.reshape(rows.shape)[i])) or not torch.allclose(
                 torch.where(torch.isfinite(expected.reshape(rows.shape)[i]), y.reshape(rows.shape)[i],
                             torch.zeros(())).double(),
                 torch.where(torch.isfinite(expected.reshape(rows.shape)[i]),
                             expected.reshape(rows.shape)[i], torch.zeros(())).double(), atol=1e-6))
    probs = rows[r].softmax(-1)
    show = lambda t: [j for j in range(t.numel()) if torch.isfinite(t[j])]  # noqa: E731
    order = torch.argsort(probs, descending=True).tolist()[:8]
    fail(f"{what}: row {r} keeps tokens {show(y.reshape(rows.shape)[r])}, expected "
         f"{show(expected.reshape(rows.shape)[r])} (kept tokens must hold their own logits).\n"
         f"  probabilities, most probable first: "
         + ", ".join(f"token {j}: {probs[j].item():.3f}" for j in order)
         + f"\n  top_p = {p}\n" + (why or "Keep a token while the total probability of the tokens "
                                   "ranked above it is still below top_p."))


def check_top_p_basic(top_p_filter):
    probs = torch.tensor([0.15, 0.05, 0.5, 0.1, 0.2])  # sorted: 0.5 (2), 0.2 (4), 0.15 (0), ...
    logits = probs.log()
    for p in (0.6, 0.8, 0.9):
        y = _top_p_call(top_p_filter, logits, p, f"top_p_filter(logits, {p}) for probabilities "
                        f"{probs.tolist()}")
        _compare_top_p(y, logits, p, f"top_p_filter(logits, {p})")
    batch = torch.stack([logits, logits.flip(0) * 2.0, torch.zeros(5) + torch.arange(5.0)])
    y = _top_p_call(top_p_filter, batch, 0.7, "top_p_filter on a batch (3, 5)")
    _compare_top_p(y, batch, 0.7, "top_p_filter on a batch (3, 5), top_p=0.7 (each row on its own)")
    passed("top_p_filter: keeps the most probable tokens until their total reaches top_p, the rest "
           "-inf, logits unchanged and in vocabulary order")


def check_top_p_top_token(top_p_filter):
    logits = torch.tensor([[0.0, 4.0, 1.0, -1.0], [2.0, 2.5, -3.0, 0.0]])  # row 0: top ~0.94
    for p in (0.5, 0.9):
        y = _top_p_call(top_p_filter, logits, p, f"top_p_filter(logits, {p})")
        if not torch.isfinite(y[0, 1]):
            fail(f"top_p_filter(logits, {p}) removed the top token (probability "
                 f"{logits[0].softmax(-1)[1].item():.3f} > top_p): nothing would be left to sample. "
                 "The top token is always kept: keep a token while the mass BEFORE it is below "
                 "top_p (cumsum - probs < top_p), not while cumsum <= top_p.")
        _compare_top_p(y, logits, p, f"top_p_filter(logits, {p}) with a top token above top_p")
    passed("top_p_filter: a top token whose probability alone exceeds top_p is kept (and alone)")


def check_top_p_random(top_p_filter, seed=0, cases=(((3, 10), 0.75, 2.0),)):
    for i, (shape, p, scale) in enumerate(cases):
        with seeded(seed + i):
            logits = torch.randn(*shape) * scale
        what = f"top_p_filter for logits {tuple(shape)}, top_p={p}"
        y = _top_p_call(top_p_filter, logits, p, what)
        _compare_top_p(y, logits, p, what)
    passed(f"top_p_filter: matches the nucleus on {len(cases)} random case(s)")
