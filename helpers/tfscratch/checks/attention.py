"""Checks for notebook 01_attention: `softmax` and `scaled_dot_product_attention`."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..reference import softmax as ref_softmax
from .core import CheckFailed, _match, _unpack, call, check_close, check_shape, check_true, fail, passed, seeded

SM = ("softmax",)  # shortcut group guarded in the softmax exercise
ATT = ("attention",)  # ... and in the attention exercise (torch.softmax is allowed there)


# --------------------------------------------------------------------------- softmax
def check_softmax_rows(softmax):
    """Rows sum to 1 along the last axis, values in [0, 1], and match exp(x)/sum exp(x)."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    y = call(softmax, x, shortcuts=SM, what="softmax(x)")
    check_shape(y, x.shape, "softmax(x) for x of shape (3, 4)",
                "Softmax keeps the shape of its input: do not sum or squeeze an axis away.")
    expected = ref_softmax(x, dim=-1)
    wrong = _match(y, {
        "you normalised over dim=0 (down the columns); the default is dim=-1, the last axis.":
            ref_softmax(x, dim=0),
        "you returned exp(x) without dividing by the sum.": x.exp(),
        "you divided x by its sum instead of exponentiating first.": x / x.sum(-1, keepdim=True),
        "you normalised with the sum over the whole tensor, not along dim.": x.exp() / x.exp().sum(),
        "you divided by the sum over the whole tensor, e.sum(), not along dim "
        "(e.sum(dim=dim, keepdim=True)).":
            (x - x.amax(-1, keepdim=True)).exp() / (x - x.amax(-1, keepdim=True)).exp().sum(),
        "you divided by the sum over the whole tensor, e.sum(), not along dim, after "
        "subtracting one max for the whole tensor.": (x - x.max()).exp() / (x - x.max()).exp().sum(),
    })
    if wrong:
        fail("softmax(x) is not the softmax along the last axis: " + wrong)
    sums = y.sum(dim=-1)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-5) and abs(float(y.sum()) - 1) < 1e-4:
        fail("softmax(x) is not the softmax along the last axis: the whole tensor sums to 1, "
             f"each row does not (row sums {[round(s, 4) for s in sums.tolist()]}): you divided "
             "by the sum over the whole tensor. Sum along dim with keepdim=True.")
    check_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-5),
               f"rows of softmax(x) do not sum to 1 along the last axis: row sums are "
               f"{[round(s, 4) for s in sums.tolist()]}. Divide exp(x) by its sum along dim.")
    check_true(bool((y >= 0).all()), "softmax(x) has negative values; every weight must be >= 0.")
    check_close(y, expected, "softmax(x)", "softmax(x)_i = exp(x_i) / sum_j exp(x_j) along dim.")
    passed("softmax: rows sum to 1 along the last axis and match exp(x) / sum(exp(x))")


def check_softmax_dim(softmax):
    """The dim argument is honoured on a 3-D input, for every axis."""
    with seeded(1):
        x = torch.randn(2, 3, 4)
    for dim in (0, 1, 2, -1, -2):
        y = call(softmax, x, dim=dim, shortcuts=SM, what=f"softmax(x, dim={dim})")
        check_shape(y, x.shape, f"softmax(x, dim={dim}) for x of shape (2, 3, 4)")
        if not torch.allclose(y, ref_softmax(x, dim=dim), atol=1e-5, rtol=1e-4):
            if torch.allclose(y, ref_softmax(x, dim=-1), atol=1e-5):
                fail(f"softmax(x, dim={dim}) normalised over the last axis: the dim argument is "
                     "ignored. Use dim in the max, the exp and the sum.")
            if torch.allclose(y, x.exp() / x.exp().sum(dim=dim, keepdim=True).max(), atol=1e-5):
                fail(f"softmax(x, dim={dim}) is wrong: keep the reduced axis (keepdim=True).")
            check_close(y, ref_softmax(x, dim=dim), f"softmax(x, dim={dim})",
                        "Reduce along `dim` with keepdim=True so the result broadcasts back "
                        "against x.")
    passed("softmax: the dim argument works on a 3-D tensor for every axis")


def check_softmax_stable(softmax):
    """Large and very negative logits: no overflow, no NaN, and the per-row max is used."""
    x = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0],
                      [0.0, 1.0, 2.0]])
    y = call(softmax, x, shortcuts=SM, what="softmax(x) with logits near +-1000")
    check_shape(y, x.shape, "softmax(x)")
    if not torch.isfinite(y).all() and torch.isfinite(y[0]).all():
        fail("softmax(x) is NaN for the row near -1000 but fine for the row near +1000: you "
             "subtracted one max for the whole tensor, so the other rows underflow to 0/0. "
             "Subtract each row's own max (amax along dim, keepdim=True).\n"
             f"  your output: {y.tolist()}")
    if not torch.isfinite(y).all():
        fail("softmax(x) gives NaN/inf for logits near 1000: exp(1000) overflows to inf in "
             "float32 (and exp(-1000) underflows to 0, giving 0/0). Subtract each row's max "
             "before exp: softmax(x) = softmax(x - max(x)), mathematically the same.\n"
             f"  your output: {y.tolist()}")
    check_close(y, ref_softmax(x), "softmax(x) with logits near +-1000",
                "Subtract the max along `dim` (keepdim=True), one max per row, not one for "
                "the whole tensor.")
    # a square input: max(dim=-1) without keepdim broadcasts against the wrong axis
    sq = torch.tensor([[0.0, 1.0, 2.0], [5.0, 1.0, 0.0], [-3.0, 9.0, 4.0]])
    y = call(softmax, sq, shortcuts=SM, what="softmax(x) for a square x")
    check_close(y, ref_softmax(sq), "softmax(x) for a square (3, 3) x",
                "Rows must still sum to 1: take the max with keepdim=True; without it the "
                "(3,) max broadcasts along the wrong axis (each column gets another row's max).")
    g = torch.tensor([[0.0, 1.0, 2.0], [-200.0, -201.0, -202.0]])
    y = call(softmax, g, shortcuts=SM, what="softmax(x) with rows far apart")
    if not torch.isfinite(y).all() or not torch.allclose(y, ref_softmax(g), atol=1e-5):
        fail("softmax(x) fails when rows have very different scales (row 2 is near -200): "
             "you subtracted one max for the whole tensor, so exp underflows to 0 in row 2. "
             "Subtract each row's own max (amax along dim, keepdim=True).\n"
             f"  your output: {y.tolist()}")
    passed("softmax: stable for logits near +-1000 (each row's max is subtracted)")


def check_softmax_gradient(softmax):
    """Gradients flow through softmax and match the reference."""
    with seeded(3):
        x = torch.randn(4, 6, dtype=torch.float32)
        w = torch.randn(4, 6)
    xa = x.clone().requires_grad_(True)
    y = call(softmax, xa, shortcuts=SM, what="softmax(x)")
    check_true(y.requires_grad, "softmax(x) is cut off from the autograd graph (no gradient "
               "flows back to x): do not use .detach(), .item(), numpy or torch.tensor(...) "
               "on intermediate results.")
    (y * w).sum().backward()
    xb = x.clone().requires_grad_(True)
    (ref_softmax(xb) * w).sum().backward()
    forward_ok = isinstance(y, torch.Tensor) and y.shape == x.shape and torch.allclose(
        y.detach(), ref_softmax(x), atol=1e-5, rtol=1e-4)
    check_close(xa.grad, xb.grad, "the gradient of softmax with respect to x",
                "The forward values are right but the gradient is not: detach()ing the max "
                "is fine, detaching the exponentials or the sum is not." if forward_ok else
                "The forward values are wrong too (see the other softmax tests): fix those "
                "first; the gradient follows from the forward.")
    passed("softmax: gradients flow back to x and match")


def check_softmax_against_torch(softmax, seed=0, shapes=((5, 7),), dims=(-1,), scale=10.0):
    """Random inputs of the given shapes, compared with torch.softmax (computed outside the guard)."""
    with seeded(seed):
        xs = [torch.randn(*s) * scale for s in shapes]
    for x in xs:
        for dim in dims:
            if not -x.dim() <= dim < x.dim():
                continue
            expected = torch.softmax(x, dim=dim)
            y = call(softmax, x, dim=dim, shortcuts=SM, what=f"softmax(x, dim={dim})")
            check_close(y, expected, f"softmax(x, dim={dim}) for x of shape {tuple(x.shape)}",
                        "Compared with torch.softmax on random inputs; check the axis and "
                        "keepdim=True in every reduction.")
    passed(f"softmax: matches torch.softmax on {len(xs)} random shapes")


# --------------------------------------------------------------------------- attention
def _qkv(seed, batch, Lq, Lk, dk, dv, scale=1.0):
    with seeded(seed):
        q = torch.randn(*batch, Lq, dk) * scale
        k = torch.randn(*batch, Lk, dk) * scale
        v = torch.randn(*batch, Lk, dv)
    return q, k, v


def check_attention_shapes(sdpa):
    """Lq != Lk and d_v != d_k: output (B, Lq, d_v), weights (B, Lq, Lk)."""
    q, k, v = _qkv(0, (2,), 3, 5, 4, 6)
    out, w = _unpack(call(sdpa, q, k, v, shortcuts=ATT, what="scaled_dot_product_attention(q, k, v)"),
                     "scaled_dot_product_attention")
    if isinstance(w, torch.Tensor) and tuple(w.shape) == (2, 5, 3):
        fail("weights have shape (2, 5, 3) = (B, Lk, Lq): they are transposed. Scores are "
             "q @ k^T, one row per query, one column per key: (B, Lq, Lk) = (2, 3, 5).")
    if isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor) and tuple(out.shape) == (2, 3, 5) \
            and tuple(w.shape) == (2, 3, 6):
        fail("output and weights are swapped: return (output, weights), in that order.")
    if isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor) \
            and tuple(w.shape) == (2, 3, 5) and tuple(out.shape) == (2, 3, 4):
        fail("the output has shape (2, 3, 4): its last axis is d_k = 4, the key size, not "
             "d_v = 6: it averages the keys instead of the values. The output is weights @ v.")
    check_shape(w, (2, 3, 5), "weights for q (2, 3, 4), k (2, 5, 4), v (2, 5, 6)",
                "Weights are (B, Lq, Lk): one row per query, one column per key.")
    check_shape(out, (2, 3, 6), "output for q (2, 3, 4), k (2, 5, 4), v (2, 5, 6)",
                "The output is weights @ v: (B, Lq, Lk) @ (B, Lk, d_v) -> (B, Lq, d_v).")
    passed("attention: output (B, Lq, d_v) and weights (B, Lq, Lk) with Lq != Lk, d_v != d_k")


def check_attention_weights(sdpa):
    """Weights are softmax(q k^T / sqrt(d_k)) over the key axis."""
    q, k, v = _qkv(1, (2,), 4, 6, 16, 8)
    out, w = _unpack(call(sdpa, q, k, v, shortcuts=ATT, what="scaled_dot_product_attention"),
                     "scaled_dot_product_attention")
    check_shape(w, (2, 4, 6), "weights")
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(16), dim=-1)
    if not torch.allclose(w, expected, atol=1e-5, rtol=1e-4):
        s = q @ k.transpose(-2, -1)
        why = _match(w, {
            "you forgot to divide the scores by sqrt(d_k).": torch.softmax(s, -1),
            "you divided by d_k; the scale is sqrt(d_k).": torch.softmax(s / 16, -1),
            "you multiplied by sqrt(d_k) instead of dividing.": torch.softmax(s * 4, -1),
            "you scaled by sqrt(d_v), the value size; the scale uses d_k, the query/key size.":
                torch.softmax(s / math.sqrt(8), -1),
            "softmax ran over the query axis (dim=-2); it must run over the keys, dim=-1.":
                torch.softmax(s / 4, -2),
            "you returned the raw scores q k^T / sqrt(d_k); softmax them into weights.": s / 4,
        })
        if why:
            fail("the attention weights are wrong: " + why)
        sums = w.sum(-1)
        check_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-4),
                   "rows of the weights do not sum to 1 along the key axis: softmax over dim=-1. "
                   f"Row sums: {sums.flatten()[:4].tolist()} ...")
        check_close(w, expected, "weights", "weights = softmax(q @ k^T / sqrt(d_k), dim=-1).")
    passed("attention: weights = softmax(q k^T / sqrt(d_k)) along the keys; rows sum to 1")


def check_attention_output(sdpa):
    """The output is the weighted average of the values, and gradients flow to q, k, v."""
    q, k, v = _qkv(2, (3,), 5, 5, 8, 8)
    qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, w = _unpack(call(sdpa, qa, ka, va, shortcuts=ATT, what="scaled_dot_product_attention"),
                     "scaled_dot_product_attention")
    ref_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1)
    expected = ref_w @ v
    check_shape(out, expected.shape, "output")
    why = _match(out, {
        "the output uses the keys instead of the values: it must be weights @ v.": ref_w @ k,
        "the output is weights^T @ v: multiply the (Lq, Lk) weights by v without transposing.":
            ref_w.transpose(-2, -1) @ v,
        "you returned the plain sum of the values: weight them, weights @ v.":
            v.sum(-2, keepdim=True).expand_as(v),
    })
    if why:
        fail("the attention output is wrong: " + why)
    check_close(out, expected, "output", "output = softmax(q k^T / sqrt(d_k)) @ v.")
    check_true(out.requires_grad, "the output is cut off from autograd (no .detach(), .item(), "
               "numpy or torch.tensor(...) in the middle).")
    g = torch.randn_like(expected, generator=torch.Generator().manual_seed(5))
    (out * g).sum().backward()
    qb, kb, vb = (t.clone().requires_grad_(True) for t in (q, k, v))
    ((torch.softmax(qb @ kb.transpose(-2, -1) / math.sqrt(8), -1) @ vb) * g).sum().backward()
    for name, a, b in (("q", qa, qb), ("k", ka, kb), ("v", va, vb)):
        check_true(a.grad is not None, f"no gradient reaches {name}.")
        check_close(a.grad, b.grad, f"the gradient with respect to {name}")
    passed("attention: output = weights @ v, and gradients reach q, k and v")


def _rank_hint(e, rank):
    """Why a call on `rank`-D inputs crashed, from the original exception."""
    cause, text = e.__cause__, str(e.__cause__ or e)
    if isinstance(cause, AssertionError):
        return (f"Your own assert rejected {rank}-D inputs (e.g. assert q.dim() == 3): the "
                "function must accept any number of leading axes, (..., L, d). Drop the rank "
                "assert; the operations below it work for every rank.")
    if "bmm" in text or "3D tensor" in text or "3-D" in text or "3-dimensional" in text:
        return (f"torch.bmm only takes 3-D tensors, so {rank}-D inputs fail: use the @ operator "
                "(torch.matmul), which broadcasts over any leading axes, with "
                "k.transpose(-2, -1).")
    return (f"With {rank}-D inputs the key transpose must swap the LAST two axes: "
            "k.transpose(-2, -1). k.T or k.transpose(1, 2) only work for one rank.")


def check_attention_batch_axes(sdpa):
    """Any number of leading axes: (L, d), (B, L, d) and (B, H, L, d)."""
    for batch in ((), (2,), (2, 3)):
        q, k, v = _qkv(4, batch, 3, 4, 5, 2)
        try:
            res = call(sdpa, q, k, v, shortcuts=ATT, what=f"attention on {len(batch) + 2}-D inputs")
        except CheckFailed as e:
            fail(f"{e}\n" + _rank_hint(e, len(batch) + 2))
        out, w = _unpack(res, "scaled_dot_product_attention")
        ref_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(5), -1)
        check_shape(w, ref_w.shape, f"weights for {len(batch) + 2}-D inputs",
                    "Use k.transpose(-2, -1) (the last two axes) so any leading axes work.")
        check_close(w, ref_w, f"weights for {len(batch) + 2}-D inputs",
                    "Transpose only the last two axes of k: k.transpose(-2, -1).")
        check_close(out, ref_w @ v, f"output for {len(batch) + 2}-D inputs")
    passed("attention: works with 0, 1 and 2 leading batch axes")


def check_attention_against_torch(sdpa, seed=0, cases=(((2,), 5, 7, 8, 3),), scale=1.0):
    """Random cases (batch, Lq, Lk, d_k, d_v) compared with F.scaled_dot_product_attention."""
    for i, (batch, Lq, Lk, dk, dv) in enumerate(cases):
        q, k, v = _qkv(seed + i, batch, Lq, Lk, dk, dv, scale)
        expected = F.scaled_dot_product_attention(q, k, v)
        ref_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dk), -1)
        out, w = _unpack(call(sdpa, q, k, v, shortcuts=ATT, what="scaled_dot_product_attention"),
                         "scaled_dot_product_attention")
        shape = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        check_close(w, ref_w, f"weights for {shape}", "weights = softmax(q k^T / sqrt(d_k)).")
        check_close(out, expected, f"output for {shape}",
                    "Compared with F.scaled_dot_product_attention.")
    passed(f"attention: matches F.scaled_dot_product_attention on {len(cases)} random cases")
