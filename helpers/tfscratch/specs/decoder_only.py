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
when every row has finished, an eos_id inside the prompt does not count)."""
import numpy as np
import torch

from . import engine, vm
from .engine import Exercise, Probe, call, ctor, fixture, given, prev, randint, randn
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


# -- next_token_loss --------------------------------------------------------------------------

N = "test_next_token_loss"

NEXT_TOKEN_LOSS = Exercise("next_token_loss", ref="decoder_only.next_token_loss", probes=[
    Probe("seed tables", (f"{N}_seed_tables",),
          [call(randn(2, 6, 5, scale=2.0), _fixed(SEED_TOKENS, "seed 001's two sentences"),
                grad=(0,), backward=_scalar()),
           call(randn(2, 6, 5, scale=2.0), _fixed([r[::-1] for r in SEED_TOKENS], "reversed"),
                grad=(0,), backward=_scalar(0.5))],
          atol=1e-5, rtol=1e-4,
          what="seed 001's two sentences: the value and its gradient with respect to the logits"),
    Probe("ignore id", (f"{N}_ignore_id",),
          [call(randn(3, 7, 10), _padded(3, 7, 10, 0, [5, 7, 2]), ignore_id=0),
           call(randn(4, 6, 9), _padded(4, 6, 9, 3, [6, 2, 4, 5]), ignore_id=3),
           call(randn(2, 5, 6), _padded(2, 5, 6, 0, [5, 5]), ignore_id=0)],
          what="padded rows of different lengths with ignore_id 0 and 3, and ignore_id absent"),
    Probe("random", (f"{N}_random",),
          [call(randn(2, 7, 11, scale=3.0), randint(0, 11, 2, 7)),
           call(randn(3, 2, 5, scale=3.0), randint(0, 5, 3, 2)),
           call(randn(1, 13, 29, scale=3.0), _with_ignored(1, 13, 29, 0), ignore_id=0),
           call(randn(5, 9, 7, scale=3.0), _with_ignored(5, 9, 7, 6), ignore_id=6),
           call(randn(4, 17, 3, scale=3.0), randint(0, 3, 4, 17))],
          what="random (B, T, V) cases with and without ignore_id"),
])


# -- CausalSelfAttention ----------------------------------------------------------------------

A = "test_CausalSelfAttention"


def _attn(name, d, h, calls, cells, what, dropout=None, **kw):
    make = ctor(d, h) if dropout is None else ctor(d, h, dropout=dropout)
    return Probe(name, cells, calls, make=make, load="reference", mode="eval", what=what, **kw)


def _chunks(B, d, sizes):
    """A prefix, then chunks fed with the cache the previous call returned."""
    calls = [call(randn(B, sizes[0], d))]
    for i, n in enumerate(sizes[1:]):
        calls.append(call(randn(B, n, d), prev(i, "1")))
    return calls


CAUSAL_SELF_ATTENTION = Exercise("CausalSelfAttention", ref="decoder_only.CausalSelfAttention", probes=[
    _attn("shapes", 12, 3, _chunks(2, 12, (5, 2)), (f"{A}_shapes",),
          "shapes: 5 tokens, then 2 more with the cache (3 heads of size 4)", params=True),
    _attn("torch 1", 16, 4, [call(randn(2, 6, 16))], (f"{A}_matches_torch",),
          "no cache: (2, 6, 16), 4 heads"),
    _attn("torch 2", 24, 3, [call(randn(3, 9, 24)), call(randn(1, 1, 24))],
          (f"{A}_matches_torch",), "no cache: (3, 9, 24) with 3 heads, and a single token"),
    _attn("torch 3", 32, 8, [call(randn(2, 13, 32))], (f"{A}_matches_torch",),
          "eval mode with dropout=0.3: (2, 13, 32), 8 heads", dropout=0.3),
    _attn("torch 4", 10, 1, [call(randn(4, 5, 10))], (f"{A}_matches_torch",),
          "one head: (4, 5, 10)"),
    _attn("cache 1", 16, 4, _chunks(2, 16, (4, 1, 2, 1)), (f"{A}_cache",),
          "cache: a prefix of 4, then chunks of 1, 2 and 1 tokens"),
    _attn("cache 2", 24, 6, _chunks(3, 24, (1, 1, 1, 5, 3)), (f"{A}_cache",),
          "cache: chunks of 1, 1, 1, 5 and 3 tokens, 6 heads"),
    _attn("cache 3", 12, 3, _chunks(2, 12, (3, 4, 1)), (f"{A}_cache",),
          "cache: chunks of 3, 4 and 1 tokens"),
])


# -- DecoderOnlyLM ----------------------------------------------------------------------------

M = "test_DecoderOnlyLM"


def _model(cells, name, V, D, H, L, Fd, calls, what, dropout=None, max_len=64, **kw):
    extra = {} if dropout is None else {"dropout": dropout}
    return Probe(name, cells, calls, make=ctor(V, D, H, L, Fd, max_len=max_len, **extra),
                 load="reference", mode="eval", atol=1e-4, rtol=1e-4, what=what, **kw)


def _cached(B, V, sizes):
    calls = [call(randint(0, V, B, sizes[0]), use_cache=True)]
    for i, n in enumerate(sizes[1:]):
        calls.append(call(randint(0, V, B, n), past_kv=prev(i, "1"), use_cache=True))
    return calls


DECODER_ONLY_LM = Exercise("DecoderOnlyLM", ref="decoder_only.DecoderOnlyLM", probes=[
    _model((f"{M}_shapes",), "shapes", 13, 16, 4, 2, 32,
           [call(randint(0, 13, 2, 7)), call(randint(0, 13, 2, 7), use_cache=True)],
           "logits (2, 7, 13), then (logits, cache) with use_cache=True; the parameters (every "
           "layer, each LayerNorm and lm_head with their own weights)", params=True),
    _model((f"{M}_shapes", f"{M}_causal"), "three layers", 9, 8, 2, 3, 16,
           [call(randint(0, 9, 3, 5))],
           "three layers: the parameters of every block are its own", params=True),
    _model((f"{M}_causal",), "causal", 11, 16, 2, 2, 32,
           [call(randint(0, 11, 2, 9)), call(randint(0, 11, 1, 4))],
           "tokens (2, 9) and (1, 4): embeddings x sqrt(d_model) + positions, pre-norm causal "
           "blocks, final norm, lm_head"),
    _model((f"{M}_matches_torch",), "torch 1", 13, 16, 4, 2, 32, [call(randint(0, 13, 2, 7))],
           "DecoderOnlyLM(13, 16, 4, 2, 32) on (2, 7)"),
    _model((f"{M}_matches_torch",), "torch 2", 7, 24, 3, 3, 40, [call(randint(0, 7, 3, 11))],
           "DecoderOnlyLM(7, 24, 3, 3, 40) on (3, 11)"),
    _model((f"{M}_matches_torch",), "torch 3", 31, 8, 2, 1, 16, [call(randint(0, 31, 1, 1))],
           "one layer, one token"),
    _model((f"{M}_matches_torch",), "torch 4", 19, 32, 8, 2, 64, [call(randint(0, 19, 2, 20))],
           "eval mode with dropout=0.25, (2, 20)", dropout=0.25),
    _model((f"{M}_kv_cache",), "cache 1", 13, 16, 4, 2, 32, _cached(2, 13, (4, 1, 1, 3, 1)),
           "a prompt of 4, then cached chunks of 1, 1, 3 and 1 tokens (positions continue "
           "after the cache)", params=True),
    _model((f"{M}_kv_cache",), "cache 2", 9, 24, 6, 3, 48, _cached(3, 9, (1, 1, 5, 1, 2)),
           "three layers, chunks of 1, 1, 5, 1 and 2 tokens"),
    _model((f"{M}_kv_cache",), "cache 3", 21, 8, 2, 1, 12, _cached(1, 21, (7, 1, 1)),
           "one layer, a prompt of 7 then two single tokens"),
])


# -- generate ---------------------------------------------------------------------------------

GEN = "test_generate"
_SAMPLES = 12000


def _greedy(V, base, B, T0, n, **kw):
    return call(_lm(V, 8, base), randint(0, V, B, T0), n, temperature=0.0, use_cache=False,
                keep=(1,), **kw)


def _sample(V, base, temperature, top_k):
    return call(_lm(V, 8, base), _same_prompt(_SAMPLES, V), 1, temperature=temperature,
                top_k=top_k, use_cache=False)


def _eos_case(V, base, B, T0, n, eos, n_with_eos, temperature=1.0):
    return call(_lm(V, 8, base), _eos_prompts(B, T0, V, eos, n_with_eos), n,
                temperature=temperature, eos_id=eos, use_cache=False)


GENERATE = Exercise("generate", ref="decoder_only.generate", probes=[
    Probe("greedy", (f"{GEN}_greedy_cache",),
          [_greedy(17, 801, 2, 4, 12), _greedy(17, 802, 3, 5, 17), _greedy(9, 803, 1, 1, 30),
           _greedy(17, 804, 4, 9, 6)],
          what="temperature=0 (greedy) on a stand-in model, use_cache=False; the prompt is "
               "left unchanged"),
    Probe("greedy equivalents", (f"{GEN}_greedy_equivalents",),
          [_greedy(17, 805, 3, 3, 10), _greedy(17, 805, 3, 3, 10, top_k=5),
           call(_lm(17, 8, 805), randint(0, 17, 3, 3), 10, temperature=1.0, top_k=1,
                use_cache=False),
           call(_lm(17, 8, 806), randint(0, 17, 3, 3), 10, temperature=1.7, top_k=1,
                use_cache=False)],
          what="greedy decoding three ways: temperature=0, temperature=0 with top_k=5, and "
               "top_k=1 at temperature 1.0 and 1.7"),
    Probe("sampling hot", (f"{GEN}_sampling",), [_sample(8, 811, 2.0, None)],
          compare=_frequencies(8), what=f"one token sampled for {_SAMPLES} identical prompts at "
                                       "temperature 2.0"),
    Probe("sampling cold", (f"{GEN}_sampling",), [_sample(8, 812, 0.25, None)],
          compare=_frequencies(8), what="temperature 0.25"),
    Probe("sampling top-k 3", (f"{GEN}_sampling",), [_sample(8, 813, 0.5, 3)],
          compare=_frequencies(8, 3), what="top_k=3 at temperature 0.5"),
    Probe("sampling top-k 5", (f"{GEN}_sampling",), [_sample(8, 814, 0.3, 5)],
          compare=_frequencies(8, 5), what="top_k=5 at temperature 0.3"),
    Probe("eos", (f"{GEN}_eos",), [_eos_case(3, 821, 48, 3, 12, 2, 16)],
          compare=_eos_rules(3, 12, 2, 16),
          what="48 sampled rows with eos_id=2, 16 of whose prompts already hold it"),
    Probe("eos zero", (f"{GEN}_eos",), [_eos_case(3, 822, 48, 3, 12, 0, 16)],
          compare=_eos_rules(3, 12, 0, 16),
          what="eos_id=0 (an id like any other), 16 prompts holding it"),
    Probe("eos greedy", (f"{GEN}_eos",),
          [_greedy(5, 823, 6, 3, 10, eos_id=4), _greedy(5, 824, 6, 3, 10, eos_id=0),
           _greedy(5, 825, 3, 3, 6)],
          what="greedy with eos_id 4 and 0, and eos_id=None (exactly max_new_tokens)"),
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
    ex = Exercise("probe", ref="decoder_only.generate", probes=[Probe("p", ("c",), [call(f), call(f)])])
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

    GENERATE.probes.append(Probe(
        "greedy with the cache", (f"{GEN}_greedy_cache",),
        [_cached_greedy(841, 2, 4, 12), _cached_greedy(842, 3, 5, 17), _cached_greedy(843, 1, 1, 30),
         _cached_greedy(844, 4, 9, 6), _cached_greedy(845, 2, 4, 12, use_cache=False),
         _cached_greedy(846, 3, 2, 9, eos_id=3)],
        what="temperature=0 on a stand-in with a KV cache (use_cache=True: the prompt once, then "
             "only the newest token with past_kv=cache and use_cache=True; no gradients), and "
             "use_cache=False"))

if _generator_values() and _shared_fixtures():
    _M = _lm(8, 8, 851)
    GENERATE.probes.append(Probe(
        "generator", (f"{GEN}_sampling",),
        [call(_M, _fixed([[0]] * 64, "64 prompts [0]"), 3, temperature=1.0, use_cache=False,
              generator={"$generator": s}) for s in (7, 7, 8)],
        compare=_reproducible,
        what="sampling with torch.Generator objects seeded 7, 7 and 8 (reproducible runs)"))

EXERCISES = [NEXT_TOKEN_LOSS, CAUSAL_SELF_ATTENTION, DECODER_ONLY_LM, GENERATE]
