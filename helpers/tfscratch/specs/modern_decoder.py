"""09_modern_decoder: what the grader runs on the student's `rms_norm`, `RMSNorm`, `apply_rope`,
`SwiGLU`, `GroupedQueryAttention`, `ModernDecoderLM` and `top_p_filter`, on inputs drawn for
each grading run.

Cached calls pass the cache of one call into the next (`prev(i, "1")`); their outputs are
compared with the reference's, which equal one full pass over the same tokens (a call 0 in the
same probe makes that full pass). Sequences cut into chunks are slices of ONE drawn sequence.
RoPE stays at positions <= 64 (float32 angles drift past that); `top_p` is kept away from
ties and from cumulative sums that equal it (the logits are redrawn until they are).

The diagnoses recompute the known mistakes on the probe's inputs with the reference's weights;
for the cached probes, `_seq_like` replays the whole chain of calls, each mistake feeding its
own cache to the next call."""

ASSIGNMENT = "09_modern_decoder"
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

from . import vm
from .engine import (Exercise, Input, Probe, call, ctor, given, grades, like, prev, randint, randn,
                     sample, shapes, when)

ROPE_ATOL = 5e-5   # float32 angles at positions up to 64 (COURSE_SPEC 09/10 test ranges)


# -- comparisons ----------------------------------------------------------------------------

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


# One sequence per probe (a Sample): the full pass and the chunks of a cached run are column
# slices of the same numbers (`x[:, a:b]`).
def _seq(B, T, d):
    return sample(lambda g: (torch.randn(B, T, d, generator=g),), f"x{(B, T, d)}")[0]


def _tokens(V, B, T):
    return sample(lambda g: (torch.randint(0, V, (B, T), generator=g),), f"tokens{(B, T)}")[0]


def _chunked(full_input, chunks, full=True, past=None):
    """Calls that feed the chunks of `full_input` (B, T, ...) through the cache: call 0 the full
    pass (when `full`), then chunk by chunk with the previous call's cache; `past` (an input)
    one more call that must raise (past max_len)."""
    calls = [call(full_input)] if full else []
    s0 = 0
    for n in chunks:
        kw = {} if s0 == 0 else {"cache": prev(len(calls) - 1, "1")}
        calls.append(call(full_input[:, s0:s0 + n], **kw))
        s0 += n
    if past is not None:
        calls.append(call(past, cache=prev(len(calls) - 1, "1"), raises=True))
    return calls


def _gapped(B, T):
    """ONE (B, T) tensor of increasing positions with gaps, below 40, per row (slice it)."""
    def draw(g):
        return (torch.stack([torch.randperm(40, generator=g)[:T].sort().values for _ in range(B)]),)
    return sample(draw, f"positions{(B, T)}")[0]


def _positioned(B, T, d, chunks):
    """A full pass with per-row positions, the same through the cache chunk by chunk with the
    chunks' positions, then a full pass with (T,) positions (row 0's)."""
    x, pos = _seq(B, T, d), _gapped(B, T)
    calls = [call(x, positions=pos)]
    s0 = 0
    for n in chunks:
        kw = {} if s0 == 0 else {"cache": prev(len(calls) - 1, "1")}
        calls.append(call(x[:, s0:s0 + n], positions=pos[:, s0:s0 + n], **kw))
        s0 += n
    calls.append(call(x, positions=pos[0]))       # (T,) positions: row 0's
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


# -- diagnoses: the known mistakes, recomputed on the probe's inputs ------------------------

def _names(e):
    """The parameter names of the student's module (None when it was not built)."""
    ps = e.meta("params")
    return None if ps is None else [n for n, _ in ps]


def _extra(e):
    """Parameters the student's module has and the specification's does not."""
    want = set(e.ref_params())
    return [n for n in (_names(e) or []) if n not in want]


def _param_ids(e):
    """(student's, specification's) number of distinct parameter tensors (aliases and tied
    weights count once), or None where not captured."""
    return e.meta("param_ids"), e._want["meta"].get(f"{e.p.name}.param_ids")


def _missing(e, name):
    ns = _names(e)
    return f"no parameter named {name!r}" in e.error or (ns is not None and name not in ns)


def _in_place(e):
    return "updated in place" in e.problem


def _lin(m, t):
    return F.linear(t, m.weight.double(), None if m.bias is None else m.bias.double())


def _leaves(out, path=""):
    """(path, tensor) for every tensor of a nested output: "0", "1.0", "1.1", ..."""
    if isinstance(out, torch.Tensor):
        yield path, out
    elif isinstance(out, (tuple, list)):
        for i, o in enumerate(out):
            yield from _leaves(o, f"{path}.{i}" if path else str(i))


def _seq_like(message, fn, probes=()):
    """like() for probes whose calls pass an earlier output on (a KV cache): fn(ref, *args,
    **kwargs) runs every call in order, a `prev` taken from fn's OWN earlier result, and every
    tensor it returns (output and cache) must equal the student's, on every call (fn returning
    None: not this mistake)."""
    def pred(e):
        ref, ctx, mine, n = e.ref(), vm._Ctx(e.tensors, {}), {}, 0
        for ci, c in enumerate(e.pd["calls"]):
            if c.get("raises"):
                continue
            args = [ctx.value(a) for a in c["args"]]
            kwargs = {k: vm._get(mine[v["$prev"][0]], v["$prev"][1])
                      if isinstance(v, dict) and "$prev" in v else ctx.value(v)
                      for k, v in c["kwargs"].items()}
            with torch.no_grad():
                mine[ci] = r = fn(ref, *args, **kwargs)
            if r is None:
                return False
            for path, t in _leaves(r):
                g, t = e.out(ci, path), t.detach().double().numpy()
                if g is None or g.shape != t.shape or not np.allclose(g, t, atol=1e-4, rtol=1e-3,
                                                                      equal_nan=True):
                    return False
            n += 1
        return n > 0
    return when(message, pred, probes)


# rms_norm / RMSNorm
def _ms(x, dim=-1):
    return x.double().pow(2).mean(dim, keepdim=True)


def _rms(x, weight=None, eps=1e-6):
    return x.double() / (_ms(x) + eps).sqrt() * (1.0 if weight is None else weight.double())


def _rms_like(message, norm, weighted=False):
    """rms_norm's output when x is divided by norm(x, eps) (then times the weight)."""
    def fn(x, weight=None, eps=1e-6):
        if weighted and weight is None:
            return None
        return x.double() / norm(x.double(), eps) * (1.0 if weight is None else weight.double())
    return like(message, fn)


def _dtype(what):
    return when(f"{what} returned another dtype than its input's: compute in float64 if you like, "
                "but cast the result back (.to(x.dtype)).", lambda e: "has dtype" in e.problem)


RMS_DIAGNOSES = [
    _dtype("rms_norm"),
    when("in half precision (bfloat16, float16) the mean of squares must be computed in float32: "
         "upcast x (and the weight) with x.float(), normalise, and cast the result back to x's "
         "dtype once at the end. A mean of squares, rsqrt and product rounded to bfloat16 are off "
         "by several units in the last place; in float16, x**2 overflows past 256.",
         lambda e: "has dtype" not in e.problem and not e.error, probes=("half",)),
    _rms_like("eps is missing: a row of zeros gives 0/0 = NaN and tiny inputs are blown up. Keep "
              "eps inside the square root: x / sqrt(mean(x**2) + eps).", lambda x, eps: _ms(x).sqrt()),
    like("you subtracted the mean: that is LayerNorm (without its bias). RMSNorm divides x itself "
         "by sqrt(mean(x**2) + eps), with no centring.",
         lambda x, weight=None, eps=1e-6: _rms(x - x.mean(-1, keepdim=True), weight, eps)),
    _rms_like("you divided by the standard deviation (x.std / x.var subtract the mean). RMSNorm uses "
              "the root mean square sqrt(mean(x**2) + eps) of x itself.",
              lambda x, eps: (x.var(-1, keepdim=True, unbiased=False) + eps).sqrt()),
    _rms_like("you divided by the standard deviation (x.std / x.var subtract the mean, here even with "
              "d - 1). RMSNorm uses the root mean square sqrt(mean(x**2) + eps) of x itself.",
              lambda x, eps: (x.var(-1, keepdim=True) + eps).sqrt()),
    _rms_like("eps is outside the square root: use sqrt(mean(x**2) + eps), as nn.RMSNorm does, not "
              "sqrt(mean(x**2)) + eps.", lambda x, eps: _ms(x).sqrt() + eps),
    _rms_like("the square root is missing: divide by sqrt(mean(x**2) + eps), the ROOT mean square, "
              "not by the mean square itself.", lambda x, eps: _ms(x) + eps),
    _rms_like("you divided by the L2 norm ||x|| instead of the root MEAN square ||x|| / sqrt(d): use "
              "mean, not sum, of x**2.", lambda x, eps: (x.pow(2).sum(-1, keepdim=True) + eps).sqrt()),
    _rms_like("you averaged x**2 with d - 1 in the denominator; RMSNorm averages over d (a plain mean).",
              lambda x, eps: (x.pow(2).sum(-1, keepdim=True) / (x.shape[-1] - 1) + eps).sqrt()),
    _rms_like("the mean of x**2 is taken over the wrong axis: normalise over the LAST axis "
              "(features), dim=-1 with keepdim=True.", lambda x, eps: (_ms(x, 0) + eps).sqrt()),
    _rms_like("the mean of x**2 is taken over every element at once: normalise each vector over the "
              "last axis only (dim=-1, keepdim=True).", lambda x, eps: (x.pow(2).mean() + eps).sqrt()),
    like("the weight was not applied: multiply the normalised x by weight (the learnable gain, "
         "shape (d,)).", lambda x, weight=None, eps=1e-6: None if weight is None else _rms(x, None, eps)),
    like("the weight was ADDED; it is a gain: multiply by it.",
         lambda x, weight=None, eps=1e-6: None if weight is None else _rms(x, None, eps) + weight),
    when("the result has NaN where the expected values are finite (a row of zeros?): keep eps "
         "inside the square root, x / sqrt(mean(x**2) + eps).",
         lambda e: any((np.isnan(g) & ~np.isnan(w)).any() for g, w in e.outs())),
]


def _gain_not_ones(e):
    """The output is the normalised x times one fixed gain per feature, and that gain is not 1."""
    (x,), _ = e.args(0)
    n = _rms(x, torch.ones(x.shape[-1]), 1e-6)      # as built: the specification's gain is ones
    n = n.detach().double().numpy() if isinstance(n, torch.Tensor) else np.asarray(n, dtype=np.float64)
    r = (np.asarray(e.out(0), dtype=np.float64) / n).reshape(-1, n.shape[-1])
    return np.allclose(r, r[:1], rtol=1e-3, atol=1e-3) and not np.allclose(r[0], 1.0, atol=1e-3)


def _other_default_eps(e):
    return any(e.matches(lambda ref, x, eps=eps: _rms(x, ref.weight, eps))
               for eps in (1e-5, 1e-8, 1e-12, 1e-4, 0.0))


RMSNORM_DIAGNOSES = [
    when("RMSNorm has no parameter `weight`: keep the gain as self.weight = nn.Parameter(torch.ones(d)), "
         "named like nn.RMSNorm's.", lambda e: _missing(e, "weight")),
    when("RMSNorm has a parameter `bias`: RMSNorm has no bias (that is one of the things it drops); "
         "keep only the gain `weight`.", lambda e: any("bias" in n for n in _extra(e))),
    when("RMSNorm.weight does not start at ones: initialise it to ones (the identity gain), as "
         "nn.RMSNorm does.", _gain_not_ones, probes=("as built",)),
    when("RMSNorm(d) used another eps by default; the default is eps=1e-6 (the signature "
         "RMSNorm(d, eps=1e-6)).", _other_default_eps, probes=("as built",)),
    like("the eps given to RMSNorm(d, eps) was not used: keep it (self.eps = eps) and pass it to "
         "rms_norm.", lambda ref, x: None if ref.eps == 1e-6 else _rms(x, ref.weight, 1e-6),
         probes=("random", "random eps")),
    when("no gradient reached RMSNorm.weight: use the parameter itself in forward (not a copy, "
         ".data or a plain tensor).",
         lambda e: "is missing" in e.problem and "gradient of parameter `weight`" in e.problem),
    like("you multiplied x by the weight before normalising, so the gain cancels out: normalise "
         "first, then multiply the normalised x by self.weight.",
         lambda ref, x: _rms(x * ref.weight, None, ref.eps), probes=("weight", "random", "random eps")),
]


# apply_rope
def _rope(x, offset=0, base=10000.0, layout="pairs", exponent=2.0, sign=1.0, start=0, use_offset=True):
    """RoPE with the switches of known mistakes (float64)."""
    L, D = x.shape[-2:]
    h = D // 2
    inv = base ** (-exponent * torch.arange(h, dtype=torch.float64) / D)
    pos = torch.arange(L, dtype=torch.float64) + start + (offset if use_offset else 0)
    theta = sign * torch.outer(pos, inv)
    c, s = theta.cos(), theta.sin()
    x = x.double()
    a, b = (x[..., :h], x[..., h:]) if layout == "half" else (x[..., 0::2], x[..., 1::2])
    if layout == "pairs":
        return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
    return torch.cat([a * c - b * s, a * s + b * c], -1)


def _rope_like(message, **kw):
    def fn(x, offset=0, base=10000.0):
        return None if offset == 0 and not kw.get("use_offset", True) else _rope(x, offset, base, **kw)
    return like(message, fn)


ROPE_DIAGNOSES = [
    when("apply_rope wrote the rotation into its input x (in place): build the result as a new "
         "tensor (torch.stack / torch.cat) and leave x unchanged.", _in_place),
    _dtype("apply_rope"),
    _rope_like("you used the half-split ('rotate half') layout, pairing feature i with i + D/2. This "
               "exercise pairs neighbours (2i, 2i+1): a, b = x[..., 0::2], x[..., 1::2].", layout="half"),
    _rope_like("the rotated pairs are concatenated as [all first halves, all second halves]; put each "
               "rotated pair back at (2i, 2i+1) (stack on a new last axis, then flatten).", layout="sorted"),
    _rope_like("wrong frequency exponent: pair i rotates with base**(-2i/D), and you used base**(-i/D) "
               "(i counts pairs, so the exponent is 2i/D, i.e. torch.arange(0, D, 2) / D).", exponent=1.0),
    _rope_like("wrong frequency exponent: pair i rotates with base**(-2i/D), and you used "
               "base**(-4i/D) (arange(0, D, 2) divided by D/2 counts the 2 twice).", exponent=4.0),
    _rope_like("the frequency exponent has the wrong sign: base**(-2i/D) (slower for later pairs), "
               "not base**(+2i/D).", exponent=-2.0),
    _rope_like("the rotation goes the wrong way: (a, b) -> (a cos t - b sin t, a sin t + b cos t); you "
               "have the signs of the sin terms swapped (a rotation by -t).", sign=-1.0),
    _rope_like("`offset` was ignored: row j sits at position offset + j (new tokens come after the "
               "cached ones).", use_offset=False),
    _rope_like("positions start at 1: row j sits at position offset + j, so the first row of an "
               "offset-0 call is not rotated at all.", start=1),
    when("apply_rope does not take `positions`: the signature is apply_rope(x, offset=0, "
         "base=10000.0, positions=None).", lambda e: "positions" in e.error),
    like("`positions` was ignored: when it is given, row j sits at positions[j] (or positions[b, j]), "
         "not at offset + j.",
         lambda x, offset=0, base=10000.0, positions=None:
         None if positions is None else _rope_plain(x, offset, base)),
    when("in half precision the rotation must be computed in float32 (upcast x, float32 cos and "
         "sin) and rounded to the input's dtype once at the end: rounding cos, sin and every "
         "product to bfloat16/float16 adds errors of its own.",
         lambda e: "dtype" not in e.problem and not e.error, probes=("half",)),
]


def _rope_plain(x, offset, base):
    """The rotation at positions offset + j (positions ignored), in float64."""
    L, D = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.arange(offset, offset + L, dtype=torch.float64)[:, None] * inv
    a, b = x.double()[..., 0::2], x.double()[..., 1::2]
    return torch.stack([a * th.cos() - b * th.sin(), a * th.sin() + b * th.cos()], -1).flatten(-2)


# SwiGLU
def _ffn(message, h):
    def fn(ref, x):
        x = x.double()
        return _lin(ref.down, h(_lin(ref.gate, x), _lin(ref.up, x)))
    return like(message, fn)


SWIGLU_DIAGNOSES = [
    when("SwiGLU has no `gate` layer: keep the three nn.Linear layers named gate, up and down, as "
         "the exercise says, so that their weights can be loaded by name.",
         lambda e: _missing(e, "gate.weight")),
    when("SwiGLU has a bias although bias=False (the default): pass bias=bias to nn.Linear. "
         "LLaMA-style layers have no biases.", lambda e: any(n.endswith("bias") for n in _extra(e))),
    when("SwiGLU has no bias although bias=True was asked for: pass bias=bias to nn.Linear.",
         lambda e: _missing(e, "gate.bias") and "gate.bias" in e.ref_params()),
    _ffn("the SiLU is on the wrong projection: silu(gate(x)) * up(x), not gate(x) * silu(up(x)).",
         lambda g, u: g * F.silu(u)),
    _ffn("you used a sigmoid where SwiGLU has silu(z) = z * sigmoid(z): sigmoid gating is the "
         "original GLU, not SwiGLU.", lambda g, u: torch.sigmoid(g) * u),
    _ffn("you used GELU; SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu).", lambda g, u: F.gelu(g) * u),
    _ffn("you used ReLU; SwiGLU's gate is silu(z) = z * sigmoid(z) (F.silu).", lambda g, u: F.relu(g) * u),
    _ffn("the gate is missing: down(silu(up(x))) is a plain FFN; multiply by silu(gate(x)).",
         lambda g, u: F.silu(u)),
    _ffn("the up projection is missing: down(silu(gate(x))) is a plain FFN; multiply silu(gate(x)) "
         "by up(x).", lambda g, u: F.silu(g)),
    _ffn("the SiLU is applied after the product: silu(gate(x)) * up(x), not silu(gate(x) * up(x)).",
         lambda g, u: F.silu(g * u)),
    _ffn("you added the two projections; SwiGLU MULTIPLIES silu(gate(x)) by up(x).",
         lambda g, u: F.silu(g) + u),
]


# GroupedQueryAttention
def _heads(t, n):
    B, T, _ = t.shape
    return t.view(B, T, n, -1).transpose(1, 2)


def _rope_at(x, positions, base):
    """RoPE of x (B, H, T, D) at integer positions (T,) or (B, T), float64."""
    D = x.shape[-1]
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    pos = positions.double()
    pos = pos[:, None] if pos.dim() == 2 else pos           # (B, 1, T): every head
    th = pos[..., None] * inv
    a, b = x.double()[..., 0::2], x.double()[..., 1::2]
    return torch.stack([a * th.cos() - b * th.sin(), a * th.sin() + b * th.cos()], -1).flatten(-2)


def _gqa(ref, x, cache=None, rep="interleave", rope_q=True, rope_k=True, rope_v=False,
         rope_first=False, causal=True, scale=None, offset=True, mask="offset", base=None,
         positions=None, pos_mode="use"):
    """The reference attention (its weights) with the switches of known mistakes: (out, (k, v)).
    pos_mode (when positions are given): "use", "ignore" (offset P as without them), "no cache"
    (ignored once a cache is given), "queries" (the keys at P.. whatever positions say)."""
    H, Hkv, base = ref.n_heads, ref.n_kv_heads, ref.base if base is None else base
    B, T, d = x.shape
    x = x.double()
    P = 0 if cache is None else cache[0].size(2)
    pos = P if offset else 0
    if pos_mode == "ignore" or (pos_mode == "no cache" and cache is not None):
        positions = None
    qp, kp, vp = _lin(ref.w_q, x), _lin(ref.w_k, x), _lin(ref.w_v, x)
    if rope_first:
        qp, kp = _rope(qp, pos, base), _rope(kp, pos, base)
    q, k, v = _heads(qp, H), _heads(kp, Hkv), _heads(vp, Hkv)
    if not rope_first and positions is not None:
        q = _rope_at(q, positions, base) if rope_q else q
        k = (_rope_at(k, positions, base) if pos_mode != "queries" else _rope(k, pos, base)) if rope_k else k
    elif not rope_first:
        q = _rope(q, pos, base) if rope_q else q
        k = _rope(k, pos, base) if rope_k else k
    if rope_v:
        v = _rope(v, pos, base)
    if cache is not None:
        k, v = torch.cat([cache[0].double(), k], 2), torch.cat([cache[1].double(), v], 2)
    g = H // Hkv
    ka, va = ((k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)) if rep == "interleave"
              else (k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)))
    s = q @ ka.transpose(-2, -1) * (1 / math.sqrt(d // H) if scale is None else scale)
    if causal:
        allowed = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P if mask == "offset" else 0)
        s = s.masked_fill(~allowed, float("-inf"))
    o = (s.softmax(-1) @ va).transpose(1, 2).reshape(B, T, d)
    return _lin(ref.w_o, o), (k, v)


def _gqa_like(message, **kw):
    return _seq_like(message, lambda ref, x, cache=None, positions=None:
                     _gqa(ref, x, cache, positions=positions, **kw))


def _pos_like(message, mode):
    """A mistake with `positions`: only on calls that pass them (the others run as the reference)."""
    return _seq_like(message, lambda ref, x, cache=None, positions=None:
                     _gqa(ref, x, cache, positions=positions, pos_mode=mode), probes=("positions",))


def _cache_per_query_head(e):
    for g, w in e.outs("1.0"):
        if g.ndim == 4 and g.shape[1] > w.shape[1] and g.shape[2:] == w.shape[2:]:
            return True
    return False


GQA_MATCHES = ("gqa", "gqa bias", "base", "mha", "mqa")
GQA_DIAGNOSES = [
    when("GroupedQueryAttention.forward does not take `positions`: the signature is forward(x, "
         "cache=None, positions=None).", lambda e: "positions" in e.error, probes=("positions",)),
    _pos_like("`positions` was ignored once a cache is given: the new tokens sit at the positions "
              "passed (apply_rope(..., positions=positions)), with a cache as without one; offset=P "
              "is only the default.", "no cache"),
    _pos_like("`positions` was ignored: when it is given, the queries and new keys are rotated at "
              "those positions (apply_rope(..., positions=positions)), not at P, P+1, ...", "ignore"),
    _pos_like("`positions` rotated the queries only: rotate the new keys at the same positions.",
              "queries"),
    when("the cached keys have one copy per QUERY head: cache the keys and values before repeating "
         "them for the groups, (B, n_kv_heads, T, head_dim); that is what makes the GQA cache small.",
         _cache_per_query_head),
    _gqa_like("query heads read the wrong K/V heads: query head h uses K/V head h // (n_heads // "
              "n_kv_heads), i.e. k.repeat_interleave(group, dim=1) (0,0,1,1), not k.repeat(1, group, "
              "1, 1) (0,1,0,1).", rep="tile"),
    _gqa_like("RoPE is missing: rotate the queries and keys with apply_rope (per head, offset = number "
              "of cached tokens).", rope_q=False, rope_k=False),
    _gqa_like("RoPE is applied to the queries only: rotate the keys too (scores then depend on the "
              "distance).", rope_k=False),
    _gqa_like("RoPE is applied to the keys only: rotate the queries too.", rope_q=False),
    _gqa_like("RoPE was also applied to the values: rotate only the queries and keys.", rope_v=True),
    _gqa_like("RoPE was applied over all d_model features before splitting into heads: apply it per "
              "head, over head_dim (after view(B, T, H, head_dim).transpose(1, 2)).", rope_first=True),
    _gqa_like("the attention is not causal: query i may read keys 0..i only (a lower-triangular mask "
              "with the diagonal).", causal=False),
    _gqa_like("the scores are not scaled: divide them by sqrt(head_dim).", scale=1.0),
    _seq_like("the scores are scaled by 1/sqrt(d_model); use 1/sqrt(head_dim), the size of one head.",
              lambda ref, x, cache=None: _gqa(ref, x, cache, scale=1 / math.sqrt(x.size(-1)))
              if ref.n_heads > 1 else None),
    _gqa_like("the positions of the new tokens were not offset: with P cached tokens, the new ones "
              "sit at positions P, P+1, ... (apply_rope(..., offset=P)), not 0, 1, ...", offset=False),
    _gqa_like("the causal mask over (T, P + T) is a plain tril: new query i sits at position P + i and "
              "may read keys 0..P+i, tril(diagonal=P).", mask="plain"),
    like("the cache holds the keys BEFORE RoPE; cache them after the rotation.",
         lambda ref, x, cache=None: _heads(ref.w_k(x), ref.n_kv_heads) if cache is None else None,
         out="1.0", probes=GQA_MATCHES),
    _seq_like("the `base` argument was not passed on to apply_rope (base=self.base).",
              lambda ref, x, cache=None: _gqa(ref, x, cache, base=10000.0) if ref.base != 10000.0 else None),
]


# ModernDecoderLM
def _lm(ref, tokens, cache=None, final_norm=True, scale_embed=False, add_pe=False, post_norm=False,
        head=None, first_cache=False):
    """The reference model (its weights) with the switches of known mistakes: (logits, cache)."""
    x = ref.tok_embed(tokens)
    T, d = tokens.shape[1], x.shape[-1]
    P = 0 if cache is None else cache[0][0].size(2)
    if scale_embed:
        x = x * math.sqrt(d)
    if add_pe:
        from ..reference import sinusoidal_positional_encoding
        x = x + sinusoidal_positional_encoding(P + T, d)[P:]
    new = []
    for i, layer in enumerate(ref.layers):
        c = None if cache is None else cache[0 if first_cache else i]
        if post_norm:
            a, kv = layer.self_attn(x, c)
            x = layer.norm1(x + a)
            x = layer.norm2(x + layer.ff(x))
        else:
            a, kv = layer.self_attn(layer.norm1(x), c)
            x = x + a
            x = x + layer.ff(layer.norm2(x))
        new.append(kv)
    x = ref.norm(x) if final_norm else x
    return F.linear(x, ref.lm_head.weight if head is None else head), new


def _lm_like(message, **kw):
    return _seq_like(message, lambda ref, tokens, cache=None: _lm(ref, tokens, cache, **kw))


def _copied(e):
    a, b = e.got("after.lm_head.weight"), e.got("after.tok_embed.weight")
    return a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b) \
        and (lambda g, w: g is not None and w is not None and g > w)(*_param_ids(e))


def _after_not_compared(key, got, want):
    """Parameters kept for a diagnosis (a copy or a tie?): their random values are not compared."""
    return None if ".after." in key else "default"


LM_DIAGNOSES = [
    when("lm_head has a bias; use nn.Linear(d_model, vocab_size, bias=False).",
         lambda e: "lm_head.bias" in _extra(e)),
    when("the model has bias parameters: this model has no biases (every norm is an RMSNorm with a "
         "gain only, not nn.LayerNorm, and every nn.Linear has bias=False).",
         lambda e: any(n.endswith("bias") for n in _extra(e))),
    when("lm_head.weight is tok_embed.weight although tie_weights=False: tie them only when asked.",
         lambda e: (lambda g, w: g is not None and w is not None and g < w)(*_param_ids(e)),
         probes=("structure untied",)),
    when("lm_head.weight holds the same numbers as tok_embed.weight, but as two tensors: a copy, not a "
         "tie, and the two drift apart as soon as training starts. Tie them: self.lm_head.weight = "
         "self.tok_embed.weight.", _copied, probes=("structure",)),
    when("lm_head.weight is not tok_embed.weight, so the output layer does not follow the embedding: "
         "tie them (self.lm_head.weight = self.tok_embed.weight).",
         lambda e: (lambda g, w: g is not None and w is not None and g > w)(*_param_ids(e)),
         probes=("structure",)),
    _lm_like("the final RMSNorm is missing: logits = lm_head(norm(x)).", final_norm=False),
    _lm_like("the embeddings are multiplied by sqrt(d_model) (notebook 08's convention); this model "
             "uses tok_embed(tokens) as it is.", scale_embed=True),
    _lm_like("a sinusoidal positional encoding is added to the embeddings; with RoPE the positions "
             "enter only inside attention.", add_pe=True),
    _lm_like("the blocks are post-norm (norm after the residual sum); use pre-norm: x = x + "
             "self_attn(norm1(x)), then x = x + ff(norm2(x)).", post_norm=True),
    _seq_like("the logits come from the embedding matrix although tie_weights=False: use lm_head (its "
              "own weight when untied).",
              lambda ref, t, cache=None: None if ref.lm_head.weight is ref.tok_embed.weight
              else _lm(ref, t, cache, head=ref.tok_embed.weight)),
    _lm_like("every layer got the same cache: pass cache[i] to layer i (not the same pair to every "
             "layer) and collect the (k, v) each layer returns.", first_cache=True),
    when("a call that goes past max_len positions did not raise: check P + T <= max_len in forward "
         "(assert, or raise ValueError).",
         lambda e: "should raise an error but returned normally" in e.problem),
]


# top_p_filter
def _nucleus_like(message, rule="before", fill=float("-inf"), values="logits", descending=True,
                  back=True, mass="probs"):
    def fn(logits, top_p):
        s, order = torch.sort(logits.double(), -1, descending=descending)
        probs = s.softmax(-1)
        m = probs if mass == "probs" else s
        cum = m.cumsum(-1)
        if rule == "before":
            remove = cum - m >= top_p
        else:
            remove = cum > top_p
        kept = (s if values == "logits" else probs).masked_fill(remove, fill)
        return torch.empty_like(kept).scatter(-1, order, kept) if back else kept
    return like(message, fn)


TOP_P_DIAGNOSES = [
    when("top_p_filter changed the caller's logits in place; return a new tensor (masked_fill or "
         "scatter into a new one, not logits[...] = ...).", _in_place),
    _nucleus_like("the token whose probability makes the total reach top_p was dropped (you kept "
                  "cumsum <= top_p, or < top_p). Keep a token while the mass BEFORE it is below top_p: "
                  "the set must reach top_p, and the top token is always kept.", rule="after"),
    when("a row has no token left: the top token must always be kept, even when it alone exceeds "
         "top_p (keep a token while the mass BEFORE it is below top_p).",
         lambda e: any(np.isneginf(g).all(-1).any() for g, _ in e.outs())),
    _nucleus_like("the kept logits are returned in sorted order: scatter them back to their vocabulary "
                  "positions (out.scatter(-1, sorted_indices, sorted_logits)).", back=False),
    _nucleus_like("you returned probabilities; return the LOGITS of the kept tokens (and -inf "
                  "elsewhere), so that softmax afterwards renormalises over the nucleus.", values="probs"),
    _nucleus_like("the removed tokens were set to 0; set them to -inf (a logit of 0 still has "
                  "probability after softmax).", fill=0.0),
    _nucleus_like("you sorted in ascending order: the nucleus is the MOST probable tokens, "
                  "torch.sort(..., descending=True).", descending=False),
    _nucleus_like("you summed the sorted LOGITS; the nucleus is defined by the softmax probabilities' "
                  "cumulative sum.", mass="logits"),
]


# -- the table ------------------------------------------------------------------------------

EXERCISES = [
    Exercise("rms_norm", ref="modern_decoder.rms_norm", shortcuts=("rms_norm",),
             graded=grades(basic=2, random=(2, 9191), half=1),
             diagnose=RMS_DIAGNOSES, probes=[
        Probe("hand rows", ("basic",),
              [call(given(_hand_rows)), call(given(_hand_rows), randn(7))],
              keep_dtype=True,
              what="rows of zeros, a constant row, a tiny row, a shifted row, with and without weight"),
        Probe("constant row", ("basic",),
              [call(given(lambda g: torch.full((2, 5), 2.0) + torch.randn(2, 1, generator=g).abs()))],
              keep_dtype=True, what="constant rows (RMSNorm does not centre: they become ones)"),
        Probe("random", ("random",),
              [call(_shifted(4, 13, scale=3.0), eps=1e-5),
               call(_shifted(2, 3, 2, 10, scale=0.5, dtype="float64"), randn(10, dtype="float64")),
               call(_shifted(5, 24, scale=1e-3), randn(24), eps=1e-2),
               call(_shifted(1, 2, 1, 5, scale=10.0, dtype="float64"), eps=1e-6),
               call(_shifted(3, 9, scale=0.05), randn(9), 1e-4)],
              keep_dtype=True,
              what="random shapes, float32 and float64, eps 1e-6 to 1e-2, tiny and large scales"),
        Probe("half", ("half",),
              [call(_shifted(6, 64, scale=2.0, dtype="bfloat16")),
               call(_shifted(3, 5, 48, scale=0.5, dtype="bfloat16"), eps=1e-5),
               call(randn(4, 32, scale=300.0, dtype="float16"), randn(32, dtype="float16"))],
              atol=1e-3, rtol=4e-3, keep_dtype=True,
              what="bfloat16 and float16 inputs (float16 values near 300): computed in float32 "
                   "and rounded once, returned in the input's dtype"),
    ]),
    Exercise("RMSNorm", ref="modern_decoder.RMSNorm", shortcuts=("rms_norm",),
             graded=grades(module=2, random=(1, 4242)),
             diagnose=RMSNORM_DIAGNOSES, probes=[
        Probe("as built", ("module",), make=ctor(9),
              calls=[call(randn(3, 4, 9, scale=1e-3), grad=(0,), backward=randn(3, 4, 9))],
              param_grads=True, params=True, keep_dtype=True,
              what="a new RMSNorm(9) (weight ones, default eps) on a tiny input, with gradients"),
        Probe("weight", ("module",), make=ctor(6), load="reference",
              calls=[call(randn(2, 5, 6, scale=2.0), grad=(0,), backward=randn(2, 5, 6))],
              param_grads=True, params=True, keep_dtype=True,
              what="RMSNorm(6) with a random weight, gradients of the input and the weight"),
        Probe("random", ("random",), make=ctor(11, eps=1e-2), load="reference",
              calls=[call(randn(4, 11, scale=0.05)), call(randn(2, 3, 11, scale=3.0))],
              keep_dtype=True, what="RMSNorm(11, eps=1e-2) on small and large inputs"),
        Probe("random eps", ("random",), make=ctor(20, eps=1e-4), load="reference",
              calls=[call(randn(1, 2, 3, 20, scale=0.01))],
              keep_dtype=True, what="RMSNorm(20, eps=1e-4) on a tiny 4-D input"),
    ]),
    Exercise("apply_rope", ref="modern_decoder.apply_rope", diagnose=ROPE_DIAGNOSES,
             graded=grades(basic=2, relative=2, random=(2, 2718), positions=1, half=1),
             probes=[
        Probe("unit pairs", ("basic",),
              [call(given(_unit_pairs, "unit pairs"), **_untouched())],
              atol=ROPE_ATOL, keep_dtype=True,
              what="unit vectors on each feature at positions 0..4 (position 0 unchanged)"),
        Probe("offset", ("basic",),
              [call(randn(2, 5, 8), offset=9, **_untouched()),
               call(randn(1, 16), offset=3), call(randn(1, 16), offset=21)],
              atol=ROPE_ATOL, keep_dtype=True,
              what="offset=9 on (2, 5, 8), one row at offsets 3 and 21"),
        Probe("relative", ("relative",),
              [call(v, offset=m) for m in (0, 2, 5, 11, 19, 30, 44, 57)
               for v in (randn(1, 16), randn(1, 16))],
              atol=ROPE_ATOL, keep_dtype=True,
              what="a query and a key vector at positions 0 to 57"),
        Probe("random", ("random",),
              [call(randn(3, 2, 11, 12), **_untouched()),
               call(randn(9, 20), offset=4),
               call(randn(2, 3, 6, 10, dtype="float64"), offset=33, base=500.0),
               call(randn(1, 5, 7, 32), offset=13),
               call(randn(4, 2, 2), offset=62, base=100.0),
               call(randn(2, 1, 8, 6, dtype="float64"))],
              atol=ROPE_ATOL, keep_dtype=True,
              what="random shapes, offsets up to 62, base 100 and 500, float32 and float64"),
        Probe("positions", ("positions",),
              [call(randn(2, 3, 5, 8), positions=randint(0, 60, 2, 5), **_untouched()),
               call(randn(3, 6, 10), positions=randint(0, 60, 3, 6)),
               call(randn(7, 12), positions=randint(0, 60, 7)),
               call(randn(2, 4, 8), offset=5, positions=randint(0, 60, 4), base=500.0)],
              atol=ROPE_ATOL, keep_dtype=True,
              what="positions per row: (B, L) for (B, H, L, D) and (B, L, D) inputs, (L,) for "
                   "(L, D), and positions given with an offset (positions win)"),
        Probe("half", ("half",),
              [call(randn(3, 2, 40, 16, scale=2.0, dtype="bfloat16"), offset=10),
               call(randn(2, 30, 32, scale=2.0, dtype="float16"), offset=30),
               call(randn(2, 4, 8, dtype="bfloat16"), positions=randint(0, 60, 2, 4))],
              atol=1e-3, rtol=4e-3, keep_dtype=True,
              what="bfloat16 and float16 inputs: rotated in float32 and rounded once, returned "
                   "in the input's dtype"),
    ]),
    Exercise("SwiGLU", ref="modern_decoder.SwiGLU", diagnose=SWIGLU_DIAGNOSES,
             graded=grades(structure=1, matches=(2, 3141)),
             probes=[
        Probe("structure", (shapes("structure"),), make=ctor(12, 28), calls=[], params=True,
              what="the parameters of SwiGLU(12, 28): gate, up, down, no biases"),
        Probe("structure bias", (shapes("structure"),), make=ctor(12, 28, bias=True), calls=[],
              params=True, what="the parameters of SwiGLU(12, 28, bias=True)"),
        Probe("values", ("matches",), make=ctor(20, 52), load="reference",
              calls=[call(randn(3, 6, 20, scale=2.0)), call(randn(1, 1, 20))],
              what="SwiGLU(20, 52) with random weights"),
        Probe("values bias", ("matches",), make=ctor(8, 14, bias=True), load="reference",
              calls=[call(randn(4, 3, 8, scale=2.0))], params=True,
              what="SwiGLU(8, 14, bias=True) with random weights and biases"),
    ]),
    Exercise("GroupedQueryAttention", ref="modern_decoder.GroupedQueryAttention", returns=("output", "cache"),
             graded=grades(structure=1, matches_torch=(3, 1729), cache=(2, 6502), positions=1),
             shortcuts=("attention", "multihead"), diagnose=GQA_DIAGNOSES, probes=[
        Probe("structure", (shapes("structure"),), make=ctor(24, 6, 2),
              calls=[call(given(lambda g: torch.zeros(2, 3, 24), "zeros(2, 3, 24)"))], params=True,
              what="GroupedQueryAttention(24, 6, 2): its projections and (out, (k, v)) with one "
                   "copy per K/V head"),
        Probe("structure mqa", (shapes("structure"),), make=ctor(16, 4, 1),
              calls=[call(given(lambda g: torch.zeros(1, 5, 16), "zeros(1, 5, 16)"))], params=True,
              what="GroupedQueryAttention(16, 4, 1): one K/V head"),
        Probe("structure mha", (shapes("structure"),), make=ctor(12, 3, 3),
              calls=[], params=True, what="GroupedQueryAttention(12, 3, 3): as many K/V heads as heads"),
        Probe("structure bias", (shapes("structure"),),
              make=ctor(32, 8, 4, bias=True), calls=[], params=True,
              what="GroupedQueryAttention(32, 8, 4, bias=True): biases when asked"),
        Probe("gqa", ("matches_torch",), make=ctor(24, 6, 3),
              load="reference", calls=[call(randn(2, 7, 24))],
              what="GroupedQueryAttention(24, 6, 3) on (2, 7, 24): output and cache"),
        Probe("gqa bias", ("matches_torch",), make=ctor(32, 8, 2, bias=True),
              load="reference", calls=[call(randn(3, 5, 32))],
              what="GroupedQueryAttention(32, 8, 2, bias=True) on (3, 5, 32)"),
        Probe("base", ("matches_torch",), make=ctor(16, 4, 2, base=500.0),
              load="reference", calls=[call(randn(2, 10, 16))],
              what="GroupedQueryAttention(16, 4, 2, base=500.0) on (2, 10, 16)"),
        Probe("mha", ("matches_torch",), make=ctor(16, 4, 4),
              load="reference", calls=[call(randn(2, 6, 16))],
              what="n_kv_heads == n_heads (plain multi-head attention)"),
        Probe("mqa", ("matches_torch",), make=ctor(24, 4, 1),
              load="reference", calls=[call(randn(1, 8, 24)), call(randn(2, 1, 24))],
              what="n_kv_heads == 1 (multi-query attention), and a single token"),
        Probe("cache", ("cache",), make=ctor(16, 4, 2), load="reference",
              calls=_chunked(_seq(2, 9, 16), (4, 1, 4)),
              what="9 tokens as chunks 4 + 1 + 4 through the cache, against one full pass"),
        Probe("cache mqa", ("cache",), make=ctor(24, 6, 1),
              load="reference", calls=_chunked(_seq(1, 8, 24), (1, 1, 1, 5)),
              what="n_kv_heads=1, chunks 1 + 1 + 1 + 5 through the cache"),
        Probe("cache mha", ("cache",), make=ctor(12, 3, 3),
              load="reference", calls=_chunked(_seq(3, 7, 12), (3, 4)),
              what="n_kv_heads == n_heads, chunks 3 + 4 through the cache"),
        Probe("positions", ("positions",), make=ctor(16, 4, 2),
              load="reference", calls=_positioned(2, 9, 16, (4, 2, 3)),
              what="positions per row (increasing, with gaps, up to 40): a full pass, the same "
                   "tokens as chunks 4 + 2 + 3 through the cache with their positions, and (T,) "
                   "positions shared by every row"),
    ]),
    Exercise("ModernDecoderLM", ref="modern_decoder.ModernDecoderLM", returns=("logits", "cache"),
             graded=grades(structure=2, matches_torch=(3, 8086), cache=(2, 6809)),
             shortcuts=("attention", "multihead", "transformer"), diagnose=LM_DIAGNOSES, probes=[
        Probe("structure", (shapes("structure"),), make=ctor(13, 16, 2, 4, 2, 24),
              calls=[], params=True, after=("lm_head.weight", "tok_embed.weight"),
              compare=_after_not_compared,
              what="the parameters of ModernDecoderLM(13, 16, 2, 4, 2, 24): lm_head tied to tok_embed "
                   "(one matrix), RMSNorm gains, no biases"),
        Probe("structure untied", (shapes("structure"),),
              make=ctor(13, 16, 2, 4, 2, 24, tie_weights=False), calls=[], params=True,
              what="the parameters of ModernDecoderLM(..., tie_weights=False): lm_head its own matrix"),
        Probe("tied", ("matches_torch",), make=ctor(11, 24, 2, 6, 2, 40),
              load="reference", mode="eval", calls=[call(_tokens(11, 2, 7))],
              what="a tied ModernDecoderLM(11, 24, 2, 6, 2, 40) on tokens (2, 7): logits and caches"),
        Probe("untied", ("matches_torch",),
              make=ctor(17, 16, 1, 4, 1, 24, tie_weights=False), load="reference", mode="eval",
              calls=[call(_tokens(17, 3, 5)), call(_tokens(17, 1, 1))],
              what="ModernDecoderLM(17, 16, 1, 4, 1, 24, tie_weights=False) on tokens (3, 5) and (1, 1)"),
        Probe("mha", ("matches_torch",), make=ctor(9, 32, 3, 4, 4, 48),
              load="reference", mode="eval", calls=[call(_tokens(9, 2, 12))],
              what="three layers with n_kv_heads == n_heads on tokens (2, 12)"),
        Probe("cache", ("cache",), make=ctor(13, 24, 2, 6, 3, 32, max_len=10),
              load="reference", mode="eval",
              calls=_chunked(_tokens(13, 2, 10), (4, 1, 1, 4),
                             past=_tokens(13, 2, 1)),
              what="10 tokens as chunks 4 + 1 + 1 + 4 through the cache (against one full pass), "
                   "then one token past max_len=10, which must raise"),
        Probe("cache deep", ("cache",), make=ctor(10, 16, 3, 4, 2, 24),
              load="reference", mode="eval",
              calls=_chunked(_tokens(10, 1, 9), (2, 5, 2)),
              what="three layers, chunks 2 + 5 + 2 through the cache (each layer its own cache)"),
    ]),
    Exercise("top_p_filter", ref="modern_decoder.top_p_filter", diagnose=TOP_P_DIAGNOSES,
             graded=grades(basic=2, top_token=1, random=(2, 7777)),
             probes=[
        Probe("basic", ("basic",),
              [call(_nucleus((4, 5), p, scale=1.5), p, **_untouched()) for p in (0.6, 0.8, 0.9)]
              + [call(_nucleus((2, 3, 5), 0.7, scale=2.0), 0.7, **_untouched())],
              what="5-token rows at top_p 0.6, 0.8, 0.9 and a (2, 3, 5) batch at 0.7"),
        Probe("top token", ("top_token",),
              [call(_nucleus((4, 6), p, scale=1.5, boost=5.0), p, **_untouched()) for p in (0.45, 0.85)],
              what="rows whose top token alone exceeds top_p (0.45 and 0.85)"),
        Probe("random", ("random",),
              [call(_nucleus((6, 50), 0.9, scale=3.0), 0.9, **_untouched()),
               call(_nucleus((2, 3, 17), 0.3), 0.3),
               call(_nucleus((1, 100), 0.55, scale=0.5), 0.55),
               call(_nucleus((4, 2), 0.6, scale=2.5), 0.6),
               call(_nucleus((5, 33), 0.97, scale=4.0), 0.97)],
              what="random logits (6, 50), (2, 3, 17), (1, 100), (4, 2), (5, 33) at top_p from 0.3 "
                   "to 0.97"),
    ]),
]
