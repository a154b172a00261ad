"""09_modern_decoder: what the grader runs on the student's `rms_norm`, `RMSNorm`, `apply_rope`,
`SwiGLU`, `GroupedQueryAttention`, `ModernDecoderLM` and `top_p_filter`, on inputs drawn for
each grading run.

Cached calls pass the cache of one call into the next (`prev(i, "1")`); their outputs are
compared with the reference's, which equal one full pass over the same tokens (a call 0 in the
same probe makes that full pass). Sequences cut into chunks are slices of ONE drawn sequence.
RoPE stays at positions <= 64 (float32 angles drift past that); `top_p` is kept away from
ties and from cumulative sums that equal it (the logits are redrawn until they are)."""

ASSIGNMENT = "09_modern_decoder"
import dataclasses

import torch

from .engine import Exercise, Input, Probe, call, ctor, given, label, prev, randn

ROPE_ATOL = 5e-5   # float32 angles at positions up to 64 (COURSE_SPEC 09/10 test ranges)


# -- comparisons ----------------------------------------------------------------------------

def _same_dtype(key, got, want):
    """The result keeps the input's dtype (float64 in, float64 out), then the usual comparison."""
    if want.dtype.kind == "f" and got.dtype != want.dtype:
        return (f"{label(key)} has dtype {got.dtype}, expected {want.dtype} (the input's dtype): "
                "compute in another dtype if you like, but cast the result back (.to(x.dtype))")
    return "default"


def _untouched(i=0) -> dict:
    """Call options that catch a function writing into its input: the argument is captured after
    the call where the engine can (`keep`), else it requires grad (in-place writes then raise)."""
    if "keep" in {f.name for f in dataclasses.fields(call())}:
        return {"keep": (i,)}
    return {"grad": (i,)}


# -- inputs ---------------------------------------------------------------------------------

def _shifted(*shape, scale=1.0, dtype="float32"):
    """randn * scale + 0.3 * scale: rows with a non-zero mean (centring changes them)."""
    return Input(lambda g: (torch.randn(*shape, generator=g, dtype=torch.float64) * scale
                            + 0.3 * scale).to(getattr(torch, dtype)),
                 f"randn{tuple(shape)} x{scale:g} + {0.3 * scale:g}")


def _hand_rows(g):
    """(6, 7): a random row, a row of zeros, a constant row, a tiny row, a shifted row, a big one."""
    x = torch.randn(6, 7, generator=g) * 2
    x[1] = 0.0
    x[2] = torch.randn((), generator=g).abs() + 0.5
    x[3] *= 1e-3
    x[4] += 3.0
    x[5] *= 300.0
    return x


def _unit_pairs(g):
    """(2, 4, 5, 8): in slice [0, i] every row is a unit vector on feature 2i, in [1, i] a random
    multiple of feature 2i+1, so the output lists cos and sin of every angle at positions 0..4."""
    x = torch.zeros(2, 4, 5, 8)
    for i in range(4):
        x[0, i, :, 2 * i] = 1.0
        x[1, i, :, 2 * i + 1] = torch.randn(5, generator=g)
    return x


def _slice_of(draw, a, b, what):
    """Columns a:b of ONE sequence drawn by `draw(g)` without consuming the generator, so that
    the chunks of a cached run (and a full pass) are slices of the same sequence."""
    def build(g):
        state = g.get_state()
        x = draw(g)
        g.set_state(state)
        return x[:, a:b].clone()
    return Input(build, f"{what}[:, {a}:{b}]")


def _seq(B, T, d, a=0, b=None):
    return _slice_of(lambda g: torch.randn(B, T, d, generator=g), a, T if b is None else b,
                     f"x{(B, T, d)}")


def _tokens(V, B, T, a=0, b=None):
    return _slice_of(lambda g: torch.randint(0, V, (B, T), generator=g), a, T if b is None else b,
                     f"tokens{(B, T)}")


def _chunked(make_input, chunks, full=True, past=None):
    """Calls that feed the chunks through the cache: call 0 the full pass (when `full`), then
    chunk by chunk with the previous call's cache; `past` (an input) one more call that must
    raise (past max_len)."""
    T = sum(chunks)
    calls = [call(make_input(0, T))] if full else []
    s0 = 0
    for n in chunks:
        kw = {} if s0 == 0 else {"cache": prev(len(calls) - 1, "1")}
        calls.append(call(make_input(s0, s0 + n), **kw))
        s0 += n
    if past is not None:
        calls.append(call(past, cache=prev(len(calls) - 1, "1"), raises=True))
    return calls


def _nucleus(shape, top_p, scale=1.0, boost=0.0, margin=1e-3):
    """Logits (shape) whose cumulative probabilities (most probable first) stay `margin` away
    from top_p and with no two equal logits; with `boost`, the top token of every even row is
    raised by `boost` and must alone exceed top_p. Redrawn until they do."""
    def build(g):
        for _ in range(10000):
            x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
            rows = x.reshape(-1, shape[-1])
            if boost:
                top = rows.argmax(-1)
                rows[0::2].scatter_add_(-1, top[0::2, None], torch.full((rows[0::2].shape[0], 1), boost,
                                                                       dtype=torch.float64))
            x = rows.reshape(shape).float()
            s = torch.sort(x.double().reshape(-1, shape[-1]), -1, descending=True).values
            cum = s.softmax(-1).cumsum(-1)
            if (cum - top_p).abs().min() <= margin:
                continue
            if shape[-1] > 1 and (s[:, :-1] - s[:, 1:]).min() <= 1e-6:
                continue
            if boost and (cum[0::2, 0] <= top_p + margin).any():
                continue
            return x
        raise RuntimeError("no logits away from top_p found")
    return Input(build, f"logits{tuple(shape)}")


# -- the table ------------------------------------------------------------------------------

EXERCISES = [
    Exercise("rms_norm", ref="modern_decoder.rms_norm", probes=[
        Probe("hand rows", ("test_rms_norm_basic",),
              [call(given(_hand_rows)), call(given(_hand_rows), randn(7))],
              compare=_same_dtype,
              what="rows of zeros, a constant row, a tiny row, a shifted row, with and without weight"),
        Probe("constant row", ("test_rms_norm_basic",),
              [call(given(lambda g: torch.full((2, 5), 2.0) + torch.randn(2, 1, generator=g).abs()))],
              compare=_same_dtype, what="constant rows (RMSNorm does not centre: they become ones)"),
        Probe("random", ("test_rms_norm_random",),
              [call(_shifted(4, 13, scale=3.0), eps=1e-5),
               call(_shifted(2, 3, 2, 10, scale=0.5, dtype="float64"), randn(10, dtype="float64")),
               call(_shifted(5, 24, scale=1e-3), randn(24), eps=1e-2),
               call(_shifted(1, 2, 1, 5, scale=10.0, dtype="float64"), eps=1e-6),
               call(_shifted(3, 9, scale=0.05), randn(9), 1e-4)],
              compare=_same_dtype,
              what="random shapes, float32 and float64, eps 1e-6 to 1e-2, tiny and large scales"),
    ]),
    Exercise("RMSNorm", ref="modern_decoder.RMSNorm", probes=[
        Probe("as built", ("test_RMSNorm_module",), make=ctor(9),
              calls=[call(randn(3, 4, 9, scale=1e-3), grad=(0,), backward=randn(3, 4, 9))],
              param_grads=True, params=True, compare=_same_dtype,
              what="a new RMSNorm(9) (weight ones, default eps) on a tiny input, with gradients"),
        Probe("weight", ("test_RMSNorm_module",), make=ctor(6), load="reference",
              calls=[call(randn(2, 5, 6, scale=2.0), grad=(0,), backward=randn(2, 5, 6))],
              param_grads=True, params=True, compare=_same_dtype,
              what="RMSNorm(6) with a random weight, gradients of the input and the weight"),
        Probe("random", ("test_RMSNorm_random",), make=ctor(11, eps=1e-2), load="reference",
              calls=[call(randn(4, 11, scale=0.05)), call(randn(2, 3, 11, scale=3.0))],
              compare=_same_dtype, what="RMSNorm(11, eps=1e-2) on small and large inputs"),
        Probe("random eps", ("test_RMSNorm_random",), make=ctor(20, eps=1e-4), load="reference",
              calls=[call(randn(1, 2, 3, 20, scale=0.01))],
              compare=_same_dtype, what="RMSNorm(20, eps=1e-4) on a tiny 4-D input"),
    ]),
    Exercise("apply_rope", ref="modern_decoder.apply_rope", probes=[
        Probe("unit pairs", ("test_apply_rope_basic",),
              [call(given(_unit_pairs, "unit pairs"), **_untouched())],
              atol=ROPE_ATOL, compare=_same_dtype,
              what="unit vectors on each feature at positions 0..4 (position 0 unchanged)"),
        Probe("offset", ("test_apply_rope_basic",),
              [call(randn(2, 5, 8), offset=9, **_untouched()),
               call(randn(1, 16), offset=3), call(randn(1, 16), offset=21)],
              atol=ROPE_ATOL, compare=_same_dtype,
              what="offset=9 on (2, 5, 8), one row at offsets 3 and 21"),
        Probe("relative", ("test_apply_rope_relative",),
              [call(v, offset=m) for m in (0, 2, 5, 11, 19, 30, 44, 57)
               for v in (randn(1, 16), randn(1, 16))],
              atol=ROPE_ATOL, compare=_same_dtype,
              what="a query and a key vector at positions 0 to 57"),
        Probe("random", ("test_apply_rope_random",),
              [call(randn(3, 2, 11, 12), **_untouched()),
               call(randn(9, 20), offset=4),
               call(randn(2, 3, 6, 10, dtype="float64"), offset=33, base=500.0),
               call(randn(1, 5, 7, 32), offset=13),
               call(randn(4, 2, 2), offset=62, base=100.0),
               call(randn(2, 1, 8, 6, dtype="float64"))],
              atol=ROPE_ATOL, compare=_same_dtype,
              what="random shapes, offsets up to 62, base 100 and 500, float32 and float64"),
    ]),
    Exercise("SwiGLU", ref="modern_decoder.SwiGLU", probes=[
        Probe("structure", ("test_SwiGLU_structure",), make=ctor(12, 28), calls=[], params=True,
              what="the parameters of SwiGLU(12, 28): gate, up, down, no biases"),
        Probe("structure bias", ("test_SwiGLU_structure",), make=ctor(12, 28, bias=True), calls=[],
              params=True, what="the parameters of SwiGLU(12, 28, bias=True)"),
        Probe("values", ("test_SwiGLU_matches",), make=ctor(20, 52), load="reference",
              calls=[call(randn(3, 6, 20, scale=2.0)), call(randn(1, 1, 20))],
              what="SwiGLU(20, 52) with random weights"),
        Probe("values bias", ("test_SwiGLU_matches",), make=ctor(8, 14, bias=True), load="reference",
              calls=[call(randn(4, 3, 8, scale=2.0))], params=True,
              what="SwiGLU(8, 14, bias=True) with random weights and biases"),
    ]),
    Exercise("GroupedQueryAttention", ref="modern_decoder.GroupedQueryAttention", probes=[
        Probe("structure", ("test_GroupedQueryAttention_structure",), make=ctor(24, 6, 2),
              calls=[call(given(lambda g: torch.zeros(2, 3, 24), "zeros(2, 3, 24)"))], params=True,
              what="GroupedQueryAttention(24, 6, 2): its projections and (out, (k, v)) with one "
                   "copy per K/V head"),
        Probe("structure mqa", ("test_GroupedQueryAttention_structure",), make=ctor(16, 4, 1),
              calls=[call(given(lambda g: torch.zeros(1, 5, 16), "zeros(1, 5, 16)"))], params=True,
              what="GroupedQueryAttention(16, 4, 1): one K/V head"),
        Probe("structure mha", ("test_GroupedQueryAttention_structure",), make=ctor(12, 3, 3),
              calls=[], params=True, what="GroupedQueryAttention(12, 3, 3): as many K/V heads as heads"),
        Probe("structure bias", ("test_GroupedQueryAttention_structure",),
              make=ctor(32, 8, 4, bias=True), calls=[], params=True,
              what="GroupedQueryAttention(32, 8, 4, bias=True): biases when asked"),
        Probe("gqa", ("test_GroupedQueryAttention_matches_torch",), make=ctor(24, 6, 3),
              load="reference", calls=[call(randn(2, 7, 24))],
              what="GroupedQueryAttention(24, 6, 3) on (2, 7, 24): output and cache"),
        Probe("gqa bias", ("test_GroupedQueryAttention_matches_torch",), make=ctor(32, 8, 2, bias=True),
              load="reference", calls=[call(randn(3, 5, 32))],
              what="GroupedQueryAttention(32, 8, 2, bias=True) on (3, 5, 32)"),
        Probe("base", ("test_GroupedQueryAttention_matches_torch",), make=ctor(16, 4, 2, base=500.0),
              load="reference", calls=[call(randn(2, 10, 16))],
              what="GroupedQueryAttention(16, 4, 2, base=500.0) on (2, 10, 16)"),
        Probe("mha", ("test_GroupedQueryAttention_matches_torch",), make=ctor(16, 4, 4),
              load="reference", calls=[call(randn(2, 6, 16))],
              what="n_kv_heads == n_heads (plain multi-head attention)"),
        Probe("mqa", ("test_GroupedQueryAttention_matches_torch",), make=ctor(24, 4, 1),
              load="reference", calls=[call(randn(1, 8, 24)), call(randn(2, 1, 24))],
              what="n_kv_heads == 1 (multi-query attention), and a single token"),
        Probe("cache", ("test_GroupedQueryAttention_cache",), make=ctor(16, 4, 2), load="reference",
              calls=_chunked(lambda a, b: _seq(2, 9, 16, a, b), (4, 1, 4)),
              what="9 tokens as chunks 4 + 1 + 4 through the cache, against one full pass"),
        Probe("cache mqa", ("test_GroupedQueryAttention_cache",), make=ctor(24, 6, 1),
              load="reference", calls=_chunked(lambda a, b: _seq(1, 8, 24, a, b), (1, 1, 1, 5)),
              what="n_kv_heads=1, chunks 1 + 1 + 1 + 5 through the cache"),
        Probe("cache mha", ("test_GroupedQueryAttention_cache",), make=ctor(12, 3, 3),
              load="reference", calls=_chunked(lambda a, b: _seq(3, 7, 12, a, b), (3, 4)),
              what="n_kv_heads == n_heads, chunks 3 + 4 through the cache"),
    ]),
    Exercise("ModernDecoderLM", ref="modern_decoder.ModernDecoderLM", probes=[
        Probe("structure", ("test_ModernDecoderLM_structure",), make=ctor(13, 16, 2, 4, 2, 24),
              calls=[], params=True,
              what="the parameters of ModernDecoderLM(13, 16, 2, 4, 2, 24): lm_head tied to tok_embed "
                   "(one matrix), RMSNorm gains, no biases"),
        Probe("structure untied", ("test_ModernDecoderLM_structure",),
              make=ctor(13, 16, 2, 4, 2, 24, tie_weights=False), calls=[], params=True,
              what="the parameters of ModernDecoderLM(..., tie_weights=False): lm_head its own matrix"),
        Probe("tied", ("test_ModernDecoderLM_matches_torch",), make=ctor(11, 24, 2, 6, 2, 40),
              load="reference", mode="eval", calls=[call(_tokens(11, 2, 7))],
              what="a tied ModernDecoderLM(11, 24, 2, 6, 2, 40) on tokens (2, 7): logits and caches"),
        Probe("untied", ("test_ModernDecoderLM_matches_torch",),
              make=ctor(17, 16, 1, 4, 1, 24, tie_weights=False), load="reference", mode="eval",
              calls=[call(_tokens(17, 3, 5)), call(_tokens(17, 1, 1))],
              what="ModernDecoderLM(17, 16, 1, 4, 1, 24, tie_weights=False) on tokens (3, 5) and (1, 1)"),
        Probe("mha", ("test_ModernDecoderLM_matches_torch",), make=ctor(9, 32, 3, 4, 4, 48),
              load="reference", mode="eval", calls=[call(_tokens(9, 2, 12))],
              what="three layers with n_kv_heads == n_heads on tokens (2, 12)"),
        Probe("cache", ("test_ModernDecoderLM_cache",), make=ctor(13, 24, 2, 6, 3, 32, max_len=10),
              load="reference", mode="eval",
              calls=_chunked(lambda a, b: _tokens(13, 2, 10, a, b), (4, 1, 1, 4),
                             past=_tokens(13, 2, 1)),
              what="10 tokens as chunks 4 + 1 + 1 + 4 through the cache (against one full pass), "
                   "then one token past max_len=10, which must raise"),
        Probe("cache deep", ("test_ModernDecoderLM_cache",), make=ctor(10, 16, 3, 4, 2, 24),
              load="reference", mode="eval",
              calls=_chunked(lambda a, b: _tokens(10, 1, 9, a, b), (2, 5, 2)),
              what="three layers, chunks 2 + 5 + 2 through the cache (each layer its own cache)"),
    ]),
    Exercise("top_p_filter", ref="modern_decoder.top_p_filter", probes=[
        Probe("basic", ("test_top_p_filter_basic",),
              [call(_nucleus((4, 5), p, scale=1.5), p, **_untouched()) for p in (0.6, 0.8, 0.9)]
              + [call(_nucleus((2, 3, 5), 0.7, scale=2.0), 0.7, **_untouched())],
              what="5-token rows at top_p 0.6, 0.8, 0.9 and a (2, 3, 5) batch at 0.7"),
        Probe("top token", ("test_top_p_filter_top_token",),
              [call(_nucleus((4, 6), p, scale=1.5, boost=5.0), p, **_untouched()) for p in (0.45, 0.85)],
              what="rows whose top token alone exceeds top_p (0.45 and 0.85)"),
        Probe("random", ("test_top_p_filter_random",),
              [call(_nucleus((6, 50), 0.9, scale=3.0), 0.9, **_untouched()),
               call(_nucleus((2, 3, 17), 0.3), 0.3),
               call(_nucleus((1, 100), 0.55, scale=0.5), 0.55),
               call(_nucleus((4, 2), 0.6, scale=2.5), 0.6),
               call(_nucleus((5, 33), 0.97, scale=4.0), 0.97)],
              what="random logits (6, 50), (2, 3, 17), (1, 100), (4, 2), (5, 33) at top_p from 0.3 "
                   "to 0.97"),
    ]),
]
