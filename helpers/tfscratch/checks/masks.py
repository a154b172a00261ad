"""Checks for notebook 02_masks: `make_padding_mask`, `make_causal_mask`, `make_decoder_mask`
and `scaled_dot_product_attention` with its `mask` argument.

Convention (COURSE_SPEC): masks are boolean, True = may attend, broadcastable to the scores
(..., Lq, Lk). A query row whose keys are all masked must stay finite; its weights may be all
zeros or uniform.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..reference import make_causal_mask as ref_causal
from ..reference import make_decoder_mask as ref_decoder
from ..reference import make_padding_mask as ref_padding
from ..reference import scaled_dot_product_attention as ref_sdpa
from .core import _unpack
from .core import CheckFailed, ShortcutUsed, call, check_close, check_shape, check_true, fail, \
    passed, seeded

ATT = ("attention",)  # F.scaled_dot_product_attention is forbidden inside the attention exercise

# Crash messages that point at a mask-specific mistake.
_HINTS = [
    ("full()", "torch.full takes the size as ONE tuple, then the fill value: "
     "torch.full((L, L), True). The seed notes' `torch.full(1, L, L).float('-inf')` fails "
     "exactly like this."),
    ("diagnoal", "`diagnoal` is misspelt: the keyword is `diagonal`."),
    ("Boolean value of Tensor", "`if mask:` asks Python for the truth value of a whole tensor; "
     "write `if mask is not None:`."),
    ("with a bool tensor is not supported", "`1 - mask` and `-mask` do not work on a boolean "
     "mask: use `~mask` (or mask.logical_not()) to flip it."),
    ("does not match the shape of the indexed tensor", "Boolean indexing (scores[~mask] = ...) "
     "needs a mask of exactly the scores' shape. A mask only has to be broadcastable: use "
     "scores.masked_fill(~mask, value), which broadcasts."),
    ("unexpected keyword argument 'mask'", "Give the function a fourth parameter `mask=None`."),
    ("positional argument", "Check the signature the exercise gives: "
     "scaled_dot_product_attention(q, k, v, mask=None), make_padding_mask(tokens, pad_id=0), "
     "make_causal_mask(size, device=None), make_decoder_mask(tokens, pad_id=0)."),
    ("unexpected keyword argument 'device'", "make_causal_mask takes `device=None` and creates "
     "the mask there."),
    ("unexpected keyword argument 'pad_id'", "The signature is (tokens, pad_id=0)."),
    ("is not on the expected device", "Tensors on different devices were combined: create the "
     "causal mask on the tokens' device, make_causal_mask(L, device=tokens.device)."),
    ("Expected all tensors to be on the same device", "Create the causal mask on the tokens' "
     "device: make_causal_mask(L, device=tokens.device)."),
    ("The size of tensor a", "A mask did not broadcast against the scores: a mask must be "
     "(B, 1, Lk), (Lq, Lk), (B, Lq, Lk) or 4-D with a head axis; do not reshape or unsqueeze "
     "it inside attention."),
]


def _call(fn, *args, what=None, shortcuts=(), **kwargs):
    """`call`, plus a sentence about the likely mask mistake when the student's code crashes."""
    try:
        return call(fn, *args, shortcuts=shortcuts, what=what, **kwargs)
    except ShortcutUsed:
        raise
    except CheckFailed as e:
        msg = str(e)
        extra = [h for pat, h in _HINTS if pat in msg and h not in msg]
        if extra:
            raise CheckFailed(msg + "\n" + extra[0]) from e
        raise


def _fmt(m: torch.Tensor) -> str:
    """A small boolean mask as rows of 1/0 for messages."""
    m = m.detach().cpu()
    if m.dim() == 1:
        m = m.unsqueeze(0)
    rows = m.reshape(-1, m.shape[-1])[:8]
    return "\n".join("    " + " ".join("1" if bool(x) else "0" for x in r) for r in rows)


def _is(actual, expected) -> bool:
    try:
        return tuple(actual.shape) == tuple(expected.shape) and bool((actual == expected).all())
    except RuntimeError:
        return False


def _check_bool(m, what: str):
    """The mask is a boolean tensor; diagnose additive float masks and 0/1 numbers."""
    if not isinstance(m, torch.Tensor):
        fail(f"{what} should return a tensor, got {type(m).__name__}.")
    if m.dtype == torch.bool:
        return
    if m.device.type != "meta":
        vals = m.detach().double().unique()
        shown = [round(v, 3) if math.isfinite(v) else v for v in vals.tolist()[:4]]
        if bool((vals < 0).any()) or not bool(torch.isfinite(vals).all()):
            fail(f"{what} returned an additive float mask (dtype {m.dtype}, values {shown}): 0 "
                 "where allowed and -inf (or a big negative number) where blocked, as in the "
                 "seed notes. In this course masks are boolean, True = may attend; attention "
                 "turns them into -inf itself (masked_fill). Return a boolean tensor, e.g. a "
                 "comparison such as `tokens != pad_id` or torch.tril(...) of a bool tensor.")
    fail(f"{what} returned dtype {m.dtype}; masks in this course are boolean (torch.bool), "
         "True = may attend. A 0/1 number mask breaks `~mask` (bitwise NOT of 1 is -2) and "
         "gives wrong results when added to scores: return a comparison, or add .bool().")


# --------------------------------------------------------------------------- padding mask
# three sequences of length 7 (B=3 != L=7, so a wrongly placed axis cannot hide)
_TOKENS = torch.tensor([[5, 7, 9, 2, 0, 0, 0],    # right padding
                        [0, 0, 4, 8, 3, 6, 1],    # left padding
                        [4, 1, 1, 2, 8, 9, 3]])   # no padding


def _padding_shape(m, tokens, what):
    B, L = tokens.shape
    _check_bool(m, what)
    shape = tuple(m.shape)
    if shape == (B, 1, L):
        return
    if shape == (B, L):
        fail(f"{what} has shape {shape} = (B, Lk): the query axis is missing. Against scores "
             f"(B, Lq, Lk) a (B, Lk) mask is lined up from the right as (1, B, Lk), so the batch "
             f"axis lands on the QUERY axis: an error when B != Lq, silently wrong rows when "
             f"B == Lq. Add the axis: (tokens != pad_id).unsqueeze(1) -> (B, 1, Lk) = {(B, 1, L)}.")
    if shape == (B, L, 1):
        fail(f"{what} has shape {shape} = (B, Lk, 1): it varies along the QUERY axis, so it "
             "blanks whole query rows instead of hiding the padded keys (columns). Put the new "
             f"axis in the middle: unsqueeze(1) -> (B, 1, Lk) = {(B, 1, L)}.")
    if shape == (B, 1, 1, L):
        fail(f"{what} has shape {shape} = (B, 1, 1, Lk), the multi-head form. Against "
             "single-head scores (B, Lq, Lk) it broadcasts to (B, B, Lq, Lk): every batch "
             f"element gets every other one's mask. Return (B, 1, Lk) = {(B, 1, L)}; multi-head "
             "attention (notebook 03) adds the head axis itself.")
    if shape == (B, L, L):
        fail(f"{what} has shape {shape}: you expanded it to (B, Lk, Lk). That only works when "
             "Lq == Lk; cross-attention has queries of another length. Keep the query axis of "
             f"size 1, (B, 1, Lk) = {(B, 1, L)}, and let broadcasting stretch it.")
    check_shape(m, (B, 1, L), f"{what} for tokens of shape {(B, L)}",
                "A padding mask is (B, 1, Lk): one row per sequence, broadcast over the queries.")


def _padding_values(m, tokens, pad_id, what):
    expected = ref_padding(tokens, pad_id)
    if _is(m, expected):
        return
    got = m.squeeze(1)
    real = tokens != pad_id
    lengths = real.sum(1, keepdim=True)
    right = torch.arange(tokens.size(1)).unsqueeze(0) < lengths
    why = None
    if _is(got, ~real):
        why = ("True where the token IS padding: the opposite convention. Here True = may "
               "attend, i.e. a real token: tokens != pad_id. (PyTorch's key_padding_mask uses "
               "True = ignore; do not mix the two.)")
    elif pad_id != 0 and _is(got, tokens != 0):
        why = f"you compared with 0, not with pad_id={pad_id}: use tokens != pad_id."
    elif pad_id != 0 and _is(got, tokens == 0):
        why = f"you compared with 0, not with pad_id={pad_id}, and flipped the convention."
    elif _is(got, tokens > pad_id):
        why = (f"tokens > pad_id treats every id below pad_id={pad_id} as padding; only ids equal "
               "to pad_id are padding: tokens != pad_id.")
    elif _is(got, right):
        why = ("you assumed the padding sits at the end (counted the real tokens, then compared "
               "positions with that length). Left-padded rows exist: compare each token with "
               "pad_id.")
    rows = "\n".join(f"    {r}" for r in tokens.tolist()[:8])
    fail(f"{what} has the wrong values (1 = may attend).\n  tokens (pad_id={pad_id}):\n{rows}"
         f"\n  your mask:\n{_fmt(got)}\n  expected:\n{_fmt(expected.squeeze(1))}\n"
         + (why or "True exactly where tokens != pad_id."))


def check_padding_mask_shape(make_padding_mask):
    """(B, L) tokens -> (B, 1, Lk) boolean."""
    what = "make_padding_mask(tokens)"
    m = _call(make_padding_mask, _TOKENS.clone(), what=what)
    _padding_shape(m, _TOKENS, what)
    passed("make_padding_mask: (B, L) tokens -> (B, 1, Lk) boolean mask")


def check_padding_mask_values(make_padding_mask):
    """True exactly at real tokens: right and left padding, and a non-zero pad_id."""
    what = "make_padding_mask(tokens)"
    m = _call(make_padding_mask, _TOKENS.clone(), what=what)
    _padding_shape(m, _TOKENS, what)
    _padding_values(m, _TOKENS, 0, what)
    # pad_id=3: ids 0, 1, 2 are real tokens now
    tokens = torch.tensor([[0, 1, 5, 2, 3, 3], [2, 4, 0, 3, 3, 3]])
    what = "make_padding_mask(tokens, pad_id=3)"
    m = _call(make_padding_mask, tokens.clone(), pad_id=3, what=what)
    _padding_shape(m, tokens, what)
    _padding_values(m, tokens, 3, what)
    passed("make_padding_mask: True exactly at real tokens, for left/right padding and any pad_id")


def _random_tokens(B, L, pad_id, vocab=20, left=False, min_len=1, gen=None):
    """Random non-pad ids, each row padded to L with pad_id after (or before) its length."""
    ids = torch.randint(0, vocab, (B, L), generator=gen)
    ids = torch.where(ids == pad_id, ids + 1, ids)  # keep real tokens != pad_id
    lengths = torch.randint(min_len, L + 1, (B,), generator=gen)
    lengths[0] = L  # one full row
    pos = torch.arange(L).unsqueeze(0)
    real = pos >= (L - lengths).unsqueeze(1) if left else pos < lengths.unsqueeze(1)
    return torch.where(real, ids, torch.full_like(ids, pad_id)), real


def check_padding_mask_in_attention(make_padding_mask, seed=0, cases=((3, 6, 2, 8, 0),)):
    """Used in attention (the reference one): padded keys get zero weight, for self- and
    cross-attention (Lq != Lk), and the outputs of real tokens do not change when the batch gets
    more padding. cases: (B, L, extra_pad, d, pad_id)."""
    gen = torch.Generator().manual_seed(seed)
    for B, L, extra, d, pad_id in cases:
        for left in (False, True):
            tokens, real = _random_tokens(B, L, pad_id, left=left, gen=gen)
            what = f"make_padding_mask(tokens of shape {(B, L)}, pad_id={pad_id})"
            m = _call(make_padding_mask, tokens.clone(), pad_id=pad_id, what=what)
            _padding_shape(m, tokens, what)
            _padding_values(m, tokens, pad_id, what)
            x = torch.randn(B, L, d, generator=gen)
            out, w = ref_sdpa(x, x, x, m)
            check_true(bool((w.masked_select(~real.unsqueeze(1).expand_as(w)) == 0).all()),
                       "padded keys got attention weight with your mask: True must mark real tokens.")
            # cross-attention: queries of another length against the padded keys
            q = torch.randn(B, L + 3, d, generator=gen)
            try:
                _, wc = ref_sdpa(q, x, x, m)
            except RuntimeError as e:
                fail(f"your padding mask {tuple(m.shape)} does not broadcast against cross-"
                     f"attention scores {(B, L + 3, L)} (Lq != Lk): {e}. Keep the query axis of "
                     "size 1: (B, 1, Lk).")
            check_true(bool((wc.masked_select(~real.unsqueeze(1).expand_as(wc)) == 0).all()),
                       "in cross-attention padded keys got weight: the mask must hide the keys "
                       "(last axis) for every query.")
            # more padding: real tokens' outputs must not change
            if left:
                continue  # appended padding only makes sense on the right
            tokens2 = torch.cat([tokens, torch.full((B, extra), pad_id)], dim=1)
            x2 = torch.cat([x, 50 * torch.randn(B, extra, d, generator=gen)], dim=1)
            what2 = f"make_padding_mask(tokens of shape {tuple(tokens2.shape)}, pad_id={pad_id})"
            m2 = _call(make_padding_mask, tokens2.clone(), pad_id=pad_id, what=what2)
            _padding_shape(m2, tokens2, what2)
            out2, _ = ref_sdpa(x2, x2, x2, m2)
            check_close(out2[:, :L][real], out[real],
                        f"outputs at real tokens after adding {extra} padding positions",
                        "Outputs of real tokens must not depend on how much padding the batch has: "
                        "every pad position must be False in the mask.")
    passed(f"make_padding_mask: hides padded keys in self- and cross-attention, and the outputs "
           f"of real tokens ignore extra padding ({len(cases)} case(s))")


# --------------------------------------------------------------------------- causal mask
def _causal_shape(m, L, what):
    _check_bool(m, what)
    shape = tuple(m.shape)
    if shape in ((1, L, L), (1, 1, L, L)):
        fail(f"{what} has shape {shape}; return the plain (size, size) = {(L, L)} matrix. "
             "Broadcasting adds the batch and head axes where they are needed (the seed notes "
             "keep a (1, 1, L, L) buffer and then slice it with only three indices, which "
             "goes wrong).")
    check_shape(m, (L, L), f"{what}", "A causal mask is (size, size): row = query, column = key.")


def _causal_values(m, L, what):
    ones = torch.ones(L, L, dtype=torch.bool)
    expected = torch.tril(ones)
    if _is(m.cpu(), expected):
        return
    cands = {
        "True ABOVE the diagonal marks the future: that is the set of positions to HIDE (the "
        "seed notes' -inf convention, triu(diagonal=1)). Here True = may attend: keep the "
        "diagonal and everything below, torch.tril(...).": torch.triu(ones, diagonal=1),
        "the diagonal is missing: position i must see itself (keys 0..i inclusive). Without it "
        "row 0 has no key left: a fully masked row, NaN in a plain softmax. Use tril with "
        "diagonal=0.": torch.tril(ones, diagonal=-1),
        "upper triangle including the diagonal: every position sees itself and the FUTURE, not "
        "the past. Use torch.tril (lower triangle).": torch.triu(ones),
        "this is the seed notes' triu(..., diagonal=-1) bug: it keeps the main diagonal and the "
        "one below it in the blocked part, so every token is blind to itself and its "
        "predecessor, and rows 0 and 1 are fully masked (NaN). Causal = tril, diagonal=0.":
            ~torch.triu(ones, diagonal=-1),
        "it is the blocked set of the seed notes' triu(diagonal=-1) bug: True above and on the "
        "diagonal and one below. Causal = torch.tril(ones(size, size, dtype=torch.bool)).":
            torch.triu(ones, diagonal=-1),
        "diagonal=1 lets position i see position i + 1: one token of the future leaks. Use "
        "diagonal=0 (the default).": torch.tril(ones, diagonal=1),
        "every entry is True: nothing is masked.": ones,
    }
    why = next((h for h, c in cands.items() if _is(m.cpu(), c)), None)
    fail(f"{what} has the wrong values (1 = may attend; row = query, column = key).\n"
         f"  yours:\n{_fmt(m)}\n  expected (lower triangle with the diagonal):\n{_fmt(expected)}\n"
         + (why or "Query i may attend to keys 0..i: torch.tril(torch.ones(size, size, "
            "dtype=torch.bool))."))


def check_causal_mask_values(make_causal_mask):
    """(5, 5) boolean, lower-triangular with the diagonal."""
    what = "make_causal_mask(5)"
    m = _call(make_causal_mask, 5, what=what)
    _causal_shape(m, 5, what)
    _causal_values(m, 5, what)
    passed("make_causal_mask: lower-triangular with the diagonal, True = may attend")


def check_causal_mask_sizes(make_causal_mask, sizes=(1, 2, 7)):
    """Every size gives (size, size) with the right values."""
    for L in sizes:
        what = f"make_causal_mask({L})"
        m = _call(make_causal_mask, L, what=what)
        _causal_shape(m, L, what)
        _causal_values(m, L, what)
    passed(f"make_causal_mask: right shape and values for sizes {list(sizes)}")


def check_causal_mask_device(make_causal_mask):
    """The mask is created on `device` (PyTorch's 'meta' device stands in for a GPU)."""
    m = _call(make_causal_mask, 4, what="make_causal_mask(4)")
    _causal_shape(m, 4, "make_causal_mask(4)")
    check_true(m.device.type == "cpu", f"make_causal_mask(4) with device=None returned a mask on "
               f"{m.device}; the default is the CPU (device=None).")
    meta = torch.device("meta")
    what = "make_causal_mask(4, device=torch.device('meta'))"
    m = _call(make_causal_mask, 4, device=meta, what=what)
    check_true(isinstance(m, torch.Tensor), f"{what} did not return a tensor.")
    if m.device.type != "meta":
        fail(f"{what} returned a mask on {m.device}: the device argument is ignored. Create the "
             "tensor there, e.g. torch.ones(size, size, dtype=torch.bool, device=device); "
             "otherwise the mask stays on the CPU while the scores are on the GPU and "
             "masked_fill fails. (The test uses PyTorch's 'meta' device, which stands in for a GPU.)")
    _causal_shape(m, 4, what)
    m = _call(make_causal_mask, 3, device="cpu", what="make_causal_mask(3, device='cpu')")
    _causal_shape(m, 3, "make_causal_mask(3, device='cpu')")
    passed("make_causal_mask: created on the requested device")


def check_causal_mask_in_attention(make_causal_mask, seed=0, cases=((2, 6, 8),)):
    """Used in attention (the reference one): changing token j never changes the outputs at
    positions < j, no row is NaN, and the mask broadcasts over a batch and heads.
    cases: (B, L, d)."""
    gen = torch.Generator().manual_seed(seed)
    for B, L, d in cases:
        what = f"make_causal_mask({L})"
        m = _call(make_causal_mask, L, what=what)
        _causal_shape(m, L, what)
        x = torch.randn(B, L, d, generator=gen)
        out, w = ref_sdpa(x, x, x, m)
        check_true(bool((w.sum(-1) > 0.5).all()),
                   "with your causal mask some query rows have no key left (fully masked): "
                   "position i must be allowed to see itself.")
        for t in range(1, L):
            x2 = x.clone()
            x2[:, t:] = torch.randn(B, L - t, d, generator=gen)
            out2, _ = ref_sdpa(x2, x2, x2, m)
            if not torch.allclose(out2[:, :t], out[:, :t], atol=1e-5, rtol=1e-4):
                fail(f"with your causal mask of size {L}, changing the tokens from position {t} "
                     f"on changed the outputs at positions < {t}: the past sees the future. "
                     "Query i may attend to keys 0..i only: a lower-triangular mask.")
        # 4-D scores (B, H, L, L): the (L, L) mask must broadcast there too
        xh = torch.randn(B, 3, L, d, generator=gen)
        _, wh = ref_sdpa(xh, xh, xh, m)
        check_true(bool((wh.masked_select(~ref_causal(L)) == 0).all()),
                   "with 4-D (B, H, L, L) scores your mask does not hide the future.")
    passed(f"make_causal_mask: no position sees the future in attention ({len(cases)} case(s), "
           "with and without heads)")


# --------------------------------------------------------------------------- decoder mask
_DEC_TOKENS = torch.tensor([[5, 7, 9, 2, 0, 0],
                            [3, 8, 0, 0, 0, 0],
                            [0, 0, 4, 1, 6, 2],    # left padding: tells keys from queries
                            [4, 1, 6, 2, 8, 9]])  # B=4 != L=6


def _decoder_shape(m, tokens, what):
    B, L = tokens.shape
    _check_bool(m, what)
    shape = tuple(m.shape)
    if shape == (B, L, L):
        return
    if shape == (B, 1, L, L):
        fail(f"{what} has shape {shape}, the multi-head form. Return (B, L, L) = {(B, L, L)}; "
             "multi-head attention adds the head axis (unsqueeze(1)) itself.")
    if shape in ((L, L), (1, L, L)):
        fail(f"{what} has shape {shape}: that is only the causal part, the same for every "
             "sequence. Combine it with the key-padding mask (B, 1, L) to get (B, L, L).")
    if shape == (B, 1, L):
        fail(f"{what} has shape {shape}: that is only the padding mask. Combine it with the "
             "causal (L, L) mask: (B, 1, L) & (L, L) broadcasts to (B, L, L).")
    check_shape(m, (B, L, L), f"{what} for tokens of shape {(B, L)}",
                "The decoder mask is (B, L, L): padding (B, 1, L) AND causal (L, L).")


def _decoder_values(m, tokens, pad_id, what):
    expected = ref_decoder(tokens, pad_id)
    if _is(m, expected):
        return
    L = tokens.size(1)
    pad_k = (tokens != pad_id).unsqueeze(1)   # (B, 1, L)
    pad_q = (tokens != pad_id).unsqueeze(2)   # (B, L, 1)
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool))
    full = torch.ones_like(expected)
    cands = {
        "the opposite convention: True where attention is blocked. Here True = may attend.":
            ~expected,
        "you combined the two masks with OR (|): a key must be real AND not in the future, "
        "so combine with &.": pad_k | causal,
        "you also masked the query rows at padding positions (pad & pad^T & causal). The spec "
        "masks keys only: a pad position's row keeps its causal keys (its output is ignored by "
        "the loss anyway), while blanking whole rows invites the fully-masked-row NaN.":
            pad_q & pad_k & causal,
        "you masked the QUERIES instead of the keys: the padding part must vary along the last "
        "axis (keys), (B, 1, L), not (B, L, 1).": pad_q & causal,
        "the padding part is missing: padded keys are visible (only the causal mask).":
            causal & full,
        "the causal part is missing: every token sees the future (only the padding mask).":
            pad_k & full,
        "the causal part is upside down (triu): tokens see the future instead of the past.":
            pad_k & torch.triu(torch.ones(L, L, dtype=torch.bool)),
        "the diagonal is missing from the causal part: each token must see itself.":
            pad_k & torch.tril(torch.ones(L, L, dtype=torch.bool), diagonal=-1),
    }
    if pad_id != 0:
        cands[f"you compared with 0 instead of pad_id={pad_id}."] = \
            (tokens != 0).unsqueeze(1) & causal
    why = next((h for h, c in cands.items() if _is(m, c)), None)
    b = int((m != expected).reshape(m.size(0), -1).any(1).nonzero()[0]) if m.shape == expected.shape else 0
    fail(f"{what} has the wrong values (1 = may attend; row = query, column = key).\n"
         f"  sequence {b}: tokens {tokens[b].tolist()} (pad_id={pad_id})\n  yours:\n{_fmt(m[b])}\n"
         f"  expected:\n{_fmt(expected[b])}\n"
         + (why or "decoder mask = padding mask (B, 1, L) & causal mask (L, L)."))


def check_decoder_mask_shape(make_decoder_mask):
    """(B, L) tokens -> (B, L, L) boolean."""
    what = "make_decoder_mask(tokens)"
    m = _call(make_decoder_mask, _DEC_TOKENS.clone(), what=what)
    _decoder_shape(m, _DEC_TOKENS, what)
    passed("make_decoder_mask: (B, L) tokens -> (B, L, L) boolean mask")


def check_decoder_mask_values(make_decoder_mask):
    """causal AND key padding; query rows at pads are not blanked; pad_id honoured."""
    what = "make_decoder_mask(tokens)"
    m = _call(make_decoder_mask, _DEC_TOKENS.clone(), what=what)
    _decoder_shape(m, _DEC_TOKENS, what)
    _decoder_values(m, _DEC_TOKENS, 0, what)
    tokens = torch.tensor([[1, 0, 4, 5, 2, 2, 2], [3, 6, 0, 1, 4, 8, 2],
                           [2, 2, 5, 1, 0, 3, 4]])  # the last one is left-padded
    what = "make_decoder_mask(tokens, pad_id=2)"
    m = _call(make_decoder_mask, tokens.clone(), pad_id=2, what=what)
    _decoder_shape(m, tokens, what)
    _decoder_values(m, tokens, 2, what)
    passed("make_decoder_mask: causal AND key padding, for any pad_id")


def check_decoder_mask_device(make_decoder_mask):
    """The mask lives on the tokens' device ('meta' stands in for a GPU)."""
    tokens = _DEC_TOKENS.to("meta")
    what = "make_decoder_mask(tokens on the 'meta' device)"
    m = _call(make_decoder_mask, tokens, what=what)
    check_true(isinstance(m, torch.Tensor), f"{what} did not return a tensor.")
    if m.device.type != "meta":
        fail(f"{what} returned a mask on {m.device}: build every part on tokens.device (pass "
             "device=tokens.device to make_causal_mask), or the decoder breaks on a GPU. (The "
             "test uses PyTorch's 'meta' device, which stands in for a GPU.)")
    _decoder_shape(m, tokens, what)
    passed("make_decoder_mask: built on the tokens' device")


def check_decoder_mask_in_attention(make_decoder_mask, seed=0, cases=((3, 7, 2, 8, 0),)):
    """Used in attention (the reference one): outputs of real positions do not change when
    future tokens change or the batch gets more padding; no NaN. cases: (B, L, extra, d, pad_id)."""
    gen = torch.Generator().manual_seed(seed)
    for B, L, extra, d, pad_id in cases:
        tokens, real = _random_tokens(B, L, pad_id, gen=gen)
        what = f"make_decoder_mask(tokens of shape {(B, L)}, pad_id={pad_id})"
        m = _call(make_decoder_mask, tokens.clone(), pad_id=pad_id, what=what)
        _decoder_shape(m, tokens, what)
        _decoder_values(m, tokens, pad_id, what)
        x = torch.randn(B, L, d, generator=gen)
        out, w = ref_sdpa(x, x, x, m)
        check_true(bool(torch.isfinite(out).all()), "attention with your decoder mask gave NaN/inf.")
        for t in range(1, L):
            x2 = x.clone()
            x2[:, t:] = torch.randn(B, L - t, d, generator=gen)
            out2, _ = ref_sdpa(x2, x2, x2, m)
            keep = real[:, :t]
            check_close(out2[:, :t][keep], out[:, :t][keep],
                        f"outputs of real positions < {t} after changing the tokens from {t} on",
                        "the past must not see the future: AND the causal mask in.")
        tokens2 = torch.cat([tokens, torch.full((B, extra), pad_id)], dim=1)
        x2 = torch.cat([x, 50 * torch.randn(B, extra, d, generator=gen)], dim=1)
        what2 = f"make_decoder_mask(tokens of shape {tuple(tokens2.shape)}, pad_id={pad_id})"
        m2 = _call(make_decoder_mask, tokens2.clone(), pad_id=pad_id, what=what2)
        _decoder_shape(m2, tokens2, what2)
        out2, _ = ref_sdpa(x2, x2, x2, m2)
        check_close(out2[:, :L][real], out[real],
                    f"outputs of real tokens after adding {extra} padding positions",
                    "padded keys must be hidden from every query: AND the key-padding mask in.")
    passed(f"make_decoder_mask: real positions ignore the future and the padding in attention "
           f"({len(cases)} case(s))")


# --------------------------------------------------------------------------- masked attention
def _qkv(gen, batch, Lq, Lk, dk, dv, scale=1.0):
    q = torch.randn(*batch, Lq, dk, generator=gen) * scale
    k = torch.randn(*batch, Lk, dk, generator=gen) * scale
    v = torch.randn(*batch, Lk, dv, generator=gen)
    return q, k, v


def _partial_mask(gen, shape):
    """A random boolean mask in which every row has at least one True and one False."""
    Lk = shape[-1]
    m = torch.rand(*shape, generator=gen) < 0.5
    first = torch.randint(0, Lk, shape[:-1], generator=gen)
    m.scatter_(-1, first.unsqueeze(-1), True)
    m.scatter_(-1, ((first + 1 + torch.randint(0, Lk - 1, shape[:-1], generator=gen)) % Lk).unsqueeze(-1), False)
    return m


def _sdpa(sdpa, q, k, v, mask, what=None):
    what = what or (f"scaled_dot_product_attention(q {tuple(q.shape)}, k {tuple(k.shape)}, "
                    f"v {tuple(v.shape)}, mask {tuple(mask.shape) if mask is not None else None})")
    res = _call(sdpa, q, k, v, mask, shortcuts=ATT, what=what)
    return _unpack(res, "scaled_dot_product_attention")


def _diagnose_weights(w, q, k, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    m = mask.expand_as(s)
    big = -1e9
    cands = {
        "the mask was ignored: masked keys still get weight.": torch.softmax(s, -1),
        "you blocked the keys where the mask is True. True means MAY attend: fill where the "
        "mask is False, scores.masked_fill(~mask, ...). (PyTorch's key_padding_mask uses the "
        "opposite convention; do not mix them.)": torch.softmax(s.masked_fill(m, big), -1),
        "the masked scores were set to 0 (masked_fill(~mask, 0) or scores * mask), but "
        "exp(0) = 1: masked keys still get weight. Fill with -inf or a very negative number.":
            torch.softmax(s.masked_fill(~m, 0.0), -1),
        "you zeroed the weights after softmax without renormalising, so rows no longer sum to "
        "1. Mask the SCORES before softmax.": torch.softmax(s, -1) * m,
        "you added the boolean mask to the scores (True counts as +1). A boolean mask is not "
        "additive: use scores.masked_fill(~mask, -inf), or turn it into 0 / -inf first.":
            torch.softmax(s + m.to(s.dtype), -1),
        "the scores are not divided by sqrt(d_k).":
            torch.softmax((s * math.sqrt(q.size(-1))).masked_fill(~m, big), -1),
        "softmax ran over the query axis (dim=-2); it must run over the keys, dim=-1.":
            torch.softmax(s.masked_fill(~m, big), -2),
    }
    for hint, c in cands.items():
        if w.shape == c.shape and torch.allclose(w.detach().double(), c.double(), atol=1e-4, rtol=1e-3):
            return hint
    return None


def _check_masked_weights(w, out, q, k, v, mask, what):
    """Rows with at least one allowed key: zero weight on masked keys, rows sum to 1, values and
    output match the reference."""
    ref_out, ref_w = ref_sdpa(q.double(), k.double(), v.double(), mask)
    check_shape(w, ref_w.shape, f"weights of {what}",
                "Weights are (..., Lq, Lk): the mask broadcasts against the scores; it must not "
                "add axes (no unsqueeze inside attention) or change their shape.")
    check_shape(out, ref_out.shape, f"output of {what}")
    m = mask.expand_as(ref_w)
    ok = m.any(-1)  # rows that have some key
    wd = w.detach().double()
    if not bool(torch.isfinite(wd[ok]).all()):
        why = _diagnose_weights(w, q, k, mask)
        fail(f"weights of {what} contain NaN/inf in rows that have allowed keys. "
             + (why or "Fill masked scores with -inf or a large negative number, then softmax."))
    leaked = wd.masked_select(~m & ok.unsqueeze(-1)).abs()
    if leaked.numel() and leaked.max() > 1e-6:
        why = _diagnose_weights(w, q, k, mask)
        fail(f"weights of {what} are not zero where the mask is False: up to "
             f"{leaked.max().item():.3g} of weight on masked keys. "
             + (why or "Set the masked scores to -inf (or a very negative number) BEFORE softmax: "
                "scores.masked_fill(~mask, float('-inf'))."))
    sums = wd.sum(-1)[ok]
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        why = _diagnose_weights(w, q, k, mask)
        fail(f"rows of the weights of {what} do not sum to 1 along the keys (row sums "
             f"{[round(s, 4) for s in sums[:4].tolist()]} ...). "
             + (why or "Mask the scores before softmax; softmax over dim=-1."))
    why = _diagnose_weights(w, q, k, mask)
    hint = ("the attention weights are wrong: " + why) if why else \
        "weights = softmax(scores.masked_fill(~mask, -inf)) with scores = q k^T / sqrt(d_k)."
    check_close(w.detach()[ok], ref_w[ok].float(), f"weights of {what} (rows with allowed keys)", hint)
    check_close(out.detach()[ok], ref_out[ok].float(), f"output of {what} (rows with allowed keys)",
                "output = weights @ v.")


def check_masked_attention_no_mask(sdpa):
    """mask=None is the default and gives plain attention; shapes with Lq != Lk, d_v != d_k."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(gen, (2,), 3, 5, 4, 6)
    what = "scaled_dot_product_attention(q, k, v) with no mask"
    out, w = _unpack(_call(sdpa, q, k, v, shortcuts=ATT, what=what), "scaled_dot_product_attention")
    ref_w = torch.softmax(q @ k.transpose(-2, -1) / 2.0, -1)
    check_shape(w, (2, 3, 5), "weights for q (2, 3, 4), k (2, 5, 4), v (2, 5, 6)",
                "Weights are (B, Lq, Lk): one row per query, one column per key.")
    check_shape(out, (2, 3, 6), "output for q (2, 3, 4), k (2, 5, 4), v (2, 5, 6)",
                "The output is weights @ v: (B, Lq, Lk) @ (B, Lk, d_v) -> (B, Lq, d_v).")
    check_close(w, ref_w, "weights with no mask", "With mask=None nothing is masked: "
                "weights = softmax(q k^T / sqrt(d_k), dim=-1).")
    check_close(out, ref_w @ v, "output with no mask", "output = weights @ v.")
    out2, w2 = _unpack(_call(sdpa, q, k, v, mask=None, shortcuts=ATT,
                             what="scaled_dot_product_attention(q, k, v, mask=None)"),
                       "scaled_dot_product_attention")
    check_close(w2, ref_w, "weights with mask=None")
    passed("masked attention: mask=None is the default and gives plain attention")


def check_masked_attention_weights(sdpa):
    """Zero weight where masked, rows sum to 1, values and output right; gradients flow."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = _qkv(gen, (2,), 4, 6, 8, 5)
    mask = _partial_mask(gen, (2, 4, 6))
    qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
    what = "scaled_dot_product_attention(q, k, v, mask) with a (B, Lq, Lk) mask"
    out, w = _sdpa(sdpa, qa, ka, va, mask, what)
    _check_masked_weights(w, out, q, k, v, mask, what)
    check_true(out.requires_grad, "the output is cut off from autograd (no .detach(), .item(), "
               "numpy or torch.tensor(...) in the middle).")
    out.sum().backward()
    check_true(ka.grad is not None and bool(torch.isfinite(ka.grad).all()),
               "no finite gradient reaches k through the masked attention.")
    passed("masked attention: zero weight on masked keys, rows sum to 1, output = weights @ v")


# (query/key batch axes, mask shape) pairs: every mask form the course uses
_BROADCAST_CASES = [
    ((2,), lambda B, H, Lq, Lk: (B, 1, Lk)),          # padding mask
    ((2,), lambda B, H, Lq, Lk: (Lq, Lk)),            # causal-style, shared by the batch
    ((2,), lambda B, H, Lq, Lk: (B, Lq, Lk)),         # decoder mask
    ((2, 3), lambda B, H, Lq, Lk: (B, 1, 1, Lk)),     # padding mask with a head axis
    ((2, 3), lambda B, H, Lq, Lk: (B, 1, Lq, Lk)),    # decoder mask with a head axis
    ((2, 3), lambda B, H, Lq, Lk: (Lq, Lk)),          # causal mask against heads
    ((2, 3), lambda B, H, Lq, Lk: (B, H, Lq, Lk)),    # full 4-D
]


def check_masked_attention_broadcast(sdpa, seed=2, Lq=4, Lk=6):
    """Any mask broadcastable to the scores works: (B, 1, Lk), (Lq, Lk), (B, Lq, Lk) against
    3-D inputs; (B, 1, 1, Lk), (B, 1, Lq, Lk), (Lq, Lk), (B, H, Lq, Lk) against 4-D ones."""
    gen = torch.Generator().manual_seed(seed)
    for batch, shape_fn in _BROADCAST_CASES:
        B, H = batch[0], (batch[1] if len(batch) > 1 else 1)
        q, k, v = _qkv(gen, batch, Lq, Lk, 8, 5)
        mshape = shape_fn(B, H, Lq, Lk)
        mask = _partial_mask(gen, mshape)
        scores_shape = (*batch, Lq, Lk)
        what = (f"scaled_dot_product_attention with {len(batch) + 2}-D q {tuple(q.shape)} and a "
                f"mask of shape {mshape}")
        try:
            out, w = _sdpa(sdpa, q, k, v, mask, what)
        except ShortcutUsed:
            raise
        except CheckFailed as e:
            fail(f"{e}\nThe scores are {scores_shape}; a mask of shape {mshape} broadcasts "
                 "against them as it is. Use scores.masked_fill(~mask, value) without "
                 "reshaping, unsqueezing or indexing with the mask.")
        if isinstance(w, torch.Tensor) and tuple(w.shape) != scores_shape:
            fail(f"{what}: the weights have shape {tuple(w.shape)}, expected {scores_shape}. "
                 "The mask added or changed axes: do not unsqueeze the mask inside attention "
                 "(a (B, 1, Lk) mask made 4-D meets 3-D scores as (B, B, Lq, Lk)). "
                 "masked_fill broadcasts it as it is.")
        _check_masked_weights(w, out, q, k, v, mask, what)
    passed(f"masked attention: works with {len(_BROADCAST_CASES)} mask shapes, 3-D and 4-D")


def check_masked_attention_fully_masked(sdpa):
    """Rows whose keys are all masked: finite output, weights all zeros or uniform, output
    consistent with them, and finite gradients; the other rows stay right."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(gen, (2,), 3, 5, 4, 3)
    mask = _partial_mask(gen, (2, 3, 5))
    mask[0, 1] = False
    mask[1, 2] = False
    # a batch whose second sequence is padding only: every row of it is fully masked
    q2, k2, v2 = _qkv(gen, (2,), 4, 4, 6, 3)
    pad = torch.tensor([[True, True, False, False], [False, False, False, False]]).unsqueeze(1)
    for (q, k, v, mask, kind) in ((q, k, v, mask, "a (B, Lq, Lk) mask with two all-False rows"),
                                  (q2, k2, v2, pad, "a (B, 1, Lk) padding mask whose second "
                                                    "sequence is all padding")):
        qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
        what = f"scaled_dot_product_attention with {kind}"
        out, w = _sdpa(sdpa, qa, ka, va, mask, what)
        m = mask.expand(*q.shape[:-1], k.size(-2))
        dead = ~m.any(-1)
        Lk = k.size(-2)
        for name, t in (("weights", w), ("output", out)):
            if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all()):
                fail(f"the {name} of {what} contain NaN. Where every key of a row is masked, "
                     "softmax over a row of -inf computes exp(-inf - (-inf)) = exp(NaN): 0/0. "
                     "Fill with a large finite negative number (torch.finfo(scores.dtype).min "
                     "or -1e9: the row then becomes uniform), or set such rows to zero after "
                     "softmax (torch.where(mask.any(-1, keepdim=True), weights, 0.0)).")
        check_shape(w, m.shape, f"weights of {what}")
        wd = w.detach()[dead]
        zeros = bool((wd.abs() <= 1e-6).all())
        uniform = bool(((wd - 1.0 / Lk).abs() <= 1e-5).all())
        if not (zeros or uniform):
            fail(f"fully masked rows of the weights of {what} are neither all zeros nor uniform "
                 f"(1/Lk = {1 / Lk:.3g}): first such row {wd[0].tolist()}. A row with no allowed "
                 "key should give zero weights (or, with a finite fill value, uniform ones).")
        ref_dead = (w.detach() @ v)[dead]
        check_close(out.detach()[dead], ref_dead, f"output of the fully masked rows of {what}",
                    "The output of a fully masked row must be its weights @ v (zeros, or the "
                    "mean of v with uniform weights).")
        _check_masked_weights(w, out, q, k, v, mask, what)
        g = torch.randn(out.shape, generator=gen)
        (out * g).sum().backward()
        for name, t in (("q", qa), ("k", ka), ("v", va)):
            if t.grad is None or not bool(torch.isfinite(t.grad).all()):
                fail(f"the gradient with respect to {name} is NaN (or missing) for {what}, "
                     "although the forward pass is finite. An additive -inf mask followed by "
                     "nan_to_num hides the NaN going forward, but it flows back through the "
                     "addition into the scores and poisons every parameter. Use "
                     "scores.masked_fill(~mask, ...) (its backward blocks masked entries) or a "
                     "finite fill value.")
    passed("masked attention: fully masked rows stay finite (weights zero or uniform), gradients too")


def check_masked_attention_padding(sdpa, seed=4, cases=((3, 5, 3, 8),)):
    """Outputs of real tokens do not change when more padding is added to the batch.
    cases: (B, L, extra, d)."""
    gen = torch.Generator().manual_seed(seed)
    for B, L, extra, d in cases:
        tokens, real = _random_tokens(B, L, 0, gen=gen)
        x = torch.randn(B, L, d, generator=gen)
        mask = ref_padding(tokens)
        what = f"scaled_dot_product_attention(x, x, x, padding mask) for x {tuple(x.shape)}"
        out, w = _sdpa(sdpa, x, x, x, mask, what)
        check_shape(out, (B, L, d), f"output of {what}")
        x2 = torch.cat([x, 50 * torch.randn(B, extra, d, generator=gen)], dim=1)
        mask2 = ref_padding(torch.cat([tokens, torch.zeros(B, extra, dtype=tokens.dtype)], 1))
        what2 = f"the same batch with {extra} more padding positions"
        out2, w2 = _sdpa(sdpa, x2, x2, x2, mask2, what2)
        check_shape(out2, (B, L + extra, d), f"output of {what2}")
        if not torch.allclose(out2[:, :L][real], out[real], atol=1e-5, rtol=1e-4):
            why = _diagnose_weights(w2, x2, x2, mask2)
            check_close(out2[:, :L][real], out[real],
                        f"outputs of real tokens after adding {extra} padding positions",
                        "Real tokens must give the same output however much padding the batch "
                        "has: padded keys need exactly zero weight. "
                        + (("Likely: " + why) if why else ""))
    passed("masked attention: outputs of real tokens do not change when padding is added")


def _random_mask(gen, shape, p_keep=0.6):
    return torch.rand(*shape, generator=gen) < p_keep


def check_masked_attention_against_torch(sdpa, seed=0, cases=(((2,), 5, 7, 8, 3, "pad"),),
                                         scale=1.0):
    """Random cases compared with F.scaled_dot_product_attention with a boolean attn_mask on
    rows that are not fully masked; fully masked rows must be finite, zero or uniform.
    cases: (batch, Lq, Lk, d_k, d_v, kind) with kind in 'pad' (B, 1, Lk), 'causal' (Lq, Lk),
    'full' (..., Lq, Lk) random, 'heads' (B, 1, 1, Lk) against 4-D inputs."""
    gen = torch.Generator().manual_seed(seed)
    for batch, Lq, Lk, dk, dv, kind in cases:
        q, k, v = _qkv(gen, batch, Lq, Lk, dk, dv, scale)
        if kind == "pad":
            mshape = (batch[0], 1, Lk)
        elif kind == "heads":
            mshape = (batch[0], 1, 1, Lk)
        elif kind == "causal":
            mshape = (Lq, Lk)
        else:
            mshape = (*batch, Lq, Lk)
        mask = (torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq) if kind == "causal"
                else _random_mask(gen, mshape))
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        shape = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, mask {tuple(mask.shape)}"
        out, w = _sdpa(sdpa, q, k, v, mask, f"scaled_dot_product_attention({shape})")
        scores = (*batch, Lq, Lk)
        check_shape(w, scores, f"weights for {shape}", "Weights are (..., Lq, Lk).")
        check_shape(out, (*batch, Lq, dv), f"output for {shape}", "The output is (..., Lq, d_v).")
        live = mask.expand(*scores).any(-1)
        for name, t in (("weights", w), ("output", out)):
            check_true(bool(torch.isfinite(t.detach()).all()),
                       f"the {name} for {shape} contain NaN/inf: a row whose keys are all masked "
                       "must stay finite (large finite fill value, or zero such rows after softmax).")
        _check_masked_weights(w, out, q, k, v, mask, f"scaled_dot_product_attention({shape})")
        check_close(out.detach()[live], expected[live], f"output for {shape} (rows with allowed keys)",
                    "Compared with F.scaled_dot_product_attention(q, k, v, attn_mask=mask).")
        if (~live).any():
            wd = w.detach()[~live]
            check_true(bool((wd.abs() <= 1e-6).all()) or bool(((wd - 1 / Lk).abs() <= 1e-5).all()),
                       f"fully masked rows for {shape} are neither all zeros nor uniform.")
    passed(f"masked attention: matches F.scaled_dot_product_attention on {len(cases)} random "
           "case(s)")
