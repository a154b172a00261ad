"""03_multihead: what the grader runs on the student's `split_heads`, `combine_heads` and
`MultiHeadAttention`, on inputs drawn for each grading run.

`split_heads` and `combine_heads` are pure rearrangements: compared exactly enough to place
every number, with B, L, H and D_h all different (and H = 1, D_h = 1), gradients included.

`MultiHeadAttention` is built with the exercise's constructor and given the reference's
(perturbed) `w_q`, `w_k`, `w_v`, `w_o` by name, so missing, unregistered, shared or extra
layers fail to load or show in the parameter list; forward is compared in eval mode (output,
`attn_weights` per head, input and parameter gradients) for self- and cross-attention, every
mask rank the course uses, bias=False and dropout > 0. Train mode is probed with dropout=1.0
only, where every implementation must drop every weight: the output is then w_o's bias and
`attn_weights` are still the softmax before dropout.

A query row whose keys are all masked may give uniform (the reference) or all-zero weights
(`DEAD_ROWS`, a declared property of the probe); those probes use bias=False and values with zero mean over the keys, so both
choices give the same (zero) output.
"""

ASSIGNMENT = "03_multihead"

import math

import numpy as np
import torch
import torch.nn.functional as F

from .engine import (DeadRows, Exercise, Probe, call, ctor, given, grades, like, randn, sample,
                     shapes, when)

# `attn_weights`: the reference makes a fully masked row uniform
DEAD_ROWS = DeadRows(".after.attn_weights", "uniform",
                     "fill the masked scores with a large negative finite number (torch.finfo(dtype).min), not -inf")


# -- inputs ---------------------------------------------------------------------------------

def _same(B, L, D):
    """(query, key, value) holding the same (B, L, D) numbers: self-attention."""
    x = sample(lambda g: (torch.randn(B, L, D, generator=g),), f"x ({B}, {L}, {D}) as query, key and value")
    return x[0], x[0], x[0]


def _zero_mean(B, L, D):
    """Values with zero mean over the keys: with bias=False a fully masked row then gives a
    zero output for uniform and for all-zero weights alike."""
    def build(g):
        v = torch.randn(B, L, D, generator=g)
        return v - v.mean(1, keepdim=True)
    return given(build, f"values ({B}, {L}, {D}) with zero mean over the keys")


def _lengths(g, B, L):
    n = torch.randint(1, L + 1, (B,), generator=g)
    n[0] = L
    if B > 1 and L > 1:
        n[1] = min(int(n[1]), L - 1)  # at least one padded sequence
    return n


def _pad_mask(B, Lk):
    def build(g):
        return (torch.arange(Lk)[None, :] < _lengths(g, B, Lk)[:, None]).unsqueeze(1)
    return given(build, f"a padding mask ({B}, 1, {Lk})")


def _causal(L):
    return given(lambda g: torch.ones(L, L, dtype=torch.bool).tril(), f"a causal mask ({L}, {L})")


def _decoder(B, L, heads_axis=False):
    def build(g):
        pad = torch.arange(L)[None, :] < _lengths(g, B, L)[:, None]
        m = pad[:, None, :] & torch.ones(L, L, dtype=torch.bool).tril()
        return m.unsqueeze(1) if heads_axis else m
    return given(build, f"a decoder mask ({B}, {'1, ' if heads_axis else ''}{L}, {L})")


def _per_head(B, H, Lq, Lk):
    def build(g):
        m = torch.rand(B, H, Lq, Lk, generator=g) > 0.4
        m[..., 0] = True
        return m
    return given(build, f"a per-head mask ({B}, {H}, {Lq}, {Lk})")


def _decoder_dead(B, L):
    """A decoder mask whose sequence 1 starts with padding: its query 0 sees no key."""
    def build(g):
        pad = torch.arange(L)[None, :] < _lengths(g, B, L)[:, None]
        pad[1, 0] = False
        return pad[:, None, :] & torch.ones(L, L, dtype=torch.bool).tril()
    return given(build, f"a decoder mask ({B}, {L}, {L}) with a fully masked query row")


def _all_padding(B, Lk):
    """A padding mask whose last sequence is padding only: all its query rows are dead."""
    def build(g):
        m = torch.arange(Lk)[None, :] < _lengths(g, B, Lk)[:, None]
        m[-1] = False
        return m.unsqueeze(1)
    return given(build, f"a padding mask ({B}, 1, {Lk}) whose last sequence is all padding")


# -- special comparisons --------------------------------------------------------------------

# -- diagnoses ------------------------------------------------------------------------------

def _crash(pattern, message):
    return when(message, lambda e: pattern in e.error)


def _heads(x, n_heads):
    B, L, D = x.shape
    return B, L, n_heads, D // n_heads


def _split(fn):
    """A wrong split_heads: fn(x, B, L, H, D_h)."""
    return lambda x, n_heads: fn(x, *_heads(x, n_heads))


def _split_shape(*shapes):
    """The first output has one of the shapes(B, L, H, D_h)."""
    def pred(e):
        (x, *rest), kw = e.args(0)
        dims = _heads(x, rest[0] if rest else kw["n_heads"])
        return e.out(0) is not None and tuple(e.out(0).shape) in [f(*dims) for f in shapes]
    return pred


SPLIT_DIAGNOSES = [
    _crash("does not require grad", "the result is cut off from autograd: keep to view, "
           "reshape, transpose and permute (no .detach(), .numpy(), torch.tensor(...) or "
           "torch.from_numpy), so the gradient flows back to x."),
    _crash("invalid for input of size", "The split must come from the sizes of x and the n_heads "
           "argument: B, L, D = x.shape; view(B, L, n_heads, D // n_heads). Is n_heads or a size "
           "hard-coded?"),
    when("the head axis is still after the sequence axis: after view(B, L, H, D_h), move the "
         "heads forward with .transpose(1, 2) so each head sees a (L, D_h) matrix.",
         _split_shape(lambda B, L, H, Dh: (B, L, H, Dh))),
    when("n_heads and D_h are swapped: view(B, L, n_heads, D // n_heads), not "
         "view(B, L, D // n_heads, n_heads). (x.split(k) makes pieces of SIZE k; x.chunk(k) "
         "makes k pieces.)", _split_shape(lambda B, L, H, Dh: (B, Dh, L, H),
                                         lambda B, L, H, Dh: (B, L, Dh, H))),
    when("the wrong axes were transposed: swap the sequence and head axes, transpose(1, 2).",
         _split_shape(lambda B, L, H, Dh: (L, B, H, Dh))),
    like("view(B, H, L, D_h) alone re-reads the numbers in memory order, so 'head 0' gets whole "
         "tokens (all their features) instead of one slice of every token: the split MIXES HEADS "
         "and tokens. Split the feature axis first, view(B, L, H, D_h), then move the heads "
         "forward with transpose(1, 2).", _split(lambda x, B, L, H, Dh: x.reshape(B, H, L, Dh))),
    like("each head got every H-th feature (an interleaved split, view(B, L, D_h, H)): head h "
         "must get the contiguous block of features h*D_h .. (h+1)*D_h - 1, which is how W_q's "
         "rows for head h are laid out. Use view(B, L, H, D_h).transpose(1, 2).",
         _split(lambda x, B, L, H, Dh: x.reshape(B, L, Dh, H).permute(0, 3, 1, 2))),
    like("x was transposed to (B, D, L) BEFORE splitting, which scrambles tokens and features "
         "within each head. Split first, view(B, L, H, D_h), then transpose(1, 2).",
         _split(lambda x, B, L, H, Dh: x.transpose(1, 2).reshape(B, H, L, Dh))),
]


def _combine(fn):
    """A wrong combine_heads: fn(x, B, H, L, D_h)."""
    return lambda x: fn(x, *x.shape)


COMBINE_DIAGNOSES = [
    _crash("does not require grad", "the result is cut off from autograd: keep to view, "
           "reshape, transpose and permute (no .detach(), .numpy(), torch.tensor(...) or "
           "torch.from_numpy), so the gradient flows back to x."),
    _crash("view size is not compatible", "x.transpose(1, 2) is not contiguous in memory, so "
           ".view fails on it: call .contiguous() first, x.transpose(1, 2).contiguous()"
           ".view(B, L, H * D_h), or use .reshape."),
    like("the heads were merged without transpose(1, 2): reshaping (B, H, L, D_h) straight to "
         "(B, L, H * D_h) glues together whole rows of one head (several tokens) instead of "
         "every head's slice of one token. transpose(1, 2) first, then merge.",
         _combine(lambda x, B, H, L, Dh: x.reshape(B, L, H * Dh))),
    like("the features came out interleaved (feature 0 of every head, then feature 1, ...): "
         "merge (H, D_h) in that order, x.transpose(1, 2) -> (B, L, H, D_h), not (B, L, D_h, H).",
         _combine(lambda x, B, H, L, Dh: x.permute(0, 2, 3, 1).reshape(B, L, H * Dh))),
    like("the last two axes were transposed (transpose(2, 3)) instead of the head and sequence "
         "axes (transpose(1, 2)).", _combine(lambda x, B, H, L, Dh: x.transpose(2, 3).reshape(B, L, H * Dh))),
    like("the heads were concatenated along the sequence axis: they belong side by side on the "
         "feature axis, (B, L, H * D_h).", lambda x: torch.cat(x.unbind(1), dim=1)),
    like("the heads were summed or averaged: concatenate them instead (each head keeps its own "
         "D_h features; W_o mixes them afterwards).", lambda x: x.sum(1)),
    like("the heads were summed or averaged: concatenate them instead (each head keeps its own "
         "D_h features; W_o mixes them afterwards).", lambda x: x.mean(1)),
    like("the heads are still on axis 1: read the sizes in the order (B, H, L, D_h), "
         "transpose(1, 2) to bring the tokens forward, then merge (H, D_h) into H * D_h.",
         _combine(lambda x, B, H, L, Dh: x.transpose(1, 2).reshape(B, H, L * Dh))),
]


def _forward(ref, query, key, value, mask=None, *, scale="head", split="ok", combine="ok",
         use_wo=True, q_layer="w_q", v_layer="w_v", v_from="value", mask_mode="ok", sm_dim=-1):
    """The forward pass with the probe's weights and one known mistake switched on."""
    if mask is None and mask_mode != "ok":
        return None
    B, Lq, D = query.shape
    H = ref.n_heads
    Dh = D // H

    def sp(t):
        b, n, _ = t.shape
        if split == "view_only":
            return t.reshape(b, H, n, Dh)
        return t.reshape(b, n, H, Dh).transpose(1, 2)
    q, k = sp(getattr(ref, q_layer)(query)), sp(ref.w_k(key))
    v = sp(getattr(ref, v_layer)(key if v_from == "key" else value))
    s = q @ k.transpose(-2, -1) / {"head": math.sqrt(Dh), "model": math.sqrt(D), "none": 1.0,
                                   "head_lin": float(Dh)}[scale]
    if mask is not None and mask_mode != "ignore":
        mk = mask.unsqueeze(1) if (mask.dim() == 3) != (mask_mode == "nohead") else mask
        mk = mask.unsqueeze(1) if mask_mode == "always" else mk
        s = s.masked_fill(mk if mask_mode == "invert" else ~mk, -1e9)
    o = torch.softmax(s, dim=sm_dim) @ v
    o = o.reshape(B, Lq, D) if combine == "no_transpose" else o.transpose(1, 2).reshape(B, Lq, D)
    return ref.w_o(o) if use_wo else o


def _as(message, **opts):
    return like(message, lambda ref, *a, **kw: _forward(ref, *a, **kw, **opts))


def _mask_dim(e):
    a, kw = e.args(0)
    m = kw.get("mask", a[3] if len(a) > 3 else None)
    return None if m is None else m.dim()


def _broadcast_error(e):
    return "must match the size of tensor" in e.error or "broadcast" in e.error


def _weights_kept(e):
    g, w = e.got("after.attn_weights"), e.want("after.attn_weights")
    return g is not None and w is not None and g.shape == w.shape and np.allclose(g, w, atol=1e-5)


def _missing(*names):
    return lambda e: any(f"no parameter named '{n}." in e.error for n in names)


def _values_from_key(e):
    """Self-attention (the same numbers in query, key and value): the output is right, but no
    gradient reaches `value` while the query's gradient is the reference's."""
    g_q, w_q = e.got("0.grad.0"), e.want("0.grad.0")
    return (e.got("0.grad.2") is None and e.want("0.grad.2") is not None and g_q is not None
            and e.got("0.grad.1") is not None and np.allclose(g_q, w_q, atol=1e-4, rtol=1e-3))


def _has_norm(e):
    return any("norm" in n.lower() for n, _ in (e.meta("params") or [])) or \
        "norm" in e.problem.lower()


MHA_DIAGNOSES = [
    _crash("takes 1 positional argument", "Is the constructor spelled __init__ (two underscores "
           "on each side)? With `_init_` Python never calls it and nn.Module's own __init__ gets "
           "your arguments."),
    _crash("'super' object", "Call super().__init__() (with parentheses after super) first thing "
           "in __init__."),
    _crash("cannot assign module before Module.__init__", "Call super().__init__() before "
           "creating layers in __init__."),
    when("self.w_v is never created (check the spelling: the study notes assign self.wk twice "
         "and never create wv). Create the four projections w_q, w_k, w_v and w_o in __init__, "
         "each nn.Linear(d_model, d_model, bias=bias).",
         lambda e: "no parameter named 'w_v." in e.error),
    when("w_q, w_k, w_v, w_o must be layers registered on the module in __init__: a plain Python "
         "list (or dict) of layers is NOT registered, and layers created inside forward get new "
         "random weights at every call; either way they are missing from parameters() and "
         "state_dict(), so the optimizer never sees them. Use one nn.Linear(d_model, d_model) per "
         "projection (its rows h*D_h:(h+1)*D_h are head h's projection); to keep per-head layers "
         "use nn.ModuleList.", _missing("w_q", "w_k", "w_v", "w_o")),
    _crash("has no attribute", "An attribute is used before it is created, or its name is "
           "misspelt (the study notes assign self.wk twice and never create self.wv)."),
    when("forward returned a tuple: it returns the output only, (B, Lq, d_model). Keep the "
         "weights in self.attn_weights instead.",
         lambda e: str(e.meta("0.out")).startswith(("tuple", "list"))),
    _crash("invalid for input of size", "In cross-attention the keys and values have their own "
           "length Lk != Lq: split each tensor with its own sizes (key.size(1)), not the query's "
           "seqlen."),
    when("A 3-D mask, (B, Lq, Lk) or (B, 1, Lk), needs a head axis to broadcast against the "
         "(B, H, Lq, Lk) scores: mask.unsqueeze(1). (2-D and 4-D masks are used as they are.)",
         lambda e: _broadcast_error(e) and _mask_dim(e) == 3),
    when("A 2-D or 4-D mask broadcasts against the (B, H, Lq, Lk) scores as it is: only 3-D "
         "masks get unsqueeze(1).", lambda e: _broadcast_error(e) and _mask_dim(e) in (2, 4)),
    when("Shortcut used: the module contains PyTorch's nn.MultiheadAttention. This exercise "
         "asks you to build multi-head attention yourself from w_q, w_k, w_v, w_o, split_heads, "
         "attention and combine_heads.",
         lambda e: any("in_proj" in n for n, _ in (e.meta("params") or []))),
    when("MultiHeadAttention(..., bias=False) still has biases: pass bias=bias to every "
         "nn.Linear.", lambda e: "w_q.bias" not in e.ref_params()
         and any(n.endswith(".bias") for n, _ in (e.meta("params") or []))),
    when("the module contains a LayerNorm: the residual connection and the LayerNorm belong to "
         "the encoder and decoder layers (notebook 06), not to the attention module (some public "
         "implementations put them inside). forward returns w_o(combined heads) only.", _has_norm),
    like("the output is LayerNorm(query + attention): the module adds the residual and a "
         "LayerNorm inside. The residual connection and the LayerNorm belong to the encoder and "
         "decoder layers (notebook 06); forward returns w_o(combined heads) only.",
         lambda ref, q, k, v, mask=None: F.layer_norm(ref(q, k, v, mask) + q, q.shape[-1:], eps=1e-6)),
    when("the head axis is missing from self.attn_weights (averaged or summed over the "
         "heads?): keep one map per head, (B, H, Lq, Lk).",
         lambda e: e.got("after.attn_weights") is not None and e.want("after.attn_weights") is not None
         and e.got("after.attn_weights").shape == tuple(np.delete(e.want("after.attn_weights").shape, 1))),
    when("a query row whose keys are ALL masked gave NaN/inf. Fill masked scores with a large "
         "negative FINITE number (torch.finfo(dtype).min or -1e9) rather than -inf: softmax of a "
         "row of -inf is 0/0 = NaN, and the NaN then spreads through W_o. (Such a row may give "
         "uniform or zero weights.)", lambda e: "NaN" in e.problem),
    when("in eval mode dropout must be off, but the output is random although the attention "
         "weights are right. Use an nn.Dropout layer (it follows model.eval()/train()); "
         "F.dropout(x, p) defaults to training=True, so pass training=self.training.",
         _weights_kept, probes=("dropout eval",)),
    like("with dropout=1.0 in training mode every attention weight must be dropped, but the "
         "output is the one without dropout: the dropout argument is ignored. Apply "
         "nn.Dropout(dropout) to the attention weights before multiplying by v.",
         lambda ref, *a, **kw: ref.eval()(*a, **kw), probes=("dropout train",)),
    when("self.attn_weights must be the softmax output BEFORE dropout (rows sum to 1); yours "
         "were stored after dropout, which zeroes some and rescales the rest by 1/(1-p).",
         lambda e: not _weights_kept(e), probes=("dropout train",)),
    _as("self.w_k is the same layer as self.w_q (one module, or one weight, under two names): "
        "each projection needs its own weights. Create four nn.Linear(d_model, d_model).",
        q_layer="w_k"),
    when("two of w_q, w_k, w_v, w_o are the same layer (one module, or one weight, under two "
         "names): each projection needs its own weights. Create four nn.Linear(d_model, d_model).",
         lambda e: "distinct parameter tensors" in e.problem),
    _as("the scores are divided by sqrt(d_model). Each head's dot product q_h . k_h has only "
        "D_h = d_model / n_heads terms, so divide by sqrt(D_h), the HEAD dimension.", scale="model"),
    _as("the scores are not scaled: divide q k^T by sqrt(D_h), the head dimension.", scale="none"),
    _as("the scores are divided by D_h; the scale is sqrt(D_h).", scale="head_lin"),
    _as("the head split MIXES HEADS: view(B, H, L, D_h) re-reads memory in order, so a 'head' "
        "gets whole tokens, and the heads are not independent. Split the feature axis, "
        "view(B, L, H, D_h), then transpose(1, 2).", split="view_only"),
    _as("the heads are merged without transpose(1, 2): reshape (B, H, Lq, D_h) -> "
        "(B, Lq, d_model) directly mixes tokens and heads. transpose(1, 2).contiguous()"
        ".view(B, Lq, d_model).", combine="no_transpose"),
    _as("the output projection w_o is missing: return self.w_o(combined heads).", use_wo=False),
    _as("the values are projected with w_k instead of w_v (a copy-paste slip: the study notes "
        "assign self.wk twice).", v_layer="w_k"),
    _as("the values are computed from `key` instead of `value`: v = self.w_v(value). (In "
        "self-attention the three are the same tensor, which hides this; cross-attention does "
        "not.)", v_from="key"),
    when("the values are computed from `key` instead of `value`: v = self.w_v(value). (In "
         "self-attention the three hold the same numbers, which hides it in the output; the "
         "gradient shows it: none reaches `value`, twice as much reaches `key`.)", _values_from_key),
    _as("softmax ran over the query axis (dim=-2); normalise over the keys, dim=-1.", sm_dim=-2),
    _as("the mask is inverted: True means MAY attend, so fill the scores where the mask is "
        "False, masked_fill(~mask, ...) (PyTorch's own attn_mask/key_padding_mask use the "
        "opposite meaning).", mask_mode="invert"),
    _as("the mask is ignored: fill the scores where the mask is False before the softmax.",
        mask_mode="ignore"),
    _as("a 3-D mask was used without a head axis. Scores are (B, H, Lq, Lk); a (B, Lq, Lk) or "
        "(B, 1, Lk) mask lines up with (H, Lq, Lk) and masks the wrong thing. Add the head "
        "axis: mask.unsqueeze(1).", mask_mode="nohead"),
    _as("a 2-D (Lq, Lk) or 4-D mask also got unsqueeze(1): it broadcasts as it is; only 3-D "
        "masks need the head axis.", mask_mode="always"),
]


# -- the table ------------------------------------------------------------------------------

_W = ("attn_weights",)


def _mha(name, cells, make, calls, what, **kw):
    """A MultiHeadAttention probe: the reference's weights, eval mode, attn_weights after."""
    kw.setdefault("mode", "eval")
    return Probe(name, cells, calls, make=make, load="reference", after=_W, what=what, **kw)


def _qkv(B, Lq, Lk, D, **kw):
    return call(randn(B, Lq, D), randn(B, Lk, D), randn(B, Lk, D), **kw)


EXERCISES = [
    Exercise("split_heads", ref="multihead.split_heads", diagnose=SPLIT_DIAGNOSES,
             graded=grades(shape=1, values=2, random=(1, 3131)),
             probes=[
        Probe("shape", (shapes("shape"),),
              [call(randn(2, 5, 12), 3), call(randn(3, 4, 8), 1), call(randn(1, 6, 6), 6)],
              what="(B, L, D) -> (B, H, L, D // H), also for H = 1 and D_h = 1"),
        Probe("values", ("values",),
              [call(randn(2, 5, 12), 3), call(randn(3, 4, 20), n_heads=5)],
              what="head h of token l = features h*D_h .. (h+1)*D_h - 1 of token l"),
        Probe("random", ("random",),
              [call(randn(3, 5, 12), 4), call(randn(4, 9, 30), 5), call(randn(5, 2, 20), 1),
               call(randn(2, 7, 16), 8),
               call(randn(2, 3, 18), 6, grad=(0,), backward=randn(2, 6, 3, 3))],
              what="random (B, L, D, H) and the gradient of x"),
    ]),
    Exercise("combine_heads", ref="multihead.combine_heads", diagnose=COMBINE_DIAGNOSES,
             graded=grades(shape=1, values=2, inverts_split=(1, 2718)),
             probes=[
        Probe("shape", (shapes("shape"),),
              [call(randn(2, 3, 5, 4)), call(randn(3, 1, 4, 6)), call(randn(1, 4, 2, 1))],
              what="(B, H, L, D_h) -> (B, L, H * D_h), also for H = 1 and D_h = 1"),
        Probe("values", ("values",),
              [call(randn(2, 3, 5, 4)), call(randn(3, 4, 2, 3))],
              what="token l's features = [head 0 | head 1 | ...] of that token"),
        Probe("inverse", ("inverts_split",),
              [call(randn(3, 4, 5, 2)), call(randn(1, 1, 7, 8)), call(randn(4, 8, 2, 1)),
               call(randn(2, 5, 9, 3), grad=(0,), backward=randn(2, 9, 15))],
              what="random (B, H, L, D_h) and the gradient of x"),
    ]),
    Exercise("MultiHeadAttention", ref="multihead.MultiHeadAttention", shortcuts=("multihead",),
             graded=grades(parameters=2, shapes=1, matches_torch=3, cross_attention=2, masks=3,
                           head_independence=2, dropout=2, random=(2, 8080)),
             diagnose=MHA_DIAGNOSES, probes=[
        # -- structure
        _mha("parameters", (shapes("parameters"),), ctor(16, 4), [_qkv(2, 5, 5, 16)],
             "w_q, w_k, w_v, w_o of MultiHeadAttention(16, 4)", params=True),
        _mha("parameters 2 heads", (shapes("parameters"),), ctor(16, 2), [_qkv(2, 3, 4, 16)],
             "MultiHeadAttention(16, 2): the number of heads does not change the parameters",
             params=True),
        _mha("parameters no bias", (shapes("parameters"), "random"), ctor(12, 3, bias=False),
             [_qkv(2, 4, 6, 12)], "MultiHeadAttention(12, 3, bias=False)", params=True),
        # -- shapes
        _mha("self shapes", (shapes("shapes"),), ctor(12, 3), [call(*_same(2, 5, 12))],
             "self-attention, x (2, 5, 12), 3 heads: output and attn_weights shapes"),
        _mha("cross shapes", (shapes("shapes"),), ctor(12, 3), [_qkv(2, 5, 7, 12)],
             "cross-attention, Lq=5, Lk=7: output (B, Lq, d) and attn_weights (B, H, Lq, Lk)"),
        # -- values and gradients
        _mha("self", ("matches_torch",), ctor(16, 4),
             [call(*_same(2, 6, 16), grad=(0, 1, 2), backward=randn(2, 6, 16))],
             "self-attention, B=2, L=6, d_model=16, 4 heads, with gradients", param_grads=True),
        _mha("cross", ("cross_attention",), ctor(12, 3),
             [_qkv(3, 4, 9, 12, grad=(0, 1, 2), backward=randn(3, 4, 12))],
             "cross-attention, Lq=4, Lk=9, key != value, with gradients", param_grads=True),
        _mha("cross short keys", ("cross_attention",), ctor(8, 2), [_qkv(2, 7, 3, 8)],
             "cross-attention, Lq=7, Lk=3"),
        # -- masks
        _mha("padding mask", ("masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _pad_mask(2, 6))], "a padding mask (B, 1, Lk), B=2, H=3"),
        _mha("causal mask", ("masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _causal(6))], "a causal mask (L, L)"),
        _mha("decoder mask", ("masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), mask=_decoder(2, 6))], "a decoder mask (B, L, L)"),
        _mha("4-D mask", ("masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _decoder(2, 6, heads_axis=True))], "a 4-D mask (B, 1, L, L)"),
        _mha("per-head mask", ("masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _per_head(2, 3, 6, 6))], "a per-head mask (B, H, L, L)"),
        _mha("cross padding mask", ("masks",), ctor(12, 3),
             [_qkv(3, 4, 8, 12, mask=_pad_mask(3, 8))],
             "cross-attention with a padding mask (B, 1, Lk) over the source"),
        _mha("fully masked rows", ("masks",), ctor(12, 3, bias=False),
             [call(randn(2, 5, 12), randn(2, 5, 12), _zero_mean(2, 5, 12), _all_padding(2, 5)),
              call(randn(2, 5, 12), randn(2, 5, 12), _zero_mean(2, 5, 12), _decoder_dead(2, 5))],
             "a sequence that is all padding, and a decoder mask with a fully masked query row "
             "(finite, uniform or zero weights)", dead_rows=DEAD_ROWS),
        # -- heads
        _mha("heads of two", ("head_independence",), ctor(8, 4),
             [call(*_same(3, 5, 8))], "d_model=8 with 4 heads of size 2"),
        _mha("many heads", ("head_independence",), ctor(20, 5),
             [_qkv(2, 4, 6, 20)], "d_model=20 with 5 heads of size 4"),
        # -- dropout
        _mha("dropout eval", ("dropout",), ctor(12, 3, dropout=0.5),
             [call(*_same(2, 6, 12)), _qkv(2, 6, 4, 12)],
             "eval mode with dropout=0.5 (dropout must be off)"),
        _mha("dropout train", ("dropout",), ctor(12, 3, dropout=1.0),
             [call(*_same(2, 6, 12))],
             "train mode with dropout=1.0: every weight dropped (the output is w_o's bias), "
             "attn_weights kept before dropout", mode="train"),
        # -- random cases
        _mha("random decoder", ("random",), ctor(24, 6),
             [call(*_same(3, 7, 24), _decoder(3, 7), grad=(0, 1, 2), backward=randn(3, 7, 24))],
             "d_model=24, 6 heads, a decoder mask, with gradients", param_grads=True),
        _mha("random padding no bias", ("random",), ctor(20, 5, bias=False),
             [_qkv(2, 4, 9, 20, mask=_pad_mask(2, 9))],
             "bias=False, cross-attention with a padding mask"),
        _mha("random causal", ("random",), ctor(32, 8),
             [call(*_same(1, 8, 32), _causal(8))], "d_model=32, 8 heads, a causal mask"),
        _mha("random one head", ("random",), ctor(8, 1), [call(*_same(2, 6, 8))],
             "one head"),
        _mha("random one query", ("random",), ctor(40, 10),
             [_qkv(5, 1, 11, 40, mask=_pad_mask(5, 11))],
             "one query against 11 keys, 10 heads, a padding mask"),
    ]),
]
