"""Checks for notebook 08_decoder_only: `next_token_loss`, `CausalSelfAttention`,
`DecoderOnlyLM` and `generate`.

The model checks write their own values, different in every layer, into the student's model
through the attribute names fixed in the exercise text (tok_embed, layers[i].norm1 / self_attn /
norm2 / ff, norm, lm_head), read them back (a part shared under two names is caught there, as
are a repeated block, one LayerNorm for two and an lm_head tied to the embedding), and rebuild
the expected result from them, with PyTorch's own
nn.MultiheadAttention / nn.TransformerEncoderLayer, or by hand for the known wrong variants
that name a mistake. The `generate` checks drive the reference model and small scripted
models, so that they grade `generate` alone.
"""
from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from ..reference import sinusoidal_positional_encoding
from ..reference.decoder_only import DecoderOnlyLM as RefLM
from ..reference.decoder_only import generate as ref_generate
from .core import (CheckFailed, call, check_close, check_shape, check_true, copy_mha_to_torch, fail,
                   passed, seeded)

ATTN_SC = ("attention", "multihead")
LM_SC = ("attention", "multihead", "transformer")
SEED_VOCAB = ["what", "is", "statquest", "awesome", "<EOS>"]
SEED_TOKENS = torch.tensor([[0, 1, 2, 4, 3, 4],   # what is statquest <EOS> awesome <EOS>
                            [2, 1, 0, 4, 3, 4]])  # statquest is what <EOS> awesome <EOS>
LM_ATOL, LM_RTOL = 1e-4, 1e-4  # several float32 layers: a little looser than one op


def _match(actual, candidates: dict, atol=1e-4, rtol=1e-3):
    """The first hint whose wrong-but-plausible result equals `actual`, or None."""
    if not isinstance(actual, torch.Tensor):
        return None
    for hint, cand in candidates.items():
        try:
            if cand is not None and actual.shape == cand.shape and torch.allclose(
                    actual.detach().double(), cand.detach().double(), atol=atol, rtol=rtol):
                return hint
        except RuntimeError:
            continue
    return None


def _ce(logits, targets, ignore=-100):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=ignore)


# =========================================================================== next_token_loss
def _table(tokens):
    words = lambda row: " ".join(f"{SEED_VOCAB[i]:>9}" for i in row)
    return (f"    inputs  (tokens[:, :-1]): {words(tokens[0, :-1].tolist())}\n"
            f"    labels  (tokens[:, 1:]):  {words(tokens[0, 1:].tolist())}")


def _loss_value(fn, logits, tokens, what, **kw):
    try:
        y = call(fn, logits, tokens, what=what, **kw)
    except CheckFailed as e:
        if "Expected target size" in str(e) or "Expected input batch_size" in str(e):
            raise CheckFailed(f"{e}\nF.cross_entropy wants the classes on dim 1: flatten the "
                              "logits to (B*(T-1), V) and the targets to (B*(T-1),) first.") from None
        raise
    if not isinstance(y, torch.Tensor):
        fail(f"{what} returned {type(y).__name__}; return the loss as a 0-d tensor (keep it a "
             "tensor, no .item(), so that loss.backward() works).")
    if y.dim() != 0:
        fail(f"{what} returned a tensor of shape {tuple(y.shape)}; return one number, the mean "
             "over every predicted position (a 0-d tensor). Flatten logits to (N, V) and targets "
             "to (N,) before F.cross_entropy, whose default reduction is the mean.")
    return y


def _loss_candidates(logits, tokens, ignore=-100):
    B, T, V = logits.shape
    exp = _ce(logits[:, :-1], tokens[:, 1:], ignore)
    n = (tokens[:, 1:] != ignore).sum()
    return {
        "no shift: position t is compared with the token AT position t, so the model only has to "
        "copy its input (which the causal mask lets it see). Position t must predict the NEXT "
        "token: logits[:, :-1] against tokens[:, 1:].": _ce(logits, tokens, ignore),
        "no shift (both sides cut the same way): logits[:, :-1] is compared with tokens[:, :-1], "
        "the same positions, so the model learns to copy. The labels are tokens[:, 1:].":
            _ce(logits[:, :-1], tokens[:, :-1], ignore),
        "no shift (both sides cut the same way): logits[:, 1:] is compared with tokens[:, 1:], the "
        "same positions, so the model learns to copy. Use logits[:, :-1] against tokens[:, 1:].":
            _ce(logits[:, 1:], tokens[:, 1:], ignore),
        "the shift goes the wrong way: logits[:, 1:] against tokens[:, :-1] asks each position for "
        "the PREVIOUS token. Use logits[:, :-1] against tokens[:, 1:].":
            _ce(logits[:, 1:], tokens[:, :-1], ignore),
        "you applied softmax before F.cross_entropy, which applies log_softmax itself: pass the "
        "raw logits.": _ce(logits[:, :-1].softmax(-1), tokens[:, 1:], ignore),
        "F.nll_loss expects log-probabilities, and you gave it raw logits: use F.cross_entropy "
        "(or log_softmax first).": F.nll_loss(logits[:, :-1].reshape(-1, V),
                                               tokens[:, 1:].reshape(-1), ignore_index=ignore),
        "you summed the per-token losses; the loss is their MEAN (reduction='mean').": exp * n,
        "F.cross_entropy read the TIME axis as the classes: it wants the classes on dim 1, so "
        "flatten the logits to (B*(T-1), V) and the targets to (B*(T-1),) first.":
            (F.cross_entropy(logits[:, :-1], tokens[:, 1:], ignore_index=ignore)
             if T - 1 == V else None),
    }


def check_next_token_loss_seed(next_token_loss):
    """Seed 001's two sentences: inputs and labels shifted by one."""
    tokens = SEED_TOKENS.clone()
    with seeded(8):
        logits = torch.randn(2, 6, 5) * 2
    la = logits.clone().requires_grad_(True)
    y = _loss_value(next_token_loss, la, tokens, "next_token_loss(logits, tokens)")
    expected = _ce(logits[:, :-1], tokens[:, 1:])
    if not torch.allclose(y.detach(), expected, atol=1e-5, rtol=1e-4):
        why = _match(y, _loss_candidates(logits, tokens))
        table = ("\n  For seed 001's first sentence the pairs are:\n" + _table(tokens))
        fail(f"next_token_loss on seed 001's two sentences is {y.item():.5f}, expected "
             f"{expected.item():.5f}.\n  " + (why or "Mean cross-entropy of logits[:, :-1] "
                                              "against tokens[:, 1:].") + table)
    check_true(y.requires_grad, "the loss is cut off from autograd: keep it a tensor computed "
               "from the logits (no .item(), numpy or torch.tensor(...)).")
    y.backward()
    lb = logits.clone().requires_grad_(True)
    _ce(lb[:, :-1], tokens[:, 1:]).backward()
    check_close(la.grad, lb.grad, "the gradient of the loss with respect to the logits",
                "The last position predicts nothing (no token follows it): its gradient is 0.")
    passed("next_token_loss: seed 001's tables, logits[:, :-1] against tokens[:, 1:], "
           "gradients included")


def check_next_token_loss_ignore(next_token_loss):
    """Padding targets equal to ignore_id are left out of the mean."""
    pad = 0
    tokens = torch.tensor([[5, 3, 7, 2, 9, 0, 0], [4, 4, 8, 1, 6, 3, 2], [7, 1, 0, 0, 0, 0, 0]])
    with seeded(9):
        logits = torch.randn(3, 7, 10)
    y = _loss_value(next_token_loss, logits, tokens, "next_token_loss(logits, tokens, ignore_id=0)",
                    ignore_id=pad)
    expected = _ce(logits[:, :-1], tokens[:, 1:], pad)
    if not torch.allclose(y, expected, atol=1e-5, rtol=1e-4):
        keep = tokens[:, :-1] != pad
        per_tok = F.cross_entropy(logits[:, :-1].reshape(-1, 10), tokens[:, 1:].reshape(-1),
                                  reduction="none").view(3, 6)
        tmask = (tokens[:, 1:] != pad).float()
        cands = _loss_candidates(logits, tokens, pad)
        cands.update({
            "targets equal to ignore_id were counted: pass ignore_index=ignore_id to "
            "F.cross_entropy (or drop those positions before averaging).": _ce(
                logits[:, :-1], tokens[:, 1:]),
            "you masked by the INPUT token (tokens[:, :-1]); what must be ignored is a padding "
            "TARGET, tokens[:, 1:] == ignore_id.": (per_tok * keep).sum() / keep.sum(),
            "you averaged each row first and then the rows; the loss is the mean over all kept "
            "targets (a long row weighs more than a short one).":
                ((per_tok * tmask).sum(1) / tmask.sum(1)).mean(),
            "you zeroed the ignored targets but divided by ALL positions; divide by the number "
            "of kept targets.": (per_tok * tmask).sum() / tmask.numel(),
        })
        why = _match(y, cands)
        fail(f"next_token_loss(..., ignore_id=0) is {y.item():.5f}, expected {expected.item():.5f}"
             f" with padding targets left out.\n  " + (why or "Leave out every target equal to "
                                                         "ignore_id and average the rest."))
    y2 = _loss_value(next_token_loss, logits, tokens.clamp(min=1), "next_token_loss with no "
                     "padding present", ignore_id=pad)
    check_close(y2, _ce(logits[:, :-1], tokens.clamp(min=1)[:, 1:]),
                "the loss with ignore_id given but absent from the targets")
    passed("next_token_loss: targets equal to ignore_id are left out of the mean")


def check_next_token_loss_random(next_token_loss, seed=0, cases=((2, 7, 11, None),)):
    """Random (B, T, V) cases compared with F.cross_entropy on the shifted pairs."""
    for i, (B, T, V, ignore) in enumerate(cases):
        with seeded(seed + i):
            logits = torch.randn(B, T, V) * 3
            tokens = torch.randint(0, V, (B, T))
            if ignore is not None:
                tokens[torch.rand(B, T) < 0.3] = ignore
        kw = {} if ignore is None else {"ignore_id": ignore}
        expected = _ce(logits[:, :-1], tokens[:, 1:], -100 if ignore is None else ignore)
        y = _loss_value(next_token_loss, logits, tokens, f"next_token_loss for B={B}, T={T}, V={V}",
                        **kw)
        if not torch.allclose(y, expected, atol=1e-5, rtol=1e-4):
            why = _match(y, _loss_candidates(logits, tokens, -100 if ignore is None else ignore))
            check_close(y, expected, f"the loss for B={B}, T={T}, V={V}, ignore_id={ignore}",
                        why or "Mean cross-entropy of logits[:, :-1] against tokens[:, 1:].")
    passed(f"next_token_loss: matches F.cross_entropy on the shifted pairs for {len(cases)} "
           "random case(s)")


# =========================================================================== attention
def _new_attention(cls, d, h, dropout=0.0, seed=0):
    with seeded(seed):
        kw = {} if dropout == 0.0 else {"dropout": dropout}
        m = call(cls, d, h, shortcuts=ATTN_SC, what=f"CausalSelfAttention({d}, {h})", **kw)
        for name in ("w_q", "w_k", "w_v", "w_o"):
            lin = getattr(m, name, None)
            if not isinstance(lin, nn.Module) or not hasattr(lin, "weight"):
                fail(f"CausalSelfAttention has no projection `{name}`: keep w_q, w_k, w_v, w_o "
                     "as nn.Linear(d_model, d_model) so the tests can read the weights.")
    return m.eval()


def _attn_call(m, x, past=None, what="CausalSelfAttention"):
    args = (x,) if past is None else (x, past)
    res = call(m, *args, shortcuts=ATTN_SC, what=what)
    if not (isinstance(res, (tuple, list)) and len(res) == 2 and isinstance(res[0], torch.Tensor)
            and isinstance(res[1], (tuple, list)) and len(res[1]) == 2):
        fail(f"{what} must return (output, (k, v)): the output (B, T, d_model) and the keys and "
             f"values for the cache, each (B, H, T_past + T, D_h). Got {type(res).__name__}"
             f"{' of length ' + str(len(res)) if isinstance(res, (tuple, list)) else ''}.")
    return res[0], tuple(res[1])


def _heads(t, H, split="ok"):
    B, T, D = t.shape
    if split == "view":
        return t.reshape(B, H, T, D // H)
    return t.view(B, T, H, D // H).transpose(1, 2)


def _merge(o, split="ok"):
    B, H, T, Dh = o.shape
    if split == "view":
        return o.reshape(B, T, H * Dh)
    return o.transpose(1, 2).reshape(B, T, H * Dh)


def _attend(q, k, v, allowed, scale, after_softmax=False):
    s = q @ k.transpose(-2, -1) / scale
    if after_softmax:
        w = s.softmax(-1) * allowed
    else:
        w = s.masked_fill(~allowed, torch.finfo(s.dtype).min).softmax(-1)
    return w @ v


@torch.no_grad()
def _attn_manual(sa, x, H, mask="causal", scale="dh", split="ok", after_softmax=False):
    """The attention of `sa` on x (no cache), optionally with a known mistake."""
    B, T, D = x.shape
    q, k, v = (_heads(lin(x), H, split) for lin in (sa.w_q, sa.w_k, sa.w_v))
    i = torch.arange(T)
    allowed = {"causal": i[None, :] <= i[:, None], "none": torch.ones(T, T, dtype=torch.bool),
               "triu": i[None, :] >= i[:, None], "strict": i[None, :] < i[:, None]}[mask]
    sc = {"dh": math.sqrt(D // H), "d": math.sqrt(D), "none": 1.0}[scale]
    return sa.w_o(_merge(_attend(q, k, v, allowed, sc, after_softmax), split))


@torch.no_grad()
def _attn_chunk_manual(sa, x, past, H, variant):
    """A cached step of `sa` done wrong in one known way."""
    kp, vp = past
    B, T, D = x.shape
    q, k, v = (_heads(lin(x), H) for lin in (sa.w_q, sa.w_k, sa.w_v))
    P = kp.size(2)
    if variant == "ignore_past":
        kk, vv, allowed = k, v, torch.ones(T, T, dtype=torch.bool).tril()
    elif variant == "new_first":
        kk, vv = torch.cat([k, kp], 2), torch.cat([v, vp], 2)
        allowed = torch.ones(T, P + T, dtype=torch.bool).tril(P)
    else:
        kk, vv = torch.cat([kp, k], 2), torch.cat([vp, v], 2)
        allowed = {"no_offset": torch.ones(T, P + T, dtype=torch.bool).tril(),
                   "no_mask": torch.ones(T, P + T, dtype=torch.bool)}[variant]
    return sa.w_o(_merge(_attend(q, kk, vv, allowed, math.sqrt(D // H))))


def _torch_causal_mha(m, x, H):
    """PyTorch's own nn.MultiheadAttention with the student's weights and a causal mask."""
    B, T, D = x.shape
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    copy_mha_to_torch(m, ref)
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # PyTorch: True = NOT allowed
    with torch.no_grad():
        return ref(x, x, x, attn_mask=blocked, need_weights=False)[0]


def _diagnose_attention(out, m, x, H):
    if not torch.isfinite(out).all():
        if torch.isfinite(out[:, 1:]).all():
            return ("position 0 came out NaN: its row of the mask has no allowed key. A token "
                    "must be allowed to attend to ITSELF: the causal mask keeps the diagonal "
                    "(tril with diagonal=0, True on and below it).")
        return "the output has NaN/inf values."
    cands = {
        "no causal mask: every position attends to later tokens. Allow key j for query i only "
        "when j <= i (tril, True on and below the diagonal).": _attn_manual(m, x, H, mask="none"),
        "the mask is the wrong way round: it lets each position see the FUTURE (triu). Allowed "
        "keys are j <= i: torch.tril.": _attn_manual(m, x, H, mask="triu"),
        "the mask excludes the diagonal: a token must be allowed to attend to itself (tril with "
        "diagonal=0).": _attn_manual(m, x, H, mask="strict"),
        "you scaled by sqrt(d_model); each head's scores are scaled by sqrt(D_h), D_h = d_model "
        "// n_heads.": _attn_manual(m, x, H, scale="d"),
        "the scores are not scaled by 1/sqrt(D_h).": _attn_manual(m, x, H, scale="none"),
        "heads were split with view(B, H, T, D_h) without a transpose, which mixes positions "
        "and features. Use view(B, T, H, D_h).transpose(1, 2), and the reverse to merge.":
            _attn_manual(m, x, H, split="view"),
        "the mask was applied AFTER softmax (weights * mask): the rows no longer sum to 1. Mask "
        "the scores with a large negative number before softmax.":
            _attn_manual(m, x, H, after_softmax=True),
    }
    why = _match(out, cands)
    if why is None:  # the strict mask's row 0 depends on how it is filled: compare the rest
        strict = _attn_manual(m, x, H, mask="strict")
        if torch.allclose(out[:, 1:].double(), strict[:, 1:].double(), atol=1e-4, rtol=1e-3):
            why = list(cands)[2]
    return why


def check_attention_shapes(cls):
    """Output (B, T, d_model); cache keys/values (B, H, T_past + T, D_h)."""
    m = _new_attention(cls, 12, 3, seed=0)
    with seeded(1):
        x = torch.randn(2, 5, 12)
        x2 = torch.randn(2, 2, 12)
    out, (k, v) = _attn_call(m, x, what="CausalSelfAttention on x (2, 5, 12), 3 heads")
    check_shape(out, (2, 5, 12), "the output for x (2, 5, 12)",
                "The output has the input's shape (B, T, d_model): merge the heads and apply w_o.")
    for name, t in (("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and tuple(t.shape) == (2, 5, 12):
            fail(f"the cached {name} has shape (2, 5, 12) = (B, T, d_model): cache it AFTER "
                 "splitting into heads, (B, H, T, D_h) = (2, 3, 5, 4), so the next step can "
                 "concatenate along the time axis (dim=2).")
        check_shape(t, (2, 3, 5, 4), f"the cached {name} for x (2, 5, 12), 3 heads",
                    "Cache the keys/values after splitting into heads: (B, H, T, D_h).")
    out2, (k2, v2) = _attn_call(m, x2, (k, v), what="CausalSelfAttention(x (2, 2, 12), past_kv)")
    check_shape(out2, (2, 2, 12), "the output for 2 new tokens after 5 cached ones",
                "Only the NEW tokens are queries: the output is (B, T_new, d_model).")
    if isinstance(k2, torch.Tensor) and tuple(k2.shape) == (2, 3, 2, 4):
        fail("after a cached step, k has shape (2, 3, 2, 4): you returned only the new keys. "
             "Return the whole cache, torch.cat([past_k, k], dim=2): (B, H, 5 + 2, D_h).")
    check_shape(k2, (2, 3, 7, 4), "the cached k after 5 + 2 tokens",
                "Concatenate the past keys and the new ones along the time axis (dim=2).")
    check_shape(v2, (2, 3, 7, 4), "the cached v after 5 + 2 tokens",
                "Concatenate the past values and the new ones along the time axis (dim=2).")
    passed("CausalSelfAttention: output (B, T, d_model); the cache grows to (B, H, T_past + T, D_h)")


def check_attention_matches_torch(cls, seed=0, cases=((2, 6, 16, 4, 0.0),)):
    """No cache: equal to nn.MultiheadAttention with a causal mask and the same weights."""
    for i, (B, T, D, H, p) in enumerate(cases):
        m = _new_attention(cls, D, H, dropout=p, seed=seed + i)
        with seeded(seed + 100 + i):
            x = torch.randn(B, T, D)
        expected = _torch_causal_mha(m, x, H)
        out, _ = _attn_call(m, x, what=f"CausalSelfAttention({D}, {H}) on x {tuple(x.shape)}")
        check_shape(out, expected.shape, f"the output for x {tuple(x.shape)}")
        if not torch.allclose(out.detach(), expected, atol=1e-5, rtol=1e-4):
            why = _diagnose_attention(out.detach(), m, x, H)
            check_close(out, expected, f"the output for x {tuple(x.shape)}, {H} heads"
                        + (f", dropout={p} in eval mode" if p else ""),
                        (why or "Compared with nn.MultiheadAttention and a causal mask: "
                         "softmax(q k^T / sqrt(D_h) masked so that j <= i) v, per head, then w_o."))
    passed(f"CausalSelfAttention: matches nn.MultiheadAttention with a causal mask on "
           f"{len(cases)} case(s)")


def check_attention_cache(cls, seed=0, cases=((2, 8, 16, 4, (4, 1, 3)),)):
    """Prefix, then chunks with past_kv: the same outputs and keys as one full pass."""
    for i, (B, T, D, H, chunks) in enumerate(cases):
        m = _new_attention(cls, D, H, seed=seed + i)
        with seeded(seed + 200 + i):
            x = torch.randn(B, T, D)
        full, (kf, vf) = _attn_call(m, x, what=f"CausalSelfAttention on the full x {tuple(x.shape)}")
        full_why = None  # the cache hints assume a right uncached pass: check that first
        if isinstance(full, torch.Tensor) and full.shape == x.shape and not torch.allclose(
                full.detach(), _torch_causal_mha(m, x, H), atol=1e-5, rtol=1e-4):
            full_why = ("the uncached pass is already wrong, so the cached steps cannot match "
                        "it either: " + (_diagnose_attention(full.detach(), m, x, H) or
                                         "see test_CausalSelfAttention_matches_torch."))
        past, start = None, 0
        for n in list(chunks) + [T - sum(chunks)]:
            if n <= 0:
                continue
            xc = x[:, start:start + n]
            what = (f"CausalSelfAttention on tokens {start}..{start + n - 1} with "
                    f"{start} cached" if past is not None else "")
            out, kv = _attn_call(m, xc, past, what=what or "CausalSelfAttention on a prefix")
            if past is not None:
                k = kv[0]
                if isinstance(k, torch.Tensor) and k.dim() == 4 and k.size(2) == n:
                    fail(f"after a step with {start} cached tokens, k holds only the {n} new "
                         f"one(s): return the whole cache, torch.cat([past_k, k], dim=2).")
                check_shape(k, (B, H, start + n, D // H), f"the cached k after {start + n} tokens",
                            "Concatenate past and new keys along the time axis (dim=2).")
                exp = full[:, start:start + n].detach()
                if not torch.allclose(out.detach(), exp, atol=1e-5, rtol=1e-4):
                    why = full_why or _match(out, {
                        f"the causal mask ignores the {start} cached tokens: new query i sits at "
                        f"position {start} + i, so it may see keys 0 .. {start} + i. Build the "
                        f"(T, {start} + T) mask with torch.tril(..., diagonal={start}) (the "
                        "number of cached tokens); a plain tril lets a new token see only the "
                        "first keys.": _attn_chunk_manual(m, xc, past, H, "no_offset"),
                        "the cache is concatenated in the wrong order: old keys come FIRST, "
                        "torch.cat([past_k, k], dim=2).": _attn_chunk_manual(m, xc, past, H,
                                                                            "new_first"),
                        "with a cache you dropped the causal mask: several new tokens at once "
                        "must still not see each other's future (mask (T, past + T), "
                        "tril with diagonal=past).": _attn_chunk_manual(m, xc, past, H, "no_mask"),
                        "past_kv is ignored: the new tokens attend only to themselves. "
                        "Concatenate the cached keys/values in front of the new ones.":
                            _attn_chunk_manual(m, xc, past, H, "ignore_past"),
                    })
                    check_close(out, exp, f"the output for tokens {start}..{start + n - 1} "
                                f"computed with {start} cached tokens",
                                why or "A cached step must give exactly what the full pass gives "
                                "at those positions.")
            past, start = kv, start + n
        check_close(past[0], kf, "the cached keys after the last chunk",
                    "The cache must hold the keys of every token so far, in order.")
        check_close(past[1], vf, "the cached values after the last chunk",
                    "The cache must hold the values of every token so far, in order.")
    passed("CausalSelfAttention: prefix + cached chunks give the same outputs and keys as one "
           "full pass")


# =========================================================================== DecoderOnlyLM
_LM_NAMES = ("tok_embed", "layers", "norm", "lm_head")
_LAYER_NAMES = ("norm1", "self_attn", "norm2", "ff")


def _lm_call(model, *args, what, **kw):
    try:
        return call(model, *args, shortcuts=LM_SC, what=what, **kw)
    except CheckFailed as e:
        if "must match the size of tensor" in str(e) or "size of tensor a" in str(e):
            raise CheckFailed(
                f"{e}\nIn DecoderOnlyLM this is usually the positional table sliced along the "
                "wrong axis: tokens are (B, T), so slice pe[offset : offset + T] with "
                "T = tokens.size(1) (size(0) is the batch).") from None
        raise


def _new_lm(cls, V, D, H, L, Fd, max_len=64, dropout=0.0, seed=0):
    with seeded(seed):
        kw = {"max_len": max_len}
        if dropout:
            kw["dropout"] = dropout
        m = call(cls, V, D, H, L, Fd, shortcuts=LM_SC,
                 what=f"DecoderOnlyLM({V}, {D}, {H}, {L}, {Fd}, max_len={max_len})", **kw)
        for name in _LM_NAMES:
            if not hasattr(m, name):
                fail(f"DecoderOnlyLM has no attribute `{name}`. Keep tok_embed, layers (one "
                     "block per layer with norm1, self_attn, norm2, ff), norm and lm_head, as "
                     "the exercise says, so the tests can read the weights.")
        if len(m.layers) != L:
            fail(f"DecoderOnlyLM(n_layers={L}) has {len(m.layers)} layers.")
        for i, layer in enumerate(m.layers):
            for name in _LAYER_NAMES:
                if not hasattr(layer, name):
                    fail(f"block {i} of DecoderOnlyLM.layers has no `{name}` (each block keeps "
                         "norm1, self_attn with w_q/w_k/w_v/w_o, norm2, ff with linear1/linear2).")
        _lm_distinct(m, L)
        _lm_own_weights(m, L)
    return m.eval()


def _lm_distinct(m, L):
    """The parts the exercise describes as separate are separate objects: a shared module
    looks right to any check that reads its weights back from the model itself."""
    if L > 1 and len({id(b) for b in m.layers}) < L:
        fail(f"DecoderOnlyLM.layers holds the same block object {L} times: [Block(...)] * "
             "n_layers repeats ONE block (one set of weights applied n_layers times). Create a "
             "new block in every iteration: nn.ModuleList(Block(...) for _ in range(n_layers)).")
    for i, b in enumerate(m.layers):
        if b.norm1 is b.norm2 or (getattr(b.norm1, "weight", None) is not None
                                  and b.norm1.weight is getattr(b.norm2, "weight", None)):
            fail(f"in block {i}, norm1 and norm2 are one LayerNorm module (self.norm1 = "
                 "self.norm2 = nn.LayerNorm(...), or one norm used twice): each sub-layer "
                 "has its own LayerNorm with its own weight and bias. Create two.")
    head_w, emb_w = getattr(m.lm_head, "weight", None), getattr(m.tok_embed, "weight", None)
    if isinstance(head_w, torch.Tensor) and isinstance(emb_w, torch.Tensor) and (
            head_w is emb_w or head_w.data_ptr() == emb_w.data_ptr()):
        fail("lm_head shares its weight with tok_embed (weight tying, lm_head.weight = "
             "tok_embed.weight). This exercise describes a separate output layer, "
             "lm_head = nn.Linear(d_model, vocab_size) with its own weight and a bias; tied "
             "embeddings come in notebook 09.")
    if getattr(m.lm_head, "bias", None) is None:
        fail("lm_head has no bias: the exercise describes nn.Linear(d_model, vocab_size), "
             "whose bias is on by default.")


def _lm_paths(L):
    paths = ["tok_embed.weight", "norm.weight", "norm.bias", "lm_head.weight", "lm_head.bias"]
    for i in range(L):
        for sub in ("norm1", "norm2", "self_attn.w_q", "self_attn.w_k", "self_attn.w_v",
                    "self_attn.w_o", "ff.linear1", "ff.linear2"):
            paths += [f"layers.{i}.{sub}.weight", f"layers.{i}.{sub}.bias"]
    return paths


def _lm_own_weights(m, L):
    """Write the test's own values, different in every layer, into each named parameter, then
    read them all back: a part shared with another (one module under two names) keeps only the
    last value written, and is named here, before any comparison."""
    params = dict(m.named_parameters(remove_duplicate=False))
    written = {}
    with torch.no_grad():
        for path in _lm_paths(L):
            p = params.get(path)
            if p is None:
                continue  # e.g. bias=False projections; the comparisons read what is there
            base = 1.0 if path.endswith("weight") and "norm" in path else 0.0
            scale = 0.2 if "norm" in path else (p.size(-1) ** -0.5 if p.dim() > 1 else 0.1)
            v = base + scale * torch.randn(p.shape)
            p.copy_(v)
            written[path] = v
        for path, v in written.items():
            if not torch.equal(params[path].detach(), v):
                other = next((q for q in written if q != path and
                              params[q].data_ptr() == params[path].data_ptr()), "another part")
                fail(f"DecoderOnlyLM.{path} is the same tensor as {other}: the model shares a "
                     "part that the exercise describes as separate (each layer, each LayerNorm "
                     "and lm_head have their own weights).")


def _ln(norm, x):
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, getattr(norm, "eps", 1e-5))


def _ff(ff, x):
    return ff.linear2(F.relu(ff.linear1(x)))


def _head(m, x):
    return F.linear(x, m.lm_head.weight, getattr(m.lm_head, "bias", None))


@torch.no_grad()
def _lm_manual(m, tokens, H, pos=None, scale=True, pe=True, prenorm=True, final_norm=True,
               residual=True, probs=False, scale_after_pe=False):
    """The model on `tokens` with position ids `pos`, optionally with a known mistake."""
    B, T = tokens.shape
    D = m.tok_embed.weight.size(1)
    pos = torch.arange(T) if pos is None else torch.as_tensor(pos)
    table = sinusoidal_positional_encoding(int(pos.max()) + 1, D)[pos]  # (T, D)
    x = F.embedding(tokens, m.tok_embed.weight)
    if scale_after_pe:
        x = (x + table) * math.sqrt(D)
    else:
        x = x * (math.sqrt(D) if scale else 1.0) + (table if pe else 0.0)
    r = 1.0 if residual else 0.0
    for layer in m.layers:
        if prenorm:
            x = r * x + _attn_manual(layer.self_attn, _ln(layer.norm1, x), H)
            x = r * x + _ff(layer.ff, _ln(layer.norm2, x))
        else:
            x = _ln(layer.norm1, r * x + _attn_manual(layer.self_attn, x, H))
            x = _ln(layer.norm2, r * x + _ff(layer.ff, x))
    logits = _head(m, _ln(m.norm, x) if final_norm else x)
    return logits.softmax(-1) if probs else logits


@torch.no_grad()
def _lm_torch(m, tokens, H):
    """PyTorch's own nn.TransformerEncoderLayer (pre-norm, causal mask) with the model's
    weights: a decoder-only block is an encoder layer that cannot look ahead."""
    B, T = tokens.shape
    D = m.tok_embed.weight.size(1)
    x = F.embedding(tokens, m.tok_embed.weight) * math.sqrt(D) + sinusoidal_positional_encoding(T, D)
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # PyTorch: True = NOT allowed
    for layer in m.layers:
        Fd = layer.ff.linear1.weight.size(0)
        ref = nn.TransformerEncoderLayer(D, H, Fd, 0.0, batch_first=True, norm_first=True).eval()
        copy_mha_to_torch(layer.self_attn, ref.self_attn)
        for a, b in ((ref.linear1, layer.ff.linear1), (ref.linear2, layer.ff.linear2),
                     (ref.norm1, layer.norm1), (ref.norm2, layer.norm2)):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)
        ref.norm1.eps = getattr(layer.norm1, "eps", 1e-5)
        ref.norm2.eps = getattr(layer.norm2, "eps", 1e-5)
        x = ref(x, src_mask=blocked)
    return _head(m, _ln(m.norm, x))


def _lm_candidates(m, tokens, H):
    return {
        "the logits come out as probabilities: forward must return raw logits (no softmax); "
        "F.cross_entropy and generate apply it themselves.": _lm_manual(m, tokens, H, probs=True),
        "the token embeddings are not multiplied by sqrt(d_model).": _lm_manual(m, tokens, H,
                                                                                  scale=False),
        "sqrt(d_model) multiplies the positional encoding too: scale the embeddings first, "
        "then add the positions.": _lm_manual(m, tokens, H, scale_after_pe=True),
        "no positional encoding: add pe[offset : offset + T] to the scaled embeddings.":
            _lm_manual(m, tokens, H, pe=False),
        "every token got the encoding of position 0 (pe[:1] or pe[0] broadcast over the "
        "sequence): add pe[offset : offset + T], one row per position.":
            _lm_manual(m, tokens, H, pos=torch.zeros(tokens.size(1), dtype=torch.long)),
        "the blocks are post-norm (norm after the residual add); this model is pre-norm like "
        "GPT-2: x = x + attn(norm1(x)); x = x + ff(norm2(x)).": _lm_manual(m, tokens, H,
                                                                          prenorm=False),
        "the final LayerNorm (`norm`) before lm_head is missing.": _lm_manual(m, tokens, H,
                                                                             final_norm=False),
        "the residual connections are missing: x = x + attn(norm1(x)), not x = attn(norm1(x)).":
            _lm_manual(m, tokens, H, residual=False),
    }


def _logits_of(res, what):
    if isinstance(res, (tuple, list)):
        fail(f"{what} returned a {type(res).__name__}; with use_cache=False (the default) "
             "forward returns the logits tensor alone.")
    return res


def check_lm_shapes(cls):
    """Logits (B, T, V); with use_cache, (logits, cache) with one (k, v) per layer."""
    m = _new_lm(cls, 13, 16, 4, 2, 32)
    with seeded(2):
        tokens = torch.randint(0, 13, (2, 7))
    logits = _logits_of(_lm_call(m, tokens, what="model(tokens (2, 7))"), "model(tokens)")
    check_shape(logits, (2, 7, 13), "the logits for tokens (2, 7), vocab 13",
                "One score per vocabulary entry at every position: (B, T, vocab_size).")
    res = _lm_call(m, tokens, use_cache=True, what="model(tokens, use_cache=True)")
    if not (isinstance(res, (tuple, list)) and len(res) == 2):
        fail("model(tokens, use_cache=True) must return a pair (logits, cache).")
    lg, cache = res
    check_shape(lg, (2, 7, 13), "the logits returned with use_cache=True")
    if not isinstance(cache, (tuple, list)):
        fail(f"the cache is a {type(cache).__name__}; make it a list with one (k, v) pair per "
             "layer.")
    check_true(len(cache) == 2, f"the cache has {len(cache)} entries for a 2-layer model: keep "
               "one (k, v) pair per layer, in order.")
    for j, kv in enumerate(cache):
        check_true(isinstance(kv, (tuple, list)) and len(kv) == 2,
                   f"cache[{j}] is not a (k, v) pair.")
        for name, t in zip("kv", kv):
            check_shape(t, (2, 4, 7, 4), f"cache[{j}] {name} after 7 tokens (4 heads of size 4)",
                        "Keep what each layer's attention returned: (B, H, T, D_h).")
    passed("DecoderOnlyLM: logits (B, T, V); use_cache=True adds one (k, v) per layer, "
           "(B, H, T, D_h)")


def check_lm_causal(cls):
    """Changing a later token leaves every earlier position's logits unchanged; positions
    matter (swapping two tokens changes what comes after them)."""
    m = _new_lm(cls, 11, 16, 2, 2, 32, seed=3)
    with seeded(4):
        tokens = torch.randint(0, 11, (2, 9))
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 3) % 11
    a = _logits_of(_lm_call(m, tokens, what="model(tokens)"), "model(tokens)")
    b = _logits_of(_lm_call(m, changed, what="model(tokens with token 5 changed)"), "model")
    check_shape(a, (2, 9, 11), "the logits")
    diff = (a - b).abs().amax(dim=(0, 2))  # per position
    leaked = [j for j in range(5) if diff[j] > 1e-5]
    if leaked:
        fail(f"changing token 5 changed the logits at earlier position(s) {leaked} (largest change "
             f"{diff[:5].max().item():.3g}): information flows from the future. Every layer's "
             "self-attention needs the causal mask (key j allowed for query i only if j <= i).")
    check_true(diff[5:].max() > 1e-4, "changing token 5 did not change the logits at positions "
               "5..8: the prediction at a position must depend on the tokens up to it.")
    m1 = _new_lm(cls, 11, 16, 2, 1, 32, seed=5)
    swapped = tokens.clone()
    swapped[:, [1, 2]] = tokens[:, [2, 1]]
    same = tokens[:, 1] == tokens[:, 2]
    swapped[same, 2] = (tokens[same, 2] + 1) % 11
    a = _logits_of(_lm_call(m1, tokens, what="model(tokens)"), "model(tokens)")[:, -1]
    b = _logits_of(_lm_call(m1, swapped, what="model(tokens with 1 and 2 swapped)"), "model")[:, -1]
    if torch.allclose(a, b, atol=1e-5) and not same.any():
        full = _logits_of(_lm_call(m1, tokens, what="model(tokens)"), "model(tokens)")
        why = _match(full, _lm_candidates(m1, tokens, 2))
        if why and not why.startswith("no positional encoding"):
            fail("swapping tokens 1 and 2 left the last position's logits unchanged, and the "
                 f"logits match a known mistake: {why}")
        fail("swapping tokens 1 and 2 left the last position's logits unchanged: the model "
             "cannot tell word order. Add the positional encoding to the embeddings.")
    passed("DecoderOnlyLM: causal (a later token never changes earlier logits) and aware of "
           "word order")


def check_lm_matches_torch(cls, seed=0, cases=((13, 16, 4, 2, 32, 2, 7, 0.0),)):
    """Cases (V, D, H, L, d_ff, B, T, dropout) compared with pre-norm nn.TransformerEncoderLayer
    blocks under a causal mask, given the model's own weights (eval mode)."""
    for i, (V, D, H, L, Fd, B, T, p) in enumerate(cases):
        m = _new_lm(cls, V, D, H, L, Fd, max_len=max(64, T), dropout=p, seed=seed + i)
        with seeded(seed + 50 + i):
            tokens = torch.randint(0, V, (B, T))
        expected = _lm_torch(m, tokens, H)
        what = f"the logits of DecoderOnlyLM({V}, {D}, {H}, {L}, {Fd}) for tokens ({B}, {T})"
        logits = _logits_of(_lm_call(m, tokens, what=what), "model(tokens)")
        check_shape(logits, expected.shape, what)
        if not torch.allclose(logits.detach(), expected, atol=LM_ATOL, rtol=LM_RTOL):
            why = _match(logits, _lm_candidates(m, tokens, H))
            check_close(logits, expected, what + (f", dropout={p}, eval mode" if p else ""),
                        why or "Expected: embeddings * sqrt(d_model) + positions, pre-norm blocks "
                        "(x + attn(norm1(x)), x + ff(norm2(x))) with a causal mask, final "
                        "norm, lm_head.", atol=LM_ATOL, rtol=LM_RTOL)
    passed(f"DecoderOnlyLM: matches pre-norm nn.TransformerEncoderLayer blocks with a causal "
           f"mask on {len(cases)} case(s)")


def _cache_pair(res, what):
    if not (isinstance(res, (tuple, list)) and len(res) == 2
            and isinstance(res[0], torch.Tensor)):
        fail(f"{what} must return (logits, cache) when use_cache=True.")
    return res


def check_lm_kv_cache(cls, seed=0, cases=((13, 16, 4, 2, 32, 2, 10, (4, 1, 1, 3)),)):
    """A prefix, then chunks fed with past_kv: the logits equal one full pass. Cases
    (V, D, H, L, d_ff, B, T, chunk sizes)."""
    for i, (V, D, H, L, Fd, B, T, chunks) in enumerate(cases):
        m = _new_lm(cls, V, D, H, L, Fd, max_len=max(64, T), seed=seed + i)
        with seeded(seed + 70 + i):
            tokens = torch.randint(0, V, (B, T))
        full = _logits_of(_lm_call(m, tokens, what="model(tokens)"), "model(tokens)").detach()
        cache, start = None, 0
        sizes = [n for n in list(chunks) + [T - sum(chunks)] if n > 0]
        for n in sizes:
            part = tokens[:, start:start + n]
            what = (f"model(tokens[:, {start}:{start + n}], past_kv=cache, use_cache=True)"
                    if cache is not None else f"model(tokens[:, :{n}], use_cache=True)")
            kw = {"use_cache": True} if cache is None else {"past_kv": cache, "use_cache": True}
            lg, new_cache = _cache_pair(_lm_call(m, part, what=what, **kw), what)
            check_true(isinstance(new_cache, (tuple, list)) and len(new_cache) == L,
                       f"{what} returned a cache with "
                       f"{len(new_cache) if isinstance(new_cache, (tuple, list)) else '?'} "
                       f"entries; keep one (k, v) per layer ({L}).")
            k0 = new_cache[0][0]
            if isinstance(k0, torch.Tensor) and k0.dim() == 4 and k0.size(2) != start + n:
                fail(f"after {start + n} tokens the first layer's cached k holds {k0.size(2)} "
                     "positions: pass each layer its own past (past_kv[i]) and keep what it "
                     "returns, which already includes the past.")
            exp = full[:, start:start + n]
            if cache is not None and not torch.allclose(lg.detach(), exp, atol=LM_ATOL, rtol=LM_RTOL):
                # which positions did the new tokens get?
                found = None
                for off in range(0, m_max_positions(m, T) - n + 1):
                    pos = torch.cat([torch.arange(start), torch.arange(off, off + n)])
                    cand = _lm_manual(m, tokens[:, :start + n], H, pos=pos)[:, start:]
                    if torch.allclose(lg.detach().double(), cand.double(), atol=1e-4, rtol=1e-3):
                        found = off
                        break
                if found == 0:
                    why = (f"the position offset is missing: with {start} tokens cached, the new "
                           f"tokens are at positions {start}..{start + n - 1}, but they got the "
                           f"encoding of positions 0..{n - 1}. Add pe[offset : offset + T] with "
                           "offset = the number of cached tokens (past_kv[0][0].size(2)); "
                           "self.pos_encoding(x) always starts at 0.")
                elif found is not None:
                    why = (f"the new tokens got positions {found}..{found + n - 1}, expected "
                           f"{start}..{start + n - 1}: offset = the number of cached tokens, "
                           "past_kv[0][0].size(2) for keys shaped (B, H, T_past, D_h).")
                else:
                    why = ("A cached step must give exactly what the full pass gives at those "
                           "positions: pass past_kv[i] to layer i, offset the positions by the "
                           "number of cached tokens, and keep the causal mask.")
                check_close(lg, exp, f"the logits for tokens {start}..{start + n - 1} computed "
                            f"with {start} cached tokens", why, atol=LM_ATOL, rtol=LM_RTOL)
            elif cache is None:
                check_close(lg, exp, "the logits of the first (uncached) chunk", atol=LM_ATOL,
                            rtol=LM_RTOL)
            cache, start = new_cache, start + n
    passed("DecoderOnlyLM: a prefix plus cached chunks gives the same logits as one full pass "
           "(the positions continue from the cache)")


def m_max_positions(m, T):
    return max(T, getattr(m, "max_len", T) if isinstance(getattr(m, "max_len", None), int) else T)


# =========================================================================== generate
class _SpyLM(RefLM):
    """The reference model, recording how generate calls it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = []

    def forward(self, tokens, past_kv=None, use_cache=False):
        self.calls.append(_record(tokens, past_kv, use_cache))
        return super().forward(tokens, past_kv=past_kv, use_cache=use_cache)


def _record(tokens, past_kv, use_cache):
    try:
        past_len = None if past_kv is None else int(past_kv[0][0].size(2))
    except Exception:  # noqa: BLE001 - a malformed cache; the model will complain itself
        past_len = -1
    return (tuple(tokens.shape), past_kv is not None, bool(use_cache), torch.is_grad_enabled(),
            past_len)


class _FakeLM(nn.Module):
    """A model whose next-token scores are chosen by `score(full_tokens, pos)`. Its cache is a
    list with one (k, v) pair that stores the token ids, shaped like real keys (B, 1, T, 1)."""

    def __init__(self, vocab_size, max_len=512):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.calls = []

    def score(self, full, P, T):  # (B, P + T) -> (B, T, V)
        raise NotImplementedError

    def forward(self, tokens, past_kv=None, use_cache=False):
        self.calls.append(_record(tokens, past_kv, use_cache))
        B, T = tokens.shape
        past = (past_kv[0][0][:, 0, :, 0].round().long() if past_kv is not None
                else tokens.new_zeros(B, 0))
        full = torch.cat([past, tokens], dim=1)
        logits = self.score(full, past.size(1), T)
        if use_cache:
            kv = full.float()[:, None, :, None]
            return logits, [(kv, kv.clone())]
        return logits


class _FixedLM(_FakeLM):
    def __init__(self, logits):
        super().__init__(logits.numel())
        self.fixed = logits

    def score(self, full, P, T):
        return self.fixed.expand(full.size(0), T, -1).clone()


class _ScriptedLM(_FakeLM):
    """Row r predicts scripts[first token of r][position]: a sharp one-hot score."""

    def __init__(self, scripts, vocab_size):
        super().__init__(vocab_size)
        self.scripts = scripts  # (n_first, max_pos)

    def score(self, full, P, T):
        nxt = self.scripts[full[:, 0]][:, P:P + T]  # (B, T)
        return F.one_hot(nxt, self.vocab_size).float() * 20.0


def _gen_call(generate, model, prompt, n, what, **kw):
    before = prompt.clone()
    out = call(generate, model, prompt, n, what=what, **kw)
    if not torch.equal(prompt, before):
        fail(f"{what} changed the prompt tensor in place; build a new tensor (torch.cat).")
    if not isinstance(out, torch.Tensor):
        fail(f"{what} returned {type(out).__name__}; return a (B, T0 + new) LongTensor of ids.")
    if out.dim() == 2 and out.size(0) == prompt.size(0) and out.size(1) <= n and \
            not torch.equal(out[:, :prompt.size(1)], prompt):
        fail(f"{what} returned shape {tuple(out.shape)}: only the new tokens? Return the prompt "
             "followed by the generated tokens, torch.cat([prompt, new], dim=1).")
    if out.dim() != 2 or out.size(0) != prompt.size(0):
        fail(f"{what} returned shape {tuple(out.shape)}; expected (B, T0 + new) = "
             f"({prompt.size(0)}, {prompt.size(1)} + up to {n}).")
    if not torch.equal(out[:, :prompt.size(1)], prompt):
        fail(f"{what}: the output does not start with the prompt; return the prompt followed by "
             "the generated tokens.")
    return out


def _greedy_reference(model, prompt, n, eos_id=None):
    return ref_generate(model, prompt, n, temperature=0.0, eos_id=eos_id, use_cache=False)


def _new_spy(V, D, H, L, Fd, seed):
    with seeded(seed):
        m = _SpyLM(V, D, H, L, Fd, max_len=128)
        with torch.no_grad():
            m.lm_head.weight.mul_(4.0)  # sharper scores: clear argmax winners
    return m.eval()


def _check_calls(m, B, T0, n_steps, cached, what):
    calls = m.calls
    if any(c[3] for c in calls):
        fail(f"{what} ran the model with gradients enabled: generation never trains, so wrap "
             "it in torch.no_grad() (or decorate generate with @torch.no_grad()); otherwise "
             "every step keeps its whole autograd graph in memory.")
    if cached:
        if not calls or calls[0][0] != (B, T0) or calls[0][1]:
            fail(f"{what}: the first call with use_cache=True must run the whole prompt "
                 f"({B}, {T0}) with no past; got {calls[0] if calls else 'no call'}.")
        later = calls[1:]
        if any(not c[2] for c in calls):
            fail(f"{what}: with use_cache=True call model(..., use_cache=True) to get the cache "
                 "back.")
        bad = [c for c in later if c[0] != (B, 1) or not c[1]]
        if bad:
            fail(f"{what}: with use_cache=True every step after the prompt must feed ONLY the "
                 f"newest token, shape ({B}, 1), with past_kv=cache; a call got tokens of shape "
                 f"{bad[0][0]} and past_kv={'set' if bad[0][1] else 'None'}. Feeding the whole "
                 "sequence again throws the cache's speed-up away (or repeats tokens in it).")
        lens = [c[4] for c in later]
        if lens != list(range(T0, T0 + len(later))):
            fail(f"{what}: the cache fed to the model held {lens[:6]}... tokens at the successive "
                 f"steps; it should grow by one per step ({T0}, {T0 + 1}, ...). Keep the cache "
                 "that each call returns: logits, cache = model(token, past_kv=cache, "
                 "use_cache=True).")
    else:
        if any(c[1] for c in calls):
            fail(f"{what}: with use_cache=False do not pass past_kv; run model(seq) on the "
                 "whole sequence at every step.")
        lens = [c[0][1] for c in calls]
        if lens[:n_steps] != list(range(T0, T0 + n_steps)):
            fail(f"{what}: with use_cache=False the model should see the whole sequence, of "
                 f"lengths {T0}, {T0 + 1}, ...; it saw lengths {lens[:6]}...")


def check_generate_greedy(generate, seed=0, cases=((2, 4, 12),)):
    """temperature=0: greedy; with and without the cache the same tokens as the reference."""
    for i, (B, T0, n) in enumerate(cases):
        m = _new_spy(17, 32, 4, 2, 64, seed + i)
        with seeded(seed + 30 + i):
            prompt = torch.randint(0, 17, (B, T0))
        expected = _greedy_reference(m, prompt, n)
        for cached in (True, False):
            m.calls.clear()
            what = f"generate(model, prompt ({B}, {T0}), {n}, temperature=0, use_cache={cached})"
            try:
                out = _gen_call(generate, m, prompt, n, what, temperature=0.0, use_cache=cached)
            except CheckFailed as e:
                if re.search(r"probability tensor contains|inf|nan|divi", str(e), re.I):
                    raise CheckFailed(f"{e}\ntemperature=0 means greedy: take the argmax of the "
                                      "last position's logits; dividing the logits by 0 gives "
                                      "inf/NaN probabilities.") from None
                raise
            _check_calls(m, B, T0, n, cached, what)
            if out.shape != expected.shape or not torch.equal(out, expected):
                first_pos = ref_first_position_greedy(m, prompt, n, cached)
                hint = ("you took the scores of the FIRST position, logits[:, 0]; the next token "
                        "is predicted by the LAST one, logits[:, -1]."
                        if out.shape == first_pos.shape and torch.equal(out, first_pos) else
                        "temperature=0 means greedy: the argmax of the last position's logits "
                        "at every step, appended to the sequence.")
                fail(f"{what} differs from greedy decoding.\n  actual:   {out.tolist()}\n"
                     f"  expected: {expected.tolist()}\n{hint}")
    passed("generate: greedy (temperature=0) gives the same tokens with and without the cache; "
           "the cache is fed one new token per step")


@torch.no_grad()
def ref_first_position_greedy(model, prompt, n, cached):
    """Greedy decoding from logits[:, 0]: at every step without a cache; with one, only the
    first step differs (later steps feed a single token, whose position 0 is the last)."""
    seq = prompt
    for step in range(n):
        pos = 0 if (step == 0 or not cached) else -1
        seq = torch.cat([seq, model(seq)[:, pos].argmax(-1, keepdim=True)], 1)
    return seq


def check_generate_greedy_equivalents(generate, seed=0):
    """top_k=1 (any temperature) and temperature=0 (any top_k) are greedy."""
    m = _new_spy(17, 32, 4, 2, 64, seed)
    with seeded(seed + 1):
        prompt = torch.randint(0, 17, (3, 3))
    expected = _greedy_reference(m, prompt, 10)
    try:
        plain = _gen_call(generate, m, prompt, 10, "generate(model, prompt, 10, temperature=0)",
                          temperature=0.0)
    except CheckFailed as e:
        raise CheckFailed(f"{e}\ntemperature=0 means greedy: take the argmax, do not divide the "
                          "logits by 0.") from None
    if plain.shape != expected.shape or not torch.equal(plain, expected):
        fail("generate(model, prompt, 10, temperature=0) is not greedy decoding in the first "
             "place (see test_generate_greedy_cache), so its equivalents cannot be either: fix "
             f"that first.\n  actual:   {plain.tolist()}\n  expected: {expected.tolist()}")
    for kw in ({"top_k": 1, "temperature": 1.0}, {"top_k": 1, "temperature": 1.7},
               {"temperature": 0.0, "top_k": 5}):
        what = "generate(model, prompt, 10, " + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")"
        try:
            out = _gen_call(generate, m, prompt, 10, what, generator=torch.Generator()
                            .manual_seed(seed + 2), **kw)
        except CheckFailed as e:
            if kw["temperature"] == 0.0:
                raise CheckFailed(f"{e}\ntemperature=0 means greedy: take the argmax, do not "
                                  "divide the logits by 0.") from None
            raise
        if out.shape != expected.shape or not torch.equal(out, expected):
            hint = ("top_k=1 keeps only the best token, so sampling from it is greedy decoding."
                    if kw.get("top_k") == 1 else
                    "temperature=0 is the limit of ever sharper softmax: greedy decoding.")
            fail(f"{what} is not greedy decoding.\n  actual:   {out.tolist()}\n"
                 f"  expected: {expected.tolist()}\n{hint}")
    passed("generate: top_k=1 and temperature=0 both give greedy decoding")


def _freqs(out, V):
    return torch.bincount(out[:, -1], minlength=V).double() / out.size(0)


SAMPLE_LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])


def check_generate_sampling(generate, n_rows=4000, tol=0.035):
    """Empirical next-token frequencies (one sample per row of a big batch) against
    softmax(logits / T) restricted to the top k; the generator makes runs reproducible."""
    lg = SAMPLE_LOGITS[[3, 0, 6, 2, 7, 1, 5, 4]]  # not sorted: top-k must find the best
    V = lg.numel()
    prompt = torch.zeros(n_rows, 1, dtype=torch.long)
    for temp, k in ((2.0, None), (0.5, None), (1.0, 3), (0.7, 5)):
        model = _FixedLM(lg)
        what = f"generate(model, prompt, 1, temperature={temp}, top_k={k})"
        out = _gen_call(generate, model, prompt, 1, what, temperature=temp, top_k=k,
                        generator=torch.Generator().manual_seed(123))
        check_shape(out, (n_rows, 2), what)
        got = _freqs(out, V)
        def dist(scale, kk):
            z = lg.double() / scale
            if kk is not None:
                z = z.masked_fill(z < z.topk(kk).values[-1], float("-inf"))
            return z.softmax(-1)
        exp = dist(temp, k)
        if k is not None:
            outside = [t for t in range(V) if exp[t] == 0 and got[t] > 0]
            if outside:
                fail(f"{what} sampled token(s) {outside}, which are not among the {k} highest "
                     f"scores {sorted(lg.topk(k).indices.tolist())}: keep the k LARGEST logits "
                     "and set the rest to -inf before softmax (torch.topk(...).values[..., -1:] "
                     "is the threshold).")
        if (got - exp).abs().max() > tol:
            cands = {
                "you multiplied the logits by the temperature; divide: softmax(logits / T), so "
                "T > 1 flattens and T < 1 sharpens.": dist(1.0 / temp, k),
                "the temperature is ignored: sample from softmax(logits / temperature).":
                    dist(1.0, k),
                "top_k is ignored: keep only the k largest logits (set the others to -inf).":
                    dist(temp, None),
                "you always picked the most likely token: with temperature > 0 draw a sample, "
                "torch.multinomial(probs, 1, generator=generator).":
                    F.one_hot(lg.argmax(), V).double(),
            }
            why = next((h for h, c in cands.items() if (got - c).abs().max() <= tol), None)
            fail(f"{what}: the sampled frequencies over {n_rows} rows do not follow the expected "
                 f"distribution.\n  actual:   {[round(x, 3) for x in got.tolist()]}\n"
                 f"  expected: {[round(x, 3) for x in exp.tolist()]}\n"
                 + (why or "Sample from softmax(logits[:, -1] / temperature), after keeping only "
                           "the top_k largest logits."))
    # reproducibility through `generator`, whatever the global RNG does
    model = _FixedLM(lg)
    small = torch.zeros(64, 1, dtype=torch.long)
    runs = []
    for global_seed, gen_seed in ((1, 7), (2, 7), (3, 8)):
        torch.manual_seed(global_seed)
        runs.append(_gen_call(generate, model, small, 3, "generate(..., generator=g)",
                              temperature=1.0, generator=torch.Generator().manual_seed(gen_seed)))
    if not torch.equal(runs[0], runs[1]):
        fail("two calls with generators seeded alike gave different tokens: draw every sample "
             "from `generator` (torch.multinomial(probs, 1, generator=generator)), not from the "
             "global random state.")
    if torch.equal(runs[0], runs[2]):
        fail("generators with different seeds gave the same 64 x 3 samples: is `generator` "
             "re-seeded or ignored?")
    passed("generate: samples follow softmax(logits / T) over the top k; `generator` makes runs "
           "reproducible")


EOS = 4


def _eos_model():
    # first token -> the token predicted at each absolute position
    s = torch.full((6, 24), 5, dtype=torch.long)
    s[1, 2:7] = torch.tensor([5, 3, EOS, 5, 3])  # row starting with 1: EOS at its 3rd new token
    s[2, 2:8] = torch.tensor([3, 3, 3, 3, EOS, 1])  # ... with 2: EOS at its 5th
    s[3, 2:5] = torch.tensor([EOS, 5, 1])  # ... with 3: EOS at once
    return _ScriptedLM(s, 6)


def _check_eos_zero(generate, prompt, expected):
    """The same story with the end token renamed to id 0 (08's own '.' separator is id 0):
    `if eos_id:` treats it as no end token at all."""
    perm = torch.arange(6)
    perm[0], perm[EOS] = EOS, 0  # swap ids 0 and EOS
    base = _eos_model()
    scripts = torch.empty_like(base.scripts)
    scripts[perm] = perm[base.scripts]  # row of first token perm[i] = relabelled row i
    prompt0, expected0 = perm[prompt], perm[expected]
    for cached in (True, False):
        model = _ScriptedLM(scripts, 6)
        what = f"generate(model, prompt, 10, temperature=0, eos_id=0, use_cache={cached})"
        out = _gen_call(generate, model, prompt0, 10, what, temperature=0.0, eos_id=0,
                        use_cache=cached)
        if out.shape == expected0.shape and torch.equal(out, expected0):
            continue
        msg = (f"{what}:\n  actual:   {out.tolist()}\n  expected: {expected0.tolist()}\n")
        plain = _gen_call(generate, _ScriptedLM(scripts, 6), prompt0, 10, "generate(..., "
                          "eos_id=None)", temperature=0.0, use_cache=cached)
        if out.shape == plain.shape and torch.equal(out, plain):
            fail(msg + "with eos_id=0 generation behaves as if there were no end token: a "
                 "test like `if eos_id:` is False for the id 0 (this notebook's own '.' "
                 "separator is id 0). Test `if eos_id is not None:`.")
        fail(msg + "with eos_id=0 the rows do not stop at their first generated 0 (with "
             f"eos_id={EOS} they do): treat every id, 0 included, the same way; test "
             "`eos_id is not None`, never the truth value of the id.")


def check_generate_eos(generate):
    """Rows stop independently; finished rows are filled with eos_id; generation stops when
    every row has produced eos_id; an eos_id inside the prompt does not count; an eos_id of 0
    works like any other."""
    prompt = torch.tensor([[1, 0, EOS], [2, 1, 0], [3, 3, 3]])  # row 0 already ends in EOS
    expected = torch.tensor([[1, 0, EOS, 5, 3, EOS, EOS, EOS],
                             [2, 1, 0, 3, 3, 3, 3, EOS],
                             [3, 3, 3, EOS, EOS, EOS, EOS, EOS]])
    for cached in (True, False):
        model = _eos_model()
        what = f"generate(model, prompt, 10, temperature=0, eos_id={EOS}, use_cache={cached})"
        out = _gen_call(generate, model, prompt, 10, what, temperature=0.0, eos_id=EOS,
                        use_cache=cached)
        if out.shape == expected.shape and torch.equal(out, expected):
            continue
        T = out.size(1)
        msg = f"{what}:\n  actual:   {out.tolist()}\n  expected: {expected.tolist()}\n"
        if T == 3 or (T > 3 and out[0, 3] == EOS):
            fail(msg + "row 0 was treated as finished before it generated anything: its prompt "
                 "ends with eos_id (seed 001's prompts do too: 'what is statquest <EOS>'). Only "
                 "GENERATED tokens end a row: track finished rows from the new tokens only.")
        gen = out[:, 3:]
        after = [r for r in range(3) if (gen[r] == EOS).any() and
                 (gen[r, int((gen[r] == EOS).nonzero()[0]):] != EOS).any()]
        if after:
            fail(msg + f"row {after[0]} goes on after its eos_id. Once a row has produced "
                 "eos_id, fill its later positions with eos_id (keep a `finished` mask).")
        if T < expected.size(1):
            fail(msg + "generation stopped when ONE row finished; keep going until EVERY row has "
                 "produced eos_id (finished.all()), or max_new_tokens.")
        if T > expected.size(1):
            fail(msg + "generation went on after every row had produced eos_id: stop as soon as "
                 "all rows are finished.")
        fail(msg + "Each row follows the model's greedy choice until its own first eos_id.")
    _check_eos_zero(generate, prompt, expected)
    model = _eos_model()
    out = _gen_call(generate, model, prompt, 6, "generate(..., eos_id=None)", temperature=0.0)
    check_shape(out, (3, 9), "generate(model, prompt (3, 3), 6, eos_id=None)",
                "With eos_id=None there is no end token: generate exactly max_new_tokens.")
    passed("generate: rows finish independently at eos_id (prompt excluded), are filled with "
           "eos_id, and generation stops when all are done")
