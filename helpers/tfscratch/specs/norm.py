"""04_normalization: what the grader runs on the student's `layer_norm`, `LayerNorm`,
`batch_norm`, `BatchNorm` and the extra exercise `rms_norm`, on inputs drawn for each grading
run.

- `layer_norm` / `rms_norm`: rows of every rank, constant and tiny-variance rows (where eps
  placement shows), non-default eps, weight and bias separately, large offsets (where
  E[x^2] - E[x]^2 loses its digits), gradients.
- `batch_norm`: the running statistics it updates IN PLACE are captured after each call
  (`keep=`); several steps on the same statistics chain them through earlier outputs: the
  first two calls of such a probe return the starting statistics (eval mode with weight 0
  returns its bias), and the later calls update those very tensors (`prev`). A last eval call
  with a backward on the updated statistics fails if a training step left them inside the
  autograd graph.
- `LayerNorm` / `BatchNorm`: built with the exercise's constructor, given the reference's
  (perturbed) parameters by name; BatchNorm's buffers are read with `get_buffer`, so running
  statistics that are plain attributes or parameters fail; `.eval()` / `.train()` are calls
  of the probe, so one object goes through train, eval and train again.
- `rms_norm`: the reference is 09's `modern_decoder.rms_norm` (04's cell is not exported);
  both default to eps=1e-6, and most calls pass eps explicitly.

Diagnoses: the wrong formulas (the seeds' unbiased std + eps, eps outside the root, the wrong
axes, a reversed momentum, ...) written once, in float64. `mistake` is `like` that also asks
the formula to differ from the reference on the probe's inputs (and, with `rivals`, that the
student's output be nearer to it than to a formula it differs from only slightly);
`_replay` runs a wrong batch_norm through a whole probe, chained statistics included, and
compares outputs and running statistics. `BatchNorm`'s first probe asks `get_parameter` for
the running statistics (it must raise), so a Parameter and a plain attribute are told apart.
"""

ASSIGNMENT = "04_normalization"
import numpy as np
import torch

from . import vm
from .engine import Exercise, Probe, batch, call, ctor, given, grades, part, prev, randn, when


# -- inputs ---------------------------------------------------------------------------------

def _normal(*shape, scale=1.0, offset=0.0):
    """scale * randn + offset, float32."""
    def build(g):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).float()
    return given(build, f"randn{tuple(shape)} x{scale:g} + {offset:g}")


def _const(*shape, value=0.0):
    return given(lambda g: torch.full(shape, float(value)), f"full{tuple(shape)}={value:g}")


def _positive(*shape):
    """Variances to start from: uniform in [0.5, 1.5)."""
    return given(lambda g: torch.rand(*shape, generator=g) + 0.5, f"rand{tuple(shape)} + 0.5")


def _constant_rows(N, D):
    """Every row constant (variance exactly 0): a missing eps gives 0/0."""
    return given(lambda g: (torch.randn(N, 1, generator=g) * 3).expand(N, D).contiguous(),
                 f"constant rows ({N}, {D})")


def _tiny_rows(N, D, spread=1e-3, offset=0.5):
    """Rows whose variance (~spread^2) is below eps=1e-5: eps placement decides the output."""
    return given(lambda g: torch.randn(N, D, generator=g) * spread + offset,
                 f"rows of variance ~{spread ** 2:g}")


def _one_tiny_row(N, D):
    """Random rows (x2 + 0.5), row 0 shrunk by 1e-3 (tiny variance)."""
    def build(g):
        x = torch.randn(N, D, generator=g) * 2 + 0.5
        x[0] = x[0] * 1e-3
        return x
    return given(build, f"({N}, {D}) with a tiny-variance row")


def _tiny_features(N, D):
    """Features of very different spread: some with a variance far below eps."""
    def build(g):
        x = torch.randn(N, D, generator=g) * 2 + 1
        scale = torch.tensor([1e-3, 3e-3, 1.0, 1e-2] * (D // 4 + 1))[:D]
        return x * scale
    return given(build, f"({N}, {D}) with feature variances from ~1e-6 to ~4")


def _shifted(*shape, scale=2.0):
    """scale * randn plus a random per-feature mean: statistics differ from 0 and 1."""
    D = shape[-1]
    def build(g):
        return torch.randn(*shape, generator=g) * scale + torch.randn(D, generator=g) * 2
    return given(build, f"randn{tuple(shape)} x{scale:g} + a mean per feature")


# -- batch_norm: statistics that persist over calls -----------------------------------------

def _start(D):
    """Two calls that RETURN the starting running_mean (random) and running_var (positive):
    eval mode with weight 0 returns its bias. Later calls pass `prev(0)` and `prev(1)`, the
    same tensors, which training updates in place."""
    zero, one = _const(D), _const(D, value=1.0)
    return [call(zero, zero, one, zero, randn(D)),
            call(zero, zero, one, zero, _positive(D))]


def _steps(shapes, D, momentum=None, eps=None, affine=True, last_eval="full"):
    """Training calls on the statistics of `_start` (calls 0 and 1: a chain opens its probe),
    then one eval call; the statistics are captured after every call, the input gradient
    too (a backward through the eval call fails when training left the statistics inside the
    autograd graph). `last_eval="graph"`: the eval call has weight 0 and keeps nothing, so it
    only asks that the statistics be out of the graph (its output is its bias whatever eval
    mode does: eval mistakes are other cells' business)."""
    kw = {}
    if momentum is not None:
        kw["momentum"] = momentum
    if eps is not None:
        kw["eps"] = eps
    w, b = (randn(D), randn(D)) if affine else (None, None)
    out = []
    for shape in shapes[:-1]:
        out.append(call(_shifted(*shape), prev(0), prev(1), w, b, training=True,
                        keep=(1, 2), grad=(0,), backward=randn(*shape), **kw))
    shape = shapes[-1]
    if last_eval == "graph":
        out.append(call(_shifted(*shape), prev(0), prev(1), _const(D), randn(D), training=False,
                        grad=(0,), backward=randn(*shape), **kw))
    else:
        out.append(call(_shifted(*shape), prev(0), prev(1), w, b, training=False,
                        keep=(1, 2), grad=(0,), backward=randn(*shape), **kw))
    return out


def _chain(shapes, D, **kw):
    return _start(D) + _steps(shapes, D, **kw)


def _outputs_only(key, got, want):
    """Chains compare outputs and statistics: their backward passes are there to free the
    graph (and test_batch_norm_gradient charges gradients), so input gradients are skipped."""
    return None if ".grad." in key else "default"


# -- BatchNorm module: train, eval, train again ---------------------------------------------

def _buffers():
    return [call("running_mean", method="get_buffer"), call("running_var", method="get_buffer")]


def _train_eval(lead, d, steps):
    shape = (*lead, d)
    calls = [call(_shifted(*shape), grad=(0,), backward=randn(*shape))] + _buffers()
    for _ in range(steps - 1):
        calls += [call(_shifted(*shape))] + _buffers()
    calls += [call(method="eval"), call(_shifted(*shape))] + _buffers()
    calls += [call(method="train"), call(_shifted(*shape))] + _buffers()
    return calls


# -- diagnoses: shared helpers --------------------------------------------------------------

def _close(a, b, atol=1e-4, rtol=1e-3):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))


def _np64(t):
    return t.detach().double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, float)


def _formula(e, fn):
    """[(call index, fn's result)] for the calls of the failing probe that fn applies to
    (fn(ref, *args) for a probe that constructs a module)."""
    ref = e.ref() if e.pd.get("make") is not None else None
    out = []
    for ci in range(len(e.pd["calls"])):
        try:
            args, kwargs = e.args(ci)
            with torch.no_grad():
                r = fn(ref, *args, **kwargs) if ref is not None else fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the formula does not apply to this call
            continue
        if r is not None:
            out.append((ci, r))
    return out


def _gap(e, fn):
    """The largest |student - fn| over the calls where fn gives a tensor (inf: none)."""
    gaps = [float(np.nan_to_num(np.abs(np.asarray(g, float) - _np64(r)), nan=np.inf).max(initial=0))
            for ci, r in _formula(e, fn)
            if (g := e.out(ci)) is not None and np.shape(g) == tuple(r.shape)]
    return max(gaps) if gaps else np.inf


def mistake(message, fn, probes=(), rivals=()):
    """`like`, and the formula is a mistake on these inputs (it differs from the reference
    somewhere), and the student's output is nearer to it than to each of `rivals` (wrong
    formulas that differ from it only slightly, e.g. eps outside the root)."""
    def test(e):
        if not e.matches(fn):
            return False
        if not any(not _close(_np64(r), w) for r, w in _results(e, fn)):
            return False
        return all(_gap(e, fn) < _gap(e, r) for r in rivals)
    return when(message, test, probes)


def _results(e, fn):
    """[(fn's result, the reference's output)] for the calls fn applies to."""
    return [(r, w) for ci, r in _formula(e, fn) if (w := e.want_out(ci)) is not None]


def _raised(*texts):
    return lambda e: any(t in e.error for t in texts)


def _grad_only(e):
    """The outputs are right, the gradient of the input is not."""
    return "the gradient of input 0" in e.problem


# -- layer_norm -----------------------------------------------------------------------------

def _ln(x, w=None, b=None, eps=1e-5, dims=(-1,), unbiased=False, eps_std=False, root=True,
        center=True, bias_first=False):
    """LayerNorm and its wrong relatives, in float64."""
    x = x.double()
    dims = tuple(sorted({d % x.dim() for d in dims}))
    m = x.mean(dims, keepdim=True)
    v = x.var(dims, unbiased=unbiased, keepdim=True)
    den = v + eps if not root else (v.sqrt() + eps if eps_std else (v + eps).sqrt())
    y = ((x - m) if center else x) / den
    if bias_first:
        return None if w is None or b is None else (y + b.double()) * w.double()
    y = y if w is None else y * w.double()
    return y if b is None else y + b.double()


def _lnf(**kw):
    return lambda x, weight=None, bias=None, eps=1e-5: _ln(x, weight, bias, eps, **kw)


def _ln_e2(x, weight=None, bias=None, eps=1e-5):
    """E[x^2] - E[x]^2 in float32, as the mistake computes it."""
    m = x.mean(-1, keepdim=True)
    v = (x ** 2).mean(-1, keepdim=True) - m ** 2
    return _affine(((x - m) / torch.sqrt(v + eps)).double(), weight, bias)


def _affine(y, w, b):
    y = y if w is None else y * w.double()
    return y if b is None else y + b.double()


def _no_keepdim(x, weight=None, bias=None, eps=1e-5):
    x = x.double()
    return _affine((x - x.mean(-1)) / (x.var(-1, unbiased=False) + eps).sqrt(), weight, bias)


SEED_LN = ("this is the seeds' LayerNorm: x.std() is the UNBIASED standard deviation (it divides "
           "by D-1) and eps is added to the std. LayerNorm uses the biased variance "
           "(var(unbiased=False), dividing by D) and puts eps inside the root: "
           "(x - mean) / sqrt(var + eps).")
UNBIASED_LN = ("you used the unbiased variance (x.var() / x.std() divide by D-1 by default); "
               "LayerNorm uses the biased one: x.var(dim=-1, unbiased=False) (correction=0).")
EPS_STD = ("eps was added to the standard deviation, (x - mean) / (std + eps); it belongs inside "
           "the square root: (x - mean) / sqrt(var + eps). The two differ when the variance is "
           "tiny.")
EPS_MISSING = ("the output is NaN for a constant row (its variance is 0, so 0 / 0): you left "
               "eps out. Add it inside the root: (x - mean) / sqrt(var + eps).")
KEEPDIM = ("the mean/variance lost their reduced axis: without keepdim=True the (N,) statistics "
           "broadcast against the wrong axis (silently, for square inputs). Use "
           "mean(dim=-1, keepdim=True).")
WHOLE = ("you took one mean and variance over the whole tensor of each example (positions and "
         "features together): LayerNorm takes them per token, over the last axis only "
         "(dim=-1, keepdim=True).")
_SEED, _UNBIASED = _lnf(unbiased=True, eps_std=True), _lnf(unbiased=True)


def _eps_ignored(e):
    return lambda x, weight=None, bias=None, eps=1e-5: None if eps == e else _ln(x, weight, bias, e)


LN_FORMULAS = [     # (message, wrong formula), most specific first
    (UNBIASED_LN, _UNBIASED),
    (SEED_LN, _SEED),
    (EPS_STD, _lnf(eps_std=True)),
    (EPS_MISSING, lambda x, weight=None, bias=None, eps=1e-5: _ln(x, weight, bias, 0.0)),
    *[(f"the eps argument was ignored: you used eps={v:g} whatever the caller passed. Use "
       "the eps parameter.", _eps_ignored(v)) for v in (1e-5, 1e-6, 1e-12, 1e-8)],
    ("you divided by the variance; divide by the standard deviation sqrt(var + eps).",
     _lnf(root=False)),
    ("you did not subtract the mean: the output is x / sqrt(var + eps), not (x - mean) / ...",
     _lnf(center=False)),
    ("you normalised over the batch axis (dim=0), one statistic per feature: that is "
     "BatchNorm. LayerNorm normalises each row (token) over its LAST axis, dim=-1.",
     _lnf(dims=(0,))),
    ("you normalised over the batch axis (dim=0), one statistic per feature: that is "
     "BatchNorm. LayerNorm normalises each row (token) over its LAST axis, dim=-1. (It "
     "also used the unbiased variance.)", _lnf(dims=(0,), unbiased=True)),
    (KEEPDIM, _no_keepdim),
    ("you normalised over the last TWO axes (positions and features together): LayerNorm "
     "takes one mean and variance per token, over the last axis only (dim=-1).",
     lambda x, weight=None, bias=None, eps=1e-5:
     _ln(x, weight, bias, eps, dims=(-2, -1)) if x.dim() >= 3 else None),
    (WHOLE, lambda x, weight=None, bias=None, eps=1e-5:
     _ln(x, weight, bias, eps, dims=range(1, x.dim())) if x.dim() >= 3 else None),
    (WHOLE, lambda x, weight=None, bias=None, eps=1e-5: _ln(x, weight, bias, eps, dims=range(x.dim()))),
    ("weight and bias are swapped: y = x_hat * weight + bias.",
     lambda x, weight=None, bias=None, eps=1e-5: _ln(x, bias, weight, eps)),
    ("the weight (scale) was not applied: y = x_hat * weight + bias.",
     lambda x, weight=None, bias=None, eps=1e-5: _ln(x, None, bias, eps)),
    ("the bias (shift) was not added: y = x_hat * weight + bias.",
     lambda x, weight=None, bias=None, eps=1e-5: _ln(x, weight, None, eps)),
    ("the bias was added before scaling, (x_hat + bias) * weight; use x_hat * weight + bias.",
     _lnf(bias_first=True)),
    ("the variance was computed as E[x^2] - E[x]^2: in float32 this loses most of its digits "
     "when the mean is large compared with the spread (catastrophic cancellation). Compute "
     "mean((x - mean)^2), or x.var(unbiased=False).", _ln_e2),
]
LN_ERRORS = [
    when(EPS_MISSING, lambda e: any(np.isnan(g).any() and not np.isnan(w).any() for g, w in e.outs())),
    when(KEEPDIM, _raised("must match the size of tensor")),
    when("`if weight:` asks a whole tensor for one True/False (\"Boolean value of Tensor ... is "
         "ambiguous\"). Test for the missing argument instead: `if weight is not None:`.",
         _raised("Boolean value of Tensor")),
    when("the forward values are right, but the gradient with respect to x is not: the mean and "
         "the variance depend on x, so gradients must flow through them. Do not detach them (or "
         "compute them under torch.no_grad()).", _grad_only),
]
LN_DIAGNOSES = ([mistake(SEED_LN, _SEED, rivals=(_UNBIASED,))]
                + [mistake(m, f) for m, f in LN_FORMULAS] + LN_ERRORS)


# -- LayerNorm ------------------------------------------------------------------------------

def _param_names(e):
    return {n for n, _ in (e.meta("params") or [])}


def _mod(fn):
    """A layer_norm formula as the module's: fn(ref, x) with the probe's weight, bias, eps."""
    return lambda m, x: fn(x, m.weight, m.bias, m.eps)


LAYERNORM_DIAGNOSES = [
    when("your module's parameters have other names (the seeds' a_2 / b_2, or gamma / beta): "
         "call them `weight` and `bias`, as PyTorch does, so weights can be copied across.",
         lambda e: bool(_param_names(e) & {"a_2", "b_2", "gamma", "beta", "alpha", "scale", "shift"})),
    when("self.weight / self.bias are plain tensors, not nn.Parameter: they would never be "
         "trained (they are not in model.parameters()). Wrap them: self.weight = "
         "nn.Parameter(torch.ones(d)).",
         lambda e: e.meta("params") is not None and "weight" not in _param_names(e)
         and e.got("after.weight") is not None),
    when("the module has no parameter named `weight`: create it in __init__, self.weight = "
         "nn.Parameter(torch.ones(d)).",
         lambda e: e.meta("params") is not None and "weight" not in _param_names(e)),
    when("the module has no parameter named `bias`: create it in __init__, self.bias = "
         "nn.Parameter(torch.zeros(d)).",
         lambda e: e.meta("params") is not None and "bias" not in _param_names(e)),
    mistake("LayerNorm(d) behaves as if eps=1e-6: the default must be eps=1e-5, nn.LayerNorm's "
            "(the tutorial's 1e-6 is a different layer).",
            lambda m, x: _ln(x, m.weight, m.bias, 1e-6), probes=("default eps",)),
    mistake("the module ignores its eps: pass self.eps on to the normalisation (it used 1e-5).",
            lambda m, x: None if m.eps == 1e-5 else _ln(x, m.weight, m.bias, 1e-5)),
    mistake(SEED_LN, _mod(_SEED), rivals=(_mod(_UNBIASED),)),
    mistake("you normalised over dim=1, which is the last axis only for 2-D inputs; for "
            "(B, L, D) it is the positions. Use dim=-1 so that every rank works.",
            lambda m, x: _ln(x, m.weight, m.bias, m.eps, dims=(1,))),
    *[mistake(m, _mod(f)) for m, f in LN_FORMULAS],
    *LN_ERRORS,
]

# -- batch_norm -----------------------------------------------------------------------------

def _bn(x, rm, rv, w=None, b=None, training=False, momentum=0.1, eps=1e-5, *, dims=None,
        unbiased=False, eps_std=False, root=True, update=True, store="unbiased", k=None,
        inplace=True, eval_batch=False, eval_update=False, n_of=None, raw_n=False):
    """batch_norm and its wrong relatives (float64, running statistics updated in place as
    the mistake does): dims(x) the axes of the statistics, store the running_var kept
    ("unbiased", "biased", "std"), k the weight of the new batch (None: momentum), n_of(x)
    the n of the unbiased correction (raw_n: n / (n - 1) even for n = 1)."""
    x = x.double()
    red = tuple(range(x.dim() - 1)) if dims is None else dims(x)
    D = x.shape[-1]
    mb, vb = x.mean(red, keepdim=True), x.var(red, unbiased=False, keepdim=True)
    batch = training or eval_batch
    m, v = (mb, x.var(red, unbiased=unbiased, keepdim=True)) if batch else (rm.clone(), rv.clone())
    if update and (training or eval_update) and rm is not None:
        n = n_of(x) if n_of else x.numel() // D if dims is None else x.numel() // mb.numel()
        fm, fv = mb.reshape(-1, D).mean(0), vb.reshape(-1, D).mean(0)
        unb = fv * n / (n - 1 if raw_n else max(n - 1, 1))
        new_v = {"unbiased": unb, "biased": fv, "std": (fv * n / (n - 1)).sqrt()}[store]
        kk = momentum if k is None else k(momentum, eps)
        nm, nv = (1 - kk) * rm + kk * fm, (1 - kk) * rv + kk * new_v
        if inplace:
            rm.copy_(nm)
            rv.copy_(nv)
    den = v + eps if not root else (v.sqrt() + eps if eps_std else (v + eps).sqrt())
    return _affine((x - m) / den, w, b)


def _bnf(**kw):
    return lambda x, rm, rv, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5: \
        _bn(x, rm, rv, weight, bias, training, momentum, eps, **kw)


def _dbl(v):
    return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


def _replay(fn, module=False):
    """A diagnosis test: run `fn` (a wrong batch_norm) on every call of the probe as the probe
    does, earlier outputs chained in and running statistics updated in place, and compare
    every output and every kept argument with the student's. True when they all agree and
    fn's differ from the reference's somewhere (fn is a mistake on these inputs).
    module=True: the probe drives a BatchNorm module; fn(x, rm, rv, w, b, training, momentum,
    eps) stands for its forward, with the probe's weight, bias, eps and momentum."""
    def test(e):
        ctx = vm._Ctx(e.tensors, {})
        if module:
            ref = e.ref()
            st = {"rm": ref.running_mean.double().clone(), "rv": ref.running_var.double().clone(),
                  "train": e.pd.get("mode") != "eval"}
        n, wrong = 0, False
        for ci, c in enumerate(e.pd["calls"]):
            args = [_dbl(a) for a in ctx.value(c["args"])]
            kwargs = {k: _dbl(v) for k, v in ctx.value(c["kwargs"]).items()}
            with torch.no_grad():
                if not module:
                    out = fn(*args, **kwargs)
                elif c["method"] in ("eval", "train"):
                    st["train"] = c["method"] == "train"
                    continue
                elif c["method"] == "get_buffer":
                    out = st["rm" if args[0] == "running_mean" else "rv"]
                else:
                    out = fn(args[0], st["rm"], st["rv"], ref.weight.double(), ref.bias.double(),
                             st["train"], ref.momentum, ref.eps)
            ctx.outs[ci] = out
            g = e.out(ci)
            if g is None:
                break
            pairs = [(g, out, e.want_out(ci))] + [
                (e.got(f"{ci}.arg.{i}"), args[i], e.want(f"{ci}.arg.{i}")) for i in c["keep"]]
            for got, mine, want in pairs:
                if got is None or want is None:
                    continue
                if not _close(got, _np64(mine)):
                    return False
                wrong = wrong or not _close(_np64(mine), want)
            n += 1
        return n > 0 and wrong
    return test


LN_NOT_BN = ("you normalised each row over its features (that is LayerNorm). BatchNorm takes one "
             "mean and variance PER FEATURE, over every other axis (the batch, and the "
             "positions for (B, L, D)).")
EVAL_USES_BATCH = ("in eval mode (training=False) you normalised with the batch's own "
                   "statistics. Eval mode uses running_mean and running_var, so an example's "
                   "output does not depend on the rest of the batch.")
RUN_GRAPH = ("the running statistics became part of the autograd graph (they now require grad): "
             "the next backward() fails. Update them under torch.no_grad(), or with "
             "mean.detach() and var.detach().")
PER_POSITION = ("the statistics were taken over the batch axis only (dim=0), one per position "
                "AND feature. For (B, L, D) BatchNorm averages each feature over the batch and "
                "the positions: dims (0, 1) (every axis but the last).")
RUN_REVERSED = ("momentum is reversed: you computed momentum * running + (1 - momentum) * batch. "
                "PyTorch's rule is running = (1 - momentum) * running + momentum * batch: "
                "momentum is the weight of the NEW batch (the opposite of an optimizer's momentum).")
EPS_MOM_SWAP = ("momentum and eps were swapped (a positional-argument mix-up): pass them by name, "
                "momentum=..., eps=....")
MOM_IGNORED = "the momentum argument was ignored (you used 0.1): use the momentum passed in."
BN_FORMULAS = [     # (message, wrong batch_norm), most specific first
    (LN_NOT_BN, _bnf(dims=lambda x: (x.dim() - 1,), update=False)),
    (LN_NOT_BN, _bnf(dims=lambda x: (x.dim() - 1,))),
    ("the batch was normalised with the unbiased variance. Normalise with the biased one "
     "(divide by n); only the running_var that is STORED uses the unbiased estimate (times "
     "n / (n - 1)).", _bnf(unbiased=True)),
    ("running_var was updated with the BIASED batch variance. PyTorch stores the unbiased "
     "estimate: batch_var * n / (n - 1), with n the number of values per feature (N, or B * L).",
     _bnf(store="biased")),
    (RUN_REVERSED, _bnf(k=lambda m, eps: 1 - m)),
    (RUN_REVERSED + " (running_var also used the biased variance.)",
     _bnf(k=lambda m, eps: 1 - m, store="biased")),
    ("the running statistics were not updated in place. `running_mean = ...` only rebinds a "
     "local name; the caller's tensor is unchanged. Update it in place: "
     "running_mean.mul_(1 - momentum).add_(momentum * mean) (or .copy_(...), or "
     ".lerp_(mean, momentum)).", _bnf(inplace=False)),
    ("the running statistics were replaced by the batch's; blend them: running = "
     "(1 - momentum) * running + momentum * batch.", _bnf(k=lambda m, eps: 1.0)),
    ("running_var was updated with the standard deviation; it keeps the (unbiased) VARIANCE.",
     _bnf(store="std")),
    (EPS_MOM_SWAP, lambda x, rm, rv, weight=None, bias=None, training=False, momentum=0.1,
     eps=1e-5: _bn(x, rm, rv, weight, bias, training, eps, momentum)),
    (MOM_IGNORED, _bnf(k=lambda m, eps: 0.1)),
    (EVAL_USES_BATCH, _bnf(eval_batch=True)),
    (EVAL_USES_BATCH + " (And with the unbiased variance.)", _bnf(eval_batch=True, unbiased=True)),
    ("the running statistics changed in eval mode (training=False): only update them while "
     "training.", _bnf(eval_update=True)),
    ("eval mode (training=False) changed the running statistics and normalised with the "
     "batch's own statistics: eval mode uses running_mean and running_var as they are.",
     _bnf(eval_update=True, eval_batch=True)),
    ("in training mode you normalised with the running statistics. Training normalises with "
     "the CURRENT batch's mean and (biased) variance, and only updates the running statistics.",
     lambda x, rm, rv, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5:
     _bn(x, rm, rv, weight, bias, False, momentum, eps, eval_update=training)),
    (PER_POSITION, _bnf(dims=lambda x: (0,), n_of=lambda x: x.shape[0], raw_n=True)),
    (PER_POSITION, _bnf(dims=lambda x: (0,), n_of=lambda x: x.shape[0])),
    (PER_POSITION, _bnf(dims=lambda x: (0,))),
    ("the statistics were taken over the positions only (dim=1), separately for each "
     "sequence. BatchNorm averages each feature over every axis but the last.",
     _bnf(dims=lambda x: (1,) if x.dim() >= 3 else None)),
    ("the unbiased correction n / (n - 1) used the wrong n: n is the number of values averaged "
     "per feature, B * L for a (B, L, D) input, not B.", _bnf(n_of=lambda x: x.shape[0])),
    ("the unbiased correction n / (n - 1) used the wrong n: n is the number of values averaged "
     "per feature, B * L for a (B, L, D) input (it must count every position of every "
     "sequence).", _bnf(n_of=lambda x: x.shape[-2])),
    ("eps was added to the std; it goes inside the root: sqrt(var + eps).", _bnf(eps_std=True)),
    ("you divided by the variance; divide by sqrt(var + eps).", _bnf(root=False)),
    ("weight and bias were not applied: y = x_hat * weight + bias.",
     lambda x, rm, rv, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5:
     None if weight is None else _bn(x, rm, rv, None, None, training, momentum, eps)),
    ("weight and bias are swapped: y = x_hat * weight + bias.",
     lambda x, rm, rv, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5:
     _bn(x, rm, rv, bias, weight, training, momentum, eps)),
    ("running_var was not updated: update both running_mean and running_var.",
     lambda x, rm, rv, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5:
     _bn(x, rm, rv.clone(), weight, bias, training, momentum, eps)),
]
BN_DIAGNOSES = [
    when(RUN_GRAPH, _raised("backward through the graph a second time", "requires grad",
                            "leaf Variable that requires grad")),
    when("the forward values are right, but the gradient with respect to x is not: in training "
         "the batch mean and variance depend on x, so gradients flow through them. Do not "
         "detach the batch statistics you normalise with (only the running statistics are "
         "updated without gradient).", _grad_only),
    *[when(m, _replay(f)) for m, f in BN_FORMULAS],
    when("`if weight:` asks a whole tensor for one True/False (\"Boolean value of Tensor ... is "
         "ambiguous\"). Test for the missing argument instead: `if weight is not None:`.",
         _raised("Boolean value of Tensor")),
]


# -- BatchNorm ------------------------------------------------------------------------------

def _not_buffer(e):
    return "is not a buffer" in e.error or "has no attribute `running_" in e.error


NOT_TRAINING = ("after model.eval() the module still normalised with the batch's own statistics "
                "(and kept updating the running ones): forward must pass "
                "training=self.training, the flag that model.train() and model.eval() set.")
BN_MODULE_FORMULAS = [
    (NOT_TRAINING, lambda x, rm, rv, w, b, training, momentum, eps:
     _bn(x, rm, rv, w, b, True, momentum, eps)),
    (EPS_MOM_SWAP, lambda x, rm, rv, w, b, training, momentum, eps:
     _bn(x, rm, rv, w, b, training, eps, momentum)),
    ("the module ignores its momentum argument: pass self.momentum on (it used 0.1).",
     lambda x, rm, rv, w, b, training, momentum, eps: _bn(x, rm, rv, w, b, training, 0.1, eps)),
    ("the module ignores its eps: pass self.eps to the normalisation (it used 1e-5).",
     lambda x, rm, rv, w, b, training, momentum, eps:
     None if eps == 1e-5 else _bn(x, rm, rv, w, b, training, momentum, 1e-5)),
    *BN_FORMULAS,
]
BATCHNORM_DIAGNOSES = [
    when("BatchNorm.running_mean is an nn.Parameter (running_var too): the optimizer would "
         "change it and it would receive gradients. Running statistics are buffers: "
         "self.register_buffer('running_mean', torch.zeros(d)).",
         lambda e: _not_buffer(e) and e.got("0.raised") is not None and not bool(e.got("0.raised"))),
    when("BatchNorm.running_mean / running_var are not registered buffers (a plain tensor "
         "attribute is not saved in state_dict() nor moved by .to(device)). Use "
         "self.register_buffer('running_mean', torch.zeros(d)) and the same for running_var.",
         _not_buffer),
    when("running_var starts at ONES, as in PyTorch: with zeros, eval mode before any training "
         "divides by sqrt(eps) and blows the activations up ~300x.",
         lambda e: e.out(3) is not None and not np.any(e.out(3)), probes=("init",)),
    when("running_mean starts at zeros and running_var at ones, as in PyTorch.",
         lambda e: not _close(e.out(2), e.want_out(2)) or not _close(e.out(3), e.want_out(3)),
         probes=("init",)),
    *LAYERNORM_DIAGNOSES[:4],
    *[when(m, _replay(f, module=True)) for m, f in BN_MODULE_FORMULAS],
    *BN_DIAGNOSES[:2],
]



# -- rms_norm -------------------------------------------------------------------------------

def _rms(x, w=None, eps=1e-6, dims=(-1,), eps_out=False, root=True, center=False, l2=False,
         std=False):
    x = x.double()
    dims = tuple(sorted({d % x.dim() for d in dims}))
    if center:
        x = x - x.mean(dims, keepdim=True)
    ms = x.pow(2).sum(dims, keepdim=True) if l2 else x.pow(2).mean(dims, keepdim=True)
    if std:
        ms = x.var(dims, keepdim=True)
    den = ms + eps if not root else (ms.sqrt() + eps if eps_out else (ms + eps).sqrt())
    return x / den if w is None else x / den * w.double()


def _rmsf(**kw):
    return lambda x, weight=None, eps=1e-6: _rms(x, weight, eps, **kw)


RMS_DIAGNOSES = [
    mistake("you subtracted the mean: that is LayerNorm. RMSNorm only rescales, "
            "x / sqrt(mean(x^2) + eps), with no centring.", _rmsf(center=True)),
    mistake("you divided by the standard deviation (x.std() / x.var()): RMSNorm divides by the "
            "root mean square sqrt(mean(x^2)), which includes the mean.", _rmsf(std=True)),
    mistake("you divided by the L2 norm ||x||; RMS is the norm divided by sqrt(D): "
            "sqrt(mean(x^2)).", _rmsf(l2=True)),
    mistake("you divided by mean(x^2); divide by its square root, sqrt(mean(x^2) + eps).",
            _rmsf(root=False)),
    mistake("eps was added outside the square root: use sqrt(mean(x^2) + eps).", _rmsf(eps_out=True)),
    mistake("the mean of x^2 was taken over dim=0; RMSNorm normalises each vector over dim=-1.",
            _rmsf(dims=(0,))),
    mistake("you took one mean of x^2 over the whole tensor; RMSNorm takes one per vector, over "
            "dim=-1 with keepdim=True.",
            lambda x, weight=None, eps=1e-6: _rms(x, weight, eps, dims=range(x.dim()))),
    mistake("the weight was not applied: y = x / rms * weight.",
            lambda x, weight=None, eps=1e-6: _rms(x, None, eps)),
    mistake("RMSNorm has a scale and NO bias; do not add one.",
            lambda x, weight=None, eps=1e-6: None if weight is None else _rms(x, weight, eps) + weight),
    *[mistake(f"the eps argument was ignored: you used eps={v:g} whatever the caller passed. Use "
              "the eps parameter.", lambda x, weight=None, eps=1e-6, v=v:
              None if eps == v else _rms(x, weight, v)) for v in (1e-6, 1e-5, 1e-8)],
    when("the forward values are right, but the gradient with respect to x is not: the mean "
         "square depends on x, so gradients must flow through it. Do not detach it.", _grad_only),
]


_LN4 = (_normal(2, 3, 4, 6, offset=2.0), randn(6), randn(6))   # two batch axes, and its rows

EXERCISES = [
    Exercise("layer_norm", ref="norm.layer_norm", shortcuts=("layer_norm",),
             graded=grades(basic=1, affine=1, eps=2, batch_axes=1, gradient=1, random=(2, 5171)),
             diagnose=LN_DIAGNOSES, probes=[
        Probe("basic", ("basic", "random"),
              [call(_normal(6, 6, scale=3.0)), call(_normal(5, 7, scale=2.0, offset=1.0))],
              what="rows of a square (6, 6) and of a (5, 7) input, no weight or bias"),
        Probe("affine", ("affine",),
              [call(_normal(4, 5, scale=2.0, offset=1.0), randn(5), randn(5)),
               call(_normal(4, 5, scale=2.0, offset=1.0), weight=randn(5)),
               call(_normal(4, 5, scale=2.0, offset=1.0), bias=randn(5))],
              what="weight and bias, weight alone, bias alone"),
        Probe("eps", ("eps",),
              [call(_constant_rows(3, 4)), call(_tiny_rows(5, 8)),
               call(_normal(3, 7, scale=0.3), randn(7), randn(7), eps=1e-2),
               call(_normal(3, 7, scale=0.3), randn(7), randn(7), eps=0.5)],
              atol=6e-5,  # rows of variance 1e-6 around 0.5: float32 keeps ~1e-5 of x - mean
              what="constant rows, rows of variance ~1e-6, eps=0.01 and eps=0.5"),
        Probe("batch axes", (batch("batch_axes"),),
              [call(_normal(6, scale=2.0), randn(6), randn(6)),
               call(_normal(2, 5, 8, scale=3.0, offset=-1.0), randn(8), randn(8)),
               call(*_LN4),
               call(part(_LN4[0], 1, 2), part(_LN4[1]), part(_LN4[2])),
               call(part(_LN4[0], 0, 1, 3), part(_LN4[1]), part(_LN4[2]))],
              what="inputs of shape (6,), (2, 5, 8) and (2, 3, 4, 6), and rows of the last on "
                   "their own"),
        Probe("gradient", ("gradient",),
              [call(_normal(3, 4, 6, scale=2.0), randn(6), randn(6), grad=(0, 1, 2),
                    backward=randn(3, 4, 6))],
              atol=1e-4, rtol=1e-3, what="gradients of x, weight and bias"),
        Probe("random", ("random",),
              [call(_normal(7, 13, scale=4.0), randn(13), randn(13), 1e-3),
               call(_normal(3, 9, 32, scale=4.0), randn(32), randn(32), eps=0.1),
               call(_normal(2, 2, 5, 3, scale=4.0), randn(3), randn(3)),
               call(_normal(11, scale=4.0), randn(11), randn(11), eps=1e-5),
               call(_tiny_rows(6, 12, spread=3e-3, offset=0.0), randn(12), randn(12), eps=1e-6)],
              what="random shapes, weights and eps values (0.001, 0.1, 1e-5, 1e-6)"),
        Probe("offset", ("random",),
              [call(_normal(5, 24, offset=100.0), randn(24), randn(24)),
               call(_normal(2, 4, 7, offset=100.0), randn(7), randn(7))],
              atol=2.1e-4, what="inputs with a large mean (randn + 100)"),
    ]),
    Exercise("LayerNorm", ref="norm.LayerNorm", shortcuts=("layer_norm",),
             graded=grades(init=1, matches_torch=(2, 8128)),
             diagnose=LAYERNORM_DIAGNOSES, probes=[
        Probe("init", ("init",), [], make=ctor(7), params=True,
              after=("weight", "bias"),
              what="LayerNorm(7) as constructed: parameters weight (ones) and bias (zeros)"),
        Probe("default eps", ("matches_torch",),
              [call(_one_tiny_row(4, 6), grad=(0,), backward=randn(4, 6))],
              make=ctor(6), load="reference", params=True, param_grads=True,
              atol=1e-4, rtol=1e-3,
              what="LayerNorm(6) (default eps) with a tiny-variance row, and its gradients"),
        Probe("eps", ("matches_torch",),
              [call(_normal(2, 5, 8, scale=2.0, offset=0.5), grad=(0,), backward=randn(2, 5, 8))],
              make=ctor(8, eps=1e-3), load="reference", params=True, param_grads=True,
              atol=1e-4, rtol=1e-3, what="LayerNorm(8, eps=0.001) on (2, 5, 8), and its gradients"),
        Probe("large eps", ("matches_torch",),
              [call(_normal(2, 3, 4, 5)), call(_normal(5, scale=0.3))],
              make=ctor(5, eps=0.2), load="reference", params=True,
              what="LayerNorm(5, eps=0.2) on (2, 3, 4, 5) and on one (5,) vector"),
    ]),
    Exercise("batch_norm", ref="norm.batch_norm", shortcuts=("batch_norm",),
             graded=grades(train=2, running_stats=2, eval=1, sequences=2, gradient=1,
                           random=(2, 9091)),
             diagnose=BN_DIAGNOSES, probes=[
        Probe("train", ("train", "random"),
              [call(_normal(6, 4, scale=2.0, offset=1.0), _const(4), _const(4, value=1.0),
                    training=True, keep=(1, 2)),
               call(_normal(6, 4, scale=6.0, offset=1.0), _const(4), _const(4, value=1.0),
                    randn(4), randn(4), training=True, keep=(1, 2))],
              what="training mode on (6, 4): batch statistics per feature, weight and bias"),
        Probe("tiny variance", ("train",),
              [call(_tiny_features(6, 4), _const(4), _const(4, value=1.0), training=True,
                    keep=(1, 2))],
              what="training mode with feature variances from ~1e-6 to ~4 (eps=1e-5)"),
        Probe("running stats", ("running_stats",),
              _chain([(5, 3)] * 4, 3, affine=False, last_eval="graph"),
              compare=_outputs_only,
              what="three training steps on the same running statistics (momentum 0.1), "
                   "then a backward through them"),
        Probe("momentum", ("running_stats",),
              _chain([(5, 3)] * 4, 3, momentum=0.3, affine=False, last_eval="graph"),
              compare=_outputs_only,
              what="three training steps with momentum=0.3, then a backward through them"),
        Probe("eval", ("eval",),
              [call(_normal(4, 3, scale=2.0), randn(3), _positive(3), keep=(1, 2)),
               call(_normal(4, 3, scale=2.0), randn(3), _positive(3), randn(3), randn(3),
                    training=False, eps=1e-3, keep=(1, 2)),
               call(_normal(1, 3, scale=2.0), randn(3), _positive(3), randn(3), randn(3),
                    training=False, keep=(1, 2))],
              what="eval mode (the default, eps=0.001, a batch of one): running statistics "
                   "used and left unchanged"),
        Probe("sequences", ("sequences",),
              _chain([(3, 5, 4), (1, 6, 4), (3, 5, 4)], 4)
              + [call(_shifted(3, 5, 4), _const(4), _const(4, value=1.0), training=True,
                      keep=(1, 2))],
              compare=_outputs_only,
              what="(B, L, D) inputs, a single sequence (1, 6, 4), training and eval mode"),
        Probe("gradient", ("gradient",),
              [call(_normal(4, 3, 5, offset=1.0), _const(5), _const(5, value=1.0), randn(5),
                    randn(5), training=True, grad=(0, 3, 4), backward=randn(4, 3, 5))],
              atol=1e-4, rtol=1e-3, what="training-mode gradients of x, weight and bias"),
        Probe("random a", ("random",),
              _chain([(13, 7)] * 5, 7, momentum=0.25),
              compare=_outputs_only, what="four steps on (13, 7), momentum 0.25, then eval"),
        Probe("random b", ("random",),
              _chain([(3, 11, 6)] * 4, 6, momentum=0.05, eps=1e-3),
              compare=_outputs_only,
              what="three steps on (3, 11, 6), momentum 0.05, eps=0.001, then eval"),
        Probe("random c", ("random",),
              _chain([(2, 3, 4, 5)] * 3, 5, momentum=0.7, eps=0.1),
              compare=_outputs_only,
              what="two steps on (2, 3, 4, 5), momentum 0.7, eps=0.1, then eval"),
        Probe("random d", ("random",),
              _chain([(1, 9, 4)] * 4, 4),
              compare=_outputs_only, what="three steps on one sequence (1, 9, 4), then eval"),
        Probe("random e", ("random",),
              _chain([(64, 2)] * 3, 2, momentum=0.9),
              compare=_outputs_only, what="two steps on (64, 2), momentum 0.9, then eval"),
    ]),
    Exercise("BatchNorm", ref="norm.BatchNorm", shortcuts=("batch_norm",),
             graded=grades(init=1, train_eval=(3, 3107)),
             diagnose=BATCHNORM_DIAGNOSES, probes=[
        Probe("init", ("init",),
              [call("running_mean", method="get_parameter", raises=True),
               call("running_var", method="get_parameter", raises=True)] + _buffers(),
              make=ctor(5), params=True,
              after=("weight", "bias"),
              what="BatchNorm(5) as constructed: weight/bias parameters, running_mean/"
                   "running_var buffers"),
        Probe("2-D", ("train_eval",), _train_eval((6,), 4, 3),
              make=ctor(4), load="reference", mode="train", params=True, param_grads=True,
              after=("running_mean", "running_var"),
              atol=1e-4, rtol=1e-3,
              what="BatchNorm(4) on (6, 4): three training steps, eval, training again"),
        Probe("3-D", ("train_eval",), _train_eval((3, 4), 5, 2),
              make=ctor(5, momentum=0.3), load="reference", mode="train", params=True,
              param_grads=True, after=("running_mean", "running_var"), atol=1e-4, rtol=1e-3,
              what="BatchNorm(5, momentum=0.3) on (3, 4, 5): train, eval, train again"),
        Probe("eps", ("train_eval",), _train_eval((2, 6), 6, 2),
              make=ctor(6, eps=0.1, momentum=0.2), load="reference", mode="train",
              params=True, param_grads=True, after=("running_mean", "running_var"),
              atol=1e-4, rtol=1e-3,
              what="BatchNorm(6, eps=0.1, momentum=0.2) on (2, 6, 6): train, eval, train again"),
    ]),
    Exercise("rms_norm", ref="modern_decoder.rms_norm", shortcuts=("rms_norm",),
             graded=grades(basic=1, random=(1, 2718)),
             diagnose=RMS_DIAGNOSES, probes=[
        Probe("basic", ("basic",),
              [call(_normal(3, 5, scale=2.0, offset=1.0)), call(_tiny_rows(2, 5, offset=0.0)),
               call(_normal(3, 5, scale=2.0, offset=1.0), randn(5), grad=(0, 1),
                    backward=randn(3, 5))],
              atol=1e-4, rtol=1e-3,
              what="(3, 5) rows, tiny rows (mean square ~1e-6), weight and gradients"),
        Probe("random", ("random",),
              [call(_normal(9, 17, scale=5.0, offset=1.0), randn(17), eps=1e-6),
               call(_normal(2, 5, 32, scale=5.0, offset=1.0), randn(32), eps=1e-3),
               call(_normal(3, scale=5.0, offset=1.0), randn(3), eps=0.3),
               call(_normal(4, 8), randn(8), eps=0.1),
               call(_tiny_rows(3, 6, spread=1e-3, offset=0.0), randn(6), eps=1e-6)],
              what="random shapes and weights, eps 1e-6, 0.001, 0.3, 0.1"),
    ]),
]
