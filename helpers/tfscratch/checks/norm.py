"""Checks for notebook 04_normalization: `layer_norm`, `batch_norm`, `LayerNorm`, `BatchNorm`
and the extra exercise `rms_norm`.

Every reference value is computed with PyTorch's own functions (F.layer_norm, F.batch_norm,
nn.LayerNorm, nn.BatchNorm1d, F.rms_norm) outside the shortcut guard, in float64 where the
input is badly conditioned. When a result is wrong, the checks recompute the known wrong
variants (the seeds' LayerNorm, unbiased variance, eps outside the root, the wrong axes, a
reversed momentum, ...) and name the one the student's result equals.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .core import CheckFailed, call, check_close, check_finite, check_shape, fail, passed, seeded

LN = ("layer_norm",)  # shortcut groups guarded while the student's code runs
BN = ("batch_norm",)


# --------------------------------------------------------------------------- helpers
def _close(a, b, atol=1e-5, rtol=1e-4):
    try:
        return a.shape == b.shape and torch.allclose(a.detach().double(), b.detach().double(),
                                                     atol=atol, rtol=rtol)
    except RuntimeError:
        return False


def _diff(actual, expected) -> str:
    a, e = actual.detach().double(), expected.detach().double()
    d = (a - e).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    i = tuple(int(j) for j in torch.nonzero(d == d.max())[0])
    return (f"\n  worst element at index {i}: actual {a[i].item():.6g}, expected {e[i].item():.6g}"
            f" (max abs difference {d.max().item():.3g})")


def _diagnose(actual, expected, candidates: dict, atol=1e-4, rtol=1e-3):
    """The first candidate (a known wrong result) that `actual` equals and the right answer
    does not; None if there is none. A first, strict pass tells apart candidates that differ
    only slightly (unbiased variance alone versus the seeds' unbiased std + eps)."""
    def dist(u, v):
        return (u.detach().double() - v.detach().double()).abs().max().item()

    for a, r in ((1e-6, 2e-6), (atol, rtol)):
        for hint, cand in candidates.items():
            if cand is None or cand.shape != actual.shape or _close(cand, expected):
                continue  # this "mistake" would pass the test: nothing to name
            if _close(actual, cand, a, r) and dist(actual, cand) < dist(actual, expected):
                return hint
    return None


def _compare(actual, expected, what, candidates=None, hint="", atol=1e-5, rtol=1e-4):
    """check_close, but when the result equals a known wrong variant, say which."""
    check_shape(actual, expected.shape, what, hint)
    if candidates and not _close(actual, expected, atol, rtol):
        why = _diagnose(actual, expected, candidates)
        if why:
            fail(f"{what} is wrong: {why}" + _diff(actual, expected))
    check_close(actual, expected, what, hint, atol=atol, rtol=rtol)


def _call(fn, *args, shortcuts, what, **kwargs):
    """core.call, plus a hint for the classic `if weight:` on a tensor."""
    try:
        return call(fn, *args, shortcuts=shortcuts, what=what, **kwargs)
    except CheckFailed as e:
        if "ambiguous" in str(e) and "Boolean value of Tensor" in str(e):
            raise CheckFailed(f"{e}\n`if weight:` asks a whole tensor for one True/False. Test "
                              "for the missing argument instead: `if weight is not None:`.") from e
        raise


def _need_tensor(y, what):
    if not isinstance(y, torch.Tensor):
        fail(f"{what} returned {type(y).__name__}, not a tensor. Return the normalised tensor "
             "(a forgotten `return` gives None).")
    return y


# --------------------------------------------------------------------------- LayerNorm maths
SEED_LN = ("this is the seeds' LayerNorm: x.std() is the UNBIASED standard deviation (it divides "
           "by D-1) and eps is added to the std. nn.LayerNorm uses the biased variance "
           "(var(unbiased=False), dividing by D) and puts eps inside the root: "
           "(x - mean) / sqrt(var + eps).")
UNBIASED_LN = ("you used the unbiased variance (x.var() / x.std() divide by D-1 by default); "
               "LayerNorm uses the biased one: x.var(dim=-1, unbiased=False) (correction=0).")
EPS_STD = ("eps was added to the standard deviation, (x - mean) / (std + eps); it belongs inside "
           "the square root: (x - mean) / sqrt(var + eps). The two differ when the variance is "
           "tiny.")
NO_SQRT = "you divided by the variance; divide by the standard deviation sqrt(var + eps)."
NO_CENTER = "you did not subtract the mean: the output is x / sqrt(var + eps), not (x - mean) / ..."
AXIS0 = ("you normalised over the batch axis (dim=0), one statistic per feature: that is "
         "BatchNorm. LayerNorm normalises each row (token) over its LAST axis, dim=-1.")
LAST2 = ("you normalised over the last TWO axes (positions and features together): LayerNorm "
         "takes one mean and variance per token, over the last axis only (dim=-1).")
DIM1 = ("you normalised over dim=1, which is the last axis only for 2-D inputs; for (B, L, D) "
        "it is the positions. Use dim=-1 so that every rank works.")
ALL_AXES = ("you used one mean and variance for the whole tensor: LayerNorm takes them per "
            "token, over the last axis (dim=-1, keepdim=True).")
NO_KEEPDIM = ("the mean/variance lost their reduced axis: without keepdim=True the (N,) "
              "statistics broadcast against the wrong axis (silently, for square inputs). Use "
              "mean(dim=-1, keepdim=True).")
EPS_IGNORED = ("the eps argument was ignored: you used eps={e} whatever the caller passed. Use "
               "the eps parameter.")
EPS_MISSING = "you left eps out: (x - mean) / sqrt(var). Add eps inside the root."
SWAP_AFFINE = "weight and bias are swapped: y = x_hat * weight + bias."
NO_WEIGHT = "the weight (scale) was not applied: y = x_hat * weight + bias."
NO_BIAS = "the bias (shift) was not added: y = x_hat * weight + bias."
NO_AFFINE = "weight and bias were ignored: y = x_hat * weight + bias."
BIAS_FIRST = "the bias was added before scaling, (x_hat + bias) * weight; use x_hat * weight + bias."
E2_MINUS_M2 = ("the variance was computed as E[x^2] - E[x]^2: in float32 this loses most of its "
               "digits when the mean is large compared with the spread (catastrophic "
               "cancellation). Compute mean((x - mean)^2), or x.var(unbiased=False).")


def _affine(y, w, b, order="normal"):
    if order == "bias_first":
        return (y + b) * w
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y


def _ln64(x, w=None, b=None, eps=1e-5, dims=(-1,), unbiased=False, eps_std=False, root=True,
          center=True, affine="normal"):
    """LayerNorm and its wrong relatives, in float64."""
    x = x.detach().double()
    dims = tuple(d % x.dim() for d in dims)
    m = x.mean(dims, keepdim=True)
    v = x.var(dims, unbiased=unbiased, keepdim=True)
    if not root:
        den = v + eps
    elif eps_std:
        den = v.sqrt() + eps
    else:
        den = (v + eps).sqrt()
    y = ((x - m) if center else x) / den
    if affine == "bias_first":
        return (y + b.double()) * w.double()
    return _affine(y, w, b)


def _ln_e2(x, w, b, eps):
    """E[x^2] - E[x]^2 in float32, as the mistake does it."""
    x = x.detach().float()
    m = x.mean(-1, keepdim=True)
    v = (x * x).mean(-1, keepdim=True) - m * m
    return _affine(((x - m) / torch.sqrt(v.clamp_min(0) + eps)).double(), w, b)


def _ln_candidates(x, w=None, b=None, eps=1e-5):
    c = {
        SEED_LN: _ln64(x, w, b, eps, unbiased=True, eps_std=True),
        UNBIASED_LN: _ln64(x, w, b, eps, unbiased=True),
        EPS_STD: _ln64(x, w, b, eps, eps_std=True),
        NO_SQRT: _ln64(x, w, b, eps, root=False),
        NO_CENTER: _ln64(x, w, b, eps, center=False),
    }
    if x.dim() >= 2 and x.shape[0] > 1:
        c[AXIS0] = _ln64(x, w, b, eps, dims=(0,))
        c[AXIS0 + " (It also used the unbiased variance.)"] = _ln64(x, w, b, eps, dims=(0,),
                                                                    unbiased=True)
    if x.dim() >= 3:
        c[LAST2] = _ln64(x, w, b, eps, dims=(-2, -1))
        c[DIM1] = _ln64(x, w, b, eps, dims=(1,))
        c[ALL_AXES] = _ln64(x, w, b, eps, dims=tuple(range(x.dim())))
    elif x.dim() == 2:
        c[ALL_AXES] = _ln64(x, w, b, eps, dims=(0, 1))
    if x.dim() == 2 and x.shape[0] == x.shape[1]:
        xd = x.double()
        m, v = xd.mean(-1), xd.var(-1, unbiased=False)
        c[NO_KEEPDIM] = _affine((xd - m) / (v + eps).sqrt(), w, b)
    for e in (1e-5, 1e-6, 1e-12, 1e-8):
        if e != eps:
            c[EPS_IGNORED.format(e=e)] = _ln64(x, w, b, e)
    c[EPS_MISSING] = _ln64(x, w, b, 0.0)
    if w is not None and b is not None:
        c[SWAP_AFFINE] = _ln64(x, b, w, eps)
        c[NO_WEIGHT] = _ln64(x, None, b, eps)
        c[NO_BIAS] = _ln64(x, w, None, eps)
        c[NO_AFFINE] = _ln64(x, None, None, eps)
        c[BIAS_FIRST] = _ln64(x, w, b, eps, affine="bias_first")
    c[E2_MINUS_M2] = _ln_e2(x, w, b, eps)
    return c


def _torch_ln(x, w=None, b=None, eps=1e-5):
    """PyTorch's own layer norm, in float64 so that the reference itself is exact."""
    D = x.shape[-1]
    return F.layer_norm(x.detach().double(), (D,), None if w is None else w.detach().double(),
                        None if b is None else b.detach().double(), eps)


def _ln_call(layer_norm, x, *args, what, **kwargs):
    return _need_tensor(_call(layer_norm, x, *args, shortcuts=LN, what=what, **kwargs), what)


# --------------------------------------------------------------------------- layer_norm
def check_layer_norm_basic(layer_norm):
    """Each row of a (N, D) input gets mean 0 and (biased) variance 1, like nn.LayerNorm."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                      [2.0, -1.0, 0.5, 0.0, 3.0, -2.0],
                      [10.0, 10.5, 9.0, 11.0, 8.0, 12.0]])
    y = _ln_call(layer_norm, x, what="layer_norm(x)")
    expected = _torch_ln(x)
    _compare(y, expected, "layer_norm(x) for x of shape (3, 6)", _ln_candidates(x),
             "y = (x - mean) / sqrt(var + eps), mean and biased var over the last axis.")
    sq = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, -4.0, 1.0, 1.0],
                       [1.0, 1.5, 0.5, 1.0], [-3.0, 6.0, 0.0, 2.0]])
    y = _ln_call(layer_norm, sq, what="layer_norm(x) for a square x")
    _compare(y, _torch_ln(sq), "layer_norm(x) for a square (4, 4) x", _ln_candidates(sq),
             "Reduce with keepdim=True so the (N, 1) statistics broadcast along the rows.")
    passed("layer_norm: each row has mean 0 and variance 1 over its features, like nn.LayerNorm")


def check_layer_norm_affine(layer_norm):
    """weight scales and bias shifts every feature after normalisation."""
    with seeded(11):
        x = torch.randn(4, 5) * 2 + 1
        w = torch.randn(5)
        b = torch.randn(5)
    y = _ln_call(layer_norm, x, w, b, what="layer_norm(x, weight, bias)")
    _compare(y, _torch_ln(x, w, b), "layer_norm(x, weight, bias)", _ln_candidates(x, w, b),
             "y = (x - mean) / sqrt(var + eps) * weight + bias.")
    y = _ln_call(layer_norm, x, weight=w, what="layer_norm(x, weight=weight)")
    _compare(y, _torch_ln(x, w), "layer_norm(x, weight=weight) with no bias",
             _ln_candidates(x, w, None), "With bias=None, only scale: x_hat * weight.")
    y = _ln_call(layer_norm, x, bias=b, what="layer_norm(x, bias=bias)")
    _compare(y, _torch_ln(x, None, b), "layer_norm(x, bias=bias) with no weight",
             _ln_candidates(x, None, b), "With weight=None, only shift: x_hat + bias.")
    passed("layer_norm: weight scales and bias shifts each feature; either may be None")


def check_layer_norm_eps(layer_norm):
    """Constant rows give 0 (not NaN); tiny variances and a non-default eps match nn.LayerNorm."""
    x = torch.tensor([[3.0, 3.0, 3.0, 3.0], [-1.0, -1.0, -1.0, -1.0]])
    y = _ln_call(layer_norm, x, what="layer_norm(x) for constant rows")
    check_shape(y, x.shape, "layer_norm(x) for constant rows")
    if not torch.isfinite(y).all():
        fail("layer_norm(x) gives NaN/inf for a constant row (its variance is 0): 0 / 0. "
             + EPS_MISSING + f"\n  your output: {y.tolist()}")
    _compare(y, _torch_ln(x), "layer_norm(x) for constant rows", _ln_candidates(x),
             "A constant row has x - mean = 0, so its output is 0 (plus the bias).")
    with seeded(12):
        tiny = torch.randn(5, 8) * 1e-3 + 0.5  # variance ~1e-6, smaller than eps = 1e-5
    y = _ln_call(layer_norm, tiny, what="layer_norm(x) for a tiny-variance x")
    _compare(y, _torch_ln(tiny), "layer_norm(x) for rows with variance ~1e-6 (eps=1e-5)",
             _ln_candidates(tiny),
             "With a variance near eps, where eps goes matters: sqrt(var + eps).")
    for eps in (1e-2, 0.5):
        with seeded(13):
            x = torch.randn(3, 7) * 0.3
            w, b = torch.randn(7), torch.randn(7)
        y = _ln_call(layer_norm, x, w, b, eps=eps, what=f"layer_norm(x, weight, bias, eps={eps})")
        _compare(y, _torch_ln(x, w, b, eps), f"layer_norm(x, weight, bias, eps={eps})",
                 _ln_candidates(x, w, b, eps), "Use the eps argument, inside the square root.")
    passed("layer_norm: constant rows give 0, tiny variances and a non-default eps match "
           "nn.LayerNorm (eps inside the root)")


def check_layer_norm_batch_axes(layer_norm):
    """Any leading axes: (D,), (B, L, D) and (B, H, L, D) normalise each vector of the last axis."""
    with seeded(14):
        xs = [torch.randn(6) * 2, torch.randn(2, 5, 8) * 3 - 1, torch.randn(2, 3, 4, 6) + 2]
    for x in xs:
        D = x.shape[-1]
        w, b = torch.linspace(0.5, 2.0, D), torch.linspace(-1.0, 1.0, D)
        what = f"layer_norm(x, weight, bias) for x of shape {tuple(x.shape)}"
        y = _ln_call(layer_norm, x, w, b, what=what)
        _compare(y, _torch_ln(x, w, b), what, _ln_candidates(x, w, b),
                 "Take the statistics over dim=-1 with keepdim=True, whatever the rank.")
    passed("layer_norm: works on (D,), (B, L, D) and (B, H, L, D): one mean and variance per "
           "vector of the last axis")


def check_layer_norm_gradient(layer_norm):
    """Gradients reach x, weight and bias and equal those of F.layer_norm."""
    with seeded(15):
        x = torch.randn(3, 4, 6) * 2
        w, b = torch.randn(6), torch.randn(6)
        g = torch.randn(3, 4, 6)
    xa, wa, ba = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = _ln_call(layer_norm, xa, wa, ba, what="layer_norm(x, weight, bias)")
    if not y.requires_grad:
        fail("the output of layer_norm is cut off from autograd: no gradient can flow back. "
             "Do not use .detach(), .item(), numpy or torch.tensor(...) on intermediate values.")
    (y * g).sum().backward()
    xb, wb, bb = (t.clone().requires_grad_(True) for t in (x, w, b))
    (F.layer_norm(xb, (6,), wb, bb, 1e-5) * g).sum().backward()
    forward_ok = y.shape == x.shape and torch.allclose(
        y.detach(), F.layer_norm(x, (6,), w, b, 1e-5), atol=1e-4, rtol=1e-3)
    for name, a, r in (("x", xa, xb), ("weight", wa, wb), ("bias", ba, bb)):
        if a.grad is None:
            fail(f"no gradient reaches {name}: it must take part in the computation of the output.")
        if not forward_ok:
            hint = ("The forward values are wrong too (see the other layer_norm tests): fix "
                    "them first; the gradients follow from the forward.")
        elif name == "x":
            hint = ("The forward values are right, but the mean and the variance depend on x: "
                    "gradients must flow through them too. Do not detach them (or compute them "
                    "under torch.no_grad()).")
        else:
            hint = ""
        check_close(a.grad, r.grad, f"the gradient of layer_norm with respect to {name}", hint,
                    atol=1e-4, rtol=1e-3)
    passed("layer_norm: gradients reach x, weight and bias and match F.layer_norm")


def check_layer_norm_against_torch(layer_norm, seed=0, shapes=((4, 10),), eps_values=(1e-5,),
                                   scale=1.0, offset=0.0):
    """Random inputs (scale * randn + offset) with random weight and bias, for each shape and
    eps, compared with F.layer_norm (computed in float64). A large offset costs float32
    digits in x - mean even in a correct implementation, so atol grows with offset / scale
    (E[x^2] - E[x]^2 still fails by an order of magnitude more)."""
    atol = 1e-5 + 2e-6 * abs(offset) / scale
    n = 0
    for i, shape in enumerate(shapes):
        with seeded(seed + i):
            x = torch.randn(*shape) * scale + offset
            w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
        for eps in eps_values:
            what = f"layer_norm(x, weight, bias, eps={eps}) for x of shape {tuple(shape)}"
            y = _ln_call(layer_norm, x, w, b, eps, what=what)
            _compare(y, _torch_ln(x, w, b, eps), what, _ln_candidates(x, w, b, eps),
                     "Compared with F.layer_norm on random inputs (scale * randn + offset). If "
                     "only inputs with a large offset fail, compute the variance as "
                     "mean((x - mean)^2), not E[x^2] - E[x]^2.", atol=atol)
            n += 1
    passed(f"layer_norm: matches F.layer_norm on {n} random cases")


# --------------------------------------------------------------------------- LayerNorm module
def _make(cls, *args, shortcuts, what, **kwargs):
    m = _call(cls, *args, shortcuts=shortcuts, what=what, **kwargs)
    if not isinstance(m, nn.Module):
        fail(f"{what} did not build an nn.Module (got {type(m).__name__}): subclass nn.Module and "
             "call super().__init__() first.")
    return m


def _check_param(m, name, expected, cls_name, extra=""):
    params = dict(m.named_parameters())
    if name not in params:
        attrs = [k for k in vars(m) if not k.startswith("_")] + list(params)
        seed_hint = ""
        if any(a in params for a in ("a_2", "b_2", "gamma", "beta", "alpha", "scale", "shift")):
            seed_hint = (" Your module has parameters named " + str(sorted(params)) + ": call them "
                         "`weight` and `bias`, as PyTorch does, so weights can be copied across "
                         "(the seeds' a_2 / b_2 names are a trap).")
        elif isinstance(getattr(m, name, None), torch.Tensor):
            seed_hint = (f" self.{name} is a plain tensor, not an nn.Parameter: it would never "
                         "be trained (it is not in model.parameters()). Wrap it: "
                         f"self.{name} = nn.Parameter(...).")
        fail(f"{cls_name} has no parameter named `{name}` (parameters: {sorted(params)}, "
             f"attributes: {sorted(set(attrs))}).{seed_hint}{extra}")
    p = params[name]
    check_shape(p, expected.shape, f"{cls_name}.{name}",
                f"One value per feature: shape (d,), like nn.{cls_name}{'1d' if cls_name == 'BatchNorm' else ''}.")
    check_close(p, expected, f"{cls_name}.{name} at initialisation",
                "weight starts at ones and bias at zeros, so that a new layer is the plain "
                "normalisation.")


def check_LayerNorm_init(LayerNorm):
    """weight (ones) and bias (zeros) are nn.Parameters of shape (d,)."""
    m = _make(LayerNorm, 7, shortcuts=LN, what="LayerNorm(7)")
    _check_param(m, "weight", torch.ones(7), "LayerNorm")
    _check_param(m, "bias", torch.zeros(7), "LayerNorm")
    extra = sorted(set(dict(m.named_parameters())) - {"weight", "bias"})
    if extra:
        fail(f"LayerNorm(7) has extra parameters {extra}: it needs only weight and bias.")
    passed("LayerNorm: parameters weight (ones) and bias (zeros) of shape (d,)")


def check_LayerNorm_matches_torch(LayerNorm, seed=0, cases=((6, (4,), 1e-5), (8, (2, 5), 1e-5))):
    """Cases (d, leading shape, eps): random weight and bias copied into nn.LayerNorm(d, eps);
    outputs and gradients (x, weight, bias) compared."""
    for i, (d, lead, eps) in enumerate(cases):
        kw = {} if eps == 1e-5 else {"eps": eps}
        label = f"LayerNorm({d}{'' if not kw else f', eps={eps}'})"
        m = _make(LayerNorm, d, shortcuts=LN, what=label, **kw)
        ref = nn.LayerNorm(d, eps=eps)
        with seeded(seed + i):
            w, b = torch.randn(d), torch.randn(d)
            x = torch.randn(*lead, d) * 2 + 0.5
            if i == 0:
                x[0] = x[0] * 1e-3  # a tiny-variance row: eps placement shows
            g = torch.randn(*lead, d)
        params = dict(m.named_parameters())
        if "weight" not in params or "bias" not in params:
            _check_param(m, "weight", torch.ones(d), "LayerNorm")
            _check_param(m, "bias", torch.zeros(d), "LayerNorm")
        with torch.no_grad():
            params["weight"].copy_(w)
            params["bias"].copy_(b)
            ref.weight.copy_(w)
            ref.bias.copy_(b)
        xa = x.clone().requires_grad_(True)
        what = f"{label}(x) for x of shape {tuple(x.shape)}"
        y = _need_tensor(_call(m, xa, shortcuts=LN, what=what), what)
        xb = x.clone().requires_grad_(True)
        expected = ref(xb)
        cands = _ln_candidates(x, w, b, eps)
        if eps == 1e-5:
            for e in (1e-6, 1e-12):
                cands = {(f"LayerNorm(d) behaves as if eps={e}: the default must be eps=1e-5, "
                          "nn.LayerNorm's (the tutorial's 1e-6 is a different layer)."):
                         _ln64(x, w, b, e), **cands}
        if eps != 1e-5:
            cands = {("the module ignores its eps: pass self.eps on to the normalisation (it "
                      "used 1e-5)."): _ln64(x, w, b, 1e-5), **cands}
        _compare(y, expected, what, cands,
                 "Compared with nn.LayerNorm holding the same weight and bias.")
        if not y.requires_grad:
            fail(f"{what} is cut off from autograd: the parameters could never be trained.")
        (y * g).sum().backward()
        (expected * g).sum().backward()
        check_close(xa.grad, xb.grad, f"the gradient of {label} with respect to x",
                    "Do not detach the mean or the variance.", atol=1e-4, rtol=1e-3)
        for name in ("weight", "bias"):
            got = params[name].grad
            if got is None:
                fail(f"{label}.{name} gets no gradient: use self.{name} in forward.")
            check_close(got, getattr(ref, name).grad,
                        f"the gradient of {label} with respect to {name}", atol=1e-4, rtol=1e-3)
    passed(f"LayerNorm: matches nn.LayerNorm (outputs and gradients) on {len(cases)} cases")


# --------------------------------------------------------------------------- BatchNorm maths
LN_NOT_BN = ("you normalised each row over its features (that is LayerNorm). BatchNorm takes one "
             "mean and variance PER FEATURE, over every other axis (the batch, and the "
             "positions for (B, L, D)).")
UNBIASED_BN = ("the batch was normalised with the unbiased variance. Normalise with the biased "
               "one (divide by n); only the running_var that is STORED uses the unbiased "
               "estimate (times n / (n - 1)).")
EPS_STD_BN = "eps was added to the std; it goes inside the root: sqrt(var + eps)."
PER_POSITION = ("the statistics were taken over the batch axis only (dim=0), one per position "
                "AND feature. For (B, L, D) BatchNorm averages each feature over the batch and "
                "the positions: dims (0, 1) (every axis but the last).")
OVER_LENGTH = ("the statistics were taken over the positions only (dim=1), separately for each "
               "sequence. BatchNorm averages each feature over every axis but the last.")
FIRST_AXIS = ("the feature axis was taken to be dim=1 (PyTorch's (N, C, L) layout). Here the "
              "features are the LAST axis: statistics per x[..., j] over all other axes.")
EVAL_USES_BATCH = ("in eval mode (training=False) you normalised with the batch's own "
                   "statistics. Eval mode uses running_mean and running_var, so an example's "
                   "output does not depend on the rest of the batch.")
TRAIN_USES_RUNNING = ("in training mode you normalised with the running statistics. Training "
                      "normalises with the CURRENT batch's mean and (biased) variance, and only "
                      "updates the running statistics.")
NO_SQRT_BN = "you divided by the variance; divide by sqrt(var + eps)."
EPS_MOM_SWAP = ("momentum and eps were swapped (a positional-argument mix-up): pass them by name, "
                "momentum=..., eps=....")
NO_AFFINE_BN = "weight and bias were not applied: y = x_hat * weight + bias."
SWAP_AFFINE_BN = "weight and bias are swapped: y = x_hat * weight + bias."

RUN_BIASED = ("running_var was updated with the BIASED batch variance. PyTorch stores the "
              "unbiased estimate: batch_var * n / (n - 1), with n the number of values per "
              "feature (N, or B * L).")
RUN_REVERSED = ("momentum is reversed: you computed momentum * running + (1 - momentum) * batch. "
                "PyTorch's rule is running = (1 - momentum) * running + momentum * batch: "
                "momentum is the weight of the NEW batch (the opposite of an optimizer's momentum).")
RUN_NOT_UPDATED = ("the running statistics were not updated in place. `running_mean = ...` only "
                   "rebinds a local name; the caller's tensor is unchanged. Update it in place: "
                   "running_mean.mul_(1 - momentum).add_(momentum * mean) (or .copy_(...), "
                   "or .lerp_(mean, momentum)).")
RUN_REPLACED = ("the running statistics were replaced by the batch's; blend them: "
                "running = (1 - momentum) * running + momentum * batch.")
RUN_N_WRONG = ("the unbiased correction n / (n - 1) used the wrong n: n is the number of values "
               "averaged per feature, B * L for a (B, L, D) input, not B.")
RUN_STD = "running_var was updated with the standard deviation; it keeps the (unbiased) VARIANCE."
RUN_MOM_IGNORED = ("the momentum argument was ignored (you used 0.1): use the momentum passed in.")
RUN_EVAL_CHANGED = ("the running statistics changed in eval mode (training=False): only update "
                    "them while training.")
RUN_ONLY_MEAN = "running_var was not updated: update both running_mean and running_var."
RUN_GRAPH = ("the running statistics became part of the autograd graph (they now require "
             "grad): the next backward() would fail. Update them under torch.no_grad(), or "
             "with mean.detach() and var.detach().")


def _stat_dims(x):
    return tuple(range(x.dim() - 1))


def _bn64(x, rm, rv, w=None, b=None, training=False, eps=1e-5, dims=None, unbiased=False,
          eps_std=False, root=True, affine=True):
    """Output of BatchNorm and of its wrong relatives (float64)."""
    x = x.detach().double()
    if training:
        dims = _stat_dims(x) if dims is None else dims
        m = x.mean(dims, keepdim=True)
        v = x.var(dims, unbiased=unbiased, keepdim=True)
    else:
        m, v = rm.detach().double(), rv.detach().double()
    den = (v + eps) if not root else (v.sqrt() + eps if eps_std else (v + eps).sqrt())
    y = (x - m) / den
    if affine:
        y = _affine(y, w, b)
    return y


def _bn_out_candidates(x, rm, rv, w, b, training, momentum, eps):
    c = {}
    if training:
        c[LN_NOT_BN] = _bn64(x, rm, rv, w, b, True, eps, dims=(x.dim() - 1,))
        c[UNBIASED_BN] = _bn64(x, rm, rv, w, b, True, eps, unbiased=True)
        c[EPS_STD_BN] = _bn64(x, rm, rv, w, b, True, eps, eps_std=True)
        c[NO_SQRT_BN] = _bn64(x, rm, rv, w, b, True, eps, root=False)
        if x.dim() >= 3:
            c[PER_POSITION] = _bn64(x, rm, rv, w, b, True, eps, dims=(0,))
            c[OVER_LENGTH] = _bn64(x, rm, rv, w, b, True, eps, dims=(1,))
            c[FIRST_AXIS] = (_bn64(x.movedim(1, -1), None, None, None, None, True, eps)
                             .movedim(-1, 1))
            c[FIRST_AXIS] = _affine(c[FIRST_AXIS], w, b)
        c[TRAIN_USES_RUNNING] = _bn64(x, rm, rv, w, b, False, eps)
        c[EPS_MOM_SWAP] = _bn64(x, rm, rv, w, b, True, momentum)
    else:
        c[EVAL_USES_BATCH] = _bn64(x, rm, rv, w, b, True, eps)
        c[EVAL_USES_BATCH + " (And with the unbiased variance.)"] = _bn64(
            x, rm, rv, w, b, True, eps, unbiased=True)
        c[EPS_STD_BN] = _bn64(x, rm, rv, w, b, False, eps, eps_std=True)
        c[NO_SQRT_BN] = _bn64(x, rm, rv, w, b, False, eps, root=False)
        c[EPS_MOM_SWAP] = _bn64(x, rm, rv, w, b, False, momentum)
    if w is not None and b is not None:
        c[NO_AFFINE_BN] = _bn64(x, rm, rv, None, None, training, eps)
        c[SWAP_AFFINE_BN] = _bn64(x, rm, rv, b, w, training, eps)
    return c


def _run_candidates(x, rm0, rv0, momentum, eps):
    """Known wrong running statistics after one training step: {hint: (mean, var)}."""
    x = x.detach().double()
    rm0, rv0 = rm0.double(), rv0.double()
    dims = _stat_dims(x)
    n = x.numel() // x.shape[-1]
    m = x.mean(dims)
    vb = x.var(dims, unbiased=False)
    vu = vb * n / max(n - 1, 1)
    mom = momentum

    def blend(r, s, k=mom):
        return (1 - k) * r + k * s
    c = {
        RUN_NOT_UPDATED: (rm0, rv0),
        RUN_EVAL_CHANGED: None,  # placeholder, used only by the eval check
        RUN_BIASED: (blend(rm0, m), blend(rv0, vb)),
        RUN_REVERSED: (blend(rm0, m, 1 - mom), blend(rv0, vu, 1 - mom)),
        RUN_REVERSED + " (running_var also used the biased variance.)":
            (blend(rm0, m, 1 - mom), blend(rv0, vb, 1 - mom)),
        RUN_REPLACED: (m, vu),
        RUN_REPLACED + " (And running_var must hold the unbiased variance.)": (m, vb),
        RUN_STD: (blend(rm0, m), blend(rv0, vu.sqrt())),
        RUN_ONLY_MEAN: (blend(rm0, m), rv0),
        EPS_MOM_SWAP: (blend(rm0, m, eps), blend(rv0, vu, eps)),
    }
    if x.dim() >= 3:
        nb = x.shape[0]
        c[RUN_N_WRONG] = (blend(rm0, m), blend(rv0, vb * nb / max(nb - 1, 1)))
        nl = x.shape[-2]
        c[RUN_N_WRONG + " (n must count every position of every sequence.)"] = (
            blend(rm0, m), blend(rv0, vb * nl / max(nl - 1, 1)))
    if mom != 0.1:
        c[RUN_MOM_IGNORED] = (blend(rm0, m, 0.1), blend(rv0, vu, 0.1))
    del c[RUN_EVAL_CHANGED]
    return c


def _torch_bn(x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5):
    """F.batch_norm with the feature axis last. Updates rm and rv in place, as it does."""
    xt = x.movedim(-1, 1) if x.dim() > 2 else x
    y = F.batch_norm(xt, rm, rv, w, b, training, momentum, eps)
    return y.movedim(1, -1) if x.dim() > 2 else y


def _check_running(rm, rv, exp_m, exp_v, what, cands, training=True):
    for t, name in ((rm, "running_mean"), (rv, "running_var")):
        if t.requires_grad or t.grad_fn is not None:
            fail(f"after {what}: {name} requires grad. " + RUN_GRAPH)
    ok = _close(rm, exp_m) and _close(rv, exp_v)
    if not ok:
        for hint, (cm, cv) in cands.items():
            if _close(cm, exp_m) and _close(cv, exp_v):
                continue  # would pass: nothing to name
            if _close(rm, cm, 1e-4, 1e-3) and _close(rv, cv, 1e-4, 1e-3):
                fail(f"the running statistics after {what} are wrong: {hint}\n"
                     f"  running_mean: actual {_fmt(rm)}, expected {_fmt(exp_m)}\n"
                     f"  running_var:  actual {_fmt(rv)}, expected {_fmt(exp_v)}")
    hint = ("running = (1 - momentum) * running + momentum * batch, in place; running_var "
            "uses the unbiased batch variance (times n / (n - 1)).")
    check_close(rm, exp_m, f"running_mean after {what}", hint)
    check_close(rv, exp_v, f"running_var after {what}", hint)


def _fmt(t):
    return "[" + ", ".join(f"{v:.4g}" for v in t.detach().flatten()[:6].tolist()) + \
        (", ...]" if t.numel() > 6 else "]")


def _bn_call(batch_norm, x, rm, rv, *args, what, **kwargs):
    return _need_tensor(_call(batch_norm, x, rm, rv, *args, shortcuts=BN, what=what, **kwargs),
                        what)


def _bn_step(batch_norm, x, rm, rv, w=None, b=None, training=True, momentum=0.1, eps=1e-5,
             what=None, defaults=False):
    """One call of the student's batch_norm against F.batch_norm: output and running stats."""
    rm0, rv0 = rm.clone(), rv.clone()
    erm, erv = rm.clone(), rv.clone()
    expected = _torch_bn(x.detach(), erm, erv, w, b, training, momentum, eps)
    what = what or (f"batch_norm(x, ..., training={training}, momentum={momentum}, eps={eps}) "
                    f"for x of shape {tuple(x.shape)}")
    if defaults:
        y = _bn_call(batch_norm, x, rm, rv, what=what)
    else:
        y = _bn_call(batch_norm, x, rm, rv, w, b, training=training, momentum=momentum, eps=eps,
                     what=what)
    if training and not _close(y, expected):  # the output first: it names most mistakes
        _compare(y, expected, what, _bn_out_candidates(x, rm0, rv0, w, b, True, momentum, eps))
    if not training:
        if not (torch.equal(rm, rm0) and torch.equal(rv, rv0)):
            fail(f"{what}: " + RUN_EVAL_CHANGED +
                 f"\n  running_mean before {_fmt(rm0)}, after {_fmt(rm)}")
        _compare(y, expected, what, _bn_out_candidates(x, rm0, rv0, w, b, False, momentum, eps))
    else:
        _check_running(rm, rv, erm, erv, what, _run_candidates(x, rm0, rv0, momentum, eps))
        _compare(y, expected, what)
    return y, expected


# --------------------------------------------------------------------------- batch_norm
def check_batch_norm_train(batch_norm):
    """Training mode on (N, D): every feature (column) gets mean 0 and biased variance 1."""
    x = torch.tensor([[1.0, 2.0, -1.0, 0.0],
                      [3.0, 0.0, 0.5, 4.0],
                      [2.0, 1.0, 2.5, -2.0],
                      [6.0, -1.0, 1.0, 2.0],
                      [0.0, 3.0, 0.0, 1.0],
                      [2.5, 1.5, -0.5, 3.0]])
    rm, rv = torch.zeros(4), torch.ones(4)
    _bn_step(batch_norm, x, rm, rv, training=True,
             what="batch_norm(x, running_mean, running_var, training=True) for x of shape (6, 4)")
    w, b = torch.tensor([1.0, 2.0, 0.5, -1.0]), torch.tensor([0.0, 1.0, -1.0, 0.5])
    _bn_step(batch_norm, x * 3 + 1, torch.zeros(4), torch.ones(4), w, b, training=True,
             what="batch_norm(x, running_mean, running_var, weight, bias, training=True)")
    tiny = x * torch.tensor([1e-3, 3e-3, 1.0, 1e-2])  # feature variances near eps = 1e-5
    _bn_step(batch_norm, tiny, torch.zeros(4), torch.ones(4), training=True,
             what="batch_norm(x, ..., training=True) for features with variance ~1e-6 .. 1e-4")
    passed("batch_norm: in training each feature is normalised with the batch's mean and "
           "biased variance, like F.batch_norm")


def check_batch_norm_running_stats(batch_norm):
    """Several training steps: running statistics updated in place, momentum as in PyTorch,
    unbiased running_var, no autograd graph attached."""
    D = 3
    for momentum in (0.1, 0.3):
        rm, rv = torch.zeros(D), torch.ones(D)
        for step in range(3):
            with seeded(20 + step):
                x = torch.randn(5, D) * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor([1.0, -2.0, 4.0])
            x.requires_grad_(True)
            _bn_step(batch_norm, x, rm, rv, training=True, momentum=momentum,
                     what=f"training step {step + 1} of batch_norm(x, running_mean, running_var, "
                          f"training=True, momentum={momentum}) on x of shape (5, {D})")
    passed("batch_norm: running statistics updated in place over several steps, "
           "running = (1 - momentum) * running + momentum * batch, running_var unbiased")


def check_batch_norm_eval(batch_norm):
    """Eval mode (the default): normalise with the running statistics, leave them unchanged."""
    x = torch.tensor([[1.0, 2.0, -1.0], [3.0, 0.0, 0.5], [2.0, 1.0, 2.5], [6.0, -1.0, 1.0]])
    rm, rv = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.5, 0.25, 4.0])
    _bn_step(batch_norm, x, rm, rv, training=False, defaults=True,
             what="batch_norm(x, running_mean, running_var) (training=False by default)")
    w, b = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([0.1, 0.2, 0.3])
    _bn_step(batch_norm, x, rm, rv, w, b, training=False, eps=1e-3,
             what="batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=1e-3)")
    one = x[:1]
    _bn_step(batch_norm, one, rm, rv, w, b, training=False,
             what="batch_norm on a batch of ONE example in eval mode")
    passed("batch_norm: eval mode normalises with running_mean and running_var and leaves them "
           "unchanged, even for a batch of one")


def check_batch_norm_sequences(batch_norm):
    """(B, L, D): one statistic per feature over the batch AND the positions, train and eval,
    including a batch of a single sequence."""
    with seeded(30):
        x = torch.randn(3, 5, 4) * 2 + torch.arange(4.0)
        one = torch.randn(1, 6, 4) - 1
        w, b = torch.randn(4), torch.randn(4)
    _bn_step(batch_norm, x, torch.zeros(4), torch.ones(4), training=True,
             what="batch_norm(x, running_mean, running_var, training=True) for x of shape "
                  "(B, L, D) = (3, 5, 4)")
    rm, rv = torch.zeros(4), torch.ones(4)
    _bn_step(batch_norm, x, rm, rv, w, b, training=True,
             what="batch_norm(x, ..., weight, bias, training=True) for x of shape (3, 5, 4)")
    _bn_step(batch_norm, one, rm, rv, w, b, training=True,
             what="batch_norm(x, ..., training=True) for ONE sequence, x of shape (1, 6, 4)")
    _bn_step(batch_norm, x, rm, rv, w, b, training=False,
             what="batch_norm(x, ..., training=False) for x of shape (3, 5, 4)")
    passed("batch_norm: (B, L, D) inputs are normalised per feature over batch and positions "
           "(B * L values each), in training and in eval")


def check_batch_norm_gradient(batch_norm):
    """Training-mode gradients (through the batch statistics) to x, weight and bias."""
    with seeded(31):
        x = torch.randn(4, 3, 5) + 1
        w, b = torch.randn(5), torch.randn(5)
        g = torch.randn(4, 3, 5)
    xa, wa, ba = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = _bn_call(batch_norm, xa, torch.zeros(5), torch.ones(5), wa, ba, training=True,
                 what="batch_norm(x, ..., training=True)")
    if not y.requires_grad:
        fail("the output of batch_norm is cut off from autograd: no gradient can flow back.")
    (y * g).sum().backward()
    xb, wb, bb = (t.clone().requires_grad_(True) for t in (x, w, b))
    (_torch_bn(xb, torch.zeros(5), torch.ones(5), wb, bb, True) * g).sum().backward()
    forward_ok = y.shape == x.shape and torch.allclose(
        y.detach(), _torch_bn(x, torch.zeros(5), torch.ones(5), w, b, True), atol=1e-4, rtol=1e-3)
    for name, a, r in (("x", xa, xb), ("weight", wa, wb), ("bias", ba, bb)):
        if a.grad is None:
            fail(f"no gradient reaches {name}: it must take part in the output.")
        if not forward_ok:
            hint = ("The forward values are wrong too (see the other batch_norm tests): fix "
                    "them first; the gradients follow from the forward.")
        else:
            hint = ("The forward values are right, but in training the batch mean and variance "
                    "depend on x, so gradients flow through them: do not detach the batch "
                    "statistics you normalise with (only the running statistics are updated "
                    "without gradient).") if name == "x" else ""
        check_close(a.grad, r.grad, f"the gradient of batch_norm (training) with respect to "
                    f"{name}", hint, atol=1e-4, rtol=1e-3)
    passed("batch_norm: training-mode gradients reach x, weight and bias and match F.batch_norm")


def check_batch_norm_against_torch(batch_norm, seed=0, cases=(((8, 5), 0.1, 1e-5, 2),),
                                   scale=2.0):
    """Cases (shape, momentum, eps, training steps): random weight, bias and starting running
    statistics; `steps` training calls then one eval call, all against F.batch_norm."""
    for i, (shape, momentum, eps, steps) in enumerate(cases):
        D = shape[-1]
        with seeded(seed + i):
            w, b = torch.randn(D), torch.randn(D)
            rm, rv = torch.randn(D), torch.rand(D) + 0.5
            xs = [torch.randn(*shape) * scale + torch.randn(D) for _ in range(steps + 1)]
        for s in range(steps):
            _bn_step(batch_norm, xs[s], rm, rv, w, b, True, momentum, eps,
                     what=f"training step {s + 1} of batch_norm(x, ..., momentum={momentum}, "
                          f"eps={eps}) for x of shape {tuple(shape)}")
        _bn_step(batch_norm, xs[-1], rm, rv, w, b, False, momentum, eps,
                 what=f"batch_norm(x, ..., training=False, eps={eps}) for x of shape "
                      f"{tuple(shape)} after {steps} training steps")
    passed(f"batch_norm: matches F.batch_norm (outputs and running statistics) on {len(cases)} "
           "random cases")


# --------------------------------------------------------------------------- BatchNorm module
def _buffer_problem(m, name):
    bufs = dict(m.named_buffers())
    params = dict(m.named_parameters())
    if name in params:
        return (f"BatchNorm.{name} is an nn.Parameter: the optimizer would change it and it "
                "would receive gradients. Running statistics are buffers: "
                f"self.register_buffer('{name}', ...).")
    if name not in bufs:
        if isinstance(getattr(m, name, None), torch.Tensor):
            return (f"BatchNorm.{name} is a plain tensor attribute, not a registered buffer: it "
                    "is not saved in state_dict() nor moved by .to(device). Use "
                    f"self.register_buffer('{name}', ...).")
        return (f"BatchNorm has no buffer named `{name}` (buffers: {sorted(bufs)}). Register "
                f"it: self.register_buffer('{name}', ...).")
    return None


def check_BatchNorm_init(BatchNorm):
    """weight/bias parameters (ones/zeros), running_mean/running_var buffers (zeros/ones)."""
    m = _make(BatchNorm, 5, shortcuts=BN, what="BatchNorm(5)")
    _check_param(m, "weight", torch.ones(5), "BatchNorm")
    _check_param(m, "bias", torch.zeros(5), "BatchNorm")
    for name, init in (("running_mean", torch.zeros(5)), ("running_var", torch.ones(5))):
        problem = _buffer_problem(m, name)
        if problem:
            fail(problem)
        buf = dict(m.named_buffers())[name]
        check_shape(buf, (5,), f"BatchNorm.{name}", "One statistic per feature: shape (d,).")
        if not _close(buf, init):
            why = ""
            if name == "running_var" and _close(buf, torch.zeros(5)):
                why = (" running_var starts at ONES, as in PyTorch: with zeros, eval mode before "
                       "any training divides by sqrt(eps) and blows the activations up ~300x.")
            fail(f"BatchNorm.{name} starts at {_fmt(buf)}, expected {_fmt(init)}.{why}")
    extra = sorted(set(dict(m.named_parameters())) - {"weight", "bias"})
    if extra:
        fail(f"BatchNorm(5) has extra parameters {extra}: only weight and bias are trained; "
             "statistics are buffers.")
    passed("BatchNorm: parameters weight/bias (ones/zeros), buffers running_mean/running_var "
           "(zeros/ones)")


def _buf(m, name):
    """The module's current buffer (a forward may replace it: self.running_mean = ...)."""
    buf = dict(m.named_buffers()).get(name)
    if buf is None:
        fail(_buffer_problem(m, name) or f"BatchNorm lost its buffer `{name}`.")
    return buf


def _module_forward(m, x, what):
    return _need_tensor(_call(m, x, shortcuts=BN, what=what), what)


def check_BatchNorm_train_eval(BatchNorm, seed=0, cases=((4, (6,), 1e-5, 0.1, 3),
                                                         (3, (2, 5), 1e-5, 0.1, 2))):
    """Cases (d, leading shape, eps, momentum, training steps) against nn.BatchNorm1d with the
    same weight and bias: outputs and running statistics after every training step, the
    gradients of the first step, then eval mode (running statistics frozen), then train again."""
    for i, (d, lead, eps, momentum, steps) in enumerate(cases):
        kw = {}
        if eps != 1e-5:
            kw["eps"] = eps
        if momentum != 0.1:
            kw["momentum"] = momentum
        label = "BatchNorm(" + ", ".join([str(d)] + [f"{k}={v}" for k, v in kw.items()]) + ")"
        m = _make(BatchNorm, d, shortcuts=BN, what=label, **kw)
        ref = nn.BatchNorm1d(d, eps=eps, momentum=momentum)
        for name in ("running_mean", "running_var"):
            problem = _buffer_problem(m, name)
            if problem:
                fail(problem)
        params = dict(m.named_parameters())
        if "weight" not in params or "bias" not in params:
            _check_param(m, "weight", torch.ones(d), "BatchNorm")
            _check_param(m, "bias", torch.zeros(d), "BatchNorm")
        with seeded(seed + i):
            w, b = torch.randn(d), torch.randn(d)
            xs = [torch.randn(*lead, d) * 2 + torch.randn(d) for _ in range(steps + 2)]
            g = torch.randn(*lead, d)
        with torch.no_grad():
            for p, v in ((params["weight"], w), (params["bias"], b), (ref.weight, w), (ref.bias, b)):
                p.copy_(v)

        def ref_fwd(x):
            return ref(x.movedim(-1, 1)).movedim(1, -1) if x.dim() > 2 else ref(x)

        m.train()
        ref.train()
        for s in range(steps):
            rm0, rv0 = _buf(m, "running_mean").clone(), _buf(m, "running_var").clone()
            what = f"{label}(x) in train mode, step {s + 1}, x of shape {tuple(xs[s].shape)}"
            xa = xs[s].clone().requires_grad_(s == 0)
            y = _module_forward(m, xa, what)
            xb = xs[s].clone().requires_grad_(s == 0)
            expected = ref_fwd(xb)
            cands = _bn_out_candidates(xs[s], rm0, rv0, w, b, True, momentum, eps)
            if eps != 1e-5:
                cands = {"the module ignores its eps: pass self.eps to the normalisation.":
                         _bn64(xs[s], rm0, rv0, w, b, True, 1e-5), **cands}
            _compare(y, expected, what, cands)
            rc = _run_candidates(xs[s], rm0, rv0, momentum, eps)
            if momentum != 0.1:
                rc["the module ignores its momentum argument: pass self.momentum on (it used "
                   "0.1)."] = rc.pop(RUN_MOM_IGNORED)
            _check_running(_buf(m, "running_mean"), _buf(m, "running_var"), ref.running_mean,
                           ref.running_var, what, rc)
            if s == 0:
                if not y.requires_grad:
                    fail(f"{what} is cut off from autograd.")
                (y * g).sum().backward()
                (expected * g).sum().backward()
                check_close(xa.grad, xb.grad, f"the gradient of {label} (train mode) with respect "
                            "to x", "Do not detach the batch statistics.", atol=1e-4, rtol=1e-3)
                for name in ("weight", "bias"):
                    if params[name].grad is None:
                        fail(f"{label}.{name} gets no gradient: use self.{name} in forward.")
                    check_close(params[name].grad, getattr(ref, name).grad,
                                f"the gradient of {label} with respect to {name}",
                                atol=1e-4, rtol=1e-3)
        m.eval()
        ref.eval()
        rm0, rv0 = _buf(m, "running_mean").clone(), _buf(m, "running_var").clone()
        what = f"{label}(x) after .eval(), x of shape {tuple(xs[-2].shape)}"
        with torch.no_grad():
            y = _module_forward(m, xs[-2], what)
            expected = ref_fwd(xs[-2])
        if not (torch.equal(_buf(m, "running_mean"), rm0) and torch.equal(_buf(m, "running_var"), rv0)):
            fail(f"{what}: the running statistics changed in eval mode. Use self.training to "
                 "choose: update them only while training.")
        cands = _bn_out_candidates(xs[-2], rm0, rv0, w, b, False, momentum, eps)
        cands[EVAL_USES_BATCH.replace("(training=False)", "(after model.eval())")
              + " Pass training=self.training."] = cands.pop(EVAL_USES_BATCH)
        _compare(y, expected, what, cands)
        m.train()
        ref.train()
        what = f"{label}(x) back in train mode after .train()"
        y = _module_forward(m, xs[-1], what)
        expected = ref_fwd(xs[-1])
        _compare(y.detach(), expected.detach(), what,
                 {TRAIN_USES_RUNNING + " (self.training must decide, not a flag set once.)":
                  _bn64(xs[-1], rm0, rv0, w, b, False, eps)})
        _check_running(_buf(m, "running_mean"), _buf(m, "running_var"), ref.running_mean,
                       ref.running_var, what, _run_candidates(xs[-1], rm0, rv0, momentum, eps))
    passed(f"BatchNorm: matches nn.BatchNorm1d in train and eval mode (outputs, gradients, "
           f"running statistics) on {len(cases)} cases")


# --------------------------------------------------------------------------- rms_norm
RMS_CENTERED = ("you subtracted the mean: that is LayerNorm. RMSNorm only rescales, "
                "x / sqrt(mean(x^2) + eps), with no centring.")
RMS_L2 = ("you divided by the L2 norm ||x||; RMS is the norm divided by sqrt(D): "
          "sqrt(mean(x^2)).")
RMS_NO_SQRT = "you divided by mean(x^2); divide by its square root, sqrt(mean(x^2) + eps)."
RMS_EPS_OUT = "eps was added outside the square root: use sqrt(mean(x^2) + eps)."
RMS_AXIS0 = "the mean of x^2 was taken over dim=0; RMSNorm normalises each vector over dim=-1."
RMS_GLOBAL = ("you took one mean of x^2 over the whole tensor; RMSNorm takes one per vector, "
              "over dim=-1 with keepdim=True.")
RMS_NO_W = "the weight was not applied: y = x / rms * weight."
RMS_BIAS = "RMSNorm has a scale and NO bias; do not add one."
RMS_STD = ("you divided by the standard deviation (x.std()): RMSNorm divides by the root mean "
           "square sqrt(mean(x^2)), which includes the mean.")


def _rms64(x, w=None, eps=1e-6, dims=(-1,), eps_out=False, root=True, center=False, l2=False,
           std=False):
    x = x.detach().double()
    if center:
        x = x - x.mean(dims, keepdim=True)
    ms = x.pow(2).sum(dims, keepdim=True) if l2 else x.pow(2).mean(dims, keepdim=True)
    if std:
        ms = x.var(dims, keepdim=True)
    den = ms + eps if not root else (ms.sqrt() + eps if eps_out else (ms + eps).sqrt())
    y = x / den
    return y * w.double() if w is not None else y


def _rms_candidates(x, w, eps):
    c = {
        RMS_CENTERED: _rms64(x, w, eps, center=True),
        RMS_L2: _rms64(x, w, eps, l2=True),
        RMS_NO_SQRT: _rms64(x, w, eps, root=False),
        RMS_EPS_OUT: _rms64(x, w, eps, eps_out=True),
        RMS_STD: _rms64(x, w, eps, std=True),
    }
    if x.dim() >= 2 and x.shape[0] > 1:
        c[RMS_AXIS0] = _rms64(x, w, eps, dims=(0,))
        c[RMS_GLOBAL] = _rms64(x, w, eps, dims=tuple(range(x.dim())))
    if w is not None:
        c[RMS_NO_W] = _rms64(x, None, eps)
    for e in (1e-6, 1e-5, 1e-8):
        if e != eps:
            c[EPS_IGNORED.format(e=e)] = _rms64(x, w, e)
    return c


def _torch_rms(x, w=None, eps=1e-6):
    return F.rms_norm(x.detach().double(), (x.shape[-1],),
                      None if w is None else w.detach().double(), eps)


def check_rms_norm_basic(rms_norm):
    """x / sqrt(mean(x^2) + eps) over the last axis, with and without weight; gradients."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, -1.0, 0.5, 0.0, 3.0],
                      [0.001, -0.002, 0.0015, 0.0, 0.001]])
    what = "rms_norm(x) for x of shape (3, 5)"
    y = _need_tensor(_call(rms_norm, x, shortcuts=LN, what=what), what)
    _compare(y, _torch_rms(x), what, _rms_candidates(x, None, 1e-6),
             "y = x / sqrt(mean(x^2, dim=-1, keepdim=True) + eps).")
    w = torch.tensor([1.0, 0.5, 2.0, -1.0, 3.0])
    xa, wa = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    what = "rms_norm(x, weight)"
    y = _need_tensor(_call(rms_norm, xa, wa, shortcuts=LN, what=what), what)
    _compare(y, _torch_rms(x, w), what, _rms_candidates(x, w, 1e-6), "y = x / rms(x) * weight.")
    g = torch.linspace(-1, 1, 15).reshape(3, 5)
    if not y.requires_grad:
        fail("the output of rms_norm is cut off from autograd.")
    (y * g).sum().backward()
    xb, wb = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    (F.rms_norm(xb, (5,), wb, 1e-6) * g).sum().backward()
    check_close(xa.grad, xb.grad, "the gradient of rms_norm with respect to x", atol=1e-4,
                rtol=1e-3)
    check_close(wa.grad, wb.grad, "the gradient of rms_norm with respect to weight", atol=1e-4,
                rtol=1e-3)
    passed("rms_norm: x / sqrt(mean(x^2) + eps) over the last axis, times weight; gradients match")


def check_rms_norm_against_torch(rms_norm, seed=0, shapes=((4, 8),), eps_values=(1e-6,),
                                 scale=1.0, offset=0.0):
    """Random shapes, weights and eps values against F.rms_norm (float64)."""
    n = 0
    for i, shape in enumerate(shapes):
        with seeded(seed + i):
            x = torch.randn(*shape) * scale + offset
            w = torch.randn(shape[-1])
        for eps in eps_values:
            what = f"rms_norm(x, weight, eps={eps}) for x of shape {tuple(shape)}"
            y = _need_tensor(_call(rms_norm, x, w, eps=eps, shortcuts=LN, what=what), what)
            _compare(y, _torch_rms(x, w, eps), what, _rms_candidates(x, w, eps),
                     "Compared with F.rms_norm.")
            n += 1
    passed(f"rms_norm: matches F.rms_norm on {n} random cases")


__all__ = [n for n in dir() if n.startswith("check_")] + ["CheckFailed", "check_finite"]
