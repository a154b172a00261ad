"""08_decoder_only: what the grader runs on the student's `next_token_loss`,
`CausalSelfAttention`, `DecoderOnlyLM` and `generate`, on inputs drawn for each grading run.

The modules get the reference's (perturbed) weights copied by name (`w_q` ... `w_o`;
`tok_embed`, `layers.i.norm1 / self_attn / norm2 / ff`, `norm`, `lm_head`), so a part the
exercise describes as separate but the student's model shares (one block repeated in `layers`,
one LayerNorm serving as norm1 and norm2, an `lm_head` tied to the embedding) has no parameter
of its own to receive, and fails; `params=True` also compares the parameter list. Cached calls
chain the model's own cache (`prev`) and must give the reference's logits.

`generate` runs on the probe machine's stand-in language model (`toy_lm`, `forward(tokens)`
only, so every call passes `use_cache=False`). Greedy decoding is compared token for token;
sampling (where valid implementations draw differently) by the frequencies of one sampled
token over a large batch; the end-of-sequence rules by checking the structure of sampled rows
(each row stops at its first generated eos_id, is filled with eos_id after it, the loop stops
when every row has finished, an eos_id inside the prompt does not count).

Diagnoses name a mistake when a probe fails: a wrong formula replayed on the same inputs
(`like`; `replay` for calls that continue from the cache an earlier call returned: the
student's own cache is fed back, so a wrong step is replayed as the student's code ran it),
greedy decoding done wrong in one known way (`_generate`), sampled frequencies that follow a
wrong distribution, or the parameter names a shared module leaves out."""
import json
import math
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from . import engine, vm
from .engine import (Diagnosis, Exercise, Probe, call, ctor, fixture, given, grades, like, prev,
                     randint, randn, shapes, variants, when)
from .transformer import _Seeded

ASSIGNMENT = "08_decoder_only"


# -- inputs -----------------------------------------------------------------------------------

SEED_TOKENS = [[0, 1, 2, 4, 3, 4], [2, 1, 0, 4, 3, 4]]   # seed 001's two sentences


def _fixed(rows, what):
    return given(lambda g: torch.tensor(rows), what)


def _padded(B, T, V, pad, lengths):
    """(B, T) ids in [0, V) other than `pad`, rows padded with `pad` after `lengths` tokens."""
    def build(g):
        t = torch.randint(0, V - 1, (B, T), generator=g)
        t = t + (t >= pad).long()
        for b, n in enumerate(lengths):
            t[b, n:] = pad
        return t
    return given(build, f"ids{(B, T)} padded with {pad} to lengths {list(lengths)}")


def _with_ignored(B, T, V, ignore, frac=0.3):
    def build(g):
        t = torch.randint(0, V, (B, T), generator=g)
        t[torch.rand(B, T, generator=g) < frac] = ignore
        return t
    return given(build, f"ids{(B, T)} with about {frac:.0%} equal to {ignore}")


def _scalar(value=1.0):
    return given(lambda g: torch.tensor(value), f"upstream gradient {value:g}")


def _lm(vocab, d, base_seed):
    """The stand-in causal LM with fixed base weights (see transformer._Seeded)."""
    return _Seeded(base_seed, "toy_lm", vocab, d)


def _same_prompt(N, V, T0=1):
    """N identical rows: one next-token distribution, sampled N times."""
    def build(g):
        row = torch.randint(0, V, (T0,), generator=g)
        return row.expand(N, T0).clone()
    return given(build, f"{N} identical prompts of length {T0}")


def _eos_prompts(B, T0, V, eos, n_with_eos):
    """Random prompts; the first `n_with_eos` rows hold eos_id somewhere (half of them at the
    end), the others never."""
    def build(g):
        t = torch.randint(0, V - 1, (B, T0), generator=g)
        t = t + (t >= eos).long()
        for b in range(n_with_eos):
            j = T0 - 1 if b % 2 == 0 else int(torch.randint(0, T0, (1,), generator=g))
            t[b, j] = eos
        return t
    return given(build, f"{B} prompts, {n_with_eos} of them holding eos_id={eos}")


# -- comparisons ------------------------------------------------------------------------------

def _frequencies(V, top_k=None, tol=0.035):
    """Sampled rows: the frequencies of the last column's tokens, compared between the
    student's and the reference's samples (same distribution, different draws: with 12000
    rows a frequency's sampling noise is below 0.007, five times less than `tol`)."""
    def compare(key, got, want):
        if not key.endswith(".out"):
            return "default"
        if got.ndim != 2 or got.shape != want.shape:
            return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if not np.array_equal(got[:, :-1], want[:, :-1]):
            return "the output does not start with the prompt"
        last = got[:, -1].astype(np.int64)
        if last.min() < 0 or last.max() >= V:
            return f"sampled ids outside the vocabulary 0..{V - 1}"
        f_got = np.bincount(last, minlength=V) / len(last)
        f_want = np.bincount(want[:, -1].astype(np.int64), minlength=V) / len(last)
        outside = [int(t) for t in np.nonzero((f_want == 0) & (f_got > 0.002))[0]]
        if outside and top_k is not None:
            return (f"token(s) {outside} were sampled although they are not among the top_k={top_k} "
                    "largest logits: keep the k LARGEST logits, set the others to -inf, then "
                    "sample")
        diff = np.abs(f_got - f_want)
        if diff.max() > tol:
            k = "" if top_k is None else f" over the top_k={top_k} largest logits"
            return (f"the sampled frequencies {np.round(f_got, 3).tolist()} over {len(last)} rows "
                    f"do not follow softmax(logits / temperature){k} (expected about "
                    f"{np.round(f_want, 3).tolist()}): divide the last position's logits by the "
                    "temperature" + (", keep the top_k largest" if top_k else "")
                    + " and draw with torch.multinomial")
        return None
    return compare


def _eos_violation(out, T0, max_new, eos, dropping_prompt_eos):
    """What breaks generate's end-of-sequence rules in `out` (an int array), or None."""
    n = out.shape[1] - T0
    if n < 0 or n > max_new:
        return f"{n} tokens were generated; between 0 and max_new_tokens={max_new} expected"
    gen = out[:, T0:]
    is_eos = gen == eos
    for b in range(gen.shape[0]):
        hits = np.nonzero(is_eos[b])[0]
        if len(hits) and not is_eos[b, hits[0]:].all():
            return (f"row {b} goes on after its first generated eos_id={eos} "
                    f"(its new tokens: {gen[b].tolist()}): a finished row is filled with "
                    "eos_id" + (" (eos_id=0 is an id like any other: test `eos_id is not "
                                "None`, not `if eos_id:`)" if eos == 0 else ""))
    done = np.logical_or.accumulate(is_eos, axis=1).all(axis=0) if n else np.zeros(0, bool)
    if n < max_new and not (n and done[-1]):
        left = int((~is_eos.any(1)).sum())
        return (f"generation stopped after {n} of max_new_tokens={max_new} tokens while {left} "
                "row(s) had not produced eos_id: stop only when EVERY row has finished")
    if n >= 2 and done[-2]:
        return (f"every row had produced eos_id after {int(np.argmax(done)) + 1} tokens, but "
                f"generation went on to {n}: stop as soon as all rows are finished")
    if dropping_prompt_eos is not None and n:
        rows = dropping_prompt_eos
        if all(gen[b, 0] == eos for b in rows):
            return (f"the {len(rows)} rows whose prompt holds eos_id={eos} were all treated as "
                    "finished from the start: only GENERATED tokens end a row")
    return None


def _eos_rules(T0, max_new, eos, prompt_eos_rows=None):
    rows = None if prompt_eos_rows is None else list(range(prompt_eos_rows))

    def compare(key, got, want):
        if not key.endswith(".out"):
            return "default"
        bad = _eos_violation(np.asarray(want), T0, max_new, eos, rows)
        if bad:  # the reference itself: a sampling accident, never the student's fault
            return None
        if got.ndim != 2 or got.shape[0] != want.shape[0]:
            return f"the output has shape {tuple(got.shape)}, expected ({want.shape[0]}, T0 + new)"
        if not np.array_equal(got[:, :T0], want[:, :T0]):
            return "the output does not start with the prompt"
        return _eos_violation(np.asarray(got), T0, max_new, eos, rows)
    return compare



# -- diagnoses: shared helpers ----------------------------------------------------------------

def _rebuilt(e, key):
    """The student's output at `key` as the code returned it (tuples of tensors), from the
    captures: what a later call received as `prev` (a KV cache)."""
    kind = e.meta(key) or ""
    if kind.startswith(("tuple[", "list[")):
        return tuple(_rebuilt(e, f"{key}.{i}") for i in range(int(kind[kind.index("[") + 1:-1])))
    g = e.got(key)
    return None if g is None else torch.from_numpy(np.array(g))


def _chained(e, ci):
    """Call ci's (args, kwargs), an earlier call's output (`prev`) taken from what the student's
    code returned: a wrong formula is replayed on the student's own cache."""
    ctx = vm._Ctx(e.tensors, engine._namespace(e.ex))
    ctx.outs = {j: _rebuilt(e, f"{j}.out") for j in range(ci)}
    c = e.pd["calls"][ci]
    return ctx.value(c["args"]), ctx.value(c["kwargs"])


def _continues(c) -> bool:
    """Whether a call continues from an earlier call's output (a cache)."""
    return "$prev" in json.dumps(c)


def _main(e, ci, want=False):
    """The output of call ci, or its output[0] (the logits or attention output of a pair)."""
    get = e.want_out if want else e.out
    g = get(ci)
    g = get(ci, "0") if g is None else g
    return None if g is None else np.asarray(g, dtype=np.float64)


def _close(a, b, atol=1e-4, rtol=1e-3):
    return a.shape == b.shape and np.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True)


def _replays(fn, cached_only=False):
    """pred: on every call (with a cache, if cached_only) where fn(ref, *args, **kwargs) gives a
    tensor, the student's output equals it, and on one of them the reference's does not."""
    def pred(e):
        ref, same, differs = e.ref(), 0, False
        for ci, c in enumerate(e.pd["calls"]):
            g, w = _main(e, ci), _main(e, ci, want=True)
            if (cached_only and not _continues(c)) or g is None or w is None:
                continue
            try:
                args, kwargs = _chained(e, ci)
                with torch.no_grad():
                    r = fn(ref, *args, **kwargs)
            except Exception:  # noqa: BLE001 - the wrong formula does not apply to this call
                continue
            if r is None:
                continue
            r = r.double().numpy()
            if not _close(g, r):
                return False
            same, differs = same + 1, differs or not _close(w, r)
        return same > 0 and differs
    return pred


def replay(message, fn, probes=(), cached_only=False) -> Diagnosis:
    """`like` for modules whose later calls continue from an earlier call's cache."""
    return when(message, _replays(fn, cached_only), probes)


def said(find, probes=()) -> Diagnosis:
    """A diagnosis whose message depends on the evidence: find(e) returns it, or None."""
    d = when("", lambda e: False, probes)

    def test(e):
        d.message = find(e) or ""
        return bool(d.message)
    d.test = test
    return d


# -- next_token_loss --------------------------------------------------------------------------



def _ce(logits, targets, ignore_id=None):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id)


def _per_target(logits, tokens):
    """(B, T-1) losses of the shifted pairs, nothing ignored."""
    B, T, V = logits.shape
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
                           reduction="none").view(B, T - 1)


def _padded_mean(logits, tokens, keep, rows_first=False, all_positions=False):
    per, keep = _per_target(logits, tokens), keep.double()
    if rows_first:
        return ((per * keep).sum(1) / keep.sum(1)).mean()
    return (per * keep).sum() / (keep.numel() if all_positions else keep.sum())


def _n_kept(tokens, ignore_id):
    return tokens[:, 1:].numel() if ignore_id is None else (tokens[:, 1:] != ignore_id).sum()


LOSS_DIAGNOSES = [
    when("next_token_loss returned a Python number (loss.item()?): return the loss as a 0-d "
         "tensor computed from the logits (no .item(), float() or numpy), so that "
         "loss.backward() works.", lambda e: (e.meta("0.out") or "") in ("float", "int")),
    when("next_token_loss returned more than one number: return the mean over every predicted "
         "position, a 0-d tensor. Flatten the logits to (B*(T-1), V) and the targets to "
         "(B*(T-1),) before F.cross_entropy, whose default reduction is the mean.",
         lambda e: any(g.ndim > 0 and g.size > 1 for g, _ in e.outs())),
    when("F.cross_entropy wants the classes on dim 1: flatten the logits to (B*(T-1), V) and the "
         "targets to (B*(T-1),) first.",
         lambda e: "Expected target size" in e.error or "Expected input batch_size" in e.error),
    like("no shift: position t is compared with the token AT position t, so the model only has "
         "to copy its input (which the causal mask lets it see). Position t must predict the "
         "NEXT token: logits[:, :-1] against tokens[:, 1:].",
         lambda lg, tk, ignore_id=None: _ce(lg, tk, ignore_id)),
    like("no shift (both sides cut the same way): logits[:, :-1] is compared with "
         "tokens[:, :-1], the same positions, so the model learns to copy. The labels are "
         "tokens[:, 1:].", lambda lg, tk, ignore_id=None: _ce(lg[:, :-1], tk[:, :-1], ignore_id)),
    like("no shift (both sides cut the same way): logits[:, 1:] is compared with tokens[:, 1:], "
         "the same positions, so the model learns to copy. Use logits[:, :-1] against "
         "tokens[:, 1:].", lambda lg, tk, ignore_id=None: _ce(lg[:, 1:], tk[:, 1:], ignore_id)),
    like("the shift goes the wrong way: logits[:, 1:] against tokens[:, :-1] asks each position "
         "for the PREVIOUS token. Use logits[:, :-1] against tokens[:, 1:].",
         lambda lg, tk, ignore_id=None: _ce(lg[:, 1:], tk[:, :-1], ignore_id)),
    like("you applied softmax before F.cross_entropy, which applies log_softmax itself: pass "
         "the raw logits.",
         lambda lg, tk, ignore_id=None: _ce(lg[:, :-1].softmax(-1), tk[:, 1:], ignore_id)),
    like("F.nll_loss expects log-probabilities, and you gave it raw logits: use "
         "F.cross_entropy (or log_softmax first).",
         lambda lg, tk, ignore_id=None: F.nll_loss(
             lg[:, :-1].reshape(-1, lg.size(-1)), tk[:, 1:].reshape(-1),
             ignore_index=-100 if ignore_id is None else ignore_id)),
    like("you summed the per-token losses; the loss is their MEAN (reduction='mean').",
         lambda lg, tk, ignore_id=None: _ce(lg[:, :-1], tk[:, 1:], ignore_id) * _n_kept(tk, ignore_id)),
    like("F.cross_entropy read the TIME axis as the classes: it wants the classes on dim 1, so "
         "flatten the logits to (B*(T-1), V) and the targets to (B*(T-1),) first.",
         lambda lg, tk, ignore_id=None: F.cross_entropy(
             lg[:, :-1], tk[:, 1:], ignore_index=-100 if ignore_id is None else ignore_id)
         if lg.size(1) - 1 == lg.size(2) else None),
    like("targets equal to ignore_id were counted: pass ignore_index=ignore_id to "
         "F.cross_entropy (or drop those positions before averaging).",
         lambda lg, tk, ignore_id=None: None if ignore_id is None else _ce(lg[:, :-1], tk[:, 1:])),
    like("you masked by the INPUT token (tokens[:, :-1]); what must be ignored is a padding "
         "TARGET, tokens[:, 1:] == ignore_id.",
         lambda lg, tk, ignore_id=None: None if ignore_id is None else
         _padded_mean(lg, tk, tk[:, :-1] != ignore_id)),
    like("you averaged each row first and then the rows; the loss is the mean over all kept "
         "targets (a long row weighs more than a short one).",
         lambda lg, tk, ignore_id=None: None if ignore_id is None else
         _padded_mean(lg, tk, tk[:, 1:] != ignore_id, rows_first=True)),
    like("you zeroed the ignored targets but divided by ALL positions; divide by the number of "
         "kept targets.", lambda lg, tk, ignore_id=None: None if ignore_id is None else
         _padded_mean(lg, tk, tk[:, 1:] != ignore_id, all_positions=True)),
    when("the gradient with respect to the logits is wrong although the value is right: the "
         "last position predicts nothing (no token follows it), so its gradient is 0; keep the "
         "loss a tensor computed from the logits.",
         lambda e: "the gradient" in e.problem and "differs" in e.problem),
]

NEXT_TOKEN_LOSS = Exercise("next_token_loss", ref="decoder_only.next_token_loss",
                           graded=grades(seed_tables=1, ignore_id=1, random=(2, 4301)),
                           diagnose=LOSS_DIAGNOSES, probes=[
    Probe("seed tables", ("seed_tables",),
          [call(randn(2, 6, 5, scale=2.0), _fixed(SEED_TOKENS, "seed 001's two sentences"),
                grad=(0,), backward=_scalar()),
           call(randn(2, 6, 5, scale=2.0), _fixed([r[::-1] for r in SEED_TOKENS], "reversed"),
                grad=(0,), backward=_scalar(0.5))],
          atol=1e-5, rtol=1e-4,
          what="seed 001's two sentences: the value and its gradient with respect to the logits"),
    Probe("ignore id", ("ignore_id",),
          [call(randn(3, 7, 10), _padded(3, 7, 10, 0, [5, 7, 2]), ignore_id=0),
           call(randn(4, 6, 9), _padded(4, 6, 9, 3, [6, 2, 4, 5]), ignore_id=3),
           call(randn(2, 5, 6), _padded(2, 5, 6, 0, [5, 5]), ignore_id=0)],
          what="padded rows of different lengths with ignore_id 0 and 3, and ignore_id absent"),
    Probe("random", ("random",),
          [call(randn(2, 7, 11, scale=3.0), randint(0, 11, 2, 7)),
           call(randn(3, 2, 5, scale=3.0), randint(0, 5, 3, 2)),
           call(randn(1, 13, 29, scale=3.0), _with_ignored(1, 13, 29, 0), ignore_id=0),
           call(randn(5, 9, 7, scale=3.0), _with_ignored(5, 9, 7, 6), ignore_id=6),
           call(randn(4, 17, 3, scale=3.0), randint(0, 3, 4, 17))],
          what="random (B, T, V) cases with and without ignore_id"),
])


# -- CausalSelfAttention ----------------------------------------------------------------------



def _attn(name, d, h, calls, cells, what, dropout=None, **kw):
    make = ctor(d, h) if dropout is None else ctor(d, h, dropout=dropout)
    return Probe(name, cells, calls, make=make, load="reference", mode="eval", what=what, **kw)


def _chunks(B, d, sizes):
    """A prefix, then chunks fed with the cache the previous call returned."""
    calls = [call(randn(B, sizes[0], d))]
    for i, n in enumerate(sizes[1:]):
        calls.append(call(randn(B, n, d), prev(i, "1")))
    return calls


def _attend(ref, x, past_kv=None, mask="causal", scale="dh", split="ok", after=False,
            new_first=False, offset=True, cache_mask=True, use_past=True):
    """The reference attention's weights on x, with one known mistake (the arguments)."""
    B, T, D = x.shape
    H = ref.n_heads

    def heads(t):
        return t.reshape(B, H, T, D // H) if split == "view" else t.view(B, T, H, D // H).transpose(1, 2)
    q, k, v = (heads(lin(x)) for lin in (ref.w_q, ref.w_k, ref.w_v))
    if past_kv is not None and use_past:
        pk, pv = past_kv
        k, v = (torch.cat([k, pk], 2), torch.cat([v, pv], 2)) if new_first else \
            (torch.cat([pk, k], 2), torch.cat([pv, v], 2))
    P = k.size(2) - T
    i, j = torch.arange(T)[:, None] + (P if offset else 0), torch.arange(P + T)[None, :]
    allowed = {"causal": j <= i, "none": j >= 0, "triu": j >= i, "strict": j < i}[mask]
    if P and not cache_mask:
        allowed = j >= 0
    s = q @ k.transpose(-2, -1) / {"dh": math.sqrt(D // H), "d": math.sqrt(D), "none": 1.0}[scale]
    w = s.softmax(-1) * allowed if after else s.masked_fill(~allowed, float("-inf")).softmax(-1)
    o = w @ v
    return ref.w_o(o.reshape(B, T, D) if split == "view" else o.transpose(1, 2).reshape(B, T, D))


def _k_shape(e, ci):
    k = e.out(ci, "1.0")
    return None if k is None else np.shape(k)


def _only_new_cached(e):
    """A cached call whose returned keys hold only its new tokens."""
    return any(_continues(c) and _k_shape(e, ci) is not None and len(_k_shape(e, ci)) == 4
               and e.want_out(ci, "1.0") is not None
               and _k_shape(e, ci)[2] < np.shape(e.want_out(ci, "1.0"))[2]
               for ci, c in enumerate(e.pd["calls"]))


def _row0_nan(e):
    outs = [_main(e, ci) for ci, c in enumerate(e.pd["calls"]) if not _continues(c)]
    return any(g is not None and not np.isfinite(g).all() and np.isfinite(g[:, 1:]).all()
               for g in outs)


def _ignored_offset(e):
    """The mask is a plain tril over (T, P + T): name P, the first cached call's past length."""
    if not _replays(partial(_attend, offset=False), cached_only=True)(e):
        return None
    ci = next(ci for ci, c in enumerate(e.pd["calls"]) if _continues(c))
    P = _chained(e, ci)[0][1][0].size(2)
    return (f"the causal mask ignores the {P} cached tokens: new query i sits at position "
            f"{P} + i, so it may see keys 0 .. {P} + i. Build the (T, {P} + T) mask with "
            f"torch.tril(..., diagonal={P}) (the number of cached tokens); a plain tril lets a "
            "new token see only the first keys.")


ATTENTION_DIAGNOSES = [
    when("the cached keys/values have shape (B, T, d_model): cache them AFTER splitting into "
         "heads, (B, H, T, D_h), so that the next step can concatenate along the time axis "
         "(dim=2).", lambda e: _k_shape(e, 0) is not None and len(_k_shape(e, 0)) == 3),
    when("after a cached step the returned cache holds only the new keys/values: return the "
         "whole cache, torch.cat([past_k, k], dim=2), of shape (B, H, T_past + T, D_h).",
         _only_new_cached),
    when("position 0 came out NaN: its row of the mask has no allowed key. A token must be "
         "allowed to attend to ITSELF: the causal mask keeps the diagonal (tril with "
         "diagonal=0, True on and below it).", _row0_nan),
    replay("no causal mask: every position attends to later tokens. Allow key j for query i "
           "only when j <= i (tril, True on and below the diagonal).", partial(_attend, mask="none")),
    replay("the mask is the wrong way round: it lets each position see the FUTURE (triu). "
           "Allowed keys are j <= i: torch.tril.", partial(_attend, mask="triu")),
    replay("the mask excludes the diagonal: a token must be allowed to attend to ITSELF (tril "
           "with diagonal=0).", partial(_attend, mask="strict")),
    replay("you scaled by sqrt(d_model); each head's scores are scaled by sqrt(D_h), D_h = "
           "d_model // n_heads.", partial(_attend, scale="d")),
    replay("the scores are not scaled by 1/sqrt(D_h).", partial(_attend, scale="none")),
    replay("heads were split with view(B, H, T, D_h) without a transpose, which mixes positions "
           "and features. Use view(B, T, H, D_h).transpose(1, 2), and the reverse to merge.",
           partial(_attend, split="view")),
    replay("the mask was applied AFTER softmax (weights * mask): the rows no longer sum to 1. "
           "Mask the scores with a large negative number before softmax.",
           partial(_attend, after=True)),
    replay("past_kv is ignored: the new tokens attend only to themselves. Concatenate the "
           "cached keys/values in front of the new ones.", partial(_attend, use_past=False),
           cached_only=True),
    said(_ignored_offset),
    replay("the cache is concatenated in the wrong order: old keys come FIRST, "
           "torch.cat([past_k, k], dim=2).", partial(_attend, new_first=True), cached_only=True),
    replay("with a cache you dropped the causal mask: several new tokens at once must still not "
           "see each other's future (mask (T, past + T), tril with diagonal=past).",
           partial(_attend, cache_mask=False), cached_only=True),
]

CAUSAL_SELF_ATTENTION = Exercise("CausalSelfAttention", ref="decoder_only.CausalSelfAttention", returns=("output", "cache"),
                                 graded=grades(shapes=1, matches_torch=(2, 8117), cache=(2, 9773)),
                                 shortcuts=("attention", "multihead"),
                                 diagnose=ATTENTION_DIAGNOSES, probes=[
    _attn("shapes", 12, 3, _chunks(2, 12, (5, 2)), (shapes("shapes"),),
          "shapes: 5 tokens, then 2 more with the cache (3 heads of size 4)", params=True),
    _attn("torch 1", 16, 4, [call(randn(2, 6, 16))], ("matches_torch",),
          "no cache: (2, 6, 16), 4 heads"),
    _attn("torch 2", 24, 3, [call(randn(3, 9, 24)), call(randn(1, 1, 24))],
          ("matches_torch",), "no cache: (3, 9, 24) with 3 heads, and a single token"),
    _attn("torch 3", 32, 8, [call(randn(2, 13, 32))], ("matches_torch",),
          "eval mode with dropout=0.3: (2, 13, 32), 8 heads", dropout=0.3),
    _attn("torch 4", 10, 1, [call(randn(4, 5, 10))], ("matches_torch",),
          "one head: (4, 5, 10)"),
    _attn("cache 1", 16, 4, _chunks(2, 16, (4, 1, 2, 1)), ("cache",),
          "cache: a prefix of 4, then chunks of 1, 2 and 1 tokens"),
    _attn("cache 2", 24, 6, _chunks(3, 24, (1, 1, 1, 5, 3)), ("cache",),
          "cache: chunks of 1, 1, 1, 5 and 3 tokens, 6 heads"),
    _attn("cache 3", 12, 3, _chunks(2, 12, (3, 4, 1)), ("cache",),
          "cache: chunks of 3, 4 and 1 tokens"),
])


# -- DecoderOnlyLM ----------------------------------------------------------------------------



def _model(cells, name, V, D, H, L, Fd, calls, what, dropout=None, max_len=64, **kw):
    extra = {} if dropout is None else {"dropout": dropout}
    return Probe(name, cells, calls, make=ctor(V, D, H, L, Fd, max_len=max_len, **extra),
                 load="reference", mode="eval", atol=1e-4, rtol=1e-4, what=what, **kw)


def _cached(B, V, sizes):
    calls = [call(randint(0, V, B, sizes[0]), use_cache=True)]
    for i, n in enumerate(sizes[1:]):
        calls.append(call(randint(0, V, B, n), past_kv=prev(i, "1"), use_cache=True))
    return calls


def _model_wrong(ref, tokens, past_kv=None, use_cache=False, at=None, scale=True, pe=True,
        scale_after_pe=False, prenorm=True, final_norm=True, residual=True, probs=False,
        first_past=False, first_row=False):
    """The reference model's logits with one known mistake; `at`: the first new position."""
    B, T = tokens.shape
    D = ref.d_model
    P = 0 if past_kv is None else past_kv[0][0].size(2)
    table = ref.pos_encoding.pe[(P if at is None else at):][:1 if first_row else T]
    x = ref.tok_embed(tokens)
    x = (x + table) * math.sqrt(D) if scale_after_pe else \
        x * (math.sqrt(D) if scale else 1.0) + (table if pe else 0.0)
    r = 1.0 if residual else 0.0
    for i, layer in enumerate(ref.layers):
        past = None if past_kv is None else past_kv[0 if first_past else i]
        if prenorm:
            x = r * x + layer.self_attn(layer.norm1(x), past)[0]
            x = r * x + layer.ff(layer.norm2(x))
        else:
            x = layer.norm1(x + layer.self_attn(x, past)[0])
            x = layer.norm2(x + layer.ff(x))
    logits = ref.lm_head(ref.norm(x) if final_norm else x)
    return logits.softmax(-1) if probs else logits


def _model_with(**mistake):
    """The reference model's logits with these of `_model_wrong`'s mistakes (for `replay`)."""
    return partial(_model_wrong, **mistake)


def _wrong_start(e):
    """The first position a cached step gave its new tokens, when one start per call explains
    the student's logits and it is not the number of cached tokens; else None."""
    ref = e.ref()
    for ci, c in enumerate(e.pd["calls"]):
        g = _main(e, ci)
        if not _continues(c) or g is None:
            continue
        args, kw = _chained(e, ci)
        P, T = kw["past_kv"][0][0].size(2), args[0].size(1)
        starts = [P] + [o for o in range(ref.pos_encoding.pe.size(0) - T + 1) if o != P]
        with torch.no_grad():
            at = next((o for o in starts
                       if _close(g, _model_wrong(ref, *args, at=o, **kw).double().numpy())), None)
        if at != P:
            return at
    return None


def _names(e):
    """(the student's parameter names, the specification's), on a probe with params=True."""
    got = {n for n, _ in e.meta("params") or []}
    return got, (set(e.ref_params()) if got else set())


def _lost(e, gone, kept):
    """Parameters named `gone` (a prefix) are missing while `kept` is there: one module
    registered under two names, counted once."""
    got, want = _names(e)
    if any(n.startswith(gone) for n in want) and not any(n.startswith(gone) for n in got) \
            and any(n.startswith(kept) for n in got):
        return True
    # parameters are listed under every name (aliases too): then the module under `gone` is
    # there, and exactly its tensors are missing from the count of distinct ones
    names = [n for n in want if n.startswith(gone)]
    g, w = e.meta("param_ids"), e._want["meta"].get(f"{e.p.name}.param_ids")
    return bool(names) and all(n in got for n in names) and g is not None and w is not None \
        and w - g >= len(names)


LM_DIAGNOSES = [
    when("the blocks' self_attn has no w_q: build each block's attention from your "
         "CausalSelfAttention (w_q, w_k, w_v, w_o), as the exercise says. PyTorch's "
         "nn.MultiheadAttention is a shortcut here (and it cannot continue from a cache).",
         lambda e: "no parameter named" in e.error and "self_attn.w_" in e.error),
    when("DecoderOnlyLM.layers holds the same block object several times: [Block(...)] * "
         "n_layers repeats ONE block (one set of weights applied n_layers times). Create a new "
         "block in every iteration: nn.ModuleList(Block(...) for _ in range(n_layers)).",
         lambda e: _lost(e, "layers.1.", "layers.0.")),
    when("norm1 and norm2 are one LayerNorm module (self.norm2 = self.norm1, or one norm used "
         "twice): each sub-layer has its own LayerNorm with its own weight and bias. Create two.",
         lambda e: _lost(e, "layers.0.norm2.", "layers.0.norm1.")),
    when("lm_head shares its weight with tok_embed (weight tying, lm_head.weight = "
         "tok_embed.weight). This exercise describes a separate output layer, lm_head = "
         "nn.Linear(d_model, vocab_size) with its own weight and a bias; tied embeddings come in "
         "notebook 09.", lambda e: _lost(e, "lm_head.weight", "tok_embed.weight")),
    when("the positional table was sliced along the wrong axis: tokens are (B, T), so slice "
         "pe[offset : offset + T] with T = tokens.size(1) (size(0) is the batch).",
         lambda e: "must match the size of tensor" in e.error),
    *variants(_model_with, [
        ({"probs": True},
         "the logits come out as probabilities: forward must return raw logits (no softmax); "
         "F.cross_entropy and generate apply it themselves."),
        ({"scale": False},
         "the token embeddings are not multiplied by sqrt(d_model)."),
        ({"scale_after_pe": True},
         "sqrt(d_model) multiplies the positional encoding too: scale the embeddings first, "
         "then add the positions."),
        ({"pe": False},
         "no positional encoding: add pe[offset : offset + T] to the scaled embeddings (without "
         "it the model cannot tell word order)."),
        ({"at": 0, "first_row": True},
         "every token got the encoding of position 0 (pe[:1] or pe[0] broadcast over the "
         "sequence, a positional table sliced along the wrong axis): add pe[offset : offset + "
         "T], one row per position."),
        ({"prenorm": False},
         "the blocks are post-norm (norm after the residual add); this model is pre-norm like "
         "GPT-2: x = x + attn(norm1(x)); x = x + ff(norm2(x))."),
        ({"final_norm": False},
         "the final LayerNorm (`norm`) before lm_head is missing."),
        ({"residual": False},
         "the residual connections are missing: x = x + attn(norm1(x)), not "
         "x = attn(norm1(x))."),
    ], make=replay),
    when("the position offset is missing: in a cached step the new tokens got the encodings "
         "of positions 0, 1, ... again, but they come after the cached ones. Add "
         "pe[offset : offset + T] with offset = the number of cached tokens "
         "(past_kv[0][0].size(2)); self.pos_encoding(x) always starts at 0.",
         lambda e: _wrong_start(e) == 0),
    when("in a cached step the new tokens got positions other than the next ones: the offset "
         "is the number of cached tokens, past_kv[0][0].size(2) for keys shaped "
         "(B, H, T_past, D_h) (size(1) counts the heads).",
         lambda e: (_wrong_start(e) or 0) > 0),
    replay("every layer was given layer 0's cache: pass layer i its own past_kv[i] and collect "
           "the (k, v) each layer returns, in order.", partial(_model_wrong, first_past=True),
           cached_only=True),
]

DECODER_ONLY_LM = Exercise("DecoderOnlyLM", ref="decoder_only.DecoderOnlyLM",
                           graded=grades(shapes=1, causal=2, matches_torch=(2, 5150),
                                         kv_cache=(3, 6021)),
                           shortcuts=("attention", "multihead", "transformer"),
                           diagnose=LM_DIAGNOSES, probes=[
    _model((shapes("shapes"),), "shapes", 13, 16, 4, 2, 32,
           [call(randint(0, 13, 2, 7)), call(randint(0, 13, 2, 7), use_cache=True)],
           "logits (2, 7, 13), then (logits, cache) with use_cache=True; the parameters (every "
           "layer, each LayerNorm and lm_head with their own weights)", params=True),
    _model((shapes("shapes"), "causal"), "three layers", 9, 8, 2, 3, 16,
           [call(randint(0, 9, 3, 5))],
           "three layers: the parameters of every block are its own", params=True),
    _model(("causal",), "causal", 11, 16, 2, 2, 32,
           [call(randint(0, 11, 2, 9)), call(randint(0, 11, 1, 4))],
           "tokens (2, 9) and (1, 4): embeddings x sqrt(d_model) + positions, pre-norm causal "
           "blocks, final norm, lm_head"),
    _model(("matches_torch",), "torch 1", 13, 16, 4, 2, 32, [call(randint(0, 13, 2, 7))],
           "DecoderOnlyLM(13, 16, 4, 2, 32) on (2, 7)"),
    _model(("matches_torch",), "torch 2", 7, 24, 3, 3, 40, [call(randint(0, 7, 3, 11))],
           "DecoderOnlyLM(7, 24, 3, 3, 40) on (3, 11)"),
    _model(("matches_torch",), "torch 3", 31, 8, 2, 1, 16, [call(randint(0, 31, 1, 1))],
           "one layer, one token"),
    _model(("matches_torch",), "torch 4", 19, 32, 8, 2, 64, [call(randint(0, 19, 2, 20))],
           "eval mode with dropout=0.25, (2, 20)", dropout=0.25),
    _model(("kv_cache",), "cache 1", 13, 16, 4, 2, 32, _cached(2, 13, (4, 1, 1, 3, 1)),
           "a prompt of 4, then cached chunks of 1, 1, 3 and 1 tokens (positions continue "
           "after the cache)", params=True),
    _model(("kv_cache",), "cache 2", 9, 24, 6, 3, 48, _cached(3, 9, (1, 1, 5, 1, 2)),
           "three layers, chunks of 1, 1, 5, 1 and 2 tokens"),
    _model(("kv_cache",), "cache 3", 21, 8, 2, 1, 12, _cached(1, 21, (7, 1, 1)),
           "one layer, a prompt of 7 then two single tokens"),
])


# -- generate ---------------------------------------------------------------------------------

_SAMPLES = 12000


def _greedy(V, base, B, T0, n, **kw):
    return call(_lm(V, 8, base), randint(0, V, B, T0), n, temperature=0.0, use_cache=False,
                keep=(1,), **kw)


def _sample(V, base, temperature, top_k):
    return call(_lm(V, 8, base), _same_prompt(_SAMPLES, V), 1, temperature=temperature,
                top_k=top_k, use_cache=False)


def _unigram(V, base, max_len=64):
    """The stand-in whose logits are one fixed vector at every step (fixtures.ToyUnigramLM)."""
    return _Seeded(base, "toy_unigram_lm", V, max_len)


def _frequencies_all(V, T0, top_k=None, tol=0.035):
    """Sampled rows of the unigram stand-in: the frequencies of every generated token (all rows,
    all steps: one distribution), compared between the student's and the reference's samples."""
    def compare(key, got, want):
        if not key.endswith(".out"):
            return "default"
        if got.ndim != 2 or got.shape != want.shape:
            return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if not np.array_equal(got[:, :T0], want[:, :T0]):
            return "the output does not start with the prompt"
        new = got[:, T0:].reshape(-1).astype(np.int64)
        if new.min() < 0 or new.max() >= V:
            return f"sampled ids outside the vocabulary 0..{V - 1}"
        f_got = np.bincount(new, minlength=V) / len(new)
        f_want = np.bincount(want[:, T0:].reshape(-1).astype(np.int64), minlength=V) / len(new)
        if np.abs(f_got - f_want).max() > tol:
            k = "" if top_k is None else f", keeping the top_k={top_k} largest of the V={V} logits"
            return (f"with {got.shape[0]} rows (fewer than top_k) and {got.shape[1] - T0} sampled "
                    f"steps, the frequencies of the generated tokens {np.round(f_got, 3).tolist()} do "
                    f"not follow softmax(logits / temperature){k} (expected about "
                    f"{np.round(f_want, 3).tolist()}): top_k counts logits along the vocabulary "
                    "axis (dim=-1), whatever the batch size")
        return None
    return compare


def _full_length(key, got, want):
    """The max_len probe: call 0 (greedy) compared as usual; call 1 (sampled) by its shape and
    its prompt only."""
    if not key.endswith(".out") or int(key.split(".")[-2]) == 0:
        return "default"
    if got.shape != want.shape:
        return (f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)}: prompt + "
                "max_new_tokens may equal the model's max_len (only more must be refused)")
    return None if np.array_equal(got[:, :5], want[:, :5]) else "the output does not start with the prompt"


def _eos_case(V, base, B, T0, n, eos, n_with_eos, temperature=1.0):
    return call(_lm(V, 8, base), _eos_prompts(B, T0, V, eos, n_with_eos), n,
                temperature=temperature, eos_id=eos, use_cache=False)


def _generate(model, prompt, n, temperature=1.0, top_k=None, eos_id=None, use_cache=True,
              generator=None, how=""):
    """Greedy decoding done wrong in one known way (`how`); None for a sampled call (its
    draws cannot be replayed)."""
    if temperature != 0 and top_k != 1:
        return None
    eos = None if how == "if eos_id" and not eos_id else eos_id
    with torch.set_grad_enabled(how == "grad"):
        seq, cache, done = prompt, None, torch.zeros(len(prompt), dtype=torch.bool)
        for _ in range(n):
            if how == "prompt eos" and eos is not None:
                done = (seq == eos).any(1)
                if done.all():
                    break
            if use_cache and how != "no cache":
                step = seq if cache is None or how == "whole" else seq[:, -1:]
                logits, new = model(step, past_kv=cache, use_cache=True)
                cache = new if cache is None or how != "stale" else cache
            else:
                logits = model(seq)
            nxt = logits[:, 0 if how == "first" else -1].argmax(-1)
            if eos is not None:
                nxt = nxt if how in ("no fill", "stop any") else nxt.masked_fill(done, eos)
                done = done if how == "prompt eos" else done | (nxt == eos)
            seq = torch.cat([seq, nxt[:, None]], 1)
            if eos is not None and how != "prompt eos" and (done.any() if how == "stop any" else done.all()):
                break
    return seq[:, prompt.size(1):] if how == "new only" else seq


def _decodes(how):
    """pred: on every greedy call, the student's tokens are those of _generate(how=how), and on
    one of them the reference's are not."""
    def pred(e):
        same, differs = 0, False
        for ci in range(len(e.pd["calls"])):
            g, w = e.out(ci), e.want_out(ci)
            if g is None or w is None:
                continue
            args, kwargs = e.args(ci)
            r = _generate(*args, how=how, **kwargs)
            if r is None:
                continue
            r = r.numpy()
            if r.shape != g.shape or not np.array_equal(r, g):
                return False
            same, differs = same + 1, differs or r.shape != w.shape or not np.array_equal(r, w)
        return same > 0 and differs
    return pred


def _dist(z, temperature, top_k):
    z = z / temperature
    if top_k is not None:
        z = z.masked_fill(z < z.topk(top_k).values[-1], float("-inf"))
    return z.softmax(-1)


def _samples_follow(probs):
    """pred: the sampled tokens' frequencies follow probs(z, temperature, top_k) (z: the
    stand-in's logits for the prompt) and not the expected distribution."""
    def pred(e):
        args, kw = e.args(0)
        g = e.out(0)
        with torch.no_grad():
            z = args[0](args[1][:1])[0, -1].double()
        last = np.asarray(g)[:, -1].astype(np.int64)
        if last.min() < 0 or last.max() >= z.numel():
            return False
        f = np.bincount(last, minlength=z.numel()) / len(last)
        T, k = kw.get("temperature", 1.0), kw.get("top_k")
        p, q = probs(z, T, k).numpy(), _dist(z, T, k).numpy()
        return np.abs(f - p).max() <= 0.035 and np.abs(p - q).max() > 0.035
    return pred


def _prompt_changed(e):
    return any(e.got(f"{ci}.arg.1") is not None and e.want(f"{ci}.arg.1") is not None
               and not np.array_equal(e.got(f"{ci}.arg.1"), e.want(f"{ci}.arg.1"))
               for ci in range(len(e.pd["calls"])))


_STOP_ALL = ("generation stopped when ONE row finished; keep going until EVERY row has produced "
             "eos_id (finished.all()), or max_new_tokens.")
_FILL = ("a row goes on after its eos_id: once a row has produced eos_id, fill its later "
         "positions with eos_id (keep a `finished` mask).")
_PROMPT_EOS = ("a row whose prompt holds eos_id was treated as finished before it generated "
               "anything: only GENERATED tokens end a row, so track finished rows from the new "
               "tokens only.")

GENERATE_DIAGNOSES = [
    when("temperature=0 means greedy: take the argmax of the last position's logits; dividing "
         "the logits by 0 gives inf/NaN probabilities.",
         lambda e: any(w in e.error for w in ("probability tensor", "inf", "nan", "divi"))),
    when("generate changed the prompt tensor in place; build a new tensor (torch.cat).",
         _prompt_changed),
    when("generate returned only the new tokens: return the prompt followed by the generated "
         "tokens, torch.cat([prompt, new], dim=1).", _decodes("new only")),
    when("you took the scores of the FIRST position, logits[:, 0]; the next token is predicted "
         "by the LAST one, logits[:, -1].", _decodes("first")),
    when("generate ran the model with gradients enabled: generation never trains, so wrap it in "
         "torch.no_grad() (or decorate generate with @torch.no_grad()); otherwise every step "
         "keeps its whole autograd graph in memory.", _decodes("grad")),
    when("use_cache=True was ignored: the model was run on the whole sequence without its "
         "cache. With use_cache=True run the prompt once with use_cache=True, then only the "
         "newest token with past_kv=cache.", _decodes("no cache")),
    when("with use_cache=True every step after the prompt must feed ONLY the newest token, "
         "(B, 1), with past_kv=cache: feeding the whole sequence again repeats it in the cache.",
         _decodes("whole")),
    when("the cache was not updated: it should grow by one per step. Keep the cache each call "
         "returns: logits, cache = model(token, past_kv=cache, use_cache=True).",
         _decodes("stale")),
    when(_STOP_ALL, _decodes("stop any")),
    when(_FILL, _decodes("no fill")),
    when(_PROMPT_EOS, _decodes("prompt eos")),
    when("with eos_id=0 generation behaves as if there were no end token: a test like "
         "`if eos_id:` is False for the id 0. Test `if eos_id is not None:`.",
         _decodes("if eos_id")),
    when(_STOP_ALL, lambda e: "generation stopped after" in e.problem),
    when(_FILL, lambda e: "goes on after its first generated" in e.problem),
    when(_PROMPT_EOS, lambda e: "treated as finished from the start" in e.problem),
    when("you multiplied the logits by the temperature; divide: softmax(logits / T), so T > 1 "
         "flattens and T < 1 sharpens.", _samples_follow(lambda z, t, k: _dist(z, 1 / t, k))),
    when("the temperature is ignored: sample from softmax(logits / temperature).",
         _samples_follow(lambda z, t, k: _dist(z, 1.0, k))),
    when("top_k is ignored: keep only the k largest logits (set the others to -inf).",
         _samples_follow(lambda z, t, k: _dist(z, t, None))),
    when("you always picked the most likely token: with temperature > 0 draw a sample, "
         "torch.multinomial(probs, 1, generator=generator).",
         _samples_follow(lambda z, t, k: F.one_hot(z.argmax(), z.numel()).double())),
]

GENERATE = Exercise("generate", ref="decoder_only.generate", diagnose=GENERATE_DIAGNOSES,
                    graded=grades(greedy_cache=(3, 3907), greedy_equivalents=1, sampling=2, eos=2),
                    probes=[
    Probe("greedy", ("greedy_cache",),
          [_greedy(17, 801, 2, 4, 12), _greedy(17, 802, 3, 5, 17), _greedy(9, 803, 1, 1, 30),
           _greedy(17, 804, 4, 9, 6)],
          what="temperature=0 (greedy) on a stand-in model, use_cache=False; the prompt is "
               "left unchanged"),
    Probe("greedy equivalents", ("greedy_equivalents",),
          [_greedy(17, 805, 3, 3, 10), _greedy(17, 805, 3, 3, 10, top_k=5),
           call(_lm(17, 8, 805), randint(0, 17, 3, 3), 10, temperature=1.0, top_k=1,
                use_cache=False),
           call(_lm(17, 8, 806), randint(0, 17, 3, 3), 10, temperature=1.7, top_k=1,
                use_cache=False)],
          what="greedy decoding three ways: temperature=0, temperature=0 with top_k=5, and "
               "top_k=1 at temperature 1.0 and 1.7"),
    Probe("sampling hot", ("sampling",), [_sample(8, 811, 2.0, None)],
          compare=_frequencies(8), what=f"one token sampled for {_SAMPLES} identical prompts at "
                                       "temperature 2.0"),
    Probe("sampling cold", ("sampling",), [_sample(8, 812, 0.25, None)],
          compare=_frequencies(8), what="temperature 0.25"),
    Probe("sampling top-k 3", ("sampling",), [_sample(8, 813, 0.5, 3)],
          compare=_frequencies(8, 3), what="top_k=3 at temperature 0.5"),
    Probe("sampling top-k 5", ("sampling",), [_sample(8, 814, 0.3, 5)],
          compare=_frequencies(8, 5), what="top_k=5 at temperature 0.3"),
    Probe("sampling top-k 2", ("sampling",),
          [call(_unigram(8, 815), _same_prompt(_SAMPLES, 8), 1, temperature=1.0, top_k=2,
                use_cache=False)],
          compare=_frequencies(8, 2), what="top_k=2 at temperature 1.0 (two tokens, sampled)"),
    Probe("sampling top-k, small batch", ("sampling",),
          [call(_unigram(8, 816), randint(0, 8, 3, 2), 1500, temperature=1.0, top_k=6,
                use_cache=False)],
          compare=_frequencies_all(8, 2, 6),
          what="top_k=6 of 8 logits with a batch of 3 rows, 1500 sampled steps (a model whose "
               "logits are the same at every step)"),
    Probe("eos", ("eos",), [_eos_case(3, 821, 48, 3, 12, 2, 16)],
          compare=_eos_rules(3, 12, 2, 16),
          what="48 sampled rows with eos_id=2, 16 of whose prompts already hold it"),
    Probe("eos zero", ("eos",), [_eos_case(3, 822, 48, 3, 12, 0, 16)],
          compare=_eos_rules(3, 12, 0, 16),
          what="eos_id=0 (an id like any other), 16 prompts holding it"),
    Probe("eos greedy", ("eos",),
          [_greedy(5, 823, 6, 3, 10, eos_id=4), _greedy(5, 824, 6, 3, 10, eos_id=0),
           _greedy(5, 825, 3, 3, 6), _greedy(5, 827, 2, 7, 10, eos_id=1),
           _greedy(5, 828, 9, 2, 10, eos_id=3)],
          what="greedy with eos_id 4 and 0, eos_id=None (exactly max_new_tokens), and batch sizes "
               "smaller and larger than the prompt length (2 x 7, 9 x 2)"),
    Probe("eos batch", ("eos",), [_eos_case(3, 826, 20, 11, 12, 1, 10)],
          compare=_eos_rules(11, 12, 1, 10),
          what="20 sampled rows of prompts of length 11 with eos_id=1, 10 of them holding it"),
    Probe("max_len", ("greedy_cache",),
          [call(_unigram(8, 829, max_len=12), randint(0, 8, 2, 4), 8, temperature=0.0,
                use_cache=False),
           call(_unigram(8, 830, max_len=12), randint(0, 8, 3, 5), 7, temperature=1.0,
                use_cache=False)],
          compare=_full_length,
          what="a model with max_len=12 asked for exactly 12 tokens in all (prompt + new): allowed"),
])


# -- what a richer probe machine allows -------------------------------------------------------
# `toy_lm` has no cache, and the plan has no torch.Generator value: the probes below join in
# when the probe machine offers a cache-capable stand-in (`toy_cache_lm`: a spy whose logits
# shift when it is called with gradients enabled, or without the cache where the cache was
# asked for), `{"$generator": seed}` values, and one model for one fixture object used by
# several calls.

def _generator_values() -> bool:
    try:
        return isinstance(vm._Ctx({}, {}).value({"$generator": 1}), torch.Generator)
    except Exception:  # noqa: BLE001 - not offered
        return False


def _shared_fixtures() -> bool:
    f = fixture("toy_lm", 3, 2)
    ex = Exercise("probe", ref="decoder_only.generate", graded=grades(c=1),
                  probes=[Probe("p", ("c",), [call(f), call(f)])])
    plan, tensors = engine.build_plan(ex, 0)
    a, b = (c["args"][0].get("load", {}) for c in plan["probes"][0]["calls"])
    return bool(a) and a.keys() == b.keys() and all(
        np.array_equal(tensors[a[k]["$t"]], tensors[b[k]["$t"]]) for k in a)


def _reproducible(key, got, want, _seen={}):
    """Calls 0 and 1 share a generator seed, call 2 has another (different global seeds)."""
    if not key.endswith(".out"):
        return "default"
    ci = int(key.split(".")[-2])
    _seen[ci] = np.asarray(got)
    if ci == 1 and not np.array_equal(_seen.get(0), _seen[1]):
        return ("two calls with generators seeded alike (under different global seeds) gave "
                "different tokens: draw every sample from `generator` "
                "(torch.multinomial(probs, 1, generator=generator)), not the global random state")
    if ci == 2 and np.array_equal(_seen.get(0), _seen[2]):
        return ("generators with different seeds gave the same samples: is `generator` "
                "re-seeded or ignored?")
    return None


if "toy_cache_lm" in vm.FIXTURES:
    def _cached_greedy(base, B, T0, n, **kw):
        return call(_Seeded(base, "toy_cache_lm", 17, 8), randint(0, 17, B, T0), n,
                    temperature=0.0, keep=(1,), **kw)

    GENERATE.add(Probe(
        "greedy with the cache", ("greedy_cache",),
        [_cached_greedy(841, 2, 4, 12), _cached_greedy(842, 3, 5, 17), _cached_greedy(843, 1, 1, 30),
         _cached_greedy(844, 4, 9, 6), _cached_greedy(845, 2, 4, 12, use_cache=False),
         _cached_greedy(846, 3, 2, 9, eos_id=3)],
        what="temperature=0 on a stand-in with a KV cache (use_cache=True: the prompt once, then "
             "only the newest token with past_kv=cache and use_cache=True; no gradients), and "
             "use_cache=False"))

if _generator_values() and _shared_fixtures():
    _M = _lm(8, 8, 851)
    GENERATE.add(Probe(
        "generator", ("sampling",),
        [call(_M, _fixed([[0]] * 64, "64 prompts [0]"), 3, temperature=1.0, use_cache=False,
              generator={"$generator": s}) for s in (7, 7, 8)],
        compare=_reproducible,
        what="sampling with torch.Generator objects seeded 7, 7 and 8 (reproducible runs)"))

EXERCISES = [NEXT_TOKEN_LOSS, CAUSAL_SELF_ATTENTION, DECODER_ONLY_LM, GENERATE]
