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
(`_dead_rows`); those probes use bias=False and values with zero mean over the keys, so both
choices give the same (zero) output.
"""

ASSIGNMENT = "03_multihead"
import numpy as np
import torch

from .engine import Exercise, Probe, call, ctor, given, masked_rows, randn


# -- inputs ---------------------------------------------------------------------------------

def _clone(g):
    h = torch.Generator()
    h.set_state(g.get_state())
    return h


def _same(B, L, D):
    """(query, key, value) holding the same (B, L, D) numbers: self-attention. The first two
    draw from a copy of the generator, the last from the generator itself."""
    what = f"x ({B}, {L}, {D}) as query, key and value"

    def draw(g):
        return torch.randn(B, L, D, generator=g)
    return (given(lambda g: draw(_clone(g)), what), given(lambda g: draw(_clone(g)), what),
            given(draw, what))


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

def _dead_rows(key, got, want):
    """`attn_weights`: a row the reference makes uniform because every key is masked may be
    uniform or all zeros, but finite; the other rows are compared as usual."""
    if not key.endswith(".after.attn_weights") or got.shape != want.shape or want.shape[-1] < 2:
        return "default"
    dead = np.ptp(want, axis=-1) == 0
    if not dead.any():
        return "default"
    return masked_rows(key, got, want, dead,
                       "fill the masked scores with a large negative finite number (torch.finfo(dtype).min), not -inf")


# -- the table ------------------------------------------------------------------------------

_W = ("attn_weights",)
_T = "test_MultiHeadAttention_"


def _mha(name, cells, make, calls, what, **kw):
    """A MultiHeadAttention probe: the reference's weights, eval mode, attn_weights after."""
    kw.setdefault("mode", "eval")
    return Probe(name, cells, calls, make=make, load="reference", after=_W, what=what, **kw)


def _qkv(B, Lq, Lk, D, **kw):
    return call(randn(B, Lq, D), randn(B, Lk, D), randn(B, Lk, D), **kw)


EXERCISES = [
    Exercise("split_heads", ref="multihead.split_heads", probes=[
        Probe("shape", ("test_split_heads_shape",),
              [call(randn(2, 5, 12), 3), call(randn(3, 4, 8), 1), call(randn(1, 6, 6), 6)],
              what="(B, L, D) -> (B, H, L, D // H), also for H = 1 and D_h = 1"),
        Probe("values", ("test_split_heads_values",),
              [call(randn(2, 5, 12), 3), call(randn(3, 4, 20), n_heads=5)],
              what="head h of token l = features h*D_h .. (h+1)*D_h - 1 of token l"),
        Probe("random", ("test_split_heads_random",),
              [call(randn(3, 5, 12), 4), call(randn(4, 9, 30), 5), call(randn(5, 2, 20), 1),
               call(randn(2, 7, 16), 8),
               call(randn(2, 3, 18), 6, grad=(0,), backward=randn(2, 6, 3, 3))],
              what="random (B, L, D, H) and the gradient of x"),
    ]),
    Exercise("combine_heads", ref="multihead.combine_heads", probes=[
        Probe("shape", ("test_combine_heads_shape",),
              [call(randn(2, 3, 5, 4)), call(randn(3, 1, 4, 6)), call(randn(1, 4, 2, 1))],
              what="(B, H, L, D_h) -> (B, L, H * D_h), also for H = 1 and D_h = 1"),
        Probe("values", ("test_combine_heads_values",),
              [call(randn(2, 3, 5, 4)), call(randn(3, 4, 2, 3))],
              what="token l's features = [head 0 | head 1 | ...] of that token"),
        Probe("inverse", ("test_combine_heads_inverts_split",),
              [call(randn(3, 4, 5, 2)), call(randn(1, 1, 7, 8)), call(randn(4, 8, 2, 1)),
               call(randn(2, 5, 9, 3), grad=(0,), backward=randn(2, 9, 15))],
              what="random (B, H, L, D_h) and the gradient of x"),
    ]),
    Exercise("MultiHeadAttention", ref="multihead.MultiHeadAttention", probes=[
        # -- structure
        _mha("parameters", (_T + "parameters",), ctor(16, 4), [_qkv(2, 5, 5, 16)],
             "w_q, w_k, w_v, w_o of MultiHeadAttention(16, 4)", params=True),
        _mha("parameters 2 heads", (_T + "parameters",), ctor(16, 2), [_qkv(2, 3, 4, 16)],
             "MultiHeadAttention(16, 2): the number of heads does not change the parameters",
             params=True),
        _mha("parameters no bias", (_T + "parameters", _T + "random"), ctor(12, 3, bias=False),
             [_qkv(2, 4, 6, 12)], "MultiHeadAttention(12, 3, bias=False)", params=True),
        # -- shapes
        _mha("self shapes", (_T + "shapes",), ctor(12, 3), [call(*_same(2, 5, 12))],
             "self-attention, x (2, 5, 12), 3 heads: output and attn_weights shapes"),
        _mha("cross shapes", (_T + "shapes",), ctor(12, 3), [_qkv(2, 5, 7, 12)],
             "cross-attention, Lq=5, Lk=7: output (B, Lq, d) and attn_weights (B, H, Lq, Lk)"),
        # -- values and gradients
        _mha("self", (_T + "matches_torch",), ctor(16, 4),
             [call(*_same(2, 6, 16), grad=(0, 1, 2), backward=randn(2, 6, 16))],
             "self-attention, B=2, L=6, d_model=16, 4 heads, with gradients", param_grads=True),
        _mha("cross", (_T + "cross_attention",), ctor(12, 3),
             [_qkv(3, 4, 9, 12, grad=(0, 1, 2), backward=randn(3, 4, 12))],
             "cross-attention, Lq=4, Lk=9, key != value, with gradients", param_grads=True),
        _mha("cross short keys", (_T + "cross_attention",), ctor(8, 2), [_qkv(2, 7, 3, 8)],
             "cross-attention, Lq=7, Lk=3"),
        # -- masks
        _mha("padding mask", (_T + "masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _pad_mask(2, 6))], "a padding mask (B, 1, Lk), B=2, H=3"),
        _mha("causal mask", (_T + "masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _causal(6))], "a causal mask (L, L)"),
        _mha("decoder mask", (_T + "masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), mask=_decoder(2, 6))], "a decoder mask (B, L, L)"),
        _mha("4-D mask", (_T + "masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _decoder(2, 6, heads_axis=True))], "a 4-D mask (B, 1, L, L)"),
        _mha("per-head mask", (_T + "masks",), ctor(12, 3),
             [call(*_same(2, 6, 12), _per_head(2, 3, 6, 6))], "a per-head mask (B, H, L, L)"),
        _mha("cross padding mask", (_T + "masks",), ctor(12, 3),
             [_qkv(3, 4, 8, 12, mask=_pad_mask(3, 8))],
             "cross-attention with a padding mask (B, 1, Lk) over the source"),
        _mha("fully masked rows", (_T + "masks",), ctor(12, 3, bias=False),
             [call(randn(2, 5, 12), randn(2, 5, 12), _zero_mean(2, 5, 12), _all_padding(2, 5)),
              call(randn(2, 5, 12), randn(2, 5, 12), _zero_mean(2, 5, 12), _decoder_dead(2, 5))],
             "a sequence that is all padding, and a decoder mask with a fully masked query row "
             "(finite, uniform or zero weights)", compare=_dead_rows),
        # -- heads
        _mha("heads of two", (_T + "head_independence",), ctor(8, 4),
             [call(*_same(3, 5, 8))], "d_model=8 with 4 heads of size 2"),
        _mha("many heads", (_T + "head_independence",), ctor(20, 5),
             [_qkv(2, 4, 6, 20)], "d_model=20 with 5 heads of size 4"),
        # -- dropout
        _mha("dropout eval", (_T + "dropout",), ctor(12, 3, dropout=0.5),
             [call(*_same(2, 6, 12)), _qkv(2, 6, 4, 12)],
             "eval mode with dropout=0.5 (dropout must be off)"),
        _mha("dropout train", (_T + "dropout",), ctor(12, 3, dropout=1.0),
             [call(*_same(2, 6, 12))],
             "train mode with dropout=1.0: every weight dropped (the output is w_o's bias), "
             "attn_weights kept before dropout", mode="train"),
        # -- random cases
        _mha("random decoder", (_T + "random",), ctor(24, 6),
             [call(*_same(3, 7, 24), _decoder(3, 7), grad=(0, 1, 2), backward=randn(3, 7, 24))],
             "d_model=24, 6 heads, a decoder mask, with gradients", param_grads=True),
        _mha("random padding no bias", (_T + "random",), ctor(20, 5, bias=False),
             [_qkv(2, 4, 9, 20, mask=_pad_mask(2, 9))],
             "bias=False, cross-attention with a padding mask"),
        _mha("random causal", (_T + "random",), ctor(32, 8),
             [call(*_same(1, 8, 32), _causal(8))], "d_model=32, 8 heads, a causal mask"),
        _mha("random one head", (_T + "random",), ctor(8, 1), [call(*_same(2, 6, 8))],
             "one head"),
        _mha("random one query", (_T + "random",), ctor(40, 10),
             [_qkv(5, 1, 11, 40, mask=_pad_mask(5, 11))],
             "one query against 11 keys, 10 heads, a padding mask"),
    ]),
]
