"""Checks for notebook 03_multihead: `split_heads`, `combine_heads`, `MultiHeadAttention`.

The module checks copy the student's weights into `nn.MultiheadAttention` (its
`in_proj_weight` stacks [W_q; W_k; W_v]) and compare outputs, per-head weights and gradients.
When something differs they recompute the forward pass with the student's own weights and
each known mistake (scale by sqrt(d_model), a split that mixes heads, no W_o, an inverted
mask, ...) and name the one that reproduces the student's numbers.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..reference import make_causal_mask, make_decoder_mask, make_padding_mask
from .core import _match
from .core import (CheckFailed, ShortcutUsed, call, check_close, check_shape, check_true,
                   copy_mha_to_torch, fail, passed, seeded)

MHA = ("multihead",)  # nn.MultiheadAttention, F.multi_head_attention_forward, F.sdpa raise


def expand_mask(mask):
    """A course mask with a head axis: (B, Lq, Lk) and (B, 1, Lk) -> (B, 1, Lq|1, Lk);
    (Lq, Lk) and 4-D masks as they are (the ranks MultiHeadAttention accepts)."""
    mask = mask.to(torch.bool)
    return mask.unsqueeze(1) if mask.dim() == 3 else mask


# =========================================================================== split_heads
def _split(x, H):  # the right answer, written differently from the reference
    return x.unflatten(-1, (H, x.size(-1) // H)).permute(0, 2, 1, 3)


def _coded(B, L, D):
    """x[b, l, d] = 1000 b + 100 l + d: every number says where it came from."""
    return (torch.arange(B).view(B, 1, 1) * 1000 + torch.arange(L).view(1, L, 1) * 100
            + torch.arange(D).view(1, 1, D)).float()


def _where(v):
    v = int(round(float(v)))
    return f"(batch {v // 1000}, token {v % 1000 // 100}, feature {v % 100})"


_SPLIT_SHAPE_HINTS = {
    "blh": "the head axis is still after the sequence axis: after view(B, L, H, D_h), move the "
           "heads forward with .transpose(1, 2) so each head sees a (L, D_h) matrix.",
    "bdlh": "n_heads and D_h are swapped: view(B, L, n_heads, D // n_heads), not "
            "view(B, L, D // n_heads, n_heads). (x.split(k) makes pieces of SIZE k; "
            "x.chunk(k) makes k pieces.)",
    "lbhd": "the wrong axes were transposed: swap the sequence and head axes, transpose(1, 2).",
}


def _split_shape_hint(y, B, L, H, Dh):
    if not isinstance(y, torch.Tensor):
        return ""
    s = tuple(y.shape)
    if s == (B, L, H, Dh):
        return _SPLIT_SHAPE_HINTS["blh"]
    if s in ((B, Dh, L, H), (B, L, Dh, H)):
        return _SPLIT_SHAPE_HINTS["bdlh"]
    if s == (L, B, H, Dh):
        return _SPLIT_SHAPE_HINTS["lbhd"]
    return "split_heads maps (B, L, D) to (B, H, L, D // H)."


def _call_split(split_heads, x, H):
    try:
        return call(split_heads, x, H, what=f"split_heads(x, n_heads={H})")
    except CheckFailed as e:
        if "invalid for input of size" in str(e):
            fail(f"{e}\nThe split must come from the sizes of x and the n_heads argument: "
                 "B, L, D = x.shape; view(B, L, n_heads, D // n_heads). Is n_heads or a size "
                 "hard-coded?")
        raise


def check_split_heads_shape(split_heads):
    """(B, L, D) -> (B, H, L, D // H) for B, L, H, D_h all different, and for H = 1 and H = D."""
    for B, L, D, H in ((2, 5, 12, 3), (3, 4, 8, 1), (1, 6, 6, 6)):
        x = torch.randn(B, L, D)
        y = _call_split(split_heads, x, H)
        check_shape(y, (B, H, L, D // H), f"split_heads(x, {H}) for x of shape {(B, L, D)}",
                    _split_shape_hint(y, B, L, H, D // H))
    passed("split_heads: (B, L, D) -> (B, H, L, D // H), also for one head and for D_h = 1")


def check_split_heads_values(split_heads):
    """Head h of token l gets features h*D_h .. (h+1)*D_h - 1 of token l, in order."""
    B, L, D, H = 2, 5, 12, 3
    Dh = D // H
    x = _coded(B, L, D)
    y = _call_split(split_heads, x, H)
    check_shape(y, (B, H, L, Dh), "split_heads(x, 3) for x of shape (2, 5, 12)",
                _split_shape_hint(y, B, L, H, Dh))
    expected = _split(x, H)
    if not torch.equal(y.detach().float(), expected):
        why = _match(y, {
            "view(B, H, L, D_h) alone re-reads the numbers in memory order, so 'head 0' gets "
            "whole tokens (all their features) instead of one slice of every token: the split "
            "MIXES HEADS and tokens. Split the feature axis first, view(B, L, H, D_h), then "
            "move the heads forward with transpose(1, 2).": x.reshape(B, H, L, Dh),
            "each head got every H-th feature (an interleaved split, view(B, L, D_h, H)): head h "
            "must get the contiguous block of features h*D_h .. (h+1)*D_h - 1, which is how "
            "W_q's rows for head h are laid out. Use view(B, L, H, D_h).transpose(1, 2).":
                x.reshape(B, L, Dh, H).permute(0, 3, 1, 2),
            "x was transposed to (B, D, L) BEFORE splitting, which scrambles tokens and features "
            "within each head. Split first, view(B, L, H, D_h), then transpose(1, 2).":
                x.transpose(1, 2).reshape(B, H, L, Dh),
        }, atol=0, rtol=0)
        b, h, l, d = (int(i) for i in (y.detach().float() != expected).nonzero()[0])
        fail("split_heads puts features in the wrong head or place.\n"
             f"  y[{b}, {h}, {l}, {d}] holds x{_where(y[b, h, l, d])}\n"
             f"  expected x{_where(expected[b, h, l, d])} (head {h} = features "
             f"{h * Dh}..{(h + 1) * Dh - 1} of token {l})\n"
             + (why or "Use view(B, L, H, D_h) then transpose(1, 2)."))
    passed("split_heads: head h of each token holds that token's features h*D_h .. (h+1)*D_h - 1")


def check_split_heads_random(split_heads, seed=0, cases=((2, 7, 16, 4),)):
    """Random (B, L, D, H) cases against x.unflatten(-1, (H, D_h)).permute(0, 2, 1, 3);
    gradients flow back to x."""
    with seeded(seed):
        xs = [torch.randn(B, L, D) for B, L, D, _ in cases]
    for (B, L, D, H), x in zip(cases, xs):
        xa = x.clone().requires_grad_(True)
        y = _call_split(split_heads, xa, H)
        check_shape(y, (B, H, L, D // H), f"split_heads(x, {H}) for x of shape {(B, L, D)}",
                    _split_shape_hint(y, B, L, H, D // H))
        check_close(y, _split(x, H), f"split_heads(x, {H}) for x of shape {(B, L, D)}",
                    "Use view(B, L, H, D_h) then transpose(1, 2).", atol=0, rtol=0)
        check_true(y.requires_grad, "split_heads cut the autograd graph: keep to view/reshape/"
                   "transpose (no .detach(), .numpy(), torch.tensor(...)).")
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
        (y * g).sum().backward()
        check_close(xa.grad, g.permute(0, 2, 1, 3).reshape(B, L, D),
                    "the gradient of split_heads", "A pure rearrangement passes each gradient "
                    "back to the number it came from.")
    passed(f"split_heads: matches on {len(cases)} random shape(s) and passes gradients back")


# =========================================================================== combine_heads
def _combine(x):
    B, H, L, Dh = x.shape
    return x.permute(0, 2, 1, 3).reshape(B, L, H * Dh)


def _combine_shape_hint(y, B, H, L, Dh):
    if not isinstance(y, torch.Tensor):
        return ""
    s = tuple(y.shape)
    if s in ((B, H * L, Dh), (B, L * H, Dh)):
        return ("the heads were concatenated along the sequence axis: they belong side by side "
                "on the feature axis, (B, L, H * D_h).")
    if s == (B, L, Dh):
        return ("the heads were summed or averaged: concatenate them instead (each head keeps "
                "its own D_h features; W_o mixes them afterwards).")
    if s == (B, H, L * Dh) or s == (B, H * Dh, L):
        return ("the heads are still on axis 1: read the sizes in the order (B, H, L, D_h), "
                "transpose(1, 2) to bring the tokens forward, then merge (H, D_h) into H * D_h.")
    return ("The input is (B, H, L, D_h): read the sizes in that order (B, H, L, Dh = x.shape), "
            "then transpose(1, 2) and merge the last two axes into H * D_h.")


def _call_combine(combine_heads, x):
    return call(combine_heads, x, what=f"combine_heads(x) for x of shape {tuple(x.shape)}")


def check_combine_heads_shape(combine_heads):
    """(B, H, L, D_h) -> (B, L, H * D_h) with all four sizes different, and for H = 1."""
    for B, H, L, Dh in ((2, 3, 5, 4), (3, 1, 4, 6), (1, 4, 2, 1)):
        x = torch.randn(B, H, L, Dh)
        y = _call_combine(combine_heads, x)
        check_shape(y, (B, L, H * Dh), f"combine_heads(x) for x of shape {(B, H, L, Dh)} "
                    "= (B, H, L, D_h)", _combine_shape_hint(y, B, H, L, Dh))
    passed("combine_heads: (B, H, L, D_h) -> (B, L, H * D_h)")


def check_combine_heads_values(combine_heads):
    """Token l's features are head 0's D_h numbers, then head 1's, ...; input is contiguous, so
    a view straight after a transpose fails here."""
    B, H, L, Dh = 2, 3, 5, 4
    # x[b, h, l, d] = 1000 b + 100 l + 10 h + d: the code says where each number came from
    x = (torch.arange(B).view(B, 1, 1, 1) * 1000 + torch.arange(H).view(1, H, 1, 1) * 10
         + torch.arange(L).view(1, 1, L, 1) * 100 + torch.arange(Dh).view(1, 1, 1, Dh)).float()
    y = _call_combine(combine_heads, x)
    check_shape(y, (B, L, H * Dh), "combine_heads(x) for x of shape (2, 3, 5, 4) = (B, H, L, D_h)",
                _combine_shape_hint(y, B, H, L, Dh))
    expected = _combine(x)
    if not torch.equal(y.detach().float(), expected):
        why = _match(y, {
            "the heads were merged without transpose(1, 2): reshaping (B, H, L, D_h) straight to "
            "(B, L, H * D_h) glues together whole rows of one head (several tokens) instead of "
            "every head's slice of one token. transpose(1, 2) first, then merge.":
                x.reshape(B, L, H * Dh),
            "the features came out interleaved (feature 0 of every head, then feature 1, ...): "
            "merge (H, D_h) in that order, x.transpose(1, 2) -> (B, L, H, D_h), not "
            "(B, L, D_h, H).": x.permute(0, 2, 3, 1).reshape(B, L, H * Dh),
            "the last two axes were transposed (transpose(2, 3)) instead of the head and "
            "sequence axes (transpose(1, 2)).": x.transpose(2, 3).reshape(B, L, H * Dh),
        }, atol=0, rtol=0)
        b, l, f = (int(i) for i in (y.detach().float() != expected).nonzero()[0])

        def src(v):
            v = int(round(float(v)))
            return (f"(batch {v // 1000}, head {v % 100 // 10}, token {v % 1000 // 100}, "
                    f"feature {v % 10})")
        fail("combine_heads puts numbers in the wrong place.\n"
             f"  y[{b}, {l}, {f}] holds x{src(y[b, l, f])}\n"
             f"  expected x{src(expected[b, l, f])} (features of token {l}: head 0's "
             f"{Dh}, then head 1's, ...)\n"
             + (why or "Use x.transpose(1, 2).contiguous().view(B, L, H * D_h)."))
    passed("combine_heads: token l = [head 0 | head 1 | ...] of that token; works on a "
           "contiguous input")


def check_combine_heads_inverts_split(combine_heads, seed=0, cases=((2, 4, 6, 3),)):
    """combine_heads(split_heads(x, H)) == x for (B, L, H, D_h) cases, on the (non-contiguous)
    output of a split and on a contiguous copy; gradients flow."""
    from ..reference import split_heads as ref_split
    with seeded(seed):
        xs = [torch.randn(B, L, H * Dh) for B, L, H, Dh in cases]
    for (B, L, H, Dh), x in zip(cases, xs):
        for contiguous in (False, True):
            parts = ref_split(x, H)
            parts = parts.contiguous() if contiguous else parts
            pa = parts.detach().clone() if contiguous else parts.detach()
            pa.requires_grad_(True)
            y = _call_combine(combine_heads, pa)
            kind = "a contiguous (B, H, L, D_h) tensor" if contiguous else "the output of a split"
            check_shape(y, x.shape, f"combine_heads of {kind} {tuple(parts.shape)}",
                        _combine_shape_hint(y, B, H, L, Dh))
            check_close(y, x, f"combine_heads(split_heads(x, {H})) for x of shape {(B, L, H * Dh)}"
                        f" ({kind})", "combine_heads must undo split_heads exactly: "
                        "transpose(1, 2), then merge (H, D_h) into H * D_h.", atol=0, rtol=0)
            check_true(y.requires_grad, "combine_heads cut the autograd graph.")
            y.sum().backward()
            check_true(pa.grad is not None and bool((pa.grad == 1).all()),
                       "gradients do not flow back through combine_heads unchanged.")
    passed(f"combine_heads: undoes split_heads on {len(cases)} shape(s), contiguous or not")


# =========================================================================== MultiHeadAttention
_INIT_HINTS = [
    ("takes 1 positional argument", "Is the constructor spelled __init__ (two underscores on each "
     "side)? With `_init_` Python never calls it and nn.Module's own __init__ gets your arguments."),
    ("'super' object", "Call super().__init__() (with parentheses after super) first thing in "
     "__init__."),
    ("cannot assign module before Module.__init__", "Call super().__init__() before creating "
     "layers in __init__."),
    ("has no attribute", "An attribute is used before it is created, or its name is misspelt "
     "(the study notes assign self.wk twice and never create self.wv)."),
]


def _make(cls, *args, **kwargs):
    argtxt = ", ".join([*map(str, args), *(f"{k}={v}" for k, v in kwargs.items())])
    try:
        m = call(cls, *args, shortcuts=MHA, what=f"MultiHeadAttention({argtxt})", **kwargs)
    except CheckFailed as e:
        extra = next((h for p, h in _INIT_HINTS if p in str(e)), "")
        if extra:
            fail(f"{e}\n{extra}")
        raise
    check_true(isinstance(m, nn.Module), "MultiHeadAttention must be an nn.Module subclass "
               "(class MultiHeadAttention(nn.Module)), so that its layers are registered.")
    inner = next((type(x).__name__ for x in m.modules() if isinstance(x, nn.MultiheadAttention)),
                 None)
    if inner:
        raise ShortcutUsed(
            f"Shortcut used: MultiHeadAttention({argtxt}) contains PyTorch's nn.{inner}. This "
            "exercise asks you to build multi-head attention yourself from w_q, w_k, w_v, w_o, "
            "split_heads, attention and combine_heads.")
    for name in ("w_q", "w_k", "w_v", "w_o"):
        lay = getattr(m, name, None)
        if lay is None:
            fail(f"MultiHeadAttention({argtxt}) has no attribute `{name}` after __init__. Create "
                 "the four projections w_q, w_k, w_v and w_o in __init__, each "
                 "nn.Linear(d_model, d_model, bias=bias) (check the spelling: the study notes "
                 "assign self.wk twice and never create wv). Layers created inside forward get "
                 "new random weights at every call and are never trained.")
        if isinstance(lay, (list, tuple, dict)):
            fail(f"self.{name} is a plain Python {type(lay).__name__}: the layers inside it are NOT "
                 "registered, so they are missing from parameters() and state_dict() (the "
                 "optimizer never sees them). Use one nn.Linear(d_model, d_model) per projection "
                 "(its rows h*D_h:(h+1)*D_h are head h's small projection); to keep per-head "
                 "layers use nn.ModuleList.")
        w = getattr(lay, "weight", None)
        if not isinstance(w, torch.Tensor):
            fail(f"self.{name} has no .weight tensor: it must be nn.Linear(d_model, d_model).")
    layers = {name: getattr(m, name) for name in ("w_q", "w_k", "w_v", "w_o")}
    for i, (a, la) in enumerate(layers.items()):
        for b, lb in list(layers.items())[i + 1:]:
            if la is lb or la.weight is lb.weight:
                fail(f"MultiHeadAttention({argtxt}): self.{b} is the same layer as self.{a} (one "
                     "module, or one weight, under two names): each projection needs its own "
                     "weights. Create four nn.Linear(d_model, d_model).")
    norms = [n for n, x in m.named_modules() if isinstance(x, (nn.LayerNorm, nn.RMSNorm))]
    if norms:
        fail(f"MultiHeadAttention({argtxt}) contains a LayerNorm (`{norms[0]}`): the residual "
             "connection and the LayerNorm belong to the encoder and decoder layers (notebook "
             "06), not to the attention module (some public implementations put them inside). "
             "forward returns w_o(combined heads) only.")
    return m


def _forward(m, query, key, value, mask=None, what="forward"):
    out = call(m, query, key, value, mask, shortcuts=MHA, what=what)
    if isinstance(out, (tuple, list)):
        fail(f"{what} returned a {type(out).__name__} of {len(out)} items: forward returns the "
             "output only, (B, Lq, d_model). Keep the weights in self.attn_weights instead.")
    check_true(isinstance(out, torch.Tensor), f"{what} returned {type(out).__name__}, not a "
               "tensor of shape (B, Lq, d_model).")
    return out


def _weights(m, shape, what):
    w = getattr(m, "attn_weights", None)
    check_true(isinstance(w, torch.Tensor), f"after {what}, self.attn_weights is "
               f"{type(w).__name__}: store the attention weights (after softmax, before "
               "dropout) in self.attn_weights, shape (B, H, Lq, Lk).")
    if tuple(w.shape) == (shape[0], shape[2], shape[3]):
        fail(f"self.attn_weights has shape {tuple(w.shape)}: the head axis is missing (averaged "
             f"or summed?). Keep one map per head, (B, H, Lq, Lk) = {tuple(shape)}.")
    check_shape(w, shape, "self.attn_weights", "It holds one (Lq, Lk) map per head: "
                "(B, H, Lq, Lk), the softmax output before dropout.")
    return w


def _torch_mha(m, D, H, bias):
    t = nn.MultiheadAttention(D, H, bias=bias, batch_first=True)
    copy_mha_to_torch(m, t)
    return t


def _torch_mask(mask, B, H, Lq, Lk):
    """Course mask (True = may attend) -> nn.MultiheadAttention's attn_mask (True = blocked)."""
    if mask is None:
        return None
    m4 = expand_mask(mask)
    if m4.dim() == 2:
        return ~m4
    return ~m4.expand(B, H, Lq, Lk).reshape(B * H, Lq, Lk)


def _reference(t, query, key, value, mask, H):
    """PyTorch's output and per-head weights, computed outside the guard (NaN on rows whose
    keys are all masked)."""
    B, Lq, _ = query.shape
    Lk = key.size(1)
    t.eval()
    out, w = t(query, key, value, attn_mask=_torch_mask(mask, B, H, Lq, Lk), need_weights=True,
               average_attn_weights=False)
    return out, w


def _variant(m, query, key, value, mask, H, *, scale="head", split="ok", combine="ok",
             use_wo=True, v_layer="w_v", v_from="value", mask_mode="ok", sm_dim=-1):
    """The forward pass with the student's weights and one known mistake switched on."""
    def lin(layer, x):
        return F.linear(x, layer.weight.detach(),
                        None if getattr(layer, "bias", None) is None else layer.bias.detach())
    B, Lq, D = query.shape
    Dh = D // H

    def sp(t):
        b, n, _ = t.shape
        if split == "view_only":
            return t.reshape(b, H, n, Dh)
        if split == "interleaved":
            return t.reshape(b, n, Dh, H).permute(0, 3, 1, 2)
        return t.reshape(b, n, H, Dh).transpose(1, 2)
    q, k = sp(lin(m.w_q, query)), sp(lin(m.w_k, key))
    v = sp(lin(getattr(m, v_layer), key if v_from == "key" else value))
    s = q @ k.transpose(-2, -1) / {"head": math.sqrt(Dh), "model": math.sqrt(D), "none": 1.0,
                                   "head_lin": float(Dh)}[scale]
    if mask is not None and mask_mode != "ignore":
        mk = {"nohead": lambda x: x, "always": lambda x: x.unsqueeze(1)}.get(
            mask_mode, expand_mask)(mask.bool())
        if mask_mode == "invert":
            mk = ~mk
        s = s.masked_fill(~mk, -1e9)
    w = torch.softmax(s, dim=sm_dim)
    o = w @ v
    o = o.reshape(B, Lq, D) if combine == "no_transpose" else o.transpose(1, 2).reshape(B, Lq, D)
    return (lin(m.w_o, o) if use_wo else o), w


_MISTAKES = [
    ("the scores are divided by sqrt(d_model). Each head's dot product q_h . k_h has only "
     "D_h = d_model / n_heads terms, so divide by sqrt(D_h), the HEAD dimension.", {"scale": "model"}),
    ("the scores are not scaled: divide q k^T by sqrt(D_h), the head dimension.", {"scale": "none"}),
    ("the scores are divided by D_h; the scale is sqrt(D_h).", {"scale": "head_lin"}),
    ("the head split MIXES HEADS: view(B, H, L, D_h) re-reads memory in order, so a 'head' gets "
     "whole tokens. Split the feature axis, view(B, L, H, D_h), then transpose(1, 2).",
     {"split": "view_only"}),
    ("each head got every H-th feature (view(B, L, D_h, H)): head h owns the contiguous block "
     "h*D_h:(h+1)*D_h of the projection. Use view(B, L, H, D_h).transpose(1, 2).",
     {"split": "interleaved"}),
    ("the heads are merged without transpose(1, 2): reshape (B, H, Lq, D_h) -> (B, Lq, d_model) "
     "directly mixes tokens and heads. transpose(1, 2).contiguous().view(B, Lq, d_model).",
     {"combine": "no_transpose"}),
    ("the output projection w_o is missing: return self.w_o(combined heads).", {"use_wo": False}),
    ("the values are projected with w_k instead of w_v (a copy-paste slip: the study notes "
     "assign self.wk twice).", {"v_layer": "w_k"}),
    ("the values are computed from `key` instead of `value`: v = self.w_v(value).",
     {"v_from": "key"}),
    ("softmax ran over the query axis (dim=-2); normalise over the keys, dim=-1.", {"sm_dim": -2}),
    ("the mask is inverted: True means MAY attend, so fill the scores where the mask is False, "
     "masked_fill(~mask, ...) (PyTorch's own attn_mask/key_padding_mask use the opposite "
     "meaning).", {"mask_mode": "invert"}),
    ("the mask is ignored: fill the scores where the mask is False before the softmax.",
     {"mask_mode": "ignore"}),
    ("a 3-D mask was used without a head axis. Scores are (B, H, Lq, Lk); a (B, Lq, Lk) or "
     "(B, 1, Lk) mask lines up with (H, Lq, Lk) and masks the wrong thing. Add the head axis: "
     "mask.unsqueeze(1).", {"mask_mode": "nohead"}),
    ("a 2-D (Lq, Lk) mask also got unsqueeze(1): it broadcasts as it is; only 3-D masks need "
     "the head axis.", {"mask_mode": "always"}),
]


def _diagnose(m, query, key, value, mask, H, out, w, rows):
    """The hint of the first known mistake that reproduces the student's output (or weights)."""
    outs, ws = {}, {}
    with torch.no_grad():
        for hint, opts in _MISTAKES:
            if mask is None and "mask_mode" in opts:
                continue
            try:
                o, a = _variant(m, query, key, value, mask, H, **opts)
            except (RuntimeError, IndexError, AttributeError):
                continue
            outs[hint] = o[rows]
            if a.shape == tuple(w.shape if w is not None else ()):
                ws[hint] = a.transpose(1, 2)[rows]
    why = _match(out[rows], outs)
    if why is None and w is not None and w.dim() == 4:
        why = _match(w.transpose(1, 2)[rows], ws)
    return why


def _compare(m, query, key, value, mask, H, what, out, w, ref_out, ref_w):
    """Compare output and per-head weights with PyTorch's on rows that PyTorch can compute."""
    rows = torch.isfinite(ref_out).all(-1)  # (B, Lq): False on fully masked query rows
    if not bool(rows.all()):
        bad = ~torch.isfinite(out.detach()[~rows])
        if bad.any():
            fail(f"{what}: NaN/inf in the output of a query row whose keys are ALL masked. Fill "
                 "masked scores with a large negative FINITE number (torch.finfo(dtype).min or "
                 "-1e9) rather than -inf: softmax of a row of -inf is 0/0 = NaN, and the NaN then "
                 "spreads through W_o. (Such a row may give uniform or zero weights.)")
    ok_out = torch.allclose(out.detach()[rows].double(), ref_out.detach()[rows].double(),
                            atol=1e-5, rtol=1e-4)
    w_rows = w.detach().transpose(1, 2)[rows] if w is not None else None
    ok_w = w is None or torch.allclose(w_rows.double(), ref_w.detach().transpose(1, 2)[rows].double(),
                                       atol=1e-5, rtol=1e-4)
    if ok_out and ok_w:
        return
    if ok_w:  # right weights, wrong output: a residual + LayerNorm wrapped around it?
        o = out.detach()[rows].double()
        r = ref_out.detach()[rows].double()
        q = query.detach()[rows].double()
        for label, cand in (("LayerNorm(query + attention)", F.layer_norm(q + r, q.shape[-1:])),
                            ("query + attention", q + r)):
            if torch.allclose(o, cand, atol=1e-4, rtol=1e-3):
                fail(f"{what}: the attention weights are right, but the output is {label}: "
                     "the module adds the residual (and a LayerNorm) inside. The residual "
                     "connection and the LayerNorm belong to the encoder and decoder layers "
                     "(notebook 06); forward returns w_o(combined heads) only.")
    why = _diagnose(m, query, key, value, mask, H, out.detach(), None if w is None else w.detach(),
                    rows)
    if why:
        fail(f"{what} does not match nn.MultiheadAttention with the same weights: {why}")
    if not ok_w:
        sums = w.detach().sum(-1)[rows.unsqueeze(1).expand(-1, w.size(1), -1)]
        check_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-4),
                   f"{what}: rows of self.attn_weights do not sum to 1 over the keys (sums "
                   f"{[round(s, 3) for s in sums.flatten()[:4].tolist()]} ...): store the softmax "
                   "output, over dim=-1, BEFORE dropout.")
        check_close(w_rows, ref_w.detach().transpose(1, 2)[rows],
                    f"{what}: self.attn_weights (rows PyTorch can compute)",
                    "Per head: softmax(q_h k_h^T / sqrt(D_h)) over the keys, mask applied.")
    check_close(out.detach()[rows], ref_out.detach()[rows],
                f"{what}: the output (rows PyTorch can compute)",
                "out = W_o(combine_heads(softmax(q k^T / sqrt(D_h)) v)) with q, k, v from "
                "w_q(query), w_k(key), w_v(value) split into heads.")


def _inputs(seed, B, Lq, Lk, D, cross=True):
    with seeded(seed):
        query = torch.randn(B, Lq, D)
        key = torch.randn(B, Lk, D) if cross else query
        value = torch.randn(B, Lk, D) if cross else query
    return query, key, value


def _run_case(cls, seed, B, Lq, Lk, D, H, *, cross, mask=None, bias=True, what=None, grads=False):
    with seeded(seed + 1):
        m = _make(cls, D, H, bias=bias) if not bias else _make(cls, D, H)
    m.eval()
    query, key, value = _inputs(seed, B, Lq, Lk, D, cross)
    t = _torch_mha(m, D, H, bias)
    ref_out, ref_w = _reference(t, query, key, value, mask, H)
    what = what or (f"{'cross' if cross else 'self'}-attention, B={B} Lq={Lq} Lk={Lk} "
                    f"d_model={D} n_heads={H}" + ("" if mask is None else
                                                  f", mask {tuple(mask.shape)}"))
    if grads:
        qa, ka, va = (x.detach().clone().requires_grad_(True) for x in (query, key, value))
    else:
        qa, ka, va = query, key, value
    try:
        out = _forward(m, qa, ka, va, mask, what=what)
    except CheckFailed as e:
        msg = str(e)
        if "Shortcut" in msg:
            raise
        if cross and "invalid for input of size" in msg:
            fail(f"{msg}\nIn cross-attention the keys and values have their own length Lk != Lq: "
                 "split each tensor with its own sizes (key.size(1)), not the query's seqlen.")
        if mask is not None and mask.dim() == 3:
            fail(f"{msg}\nA 3-D mask, (B, Lq, Lk) or (B, 1, Lk), needs a head axis to broadcast "
                 "against the (B, H, Lq, Lk) scores: mask.unsqueeze(1). (2-D and 4-D masks are "
                 "used as they are.)")
        if mask is not None and mask.dim() in (2, 4):
            fail(f"{msg}\nA {mask.dim()}-D mask broadcasts against the (B, H, Lq, Lk) scores as "
                 "it is: only 3-D masks get unsqueeze(1).")
        raise
    check_shape(out, (B, Lq, D), f"{what}: the output", "The output has the query's shape "
                "(B, Lq, d_model): w_o(combine_heads(...)).")
    w = _weights(m, (B, H, Lq, Lk), what)
    _compare(m, query, key, value, mask, H, what, out, w, ref_out, ref_w)
    if grads and bool(torch.isfinite(ref_out).all()):
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
        (out * g).sum().backward()
        q2, k2, v2 = (x.detach().clone().requires_grad_(True) for x in (query, key, value))
        t.zero_grad()
        o2, _ = t(q2, k2, v2, attn_mask=_torch_mask(mask, B, H, Lq, Lk), need_weights=False)
        (o2 * g).sum().backward()
        if va.grad is None or not bool(va.grad.abs().gt(0).any()):
            fail(f"{what}: no gradient reaches the `value` argument although the output must "
                 "depend on it: the values are computed from `key` (or `query`) instead of "
                 "from `value`. v = self.w_v(value). (In self-attention the three are the same "
                 "tensor, which hides this; cross-attention does not.)" if ka.grad is not None
                 else f"{what}: no gradient reaches the `value` argument: something in forward "
                 "cuts the autograd graph (.detach(), .item(), numpy).")
        for name, a, b in (("query", qa, q2), ("key", ka, k2), ("value", va, v2)):
            check_true(a.grad is not None, f"no gradient reaches the {name}: something in "
                       "forward cuts the autograd graph (.detach(), .item(), numpy).")
            check_close(a.grad, b.grad, f"{what}: the gradient with respect to the {name}")
        tw = t.in_proj_weight.grad
        for i, name in enumerate(("w_q", "w_k", "w_v")):
            gw = getattr(m, name).weight.grad
            check_true(gw is not None, f"no gradient reaches self.{name}.weight: is the layer "
                       "used in forward?")
            check_close(gw, tw[i * D:(i + 1) * D], f"{what}: the gradient of {name}.weight")
        check_close(m.w_o.weight.grad, t.out_proj.weight.grad, f"{what}: the gradient of "
                    "w_o.weight")
    return m


def check_mha_parameters(MultiHeadAttention):
    """w_q, w_k, w_v, w_o are registered nn.Linear(d_model, d_model) layers: 4 d^2 + 4 d numbers in
    parameters() and state_dict(); bias=False drops the biases."""
    D, H = 16, 4
    with seeded(0):
        m = _make(MultiHeadAttention, D, H)
    params = list(m.parameters())
    total = sum(p.numel() for p in params)
    sd = m.state_dict()
    for name in ("w_q", "w_k", "w_v", "w_o"):
        lay = getattr(m, name)
        check_shape(lay.weight, (D, D), f"self.{name}.weight for d_model={D}",
                    f"{name} maps d_model to d_model: nn.Linear(d_model, d_model). All heads "
                    "together: head h owns rows h*D_h:(h+1)*D_h.")
        check_true(any(p is lay.weight for p in params),
                   f"self.{name}.weight is not among model.parameters(): the layer is not "
                   "registered (kept in a plain list/dict, or created inside forward?). Assign "
                   "nn.Linear layers directly to self, or keep them in nn.ModuleList.")
        check_true(f"{name}.weight" in sd, f"'{name}.weight' is missing from state_dict(): "
                   f"its keys are {list(sd)[:8]}.")
        check_true(getattr(lay, "bias", None) is not None, f"self.{name} has no bias although "
                   "bias=True (the default).")
    expected = 4 * D * D + 4 * D
    if total != expected:
        fail(f"MultiHeadAttention({D}, {H}) has {total} parameters in parameters(); expected "
             f"{expected} = 4 * d_model^2 + 4 * d_model (four d_model x d_model projections "
             "with biases), whatever n_heads is. "
             + ("Layers kept in a plain Python list or dict are missing from parameters() and "
                "state_dict(); use nn.ModuleList." if total < expected else
                "Extra layers? Per-head layers are not needed: slices of w_q, w_k, w_v are the "
                "per-head projections."))
    with seeded(0):
        m2 = _make(MultiHeadAttention, D, 2)
    n2 = sum(p.numel() for p in m2.parameters())
    check_true(n2 == expected, f"with n_heads=2 the module has {n2} parameters, with n_heads={H} "
               f"{total}: the number of heads must not change the parameter count.")
    with seeded(0):
        mb = _make(MultiHeadAttention, D, H, bias=False)
    for name in ("w_q", "w_k", "w_v", "w_o"):
        check_true(getattr(getattr(mb, name), "bias", None) is None,
                   f"MultiHeadAttention({D}, {H}, bias=False) still has self.{name}.bias: pass "
                   "bias=bias to every nn.Linear.")
    nb = sum(p.numel() for p in mb.parameters())
    check_true(nb == 4 * D * D, f"with bias=False the module has {nb} parameters; expected "
               f"{4 * D * D} = 4 * d_model^2.")
    passed(f"MultiHeadAttention: w_q, w_k, w_v, w_o registered; {expected} parameters for "
           f"d_model={D} whatever n_heads; bias=False drops the biases")


def check_mha_shapes(MultiHeadAttention):
    """Output (B, Lq, d_model) and attn_weights (B, H, Lq, Lk) for self- and cross-attention."""
    B, Lq, Lk, D, H = 2, 5, 7, 12, 3
    with seeded(0):
        m = _make(MultiHeadAttention, D, H)
    m.eval()
    x, _, _ = _inputs(0, B, Lq, Lq, D)
    out = _forward(m, x, x, x, what=f"self-attention on x of shape {(B, Lq, D)}")
    check_shape(out, (B, Lq, D), "the self-attention output", "The output has the query's shape.")
    _weights(m, (B, H, Lq, Lq), "self-attention")
    query, key, value = _inputs(1, B, Lq, Lk, D)
    try:
        out = _forward(m, query, key, value, what=f"cross-attention, query {(B, Lq, D)}, "
                       f"key/value {(B, Lk, D)}")
    except CheckFailed as e:
        if "invalid for input of size" in str(e) or "must match the size" in str(e):
            fail(f"{e}\nIn cross-attention the keys and values have their own length Lk != Lq: "
                 "split each tensor with its own sizes (key.size(1)), not the query's seqlen.")
        raise
    check_shape(out, (B, Lq, D), "the cross-attention output (query length 5, key length 7)",
                "One output row per QUERY: (B, Lq, d_model).")
    _weights(m, (B, H, Lq, Lk), "cross-attention")
    passed("MultiHeadAttention: output (B, Lq, d_model), attn_weights (B, H, Lq, Lk), for self- "
           "and cross-attention")


def check_mha_matches_torch(MultiHeadAttention, seed=0):
    """Self-attention: output, per-head weights and every gradient equal nn.MultiheadAttention's
    after copying the weights (in_proj_weight = [W_q; W_k; W_v])."""
    _run_case(MultiHeadAttention, seed, 2, 6, 6, 16, 4, cross=False, grads=True)
    passed("MultiHeadAttention: self-attention output, per-head weights and gradients match "
           "nn.MultiheadAttention with copied weights")


def check_mha_cross_attention(MultiHeadAttention, seed=10):
    """Cross-attention (Lq != Lk, key != value) matches nn.MultiheadAttention, gradients included."""
    _run_case(MultiHeadAttention, seed, 3, 4, 9, 12, 3, cross=True, grads=True)
    _run_case(MultiHeadAttention, seed + 1, 2, 7, 3, 8, 2, cross=True)
    passed("MultiHeadAttention: cross-attention (Lq != Lk, separate key and value) matches "
           "nn.MultiheadAttention")


def _tokens(seed, B, L, pad_from):
    """Token ids with real tokens 1..9 and padding (0) from position pad_from[b] on."""
    with seeded(seed):
        tok = torch.randint(1, 10, (B, L))
    for b, p in enumerate(pad_from):
        tok[b, p:] = 0
    return tok


def check_mha_masks(MultiHeadAttention, seed=20):
    """Boolean masks (True = may attend) of every accepted rank, compared with
    nn.MultiheadAttention: padding (B, 1, Lk), causal (L, L), decoder (B, L, L), 4-D, and a
    cross-attention padding mask. Rows whose keys are all masked must stay finite."""
    D, H = 12, 3
    tok = _tokens(seed, 2, 6, (6, 3))
    cases = [
        ("padding mask (B, 1, Lk) from make_padding_mask", 2, 6, 6, make_padding_mask(tok), False),
        ("causal mask (L, L) from make_causal_mask", 2, 6, 6, make_causal_mask(6), False),
        ("decoder mask (B, L, L) from make_decoder_mask", 2, 6, 6, make_decoder_mask(tok), False),
        ("4-D mask (B, 1, Lq, Lk)", 2, 6, 6, make_decoder_mask(tok).unsqueeze(1), False),
    ]
    with seeded(seed + 1):
        per_head = torch.rand(2, H, 6, 6) > 0.4
    per_head[..., 0] = True  # every row keeps one key
    cases.append(("4-D per-head mask (B, H, Lq, Lk)", 2, 6, 6, per_head, False))
    src = _tokens(seed + 2, 3, 8, (8, 5, 2))
    cases.append(("cross-attention padding mask (B, 1, Lk) over the source", 3, 4, 8,
                  make_padding_mask(src), True))
    # a batch whose first key is padding: query 0 of the causal decoder mask sees no key at all
    tok0 = _tokens(seed + 3, 2, 5, (5, 5))
    tok0[1, 0] = 0
    cases.append(("decoder mask with a fully masked query row", 2, 5, 5, make_decoder_mask(tok0),
                  False))
    for i, (name, B, Lq, Lk, mask, cross) in enumerate(cases):
        what = f"{'cross' if cross else 'self'}-attention with a {name}"
        _run_case(MultiHeadAttention, seed + 10 * i, B, Lq, Lk, D, H, cross=cross, mask=mask,
                  what=what)
    passed("MultiHeadAttention: padding, causal, decoder and 4-D masks (True = may attend) match "
           "nn.MultiheadAttention; fully masked rows stay finite")


def check_mha_head_independence(MultiHeadAttention, seed=30):
    """With W_o = identity, changing head h's rows of W_q changes only head h's slice of the
    output (and only head h's attention map)."""
    B, L, D, H = 2, 5, 12, 3
    Dh = D // H
    with seeded(seed):
        m = _make(MultiHeadAttention, D, H)
        x = torch.randn(B, L, D)
        bumps = [torch.randn(Dh, D) for _ in range(H)]
    m.eval()
    with torch.no_grad():
        m.w_o.weight.copy_(torch.eye(D))
        if m.w_o.bias is not None:
            m.w_o.bias.zero_()
    base = _forward(m, x, x, x, what="forward with W_o = identity").detach()
    w0 = _weights(m, (B, H, L, L), "forward").detach().clone()
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        with torch.no_grad():
            m.w_q.weight[rows] += bumps[h]
        out = _forward(m, x, x, x, what=f"forward after changing head {h}'s rows of W_q").detach()
        w1 = _weights(m, (B, H, L, L), "forward").detach()
        with torch.no_grad():
            m.w_q.weight[rows] -= bumps[h]
        diff = (out - base).abs().amax(dim=(0, 1)).view(H, Dh).amax(-1)  # change per head slice
        moved = [g for g in range(H) if diff[g] > 1e-5]
        wmoved = [g for g in range(H) if (w1[:, g] - w0[:, g]).abs().max() > 1e-6]
        if moved != [h] or wmoved != [h]:
            fail(f"changing only head {h}'s slice of W_q (rows {h * Dh}..{(h + 1) * Dh - 1} of "
                 f"w_q.weight) changed the output slices of heads {moved} and the attention maps "
                 f"of heads {wmoved}; expected head {h} only.\n"
                 + ("Nothing changed: is w_q used in forward, on the query? "
                    if not moved and not wmoved else
                    "The heads are not independent: the split mixes features of different heads "
                    "(view(B, H, L, D_h) or an interleaved view), or the heads are merged in the "
                    "wrong order. Split with view(B, L, H, D_h).transpose(1, 2) and merge with "
                    "transpose(1, 2).contiguous().view(B, L, d_model)."))
    passed("MultiHeadAttention: each head depends only on its own slice of W_q (heads are "
           "independent before W_o)")


def check_mha_dropout(MultiHeadAttention, seed=40):
    """dropout > 0: eval mode is deterministic and equals nn.MultiheadAttention; training mode
    applies dropout; attn_weights are stored before dropout (rows sum to 1)."""
    B, L, D, H = 2, 6, 12, 3
    with seeded(seed):
        m = _make(MultiHeadAttention, D, H, dropout=0.5)
    x, _, _ = _inputs(seed, B, L, L, D)
    t = _torch_mha(m, D, H, True)
    ref_out, ref_w = _reference(t, x, x, x, None, H)
    m.eval()
    with seeded(seed + 1):
        o1 = _forward(m, x, x, x, what="forward in eval mode (dropout=0.5)").detach()
    with seeded(seed + 2):
        o2 = _forward(m, x, x, x, what="forward in eval mode (dropout=0.5)").detach()
    if not torch.equal(o1, o2):
        fail("in eval mode two identical calls gave different outputs (max difference "
             f"{(o1 - o2).abs().max().item():.3g}): dropout must be off in eval mode. Use an "
             "nn.Dropout layer (it follows model.eval()/train()); F.dropout(x, p) defaults to "
             "training=True, so pass training=self.training. Layers created inside forward also "
             "get new random weights at every call.")
    if not torch.allclose(o1.double(), ref_out.detach().double(), atol=1e-5, rtol=1e-4):
        # deterministic, so dropout is off as it should be: name what else is wrong
        _compare(m, x, x, x, None, H, "forward in eval mode (dropout=0.5, which is off there)",
                 o1, _weights(m, (B, H, L, L), "forward in eval mode"), ref_out, ref_w)
    m.train()
    with seeded(seed + 3):
        o3 = _forward(m, x, x, x, what="forward in training mode (dropout=0.5)").detach()
    w = _weights(m, (B, H, L, L), "forward in training mode")
    check_true(not torch.allclose(o3, o1), "in training mode with dropout=0.5 the output equals "
               "the eval-mode output: the dropout argument is ignored. Apply nn.Dropout(dropout) "
               "to the attention weights before multiplying by v.")
    sums = w.detach().sum(-1)
    check_true(torch.allclose(sums, torch.ones_like(sums), atol=1e-4),
               "in training mode the rows of self.attn_weights do not sum to 1 (sums "
               f"{[round(s, 3) for s in sums.flatten()[:4].tolist()]} ...): store the weights "
               "BEFORE dropout (dropout zeroes some and rescales the rest by 1/(1-p)).")
    check_close(w, ref_w, "self.attn_weights in training mode",
                "attn_weights are the softmax output before dropout.")
    passed("MultiHeadAttention: eval mode is deterministic with dropout=0.5, training mode drops "
           "weights, attn_weights are kept before dropout")


def check_mha_against_torch(MultiHeadAttention, seed=0, cases=((2, 5, 5, 16, 4, True, None),)):
    """Random cases (B, Lq, Lk, d_model, n_heads, bias, mask kind) against nn.MultiheadAttention.
    mask kind: None, 'padding', 'causal', 'decoder' (self-attention only when Lq == Lk)."""
    for i, (B, Lq, Lk, D, H, bias, kind) in enumerate(cases):
        s = seed + 97 * i
        mask = None
        if kind == "padding":
            with seeded(s + 5):
                pad_from = torch.randint(1, Lk + 1, (B,)).tolist()
            mask = make_padding_mask(_tokens(s, B, Lk, pad_from))
        elif kind == "causal":
            mask = make_causal_mask(Lq)
        elif kind == "decoder":
            with seeded(s + 5):
                pad_from = torch.randint(1, Lq + 1, (B,)).tolist()
            mask = make_decoder_mask(_tokens(s, B, Lq, pad_from))
        cross = Lq != Lk or kind == "padding"
        _run_case(MultiHeadAttention, s, B, Lq, Lk, D, H, cross=cross, mask=mask, bias=bias,
                  grads=(i == 0))
    passed(f"MultiHeadAttention: matches nn.MultiheadAttention on {len(cases)} random case(s)")
