"""01_attention: what the checks run on the student's `softmax` and
`scaled_dot_product_attention`: the probes (inputs drawn from the run's seed) and the
diagnoses that name a mistake when a probe fails."""

ASSIGNMENT = "01_attention"
import math

import numpy as np
import torch

from .engine import Exercise, Probe, batch, call, given, grades, like, part, randn, shapes, when


def _rows_apart(g):
    x = torch.randn(4, 7, generator=g) * 3
    x[1] -= 300.0          # a row far below the others: one global max underflows it
    x[2] += 900.0          # a row near +1000: exp overflows without a max
    return x


def _sm(x, dim=-1):
    return torch.softmax(x.double(), dim).float()


def _whole_tensor_sums(e):
    """Each output sums to 1 as a whole, but its rows do not."""
    outs = [g for g, _ in e.outs()]
    return outs and all(abs(g.sum() - 1) < 1e-3 and not np.allclose(g.sum(-1), 1, atol=1e-3)
                        for g in outs)


SOFTMAX_DIAGNOSES = [
    like("exp(x) overflows to inf for large logits (exp(89) is already inf in float32), giving "
         "NaN: subtract each row's max before exp; softmax(x) = softmax(x - max(x)).",
         lambda x, dim=-1: x.exp() / x.exp().sum(dim, keepdim=True)),
    like("you subtracted one max for the whole tensor: rows far below it underflow to 0/0. "
         "Subtract each row's own max (amax along dim, keepdim=True).",
         lambda x, dim=-1: (x - x.max()).exp() / (x - x.max()).exp().sum(dim, keepdim=True)),
    like("you took the max along dim without keepdim=True: the reduced max broadcasts against "
         "the wrong axis (each row gets another row's max).",
         lambda x, dim=-1: (x - x.max(dim).values).exp() / (x - x.max(dim).values).exp().sum(dim, keepdim=True)),
    like("you normalised over dim=0 (down the columns): the dim argument is ignored; the "
         "default is dim=-1, the last axis.", lambda x, dim=-1: _sm(x, 0) if dim % x.dim() != 0 else None),
    like("the dim argument is ignored: your softmax always runs along the last axis. Use dim "
         "in the max, the exp and the sum.",
         lambda x, dim=-1: _sm(x, -1) if dim % x.dim() != x.dim() - 1 else None),
    like("you returned exp(x) without dividing by the sum.", lambda x, dim=-1: x.exp()),
    like("you divided x by its sum instead of exponentiating first: softmax is exp(x) / sum exp(x).",
         lambda x, dim=-1: x / x.sum(dim, keepdim=True)),
    when("you divided by the sum over the whole tensor, e.sum(), not along dim: the whole "
         "tensor sums to 1, each row does not. Sum along dim with keepdim=True.", _whole_tensor_sums),
    when("softmax(x) has negative values; every weight must be >= 0 (exp(x) / sum exp(x)).",
         lambda e: any((g < 0).any() for g, _ in e.outs())),
]


def _w(q, k, scale):
    return _sm(q @ k.transpose(-2, -1) * scale)


def _not_a_pair(e):
    kind = e.meta("0.out")          # None: the call raised before returning
    return kind is not None and not kind.startswith(("tuple[2]", "list[2]"))


ATTENTION_DIAGNOSES = [
    when("scaled_dot_product_attention must return a tuple (output, weights): return both the "
         "output and the attention weights.", _not_a_pair),
    like("you forgot to divide the scores by sqrt(d_k).", lambda q, k, v: _w(q, k, 1.0), out="1"),
    like("you divided by d_k; the scale is sqrt(d_k).",
         lambda q, k, v: _w(q, k, 1 / q.size(-1)), out="1"),
    like("you multiplied the scores by sqrt(d_k) instead of dividing.",
         lambda q, k, v: _w(q, k, math.sqrt(q.size(-1))), out="1"),
    like("you scaled by sqrt(d_v), the value size; the scale uses d_k, the query/key size.",
         lambda q, k, v: _w(q, k, 1 / math.sqrt(v.size(-1))), out="1"),
    like("softmax ran over the query axis (dim=-2); it must run over the keys, dim=-1.",
         lambda q, k, v: _sm(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -2), out="1"),
    like("the weights are transposed, (Lk, Lq): you computed k q^T. Scores are q @ k^T, one row "
         "per query, one column per key: (..., Lq, Lk).",
         lambda q, k, v: _w(k, q, 1 / math.sqrt(q.size(-1))), out="1"),
    like("you returned the raw scores q k^T / sqrt(d_k) as the weights: softmax them, so each "
         "row sums to 1.", lambda q, k, v: q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), out="1"),
    like("the output averages the keys instead of the values: the output is weights @ v.",
         lambda q, k, v: _w(q, k, 1 / math.sqrt(q.size(-1))) @ k, out="0"),
    when("torch.bmm only takes 3-D tensors, so inputs with no batch axis or two batch axes fail: "
         "use the @ operator (torch.matmul), which broadcasts over any leading axes, with "
         "k.transpose(-2, -1).", lambda e: "bmm" in e.error or "3D tensor" in e.error),
    when("your own assert rejected inputs of another rank (e.g. assert q.dim() == 3): the "
         "function must accept any number of leading axes, (..., L, d). Drop the assert.",
         lambda e: e.error.startswith("AssertionError")),
    when("transpose the last two axes of k: k.transpose(-2, -1). k.T or k.transpose(1, 2) only "
         "work for one rank.", lambda e: "out of range" in e.error or "must match the size" in e.error,
         probes=("batch axes",)),
]


_QKV4 = (randn(2, 3, 5, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 2))   # two batch axes

EXERCISES = [
    Exercise("softmax", ref="attention.softmax", shortcuts=("softmax",),
             graded=grades(rows=1, dim=1, stable=2, gradient=1, random=(2, 9173)),
             diagnose=SOFTMAX_DIAGNOSES, probes=[
        Probe("rows", ("rows", "random"),
              [call(randn(5, 5, scale=3.0)), call(randn(6, 9, scale=3.0))],
              what="softmax along the last axis of random (5, 5) and (6, 9) inputs"),
        Probe("random", ("random",),
              [call(randn(7, 13, scale=60.0)), call(randn(3, 5, 11, scale=60.0), dim=0),
               call(randn(17, scale=60.0))],
              what="random logits x60 of other shapes and axes"),
        Probe("dim", ("dim", "random"),
              [call(randn(3, 4, 5), dim=d) for d in (0, 1, -2)] + [call(randn(2, 3, 6, 4), dim=1)],
              what="softmax along dim=0, 1, -2 of 3-D and 4-D inputs"),
        Probe("stable", ("stable",),
              [call(given(_rows_apart, "rows near -300 and +900")),
               call(randn(6, 3, scale=500.0), dim=0)],
              what="logits far apart (rows near -300 and +900, columns x500)"),
        Probe("gradient", ("gradient",),
              [call(randn(5, 8), grad=(0,), backward=randn(5, 8))],
              what="the gradient for a random upstream gradient"),
    ]),
    Exercise("scaled_dot_product_attention", ref="masks.scaled_dot_product_attention", returns=("output", "weights"),
             graded=grades(shapes=1, weights=2, output=2, batch_axes=1, random=(2, 4242)),
             shortcuts=("attention",), diagnose=ATTENTION_DIAGNOSES, probes=[
        Probe("shapes", (shapes("shapes"),
                         "random"),
              [call(randn(3, 4, 8), randn(3, 7, 8), randn(3, 7, 5))],
              what="Lq=4, Lk=7, d_k=8, d_v=5"),
        Probe("weights", ("weights",
                          "output",
                          "random"),
              [call(randn(2, 6, 32, scale=2.0), randn(2, 9, 32), randn(2, 9, 3))],
              what="d_k=32 with large scores"),
        Probe("batch axes", (batch("batch_axes"),),
              [call(randn(5, 16), randn(11, 16), randn(11, 4)),
               call(*_QKV4), call(*(part(t, 1, 2) for t in _QKV4))],
              what="no batch axis, two batch axes, and one element of that batch on its own"),
        Probe("gradient", ("output",),
              [call(randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6), grad=(0, 1, 2),
                    backward=randn(2, 3, 6), backward_of="0")],
              what="gradients of q, k, v"),
    ]),
]
