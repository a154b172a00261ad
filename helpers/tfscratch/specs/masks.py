"""02_masks: what the grader runs on the student's `make_padding_mask`, `make_causal_mask`,
`make_decoder_mask` and the masked `scaled_dot_product_attention`, on inputs drawn for each
grading run.

Masks are compared value for value and must be boolean (`_boolean`: a 0/1 float or an
additive 0/-inf mask fails). Token batches mix right, left and inner padding, have B != L (a
misplaced axis cannot hide), a real token 0 next to a non-zero pad_id, and rows without padding.
A device argument is checked by asking for a device this machine does not have (`ipu`): the
reference fails there, so a function that ignores `device` is caught; the decoder mask's
device is checked with tokens on PyTorch's meta device (shapes only).

Attention: a query row whose keys are all masked may give all-zero or uniform weights
(`_dead_rows`); the values of such probes have zero mean over the keys, so both choices give
the same (zero) output, and their upstream gradient is zero on those rows, so the gradients
agree too, while a NaN (forward or backward) still shows.
"""

ASSIGNMENT = "02_masks"
import numpy as np
import torch

from .engine import Exercise, Input, Probe, call, given, label, masked_rows, randn


# -- inputs ---------------------------------------------------------------------------------

def _clone(g):
    h = torch.Generator()
    h.set_state(g.get_state())
    return h


def _peek(fn, pick, what=""):
    """Part of what `fn` draws, without advancing the generator: the next `_take` of the same
    `fn` draws the very same numbers (two inputs that must agree, e.g. x and its mask)."""
    return given(lambda g: pick(fn(_clone(g))), what)


def _take(fn, pick, what=""):
    return given(lambda g: pick(fn(g)), what)


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
    what = f"x ({B}, {L + extra}, {d}) with large values at the padding"
    return (_peek(build, lambda r: r[0], what), _peek(build, lambda r: r[0], what),
            _peek(build, lambda r: r[0], what),
            _take(build, lambda r: r[1], f"its padding mask ({B}, 1, {L + extra})"))


def _causal(Lq, Lk):
    return given(lambda g: torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq),
                 f"a causal mask ({Lq}, {Lk})")


# -- special comparisons --------------------------------------------------------------------

def _on_meta(inp: Input) -> Input:
    return Input(inp.build, inp.what, device="meta")


def _boolean(key, got, want):
    """A mask must be boolean (a 0/1 float mask has the same truth values)."""
    if want.dtype == np.bool_ and got.dtype != np.bool_:
        extra = (" holding 0 where allowed and -inf (or a large negative number) where blocked: "
                 "an additive mask" if got.dtype.kind == "f" and (got < 0).any() else "")
        return (f"{label(key)} has dtype {got.dtype}{extra}; masks in this course are boolean "
                "(torch.bool), True = may attend")
    return "default"


def _dead_rows(key, got, want):
    """Attention weights: rows the reference leaves all zero (every key masked) may be all
    zeros or uniform, but finite; the other rows are compared as usual."""
    if not key.endswith(".out.1") or got.shape != want.shape or want.ndim < 1:
        return "default"
    dead = (want == 0).all(-1)
    if not dead.any():
        return "default"
    return masked_rows(key, got, want, dead,
                       "such a row must stay finite (a large finite fill value, or zero the row after softmax)")


# -- the table ------------------------------------------------------------------------------

_PAD_CELLS = ("test_make_padding_mask_values", "test_make_padding_mask_in_attention")
_DEC_CELLS = ("test_make_decoder_mask_values", "test_make_decoder_mask_in_attention")
_SDPA = "test_scaled_dot_product_attention_"

EXERCISES = [
    Exercise("make_padding_mask", ref="masks.make_padding_mask", probes=[
        Probe("shape", ("test_make_padding_mask_shape",),
              [call(_tokens(3, 7, 0)), call(_tokens(5, 2, 0))],
              compare=_boolean, what="(B, L) tokens with B != L -> (B, 1, L) boolean"),
        Probe("values", _PAD_CELLS,
              [call(_tokens(4, 9, 0)), call(_tokens(3, 6, 3), pad_id=3),
               call(_tokens(4, 5, 7), 7)],
              compare=_boolean,
              what="left, right and inner padding, pad_id=0, 3 and 7 (real ids below pad_id)"),
        Probe("batches", ("test_make_padding_mask_in_attention",),
              [call(_tokens(5, 11, 0)), call(_tokens(4, 4, 1), pad_id=1),
               call(_tokens(1, 8, 0)), call(_tokens(6, 3, 13), pad_id=13)],
              compare=_boolean, what="other batch sizes and lengths, B == L included"),
    ]),
    Exercise("make_causal_mask", ref="masks.make_causal_mask", probes=[
        Probe("values", ("test_make_causal_mask_values",), [call(5), call(6)],
              compare=_boolean, what="sizes 5 and 6: lower triangle with the diagonal"),
        Probe("sizes", ("test_make_causal_mask_sizes", "test_make_causal_mask_in_attention"),
              [call(n) for n in (1, 2, 3, 9, 17, 33)],
              compare=_boolean, what="sizes 1, 2, 3, 9, 17 and 33"),
        Probe("device", ("test_make_causal_mask_device",),
              [call(4, device="cpu"), call(3, device=None), call(2, "cpu"),
               call(4, device="ipu", raises=True)],
              compare=_boolean,
              what="device='cpu', device=None, and device='ipu' (a device this machine lacks: "
                   "a mask created there fails, one that ignores `device` does not)"),
    ]),
    Exercise("make_decoder_mask", ref="masks.make_decoder_mask", probes=[
        Probe("shape", ("test_make_decoder_mask_shape", "test_make_decoder_mask_device"),
              [call(_tokens(4, 6, 0)), call(_tokens(2, 1, 0)), call(_tokens(3, 2, 5), pad_id=5)],
              compare=_boolean, what="(B, L) tokens with B != L, L = 1 and L = 2 -> (B, L, L) "
                                     "boolean"),
        Probe("values", _DEC_CELLS,
              [call(_tokens(4, 7, 0)), call(_tokens(3, 8, 2), pad_id=2), call(_tokens(3, 5, 6), 6)],
              compare=_boolean,
              what="causal AND key padding, left/right/inner padding, pad_id=0, 2 and 6"),
        Probe("meta device", ("test_make_decoder_mask_device",),
              [call(_on_meta(_tokens(3, 5, 0)))],
              what="tokens on PyTorch's meta device (shapes, no values): the mask must be made "
                   "on the tokens' device, the causal part included"),
        Probe("batches", ("test_make_decoder_mask_in_attention",),
              [call(_tokens(5, 10, 0)), call(_tokens(2, 2, 3), pad_id=3),
               call(_tokens(1, 12, 1), pad_id=1), call(_tokens(6, 6, 0))],
              compare=_boolean, what="other batch sizes and lengths, B == L included"),
    ]),
    Exercise("scaled_dot_product_attention", ref="masks.scaled_dot_product_attention", probes=[
        Probe("no mask", (_SDPA + "no_mask",),
              [call(randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6)),
               call(randn(2, 4, 8), randn(2, 7, 8), randn(2, 7, 3), mask=None),
               call(randn(2, 3, 5, 4), randn(2, 3, 6, 4), randn(2, 3, 6, 2))],
              what="mask omitted and mask=None, Lq != Lk, d_v != d_k, 3-D and 4-D"),
        Probe("masked", (_SDPA + "masked_weights",),
              [call(randn(2, 4, 8), randn(2, 6, 8), randn(2, 6, 5), _mask(2, 4, 6),
                    grad=(0, 1, 2), backward=randn(2, 4, 5), backward_of="0"),
               call(randn(3, 5, 16, scale=2.0), randn(3, 9, 16, scale=2.0), randn(3, 9, 4),
                    mask=_mask(3, 5, 9))],
              what="a (B, Lq, Lk) mask, large scores, and the gradients of q, k, v"),
        Probe("broadcast", (_SDPA + "broadcast",),
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
        Probe("fully masked", (_SDPA + "fully_masked",),
              [call(randn(2, 3, 4), randn(2, 5, 4), _v(2, 5, 3),
                    _dead_mask((2, 3, 5), [(0, 1), (1, 2)]), grad=(0, 1, 2),
                    backward=_upstream((2, 3, 3), [(0, 1), (1, 2)]), backward_of="0"),
               call(randn(2, 4, 6), randn(2, 4, 6), _v(2, 4, 3),
                    given(lambda g: torch.tensor([[[True, True, False, False]],
                                                  [[False, False, False, False]]]),
                          "a padding mask whose second sequence is all padding"),
                    grad=(0, 1, 2), backward=_upstream((2, 4, 3), [(1,)]), backward_of="0")],
              compare=_dead_rows,
              what="query rows with every key masked, and a sequence that is all padding "
                   "(forward and gradients finite)"),
        Probe("padding", (_SDPA + "padding",),
              [call(*_pad_batch(3, 5, 8, 3)), call(*_pad_batch(4, 6, 16, 2))],
              what="self-attention over right-padded sequences whose pads hold large values"),
        Probe("random", (_SDPA + "random",),
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
              compare=_dead_rows,
              what="random shapes, causal masks with Lq != Lk, head-axis masks, random masks "
                   "with fully masked rows"),
    ]),
]
