"""02_masks: what the grader runs on the student's `make_padding_mask`, `make_causal_mask`,
`make_decoder_mask` and the masked `scaled_dot_product_attention`, on inputs drawn for each
grading run.

Masks are compared value for value and must be boolean (the engine's rule for a boolean
reference: a 0/1 float or an additive 0/-inf mask fails). Token batches mix right, left and inner padding, have B != L (a
misplaced axis cannot hide), a real token 0 next to a non-zero pad_id, and rows without padding.
A device argument is checked by asking for a device this machine does not have (`ipu`): the
reference fails there, so a function that ignores `device` is caught; the decoder mask's
device is checked with tokens on PyTorch's meta device (shapes only).

Attention: a query row whose keys are all masked may give all-zero or uniform weights
(`DEAD_ROWS`, a declared property of the probe); the values of such probes have zero mean over the keys, so both choices give
the same (zero) output, and their upstream gradient is zero on those rows, so the gradients
agree too, while a NaN (forward or backward) still shows.
"""

ASSIGNMENT = "02_masks"

import math

import numpy as np
import torch

from .engine import (DeadRows, Exercise, Input, Probe, call, given, grades, like, randn, sample,
                     shapes, when)

# the weights (the second output): the reference's fully masked rows are all zeros
DEAD_ROWS = DeadRows(".out.1", "zeros",
                     "such a row must stay finite (a large finite fill value, or zero the row after softmax)")


# -- inputs ---------------------------------------------------------------------------------

def _tokens(B, L, pad_id, vocab=12):
    """(B, L) ids: row 0 unpadded (with a real token 0), row 1 left-padded, row 2 padded
    inside, the others right-padded; every row keeps at least one real token."""
    def build(g):
        ids = torch.randint(0, vocab, (B, L), generator=g)
        ids = torch.where(ids == pad_id, ids + 1, ids)
        if pad_id != 0 and L > 1:
            ids[0, 1] = 0                       # a real token below pad_id
        real = torch.ones(B, L, dtype=torch.bool)
        for b in range(1, B):
            n = int(torch.randint(1, L, (1,), generator=g)) if L > 1 else 1  # real tokens
            if b == 1:
                real[b, :L - n] = False         # left padding
            elif b == 2 and L > 2:
                real[b] = torch.rand(L, generator=g) < 0.5
                real[b, 0] = True
                real[b, -1] = False             # padding inside and at the end
            else:
                real[b, n:] = False             # right padding
        return torch.where(real, ids, torch.full_like(ids, pad_id))
    return given(build, f"tokens ({B}, {L}) with left, right and inner padding, pad_id={pad_id}")


def _partial(g, shape):
    """A random boolean mask whose every row keeps at least one key and hides at least one."""
    Lk = shape[-1]
    m = torch.rand(*shape, generator=g) < 0.5
    first = torch.randint(0, Lk, shape[:-1], generator=g)
    m.scatter_(-1, first.unsqueeze(-1), True)
    other = (first + 1 + torch.randint(0, Lk - 1, shape[:-1], generator=g)) % Lk
    m.scatter_(-1, other.unsqueeze(-1), False)
    return m


def _mask(*shape):
    return given(lambda g: _partial(g, shape), f"a mask {shape}")


def _v(*shape):
    """Values with zero mean over the keys (axis -2): a fully masked row then has the same
    output (zero) with all-zero and with uniform weights."""
    def build(g):
        v = torch.randn(*shape, generator=g)
        return v - v.mean(-2, keepdim=True)
    return given(build, f"values {shape} with zero mean over the keys")


def _dead_mask(shape, dead):
    """A partial mask with the query rows `dead` (index tuples) fully masked."""
    def build(g):
        m = _partial(g, shape)
        for r in dead:
            m[r] = False
        return m
    return given(build, f"a mask {shape} with fully masked rows")


def _upstream(shape, dead):
    """An upstream gradient that is zero on the fully masked rows `dead`."""
    def build(g):
        t = torch.randn(*shape, generator=g)
        for r in dead:
            t[r] = 0.0
        return t
    return given(build, f"an upstream gradient {shape}")


def _pad_batch(B, L, d, extra):
    """(x, padding mask): B sequences right-padded to L + extra, the pads 50x larger."""
    def build(g):
        n = torch.randint(1, L + 1, (B,), generator=g)
        n[0] = L
        real = torch.arange(L + extra)[None, :] < n[:, None]
        x = torch.randn(B, L + extra, d, generator=g)
        return torch.where(real[..., None], x, 50 * x), real.unsqueeze(1)
    s = sample(build, f"x ({B}, {L + extra}, {d}) with large values at the padding, and its mask")
    return s[0], s[0], s[0], s[1]            # self-attention: x as query, key and value


def _causal(Lq, Lk):
    return given(lambda g: torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq),
                 f"a causal mask ({Lq}, {Lk})")


# -- special comparisons --------------------------------------------------------------------

def _on_meta(inp: Input) -> Input:
    return Input(inp.build, inp.what, device="meta")


# -- diagnoses ------------------------------------------------------------------------------

def _crash(pattern, message):
    return when(message, lambda e: pattern in e.error)


CRASHES = [   # what the student's code raised -> the likely mask mistake
    _crash("full()", "torch.full takes the size as ONE tuple, then the fill value: "
           "torch.full((L, L), True). The seed notes' `torch.full(1, L, L).float('-inf')` fails "
           "exactly like this."),
    _crash("diagnoal", "`diagnoal` is misspelt: the keyword is `diagonal`."),
    _crash("Boolean value of Tensor", "`if mask:` asks Python for the truth value of a whole "
           "tensor; write `if mask is not None:`."),
    _crash("with a bool tensor is not supported", "`1 - mask` and `-mask` do not work on a "
           "boolean mask: use `~mask` (or mask.logical_not()) to flip it."),
    _crash("does not match the shape of the indexed tensor", "Boolean indexing (scores[~mask] = "
           "...) needs a mask of exactly the scores' shape, but a mask only has to broadcast: use "
           "scores.masked_fill(~mask, value), which broadcasts."),
    _crash("unexpected keyword argument 'mask'", "Give the function a fourth parameter `mask=None`."),
    _crash("unexpected keyword argument 'device'", "make_causal_mask takes `device=None` and "
           "creates the mask there."),
    _crash("unexpected keyword argument 'pad_id'", "The signature is (tokens, pad_id=0)."),
    _crash("missing 1 required positional argument: 'mask'", "mask must be optional: give the "
           "fourth parameter a default, `mask=None`, and skip the masking when it is None."),
    _crash("positional argument", "Check the signature the exercise gives: "
           "scaled_dot_product_attention(q, k, v, mask=None), make_padding_mask(tokens, pad_id=0), "
           "make_causal_mask(size, device=None), make_decoder_mask(tokens, pad_id=0)."),
    _crash("is not on the expected device", "Tensors on different devices were combined: "
           "create the causal mask on the tokens' device, make_causal_mask(L, device=tokens.device)."),
    _crash("Expected all tensors to be on the same device", "Create the causal mask on the "
           "tokens' device: make_causal_mask(L, device=tokens.device)."),
    _crash("Mismatch in shape", "the weights have more axes than the scores: do not unsqueeze "
           "the mask inside attention (a (B, 1, Lk) mask made 4-D meets 3-D scores as "
           "(B, B, Lq, Lk)); masked_fill broadcasts it as it is."),
    _crash("The size of tensor a", "A mask did not broadcast against the scores: a mask is "
           "(B, 1, Lk), (Lq, Lk), (B, Lq, Lk) or 4-D with a head axis; do not reshape or unsqueeze "
           "it inside attention."),
]


def _first(e):
    """The student's first captured output (a numpy array), or None."""
    outs = e.outs()
    return outs[0][0] if outs else None


def _additive(e):
    g = _first(e)
    return g is not None and g.dtype.kind == "f" and bool((g < 0).any())


def _dtype(dt):
    return when(f"the mask has dtype torch.{dt}; masks in this course are boolean (torch.bool), "
                "True = may attend. A number mask breaks `~mask` (bitwise NOT of 1 is -2) and "
                "gives wrong results when added to scores: return a comparison, or add .bool().",
                lambda e: _first(e) is not None and _first(e).dtype == np.dtype(dt))


DTYPES = [
    when("you returned an additive float mask: 0 where allowed and -inf (or a big negative "
         "number) where blocked, as in the seed notes. In this course masks are boolean, True = "
         "may attend; attention turns them into -inf itself (masked_fill). Return a boolean "
         "tensor, e.g. `tokens != pad_id` or torch.tril(...) of a bool tensor.", _additive),
] + [_dtype(dt) for dt in ("float32", "float64", "float16", "int64", "int32", "uint8")]


def _pad(t, pad_id=0):
    return (t != pad_id).unsqueeze(1)


def _right_padded(t, pad_id=0):
    n = (t != pad_id).sum(1, keepdim=True)
    return (torch.arange(t.size(1)) < n).unsqueeze(1)


PADDING_DIAGNOSES = CRASHES + DTYPES + [
    like("the mask is (B, Lk): the query axis is missing. Against scores (B, Lq, Lk) a (B, Lk) "
         "mask lines up from the right as (1, B, Lk), so the batch axis lands on the query axis: "
         "an error when B != Lq, silently wrong rows when B == Lq. Add the axis: "
         "(tokens != pad_id).unsqueeze(1) -> (B, 1, Lk).", lambda t, pad_id=0: t != pad_id),
    like("the mask is (B, Lk, 1): it varies along the QUERY axis, so it blanks whole query rows "
         "instead of hiding the padded keys (columns). Put the new axis in the middle: "
         "unsqueeze(1) -> (B, 1, Lk).", lambda t, pad_id=0: (t != pad_id).unsqueeze(-1)),
    like("the mask is (B, 1, 1, Lk), the multi-head form. Against single-head scores "
         "(B, Lq, Lk) it broadcasts to (B, B, Lq, Lk): every batch element gets every other "
         "one's mask. Return (B, 1, Lk); multi-head attention (notebook 03) adds the head axis "
         "itself.", lambda t, pad_id=0: (t != pad_id)[:, None, None, :]),
    like("you expanded the mask to (B, Lk, Lk). That only works when Lq == Lk; cross-attention "
         "has queries of another length. Keep the query axis of size 1, (B, 1, Lk), and let "
         "broadcasting stretch it.",
         lambda t, pad_id=0: _pad(t, pad_id).expand(t.size(0), t.size(1), t.size(1))),
    like("True where the token IS padding: the opposite convention. Here True = may attend, "
         "i.e. a real token: tokens != pad_id. (PyTorch's key_padding_mask uses True = ignore; "
         "do not mix the two.)", lambda t, pad_id=0: (t == pad_id).unsqueeze(1)),
    like("you compared with 0, not with pad_id: use tokens != pad_id.", lambda t, pad_id=0: _pad(t, 0)),
    like("tokens > pad_id treats every id below pad_id as padding; only ids equal to pad_id are "
         "padding: tokens != pad_id.", lambda t, pad_id=0: (t > pad_id).unsqueeze(1)),
    like("you assumed the padding sits at the end (counted the real tokens, then compared "
         "positions with that length). Left-padded and inner-padded rows exist: compare each "
         "token with pad_id.", _right_padded),
]


def _tri(fn):
    """A wrong causal mask: fn of the (size, size) boolean ones."""
    return lambda size, device=None: fn(torch.ones(size, size, dtype=torch.bool))


def _plain_shape_wrong(e):
    g, w = (e.outs() or [(None, None)])[0]
    return g is not None and g.shape in ((1,) + w.shape, (1, 1) + w.shape)


CAUSAL_DIAGNOSES = CRASHES + DTYPES + [
    when("the device argument is ignored: the mask was not created on the device asked for "
         "(here device='ipu', which this machine lacks, so a mask made there fails). Create the "
         "tensor there, e.g. torch.ones(size, size, dtype=torch.bool, device=device); otherwise "
         "the mask stays on the CPU while the scores are on the GPU and masked_fill fails.",
         lambda e: "should raise an error but returned normally" in e.problem, probes=("device",)),
    when("the mask must be the plain (size, size) matrix; broadcasting adds the batch and head "
         "axes where they are needed (the seed notes keep a (1, 1, L, L) buffer and then slice "
         "it with only three indices, which goes wrong): return the plain (size, size) one.",
         _plain_shape_wrong),
    like("True ABOVE the diagonal marks the future: that is the set of positions to HIDE (the "
         "seed notes' -inf convention, triu(diagonal=1)). Here True = may attend: keep the "
         "diagonal and everything below, torch.tril(...).", _tri(lambda o: o.triu(1))),
    like("the diagonal is missing: position i must see itself (keys 0..i inclusive). Without it "
         "row 0 has no key left: a fully masked row, NaN in a plain softmax. Use tril with "
         "diagonal=0.", _tri(lambda o: o.tril(-1))),
    like("upper triangle including the diagonal: every position sees itself and the FUTURE, not "
         "the past. Use torch.tril (lower triangle).", _tri(lambda o: o.triu())),
    like("this is the seed notes' triu(..., diagonal=-1) bug: it keeps the main diagonal and the "
         "one below it in the blocked part, so every token is blind to itself and its "
         "predecessor, and rows 0 and 1 are fully masked (NaN). Causal = tril, diagonal=0.",
         _tri(lambda o: ~o.triu(-1))),
    like("it is the blocked set of the seed notes' triu(diagonal=-1) bug: True above and on the "
         "diagonal and one below. Causal = torch.tril(ones(size, size, dtype=torch.bool)).",
         _tri(lambda o: o.triu(-1))),
    like("diagonal=1 lets position i see position i + 1: one token of the future leaks. Use "
         "diagonal=0 (the default).", _tri(lambda o: o.tril(1))),
    like("every entry is True: nothing is masked. Query i may attend to keys 0..i: "
         "torch.tril(torch.ones(size, size, dtype=torch.bool)).", _tri(lambda o: o)),
]


def _dec(fn):
    """A wrong decoder mask: fn(key padding (B, 1, L), query padding (B, L, 1), causal (L, L))."""
    def wrong(t, pad_id=0):
        real = t != pad_id
        return fn(real[:, None, :], real[:, :, None], torch.ones(t.size(1), t.size(1), dtype=torch.bool).tril())
    return wrong


def _full(k, c):
    return k.expand(-1, c.size(0), -1) & c


DECODER_DIAGNOSES = CRASHES + DTYPES + [
    like("the mask has the multi-head form (B, 1, L, L). Return (B, L, L); multi-head attention "
         "adds the head axis (unsqueeze(1)) itself.", _dec(lambda k, q, c: (k & c).unsqueeze(1))),
    like("you returned only the padding mask (B, 1, L): the causal part is missing. Combine it "
         "with the causal (L, L) mask: (B, 1, L) & (L, L) broadcasts to (B, L, L).",
         _dec(lambda k, q, c: k)),
    like("the padding part is missing: that is only the causal mask, the same for every "
         "sequence, so padded keys are visible. AND the key-padding mask (B, 1, L) in to get "
         "(B, L, L).", _dec(lambda k, q, c: c.expand(k.size(0), -1, -1))),
    like("the padding part is missing: that is only the causal mask, the same for every "
         "sequence, so padded keys are visible. AND the key-padding mask (B, 1, L) in to get "
         "(B, L, L).", _dec(lambda k, q, c: c)),
    like("the opposite convention: True where attention is blocked. Here True = may attend.",
         _dec(lambda k, q, c: ~(k & c))),
    like("you combined the two masks with OR (|): a key must be real AND not in the future, so "
         "combine with &.", _dec(lambda k, q, c: k | c)),
    like("you also masked the query rows at padding positions (pad & pad^T & causal). The spec "
         "masks keys only: a pad position's row keeps its causal keys (its output is ignored by "
         "the loss anyway), while blanking whole rows invites the fully-masked-row NaN.",
         _dec(lambda k, q, c: q & k & c)),
    like("you masked the QUERIES instead of the keys: the padding part must vary along the last "
         "axis (keys), (B, 1, L), not (B, L, 1).", _dec(lambda k, q, c: q & c)),
    like("the causal part is missing: every token sees the future (only the padding mask, "
         "expanded).", _dec(lambda k, q, c: _full(k, torch.ones_like(c)))),
    like("the causal part is upside down (triu): tokens see the future instead of the past.",
         _dec(lambda k, q, c: k & c.T)),
    like("the diagonal is missing from the causal part: each token must see itself.",
         _dec(lambda k, q, c: k & c.tril(-1))),
    like("the padding was compared with 0 instead of pad_id: pass pad_id on to "
         "make_padding_mask(tokens, pad_id).",
         lambda t, pad_id=0: _dec(lambda k, q, c: k & c)(t, 0) if pad_id != 0 else None),
]


def _weights(fn, big=-1e9):
    """A wrong attention: its weights from fn(scores, mask broadcast to them, d_k)."""
    def wrong(q, k, v, mask=None):
        if mask is None:
            return None
        s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.size(-1))
        return fn(s, mask.expand_as(s), q.size(-1))
    return wrong


ATTENTION_DIAGNOSES = CRASHES + [
    when("the gradient is NaN (or missing) although the forward pass is finite. An additive "
         "-inf mask followed by nan_to_num hides the NaN going forward, but it flows back "
         "through the addition into the scores and poisons every parameter. Use "
         "scores.masked_fill(~mask, ...) (its backward blocks masked entries) or a finite fill "
         "value.", lambda e: "NaN" in e.problem and "gradient" in e.problem),
    when("a query row whose keys are all masked gave NaN: softmax over a row of -inf computes "
         "exp(-inf - (-inf)) = exp(NaN), 0/0. Fill with a large finite negative number "
         "(torch.finfo(scores.dtype).min or -1e9: the row then becomes uniform), or set such "
         "rows to zero after softmax (torch.where(mask.any(-1, keepdim=True), weights, 0.0)).",
         lambda e: "NaN" in e.problem),
    like("the mask was ignored: masked keys still get weight.",
         _weights(lambda s, m, d: torch.softmax(s, -1)), out="1"),
    like("you blocked the keys where the mask is True. True means MAY attend: fill where the "
         "mask is False, scores.masked_fill(~mask, ...). (PyTorch's key_padding_mask uses the "
         "opposite convention; do not mix them.)",
         _weights(lambda s, m, d: torch.softmax(s.masked_fill(m, -1e9), -1)), out="1"),
    like("the masked scores were set to 0 (masked_fill(~mask, 0) or scores * mask), but "
         "exp(0) = 1: masked keys still get weight. Fill with -inf or a very negative number.",
         _weights(lambda s, m, d: torch.softmax(s.masked_fill(~m, 0.0), -1)), out="1"),
    like("you zeroed the weights after softmax without renormalising, so rows no longer sum to "
         "1. Mask the SCORES before softmax.",
         _weights(lambda s, m, d: torch.softmax(s, -1) * m), out="1"),
    like("you added the boolean mask to the scores (True counts as +1). A boolean mask is not "
         "additive: use scores.masked_fill(~mask, -inf), or turn it into 0 / -inf first.",
         _weights(lambda s, m, d: torch.softmax(s + m.double(), -1)), out="1"),
    like("the scores are not divided by sqrt(d_k).",
         _weights(lambda s, m, d: torch.softmax((s * math.sqrt(d)).masked_fill(~m, -1e9), -1)),
         out="1"),
    like("softmax ran over the query axis (dim=-2); it must run over the keys, dim=-1.",
         _weights(lambda s, m, d: torch.softmax(s.masked_fill(~m, -1e9), -2)), out="1"),
]


# -- the table ------------------------------------------------------------------------------

_PAD_CELLS = ("values", "in_attention")
_DEC_CELLS = ("values", "in_attention")

EXERCISES = [
    Exercise("make_padding_mask", ref="masks.make_padding_mask",
             graded=grades(shape=1, values=2, in_attention=(2, 8121)),
             diagnose=PADDING_DIAGNOSES, probes=[
        Probe("shape", (shapes("shape"),),
              [call(_tokens(3, 7, 0)), call(_tokens(5, 2, 0))],
              what="(B, L) tokens with B != L -> (B, 1, L) boolean"),
        Probe("values", _PAD_CELLS,
              [call(_tokens(4, 9, 0)), call(_tokens(3, 6, 3), pad_id=3),
               call(_tokens(4, 5, 7), 7)],
              what="left, right and inner padding, pad_id=0, 3 and 7 (real ids below pad_id)"),
        Probe("batches", ("in_attention",),
              [call(_tokens(5, 11, 0)), call(_tokens(4, 4, 1), pad_id=1),
               call(_tokens(1, 8, 0)), call(_tokens(6, 3, 13), pad_id=13)],
              what="other batch sizes and lengths, B == L included"),
    ]),
    Exercise("make_causal_mask", ref="masks.make_causal_mask",
             graded=grades(values=2, sizes=1, device=1, in_attention=(1, 5150)),
             diagnose=CAUSAL_DIAGNOSES, probes=[
        Probe("values", ("values",), [call(5), call(6)],
              what="sizes 5 and 6: lower triangle with the diagonal"),
        Probe("sizes", (shapes("sizes"), "in_attention"),
              [call(n) for n in (1, 2, 3, 9, 17, 33)],
              what="sizes 1, 2, 3, 9, 17 and 33"),
        Probe("device", (shapes("device"),),
              [call(4, device="cpu"), call(3, device=None), call(2, "cpu"),
               call(4, device="ipu", raises=True)],
              what="device='cpu', device=None, and device='ipu' (a device this machine lacks: "
                   "a mask created there fails, one that ignores `device` does not)"),
    ]),
    Exercise("make_decoder_mask", ref="masks.make_decoder_mask",
             graded=grades(shape=1, values=2, device=1, in_attention=(2, 2718)),
             diagnose=DECODER_DIAGNOSES, probes=[
        Probe("shape", (shapes("shape"), shapes("device")),
              [call(_tokens(4, 6, 0)), call(_tokens(2, 1, 0)), call(_tokens(3, 2, 5), pad_id=5)],
              what="(B, L) tokens with B != L, L = 1 and L = 2 -> (B, L, L) "
                                     "boolean"),
        Probe("values", _DEC_CELLS,
              [call(_tokens(4, 7, 0)), call(_tokens(3, 8, 2), pad_id=2), call(_tokens(3, 5, 6), 6)],
              what="causal AND key padding, left/right/inner padding, pad_id=0, 2 and 6"),
        Probe("meta device", (shapes("device"),),
              [call(_on_meta(_tokens(3, 5, 0)))],
              what="tokens on PyTorch's meta device (shapes, no values): the mask must be made "
                   "on the tokens' device, the causal part included"),
        Probe("batches", ("in_attention",),
              [call(_tokens(5, 10, 0)), call(_tokens(2, 2, 3), pad_id=3),
               call(_tokens(1, 12, 1), pad_id=1), call(_tokens(6, 6, 0))],
              what="other batch sizes and lengths, B == L included"),
    ]),
    Exercise("scaled_dot_product_attention", ref="masks.scaled_dot_product_attention", returns=("output", "weights"),
             graded=grades(no_mask=1, masked_weights=2, broadcast=2, fully_masked=2, padding=1,
                           random=(2, 6021)),
             shortcuts=("attention",), diagnose=ATTENTION_DIAGNOSES, probes=[
        Probe("no mask", ("no_mask",),
              [call(randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6)),
               call(randn(2, 4, 8), randn(2, 7, 8), randn(2, 7, 3), mask=None),
               call(randn(2, 3, 5, 4), randn(2, 3, 6, 4), randn(2, 3, 6, 2))],
              what="mask omitted and mask=None, Lq != Lk, d_v != d_k, 3-D and 4-D"),
        Probe("masked", ("masked_weights",),
              [call(randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5), _mask(2, 4, 6),
                    grad=(0, 1, 2), backward=randn(2, 4, 5), backward_of="0"),
               call(randn(3, 5, 16, scale=2.0), randn(3, 9, 16, scale=2.0), randn(3, 9, 4),
                    mask=_mask(3, 5, 9))],
              what="a (B, Lq, Lk) mask, large scores, and the gradients of q, k, v"),
        Probe("broadcast", ("broadcast",),
              [call(randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5), _mask(2, 1, 6)),
               call(randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5), _mask(4, 6)),
               call(randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5), _mask(2, 4, 6)),
               call(randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5), _mask(2, 1, 1, 6)),
               call(randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5), _mask(2, 1, 4, 6)),
               call(randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5), _mask(4, 6)),
               call(randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 5), _mask(2, 3, 4, 6)),
               call(randn(5, 8), randn(7, 8), randn(7, 3), _mask(5, 7))],
              what="masks (B, 1, Lk), (Lq, Lk), (B, Lq, Lk) on 3-D scores; (B, 1, 1, Lk), "
                   "(B, 1, Lq, Lk), (Lq, Lk), (B, H, Lq, Lk) on 4-D scores; no batch axis"),
        Probe("fully masked", ("fully_masked",),
              [call(randn(2, 3, 4), randn(2, 5, 4), _v(2, 5, 3),
                    _dead_mask((2, 3, 5), [(0, 1), (1, 2)]), grad=(0, 1, 2),
                    backward=_upstream((2, 3, 3), [(0, 1), (1, 2)]), backward_of="0"),
               call(randn(2, 4, 6), randn(2, 4, 6), _v(2, 4, 3),
                    given(lambda g: torch.tensor([[[True, True, False, False]],
                                                  [[False, False, False, False]]]),
                          "a padding mask whose second sequence is all padding"),
                    grad=(0, 1, 2), backward=_upstream((2, 4, 3), [(1,)]), backward_of="0")],
              dead_rows=DEAD_ROWS,
              what="query rows with every key masked, and a sequence that is all padding "
                   "(forward and gradients finite)"),
        Probe("padding", ("padding",),
              [call(*_pad_batch(3, 5, 8, 3)), call(*_pad_batch(4, 6, 16, 2))],
              what="self-attention over right-padded sequences whose pads hold large values"),
        Probe("random", ("random",),
              [call(randn(3, 6, 16, scale=2.0), randn(3, 6, 16, scale=2.0), randn(3, 6, 4),
                    _causal(6, 6)),
               call(randn(2, 4, 5, 8, scale=2.0), randn(2, 4, 9, 8, scale=2.0),
                    randn(2, 4, 9, 8), _mask(2, 1, 1, 9)),
               call(randn(4, 3, 4, scale=2.0), randn(4, 5, 4, scale=2.0), _v(4, 5, 6),
                    given(lambda g: torch.rand(4, 3, 5, generator=g) < 0.4,
                          "a random (4, 3, 5) mask")),
               call(randn(2, 3, 7, 32), randn(2, 3, 7, 32), _v(2, 3, 7, 5),
                    given(lambda g: torch.rand(2, 3, 7, 7, generator=g) < 0.5,
                          "a random (2, 3, 7, 7) mask")),
               call(randn(4, 8, scale=2.0), randn(11, 8, scale=2.0), randn(11, 3),
                    _causal(4, 11)),
               call(randn(5, 1, 12), randn(5, 8, 12), randn(5, 8, 2), _mask(5, 1, 8))],
              dead_rows=DEAD_ROWS,
              what="random shapes, causal masks with Lq != Lk, head-axis masks, random masks "
                   "with fully masked rows"),
    ]),
]
