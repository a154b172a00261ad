"""Checks for notebook 10_efficient_attention: `online_softmax` and `flash_attention`.

Values are compared with `torch.softmax` and `F.scaled_dot_product_attention` (computed in
float64 outside the learner's code). Where a result is wrong, it is compared with what the usual
mistakes produce (a running sum that is not rescaled, the rescale factor inverted, the causal
mask not offset per block, ...) so the message can name the mistake. Two checks look at *how*
the result is computed, through `tfscratch.memtrack.TensorRecorder`, which sees every operation
and every tensor the learner's function creates: the online softmax must take its maxima and
sums one block at a time, and blockwise attention must never create a tensor that holds an
(Lq, Lk) matrix for one (batch, head) slice.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..memtrack import TensorRecorder
from .core import call, check_close, check_shape, check_true, fail, passed, seeded

__all__ = [
    "check_online_softmax_values", "check_online_softmax_blocks", "check_online_softmax_masked",
    "check_online_softmax_against_torch",
    "check_flash_values", "check_flash_causal", "check_flash_memory", "check_flash_gradient",
    "check_flash_against_torch", "full_matrix_tensors",
]

SOFTMAX = ("online_softmax",)


def _match_nan(actual, candidates: dict, atol=1e-5, rtol=1e-4):
    """Like core._match, but a NaN in the result matches a NaN in the candidate (some mistakes
    give NaN in exactly the places where the correct code gives a number)."""
    for hint, cand in candidates.items():
        try:
            if actual.shape == cand.shape and torch.allclose(
                    actual.detach().double(), cand.detach().double(), atol=atol, rtol=rtol,
                    equal_nan=True):
                return hint
        except RuntimeError:
            continue
    return None
FLASH = ("flash_attention",)


# --------------------------------------------------------------------------- online softmax
def _wrong_online(x, bs, bug):
    """What the usual mistakes compute (float64)."""
    x = x.double()
    N = x.size(-1)
    blocks = list(range(0, N, bs))
    if bug == "missing_tail":
        blocks = list(range(0, N - bs + 1, bs)) if N >= bs else []
    if bug == "block_local":
        outs = []
        for s in range(0, N, bs):
            b = x[..., s:s + bs]
            e = (b - b.amax(-1, keepdim=True)).exp()
            outs.append(e / e.sum(-1, keepdim=True))
        return torch.cat(outs, -1)
    lowest = torch.finfo(x.dtype).min
    m = torch.full(x.shape[:-1] + (1,), lowest, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for s in blocks:
        b = x[..., s:s + bs]
        m_new = torch.maximum(m, b.amax(-1, keepdim=True))
        if bug == "no_rescale":
            l = l + (b - m_new).exp().sum(-1, keepdim=True)
        elif bug == "inverted":
            l = l * (m_new - m).exp() + (b - m_new).exp().sum(-1, keepdim=True)
        elif bug == "block_max_only":  # the sum uses each block's own max, never reconciled
            l = l + (b - b.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)
        else:
            l = l * (m - m_new).exp() + (b - m_new).exp().sum(-1, keepdim=True)
        m = m_new
    if bug == "last_block_max":
        last = x[..., blocks[-1]:]
        return (x - last.amax(-1, keepdim=True)).exp() / l
    return (x - m).exp() / l


_SOFTMAX_HINTS = {
    "no_rescale": "the running sum is not rescaled when the max grows. When a block raises the "
                  "max from m_old to m_new, the terms already summed were exp(x - m_old): multiply "
                  "the running sum by exp(m_old - m_new) before adding the new block.",
    "inverted": "the rescale factor is inverted: exp(m_new - m_old) instead of exp(m_old - m_new). "
                "The old terms exp(x - m_old) must SHRINK to exp(x - m_new), so the factor is <= 1.",
    "block_local": "each block is normalised on its own (a softmax per block): the blocks must "
                   "share one running max and one running sum over the whole row.",
    "missing_tail": "the last, shorter block is never visited: when block_size does not divide "
                    "the length, range(0, N, block_size) still reaches the tail; "
                    "N // block_size blocks do not.",
    "block_max_only": "each block's sum uses that block's own max and the sums are added without "
                      "rescaling: bring every term to the common running max with "
                      "exp(m_old - m_new).",
    "last_block_max": "the output subtracts the max of the LAST block, not the running max of "
                      "the whole row: use the final running max m in exp(x - m) / l.",
}


def _softmax_candidates(x, bs):
    return {hint: _wrong_online(x, bs, bug) for bug, hint in _SOFTMAX_HINTS.items()}


def _softmax_call(online_softmax, x, bs):
    out = call(online_softmax, x.clone(), bs, shortcuts=SOFTMAX,
               what=f"online_softmax(x of shape {tuple(x.shape)}, block_size={bs})")
    check_true(isinstance(out, torch.Tensor),
               f"online_softmax returned {type(out).__name__}; return a tensor of x's shape.")
    check_shape(out, x.shape, f"online_softmax(x of shape {tuple(x.shape)}, block_size={bs})",
                "The softmax keeps x's shape: one probability per entry.")
    return out


def _compare_softmax(out, x, bs, what):
    expected = torch.softmax(x.double(), dim=-1)
    if torch.isnan(out).any():
        why = _match_nan(out, _softmax_candidates(x, bs))
        if why:
            fail(f"{what} contains NaN: {why}")
        nan_rows = torch.isnan(out).any(-1)
        masked_rows = x.isneginf().any(-1)
        if bool((nan_rows & masked_rows).any()) and not bool((nan_rows & ~masked_rows).any()):
            fail(f"{what} contains NaN in rows that hold -inf. A block in which every entry is "
                 "-inf has max -inf, and exp(-inf - (-inf)) = exp(nan). Start the running max at "
                 "the lowest finite value (torch.finfo(x.dtype).min) instead of -inf, or guard "
                 "the rescale factor.")
        fail(f"{what} contains NaN in rows without -inf: exp overflowed. Subtract the running "
             "max inside every block, and rescale the old sum by exp(m_old - m_new) (<= 1); the "
             "inverted factor exp(m_new - m_old) overflows to inf, and 0 * inf = NaN.")
    ok = torch.allclose(out.double(), expected, atol=1e-5, rtol=1e-4)
    if not ok:
        why = _match_nan(out, _softmax_candidates(x, bs), atol=1e-5, rtol=1e-4)
        if why:
            fail(f"{what} is not the softmax: {why}")
        sums = out.double().sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            fail(f"{what}: the rows do not sum to 1 (sums range from {sums.min().item():.4g} to "
                 f"{sums.max().item():.4g}). Divide exp(x - m) by the running sum l of the whole "
                 "row, with the FINAL running max m, and rescale l by exp(m_old - m_new) each time "
                 "the max grows.")
        check_close(out, expected.to(out.dtype), what,
                    "Compare with torch.softmax(x, dim=-1): the result must equal it for every "
                    "block size.")


def check_online_softmax_values(online_softmax, seed=0, cases=(((4, 10), 3), ((2, 3, 16), 4)),
                                scale=4.0):
    """Equal to softmax over the last axis for several shapes and block sizes (rows whose max
    sits in a late block, so the running max must grow)."""
    for shape, bs in cases:
        with seeded(seed):
            x = torch.randn(*shape) * scale
            x = x + torch.linspace(0, scale, shape[-1])  # later blocks tend to raise the max
        what = f"online_softmax(x of shape {tuple(shape)}, block_size={bs})"
        _compare_softmax(_softmax_call(online_softmax, x, bs), x, bs, what)
    passed("online_softmax equals softmax over the last axis, "
           + ", ".join(f"{tuple(s)} in blocks of {b}" for s, b in cases))


def check_online_softmax_blocks(online_softmax, seed=1, cases=(((3, 40), 8), ((2, 23), 5),
                                                               ((4, 9), 1), ((2, 6), 16))):
    """Every max, sum or other reduction over the last axis sees at most one block; block sizes
    that do not divide the length, block size 1 and block size >= the length all work."""
    for shape, bs in cases:
        with seeded(seed):
            x = torch.randn(*shape) * 3
        what = f"online_softmax(x of shape {tuple(shape)}, block_size={bs})"
        rec = TensorRecorder()
        with rec:
            out = _softmax_call(online_softmax, x, bs)
        for r in rec.records:
            if r.in_shape and r.in_shape[-1] > bs and (len(r.in_shape) - 1) in (r.dims or ()):
                fail(f"{what}: `{r.op}` reduced {r.in_shape[-1]} entries of the last axis at once "
                     f"(input of shape {r.in_shape}). The online softmax visits the row in blocks "
                     f"of at most {bs}: take each block's max and sum, and fold them into a "
                     "running max and a running sum (a max over the whole row first is the "
                     "two-pass softmax, not the online one).")
        _compare_softmax(out, x, bs, what)
    passed("online_softmax takes every max and sum one block at a time, for block sizes that "
           "divide the length, that do not, 1, and larger than the row")


def check_online_softmax_masked(online_softmax, seed=2):
    """-inf entries (a whole leading block of them included) give 0 and no NaN; huge scores do
    not overflow."""
    with seeded(seed):
        x = torch.randn(4, 24) * 5
    x[0, :8] = float("-inf")  # the whole first block is masked
    x[1, ::3] = float("-inf")
    x[2, 8:] = float("-inf")  # only the first block is finite
    x[3] = x[3] * 100 + 500  # would overflow exp without the max
    what = "online_softmax(x with -inf entries and scores near 1000, block_size=8)"
    out = _softmax_call(online_softmax, x, 8)
    _compare_softmax(out, x, 8, what)
    check_true(bool((out[x.isneginf()] == 0).all()),
               f"{what}: entries that are -inf must get probability exactly 0.")
    passed("online_softmax: -inf entries get 0 (a fully masked first block included), "
           "large scores do not overflow, no NaN")


def check_online_softmax_against_torch(online_softmax, seed=0, cases=(((5, 12), 5),),
                                       scale=3.0, dtypes=(torch.float32, torch.float64)):
    """Random inputs of several shapes, block sizes and dtypes, against torch.softmax."""
    for dtype in dtypes:
        for shape, bs in cases:
            with seeded(seed):
                x = (torch.randn(*shape) * scale).to(dtype)
            what = f"online_softmax(x of shape {tuple(shape)}, {dtype}, block_size={bs})"
            out = _softmax_call(online_softmax, x, bs)
            check_true(out.dtype == dtype, f"{what} returned {out.dtype}; keep the input's dtype.")
            _compare_softmax(out, x, bs, what)
    passed(f"online_softmax matches torch.softmax on {len(cases) * len(dtypes)} random cases "
           "(float32 and float64)")


# --------------------------------------------------------------------------- flash attention
def _ref_attention(q, k, v, causal):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


def _wrong_flash(q, k, v, bs, causal, bug):
    """Blockwise attention with one usual mistake (float64)."""
    q, k, v = q.double(), k.double(), v.double()
    Lq, Lk = q.size(-2), k.size(-2)
    scale = {"scale_dv": 1 / math.sqrt(v.size(-1)), "no_scale": 1.0,
             "scale_d": 1 / q.size(-1)}.get(bug, 1 / math.sqrt(q.size(-1)))
    m = torch.full(q.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype)
    l = torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype)
    acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
    qp = torch.arange(Lq)[:, None]
    for s in range(0, Lk, bs):
        kb, vb = k[..., s:s + bs, :], v[..., s:s + bs, :]
        sc = q @ kb.transpose(-2, -1) * scale
        if causal and bug != "ignores_causal":
            kp = torch.arange(kb.size(-2))[None, :] + (0 if bug == "local_causal" else s)
            blocked = {"strict_causal": kp >= qp, "inverted_causal": kp < qp}.get(bug, kp > qp)
            sc = sc.masked_fill(blocked, float("-inf"))
        m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
        p = (sc - m_new).exp()
        alpha = (m_new - m).exp() if bug == "inverted" else (m - m_new).exp()
        l = (l if bug == "no_l_rescale" else l * alpha) + p.sum(-1, keepdim=True)
        acc = (acc if bug == "no_acc_rescale" else acc * alpha) + p @ vb
        m = m_new
    if bug == "no_division":
        return acc
    return acc / l


_FLASH_HINTS = {
    "scale_dv": "the scores are divided by sqrt(d_v), the size of the values; the scale is "
                "1/sqrt(d_k) with d_k = q.size(-1), the size of queries and keys.",
    "no_scale": "the scores are not divided by sqrt(d_k).",
    "scale_d": "the scores are divided by d_k, not sqrt(d_k).",
    "no_acc_rescale": "the output accumulator is not rescaled when the running max grows: "
                      "acc = acc * exp(m_old - m_new) + p @ v_block (the running sum gets the same "
                      "factor).",
    "no_l_rescale": "the running sum is not rescaled when the max grows: "
                    "l = l * exp(m_old - m_new) + p.sum(-1) (the same factor as the accumulator).",
    "inverted": "the rescale factor is inverted: exp(m_new - m_old) instead of exp(m_old - m_new).",
    "no_division": "the accumulator is never divided by the running sum l at the end.",
    "local_causal": "the causal mask compares query positions with key positions counted inside "
                    "the block (0..b-1): offset the key positions by the block's start.",
    "strict_causal": "the causal mask hides the diagonal too: query i may attend to key i "
                     "(mask key j only when j > i).",
    "inverted_causal": "the causal mask is inverted: it hides the past and keeps the future "
                       "(mask key j when j > i).",
    "ignores_causal": "causal=True is ignored: every query sees every key.",
}


def _flash_candidates(q, k, v, bs, causal):
    return {hint: _wrong_flash(q, k, v, bs, causal, bug) for bug, hint in _FLASH_HINTS.items()
            if causal or bug not in ("local_causal", "strict_causal", "inverted_causal",
                                     "ignores_causal")}


def _inputs(seed, batch, Lq, Lk, d, dv, scale=1.0, dtype=torch.float32):
    with seeded(seed):
        q = torch.randn(*batch, Lq, d) * scale
        k = torch.randn(*batch, Lk, d) * scale
        v = torch.randn(*batch, Lk, dv)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _describe_case(batch, Lq, Lk, d, dv, bs, causal):
    return (f"flash_attention(q {tuple(batch) + (Lq, d)}, k {tuple(batch) + (Lk, d)}, "
            f"v {tuple(batch) + (Lk, dv)}, block_size={bs}, causal={causal})")


def _flash_call(flash_attention, q, k, v, bs, causal, what):
    out = call(flash_attention, q.clone(), k.clone(), v.clone(), block_size=bs, causal=causal,
               shortcuts=FLASH, what=what)
    check_true(isinstance(out, torch.Tensor),
               f"{what} returned {type(out).__name__}; return the output tensor only.")
    check_shape(out, q.shape[:-1] + (v.size(-1),), what,
                "The output has one row per query and the values' size: (..., Lq, d_v).")
    return out


def _compare_flash(out, q, k, v, bs, causal, what, atol=1e-5, rtol=1e-4):
    expected = _ref_attention(q, k, v, causal)
    if torch.isnan(out).any():
        why = _match_nan(out, _flash_candidates(q, k, v, bs, causal), atol=atol, rtol=rtol)
        fail(f"{what} contains NaN. "
             + (why or ("Usual causes: an inverted rescale factor exp(m_new - m_old), which "
                        "overflows to inf (and 0 * inf = NaN); or a running max started at -inf "
                        "while a row's block is fully masked (exp(-inf - (-inf)) = NaN): start "
                        "it at torch.finfo(q.dtype).min.")))
    if not torch.allclose(out.double(), expected, atol=atol, rtol=rtol):
        why = _match_nan(out, _flash_candidates(q, k, v, bs, causal), atol=atol, rtol=rtol)
        if why:
            fail(f"{what} does not match F.scaled_dot_product_attention: {why}")
        check_close(out, expected.to(out.dtype), what,
                    "Compare with F.scaled_dot_product_attention(q, k, v, is_causal=causal) "
                    "and check the running max, sum and accumulator updates.", atol=atol,
                    rtol=rtol)


def check_flash_values(flash_attention, seed=0, cases=(((2,), 24, 24, 8, 8, 8),
                                                      ((2, 3), 10, 21, 8, 5, 4))):
    """Non-causal attention equal to F.scaled_dot_product_attention, Lq != Lk and d_v != d_k,
    block sizes that do and do not divide Lk. cases: (batch, Lq, Lk, d, d_v, block_size)."""
    for i, (batch, Lq, Lk, d, dv, bs) in enumerate(cases):
        q, k, v = _inputs(seed + i, batch, Lq, Lk, d, dv, scale=1.5)
        what = _describe_case(batch, Lq, Lk, d, dv, bs, False)
        _compare_flash(_flash_call(flash_attention, q, k, v, bs, False, what), q, k, v, bs,
                       False, what)
    passed("flash_attention equals F.scaled_dot_product_attention (not causal; Lq != Lk, "
           "d_v != d_k, block sizes that do and do not divide Lk)")


def check_flash_causal(flash_attention, seed=3, cases=(((2,), 20, 20, 8, 8, 8),
                                                      ((1, 2), 13, 13, 4, 6, 5),
                                                      ((3,), 7, 7, 4, 4, 1))):
    """causal=True equal to F.scaled_dot_product_attention(..., is_causal=True)."""
    for i, (batch, Lq, Lk, d, dv, bs) in enumerate(cases):
        q, k, v = _inputs(seed + i, batch, Lq, Lk, d, dv, scale=1.5)
        what = _describe_case(batch, Lq, Lk, d, dv, bs, True)
        _compare_flash(_flash_call(flash_attention, q, k, v, bs, True, what), q, k, v, bs,
                       True, what)
    passed("flash_attention with causal=True equals F.scaled_dot_product_attention(is_causal=True),"
           " block sizes 8, 5 and 1")


def full_matrix_tensors(records, batch, Lq, Lk):
    """The records whose output holds >= Lq * Lk elements for one (batch, head) slice: the batch
    axes (as they are, or flattened into one) are left out of the count."""
    n_batch = math.prod(batch)
    bad = []
    for r in records:
        for shape in r.out_shapes:
            rest = shape
            if len(batch) and len(shape) > len(batch) and tuple(shape[:len(batch)]) == tuple(batch):
                rest = shape[len(batch):]
            elif len(batch) and len(shape) > 1 and shape[0] == n_batch:
                rest = shape[1:]
            if math.prod(rest) >= Lq * Lk:
                bad.append((r.op, shape))
    return bad


def _full_matrix_msg(what, bad, Lq, Lk):
    op, shape = bad[0]
    return (f"{what} created a tensor of shape {shape} with `{op}`: it holds Lq x Lk = "
            f"{Lq} x {Lk} elements for one (batch, head) slice, the full score or mask matrix. "
            "Blockwise attention keeps only an (Lq, block_size) block of scores at a time, and "
            "builds the causal mask for that block only, from the query positions and the "
            "block's key positions (a full tril mask counts). "
            f"({len(bad)} such tensor(s) in all.)")


def check_flash_memory(flash_attention, seed=5, cases=(((2, 3), 48, 48, 8, 8, 16, False),
                                                       ((2, 3), 48, 48, 8, 8, 16, True),
                                                       ((2,), 20, 36, 4, 4, 8, False))):
    """No tensor created by flash_attention holds an (Lq, Lk) score or mask matrix for one
    (batch, head) slice (block_size < Lk); the result is still right.
    cases: (batch, Lq, Lk, d, d_v, block_size, causal)."""
    for i, (batch, Lq, Lk, d, dv, bs, causal) in enumerate(cases):
        q, k, v = _inputs(seed + i, batch, Lq, Lk, d, dv)
        what = _describe_case(batch, Lq, Lk, d, dv, bs, causal)
        rec = TensorRecorder()
        with rec:
            out = _flash_call(flash_attention, q, k, v, bs, causal, what)
        bad = full_matrix_tensors(rec.records, batch, Lq, Lk)
        if bad:
            fail(_full_matrix_msg(what, bad, Lq, Lk))
        _compare_flash(out, q, k, v, bs, causal, what)
    passed("flash_attention never creates an (Lq, Lk) score or mask matrix (every tensor it "
           "made was inspected), causal and not")


def check_flash_gradient(flash_attention, seed=7, batch=(2,), L=12, d=4, bs=5):
    """Gradients through the blockwise loop equal those of the reference attention."""
    q, k, v = _inputs(seed, batch, L, L, d, d)
    g = torch.randn(*batch, L, d, generator=torch.Generator().manual_seed(seed))
    grads = []
    for which in ("yours", "ref"):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        if which == "yours":
            out = _flash_call(flash_attention, qq, kk, vv, bs, True,
                              _describe_case(batch, L, L, d, d, bs, True))
            check_true(out.requires_grad, "flash_attention's output does not require grad: "
                       "keep the computation differentiable (no .detach(), torch.no_grad() or "
                       ".item() inside).")
        else:
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        (out * g).sum().backward()
        grads.append((qq.grad, kk.grad, vv.grad))
    for name, a, e in zip(("q", "k", "v"), grads[0], grads[1]):
        check_true(a is not None, f"no gradient reached {name}.")
        check_close(a, e, f"the gradient of flash_attention with respect to {name}",
                    "The forward value is right but not its gradient: avoid in-place writes "
                    "into tensors that autograd needs.", atol=1e-4, rtol=1e-3)
    passed("flash_attention's gradients with respect to q, k and v equal the reference's")


def check_flash_against_torch(flash_attention, seed=0,
                              cases=(((1, 2), 16, 16, 8, 8, 4, True),), scale=1.0,
                              dtype=torch.float32):
    """Random cases against F.scaled_dot_product_attention, with the no-(Lq, Lk)-tensor rule
    applied whenever block_size < Lk. cases: (batch, Lq, Lk, d, d_v, block_size, causal)."""
    for i, (batch, Lq, Lk, d, dv, bs, causal) in enumerate(cases):
        q, k, v = _inputs(seed + i, batch, Lq, Lk, d, dv, scale=scale, dtype=dtype)
        what = _describe_case(batch, Lq, Lk, d, dv, bs, causal)
        rec = TensorRecorder()
        with rec:
            out = _flash_call(flash_attention, q, k, v, bs, causal, what)
        check_true(out.dtype == dtype, f"{what} returned {out.dtype}; keep the input's dtype.")
        _compare_flash(out, q, k, v, bs, causal, what)
        bad = full_matrix_tensors(rec.records, batch, Lq, Lk) if bs < Lk else []
        if bad:
            fail(_full_matrix_msg(what, bad, Lq, Lk))
    passed(f"flash_attention matches F.scaled_dot_product_attention on {len(cases)} random "
           "case(s)")
