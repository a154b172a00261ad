"""12_training: what the grader runs on the student's training pieces.

Each exercise runs inside a small procedure of the probe machine (`vm.DRIVERS`, a call whose
method is "@name"), whose other half is written there independently of the course's solution:
the optimizer trains a seeded toy regression for up to 100 steps (the parameters and losses are
compared; the reference equals torch.optim.AdamW, which tests/test_specs checks); clipping runs
on seeded gradients (the norm and every gradient after it); the schedule is read at every
boundary of warm-up and cosine; a checkpoint is written by the student and read back by the
machine (or the other way round) and the resumed run must give the uninterrupted run's losses
bit for bit; evaluation runs on a seeded model with dropout (so the mode matters) and seeded
data; batches are drawn from data whose token at i is i, so every window shows where it starts.
"""
import math

import numpy as np
import torch

from .engine import Exercise, Probe, call, fixture, given, grades, shapes, variants, when

ASSIGNMENT = "12_training"


def _run(driver, *args, **kwargs):
    return call(*args, method="@" + driver, **kwargs)


# -- get_batch ---------------------------------------------------------------------------------

def _flag(e, key, value):
    """Some call's output `key` is `value` (a bool the driver computed)."""
    return any(e.out(ci, key) is not None and bool(e.out(ci, key)) == value
               for ci in range(len(e.pd["calls"])))


def _text(a):
    return None if a is None else bytes(np.asarray(a).astype(np.uint8).tolist()).decode()


def _not_shifted(e):
    return _flag(e, "y_equals_x", True)


def _shift_wrong(e):
    return _flag(e, "y_is_next", False)


def _past_end(e):
    return any(s in e.error for s in ("IndexError", "out of bounds", "out of range")) or \
        _flag(e, "in_bounds", False)


def _last_offset_missed(e):
    for ci in range(len(e.pd["calls"])):
        seen, want = e.out(ci, "starts_seen"), e.want_out(ci, "starts_seen")
        if seen is not None and want is not None and np.asarray(seen).shape == np.asarray(want).shape:
            seen = np.asarray(seen)
            if not seen[-1] and seen[:-1].all():
                return True
    return False


def _aligned(e):
    """Only starts that are multiples of the context length were drawn (non-overlapping windows)."""
    for ci in range(len(e.pd["calls"])):
        seen, T = e.out(ci, "starts_seen"), int(e.args(ci)[0][3])
        if seen is not None:
            seen = np.asarray(seen)
            off = [i for i in range(len(seen)) if i % T]
            if off and seen.any() and not seen[off].any():
                return True
    return False


def _not_repeatable(e):
    return _flag(e, "repeatable", False)


def _wrong_device(e):
    return any(_text(e.out(ci, "device")) != _text(e.want_out(ci, "device"))
               for ci in range(len(e.pd["calls"])) if e.out(ci, "device") is not None)


def _wrong_dtype(e):
    return any(_text(e.out(ci, "dtype")) != _text(e.want_out(ci, "dtype"))
               for ci in range(len(e.pd["calls"])) if e.out(ci, "dtype") is not None)


BATCH_DIAGNOSES = [
    when("the targets are not shifted: y must be x moved one token on, y = data[s + 1 : s + T + 1], "
         "so that y[j] is the token that follows x[: j + 1]. With y == x the model learns to copy.",
         _not_shifted),
    when("a window runs past the end of the data: the largest start is len(data) - context_length "
         "- 1 (then y ends on the last token), so draw starts with torch.randint(0, len(data) - "
         "context_length, ...), whose upper bound is exclusive.", _past_end),
    when("only starts that are multiples of context_length are drawn (the data cut into "
         "non-overlapping windows): every offset from 0 to len(data) - context_length - 1 must be "
         "possible, torch.randint(0, len(data) - context_length, ...).", _aligned),
    when("every row of the batch starts at the same offset: draw batch_size independent starts, "
         "torch.randint(0, len(data) - context_length, (batch_size,), generator=generator), one per "
         "row.", lambda e: _flag(e, "same_start", True)),
    when("the last valid start, len(data) - context_length - 1, is never drawn: torch.randint's "
         "upper bound is exclusive, so use torch.randint(0, len(data) - context_length, ...) (not "
         "len(data) - context_length - 1).", _last_offset_missed),
    when("y is not x shifted by one token: take y = data[s + 1 : s + T + 1] from the same start s "
         "as x = data[s : s + T].", _shift_wrong),
    when("the batch does not follow `generator`: the same seeded generator must give the same "
         "batch. Pass generator=generator to torch.randint (and draw on the CPU).", _not_repeatable),
    when("x and y are not on the requested device: finish with x.to(device), y.to(device).",
         _wrong_device),
    when("x and y must be LongTensors (torch.long, int64): embeddings and cross_entropy need "
         "64-bit integer ids. Convert with torch.as_tensor(data, dtype=torch.long).", _wrong_dtype),
    when("x is not a window of the data: row i must be data[s_i : s_i + context_length], "
         "consecutive tokens from one start.", lambda e: _flag(e, "x_is_window", False)),
]


# -- AdamW -------------------------------------------------------------------------------------

def _toy(seed):
    g = torch.Generator().manual_seed(int(seed))
    shapes_ = [(8, 6), (8,), (3, 8), (3,)]
    params = [(0.5 * torch.randn(s, generator=g)).requires_grad_(True) for s in shapes_]
    return params, torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)


def _adam_like(seed, steps, kw, bias=True, decay="decoupled", schedule=False, resume_at=None,
               lr_once=False, lost_state=False):
    """The toy run of fixtures.drive_optimizer with an Adam written here, right or in a known
    wrong way, or in CS336's documented form (decay="cs336": the decay after the Adam step,
    the bias corrections folded into the step size, epsilon added to sqrt(v))."""
    from .fixtures import lr_factor
    params, x, y = _toy(seed)
    base, (b1, b2) = kw.get("lr", 1e-3), kw.get("betas", (0.9, 0.999))
    eps, wd = kw.get("eps", 1e-8), kw.get("weight_decay", 0.01)
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    start = 0
    for t in range(1, int(steps) + 1):
        if resume_at is not None and lost_state and t - 1 == int(resume_at):
            m = [torch.zeros_like(p) for p in params]   # a fresh Adam after the "checkpoint"
            v = [torch.zeros_like(p) for p in params]
            start = t - 1
        lr = base * lr_factor(t - 1) if schedule and not lr_once else base
        k = t - start                                   # the step count the optimizer keeps
        for p in params:
            p.grad = None
        w1, b1_, w2, b2_ = params
        loss = ((torch.tanh(x @ w1.T + b1_) @ w2.T + b2_ - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for i, p in enumerate(params):
                g = p.grad + wd * p if decay == "l2" else p.grad
                if decay == "decoupled":
                    p.mul_(1 - lr * wd)
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                if decay in ("cs336", "folded"):   # the bias corrections in the step size
                    if decay == "folded":
                        p.mul_(1 - lr * wd)
                    p.sub_(lr * (1 - b2 ** k) ** 0.5 / (1 - b1 ** k) * m[i] / (v[i].sqrt() + eps))
                    if decay == "cs336":
                        p.sub_(lr * wd * p)
                    continue
                mh, vh = (m[i] / (1 - b1 ** k), v[i] / (1 - b2 ** k)) if bias else (m[i], v[i])
                upd = mh / (vh.sqrt() + eps)
                if decay == "after":
                    p.sub_(lr * upd)
                    p.mul_(1 - lr * wd)
                elif decay == "none":
                    p.sub_(lr * upd)
                elif decay == "lr_free":
                    p.mul_(1 - wd)
                    p.sub_(lr * upd)
                else:
                    p.sub_(lr * upd)
    return [p.detach() for p in params]


def _adam_runs(e):
    """[(call, seed, steps, kwargs, how the driver ran it, the student's parameters)]."""
    out = []
    for ci in range(len(e.pd["calls"])):
        args, how = e.args(ci)
        got = [e.out(ci, f"params.{i}") for i in range(4)]
        if any(g is None for g in got):
            return []
        out.append((ci, args[0], args[1], args[2], how, got))
    return out


def _adam_follows(**mistake):
    def test(e):
        hit, runs = 0, _adam_runs(e)
        for ci, seed, steps, kw, how, got in runs:
            wrong = _adam_like(seed, steps, kw, **how, **mistake)
            if not all(np.allclose(g, w.numpy(), atol=1e-4, rtol=1e-3) for g, w in zip(got, wrong)):
                return False
            right = _adam_like(seed, steps, kw, **how)
            hit += not all(np.allclose(r.numpy(), w.numpy(), atol=1e-5) for r, w in zip(right, wrong))
        return bool(runs) and hit > 0
    return test


ADAM_FORMS = {   # the documented forms other than torch.optim.AdamW's, accepted at 1e-4
    "cs336": "the CS336 handout's (and Hugging Face's) form of AdamW: the weight decay after the "
             "Adam step, the bias corrections folded into the step size",
    "after": "the weight decay after the Adam step (the order of the CS336 handout and Hugging "
             "Face's AdamW)",
    "folded": "the bias corrections folded into the step size, lr * sqrt(1 - beta2**t) / (1 - "
              "beta1**t) (Kingma and Ba, section 2)",
}


def _cs336_form(e):
    """A note when the student's optimizer follows one of the other documented forms of AdamW
    (ADAM_FORMS) at 1e-4 on every call, as CS336's own test accepts its form beside PyTorch's;
    None otherwise (the probe then fails as usual)."""
    runs = _adam_runs(e)
    if not runs:
        return None
    for form, words in ADAM_FORMS.items():
        if all(all(np.allclose(g, w.numpy(), atol=1e-4, rtol=1e-4)
                   for g, w in zip(got, _adam_like(seed, steps, kw, decay=form, **how)))
               for ci, seed, steps, kw, how, got in runs):
            return (f"accepted: you wrote {words}; torch.optim.AdamW decays first and divides "
                    "the moments, and the forms differ by terms of order lr**2 * weight_decay and "
                    "in where epsilon sits")
    return None


def _state_lost(e):
    return any(e.out(ci, "n_state") is not None and int(e.out(ci, "n_state")) == 0
               and int(e.want_out(ci, "n_state")) > 0 for ci in range(len(e.pd["calls"])))


def _no_state(e):
    return "exp_avg" in e.error or "KeyError" in e.error and "step" in e.error


ADAMW_DIAGNOSES = [
    when("your optimizer is not a working torch.optim.Optimizer: subclass it and call "
         "super().__init__(params, defaults) with the hyper-parameters in `defaults`; iterate over "
         "self.param_groups in step().", lambda e: "param_groups" in e.error or "defaults" in e.error),
    when(lambda e: "the optimizer's moments are not in self.state: state_dict()['state'] was "
         "empty, so a new optimizer loaded from it (a resumed checkpoint) started Adam afresh. Keep "
         "step, exp_avg and exp_avg_sq in self.state[p], which state_dict() saves and "
         "load_state_dict() restores.", _state_lost),
    when("the learning rate was read once (in __init__, or from self.defaults): a schedule sets "
         "group['lr'] before every step, and your steps did not follow it. Read lr and the other "
         "hyper-parameters from the param group inside step().", _adam_follows(lr_once=True)),
    when("the optimizer's moments were lost when a new optimizer took over from "
         "load_state_dict(opt.state_dict()): keep step, exp_avg and exp_avg_sq in self.state[p], "
         "which state_dict() carries.", _adam_follows(lost_state=True)),
    when("Adam's bias correction is missing: divide the moments by (1 - beta1**t) and "
         "(1 - beta2**t), t counting from 1. Without it the early steps are too LARGE, not small "
         "(m is 10x too small at t = 1 but sqrt(v) about 32x, so the step is ~3x too large, ~6.6x "
         "near t = 12 with the default betas).", _adam_follows(bias=False)),
    when("the weight decay is coupled to the gradient (L2: grad + weight_decay * p goes through the "
         "moments): AdamW decays the weights directly, p *= 1 - lr * weight_decay, outside m and v.",
         _adam_follows(decay="l2")),
    when("the weight decay is missing: AdamW multiplies every parameter by (1 - lr * weight_decay) "
         "before the Adam step.", _adam_follows(decay="none")),
    when("the weight decay is not scaled by the learning rate: p *= 1 - lr * weight_decay, not "
         "1 - weight_decay.", _adam_follows(decay="lr_free")),
]


# -- cosine_schedule ---------------------------------------------------------------------------

def _sched(step, mx, mn, w, c, kind="right"):
    if kind == "warm+1" and step < w:
        return mx * (step + 1) / w
    if kind == "warm-1" and step < w:
        return mx * step / (w - 1) if w > 1 else mx
    if step < w:
        return mx * step / w
    if kind == "no_floor" and step > c:
        return mn + 0.5 * (1 + math.cos(math.pi * (step - w) / (c - w))) * (mx - mn)
    if step > c:
        return mn
    if kind == "period_c":
        return mn + 0.5 * (1 + math.cos(math.pi * (step - w) / c)) * (mx - mn)
    if kind == "from_zero":
        return mn + 0.5 * (1 + math.cos(math.pi * step / c)) * (mx - mn)
    if kind == "no_min":
        return 0.5 * (1 + math.cos(math.pi * (step - w) / (c - w))) * mx
    if kind == "full_cos":
        return mn + 0.5 * (1 + math.cos(2 * math.pi * (step - w) / (c - w))) * (mx - mn)
    return mn + 0.5 * (1 + math.cos(math.pi * (step - w) / (c - w))) * (mx - mn)


def _sched_follows(kind):
    def test(e):
        hit = 0
        for ci in range(len(e.pd["calls"])):
            args = e.args(ci)[0]
            steps, rest = args[0], args[1:]
            got = e.out(ci)
            if got is None:
                return False
            wrong = np.array([_sched(s, *rest, kind=kind) for s in steps])
            if np.asarray(got).shape != wrong.shape or not np.allclose(got, wrong, atol=1e-9, rtol=1e-6):
                return False
            hit += not np.allclose(wrong, [_sched(s, *rest) for s in steps], atol=1e-12)
        return hit > 0
    return test


SCHEDULE_DIAGNOSES = [
    *variants(_sched_follows, {
        "warm+1":
            "the warm-up is off by one: at step t < warmup_steps the rate is max_lr * t / "
            "warmup_steps, so step 0 gives 0 and max_lr is reached at t = warmup_steps (not "
            "(t + 1) / warmup_steps).",
        "warm-1":
            "the warm-up is off by one: divide by warmup_steps, not warmup_steps - 1 (max_lr is "
            "reached at t = warmup_steps, where the cosine takes over).",
        "period_c":
            "the cosine does not reach min_lr at cosine_steps: its progress is (t - warmup_steps) / "
            "(cosine_steps - warmup_steps), from 0 at the end of the warm-up to 1 at cosine_steps.",
        "from_zero":
            "the cosine starts at step 0 instead of at the end of the warm-up: use t - warmup_steps "
            "over cosine_steps - warmup_steps.",
        "no_min":
            "min_lr is missing from the cosine: min_lr + (1 + cos(...)) / 2 * (max_lr - min_lr), so "
            "that it decays to min_lr, not to 0.",
        "no_floor":
            "after cosine_steps the rate must stay at min_lr; yours keeps following the cosine back "
            "up.",
        "full_cos":
            "the cosine makes a whole period (2 pi) and comes back up: half a period, "
            "cos(pi * progress), goes from max_lr to min_lr.",
    }),
]


# -- clip_grad_norm ----------------------------------------------------------------------------

def _clip_weights(seed):
    from .fixtures import _clip_weights as w
    return [w(seed, s).detach() for i, s in enumerate([(4, 5), (5,), (3, 4), (7,)]) if i != 2]


def _clip_case(seed, scale):
    g = torch.Generator().manual_seed(int(seed))
    shapes_ = [(4, 5), (5,), (3, 4), (7,)]
    return [scale * torch.randn(s, generator=g) for i, s in enumerate(shapes_) if i != 2]


def _clip_got(e, ci):
    grads = [e.out(ci, f"grads.{i}") for i in range(3)]
    return None if any(g is None for g in grads) else [np.asarray(g) for g in grads]


def _clip_follows(kind):
    def test(e):
        hit = 0
        for ci in range(len(e.pd["calls"])):
            args = e.args(ci)[0]
            seed, max_norm, scale = args[0], args[1], args[2]
            grads = _clip_case(seed, scale)
            got, norm = _clip_got(e, ci), e.out(ci, "norm")
            if got is None:
                return False
            total = float(torch.sqrt(sum((g ** 2).sum() for g in grads)))
            if kind == "per_param":
                wrong = [g * min(1.0, max_norm / (float(g.norm()) + 1e-6)) for g in grads]
            elif kind == "always":
                wrong = [g * max_norm / (total + 1e-6) for g in grads]
            elif kind == "sum_norms":
                s = sum(float(g.norm()) for g in grads)
                wrong = [g * min(1.0, max_norm / (s + 1e-6)) for g in grads]
            elif kind == "none":
                wrong = grads
            elif kind == "weights":
                w = torch.sqrt(sum((p ** 2).sum() for p in _clip_weights(seed)))
                wrong = [g * min(1.0, max_norm / (float(w) + 1e-6)) for g in grads]
            elif kind == "value":
                wrong = [g.clamp(-max_norm, max_norm) for g in grads]
            else:
                return False
            if not all(np.allclose(a, b.numpy(), atol=1e-5, rtol=1e-4) for a, b in zip(got, wrong)):
                return False
            right = [g * min(1.0, max_norm / (total + 1e-6)) for g in grads]
            hit += not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(right, wrong))
        return hit > 0
    return test


def _norm_after(e):
    for ci in range(len(e.pd["calls"])):
        args = e.args(ci)[0]
        norm, want = e.out(ci, "norm"), e.want_out(ci, "norm")
        if norm is None or want is None:
            continue
        if float(want) > args[1] * 1.01 and abs(float(norm) - args[1]) < 1e-3 * max(1.0, args[1]):
            return True
    return False


def _norm_squared(e):
    for ci in range(len(e.pd["calls"])):
        norm, want = e.out(ci, "norm"), e.want_out(ci, "norm")
        if norm is not None and want is not None and float(want) > 1.5 and \
                abs(float(norm) - float(want) ** 2) < 1e-3 * float(want) ** 2:
            return True
    return False


def _generator_twice(e):
    for ci in range(len(e.pd["calls"])):
        args, kwargs = e.args(ci)
        if kwargs.get("as_generator") and _clip_got(e, ci) is not None and \
                not _clip_follows("none")(e) and \
                _clip_follows("none")(_One(e, ci)):
            return True
    return False


class _One:
    """The evidence of one call only (for a test that must look at one call)."""

    def __init__(self, e, ci):
        self._e, self._ci = e, ci
        self.pd = {"calls": [e.pd["calls"][ci]]}

    def args(self, ci=0):
        return self._e.args(self._ci)

    def out(self, ci=0, path=""):
        return self._e.out(self._ci, path)


CLIP_DIAGNOSES = [
    when("`parameters` may be a generator (model.parameters()): it can be gone through only once. "
         "Make a list first (grads = [p.grad for p in parameters if p.grad is not None]), then "
         "compute the norm and scale from that list.", _generator_twice),
    *variants(_clip_follows, {
        "per_param":
            "you clipped each parameter on its own: clipping uses ONE norm over all the gradients "
            "together, sqrt(sum over every parameter of sum(g**2)), and scales every gradient by the "
            "same factor, so the direction of the whole step is kept.",
        "always":
            "you rescaled the gradients even though their norm was below max_norm: the factor is "
            "min(1, max_norm / (norm + 1e-6)): small gradients are left as they are.",
        "sum_norms":
            "the total norm is not the sum of the parameters' norms: it is the square root of the sum "
            "of ALL squared entries, sqrt(sum_p ||g_p||**2).",
        "none":
            "the gradients were not changed: scale them in place (p.grad.mul_(factor)); a new tensor "
            "assigned to a local name leaves p.grad as it was.",
        "weights":
            "you took the norm of the parameters (the weights), not of their gradients: sum the "
            "squares of p.grad.",
        "value":
            "you clipped every entry to [-max_norm, max_norm] (clipping by value, "
            "clip_grad_value_): clipping by norm scales all the gradients by one factor, "
            "min(1, max_norm / (norm + 1e-6)), so their direction is kept.",
    }),
    when("you returned the norm after clipping (always <= max_norm): return the total norm computed "
         "BEFORE scaling, as torch.nn.utils.clip_grad_norm_ does: it is what a training log shows.",
         _norm_after),
    when("the returned norm is the squared norm: take the square root of the sum of squares.",
         _norm_squared),
    when("a parameter without a gradient (p.grad is None, e.g. a frozen or unused one) must be "
         "skipped.", lambda e: "NoneType" in e.error),
]


# -- checkpoints -------------------------------------------------------------------------------

def _resumed_vs_straight(e):
    """[(call, step, straight losses, resumed losses)] of the student's run."""
    out = []
    for ci in range(len(e.pd["calls"])):
        s, r, st = e.out(ci, "straight"), e.out(ci, "resumed"), e.out(ci, "step")
        if s is not None and r is not None and st is not None:
            out.append((ci, int(st), np.asarray(s), np.asarray(r)))
    return out


def _wrong_step(e):
    for ci, st, s, r in _resumed_vs_straight(e):
        if st != int(e.args(ci)[0][1]):
            return True
    return False


def _jump(e):
    return any(st == int(e.args(ci)[0][1]) and not np.array_equal(s, r)
               for ci, st, s, r in _resumed_vs_straight(e))


SAVE_DIAGNOSES = [
    when("the checkpoint has no optimizer state: save the dict {'model': model.state_dict(), "
         "'optimizer': optimizer.state_dict(), 'step': step}; without AdamW's moments a resumed "
         "run starts Adam afresh and its loss jumps.", lambda e: "'optimizer'" in e.error),
    when("the checkpoint has no step: save the dict {'model': ..., 'optimizer': ..., 'step': step}: "
         "the schedule reads the step, so a resumed run must know where it was.",
         lambda e: "'step'" in e.error),
    when("the checkpoint has no model weights under 'model': save {'model': model.state_dict(), "
         "'optimizer': optimizer.state_dict(), 'step': step}.", lambda e: "'model'" in e.error),
    when("the checkpoint must be the dict {'model': model.state_dict(), 'optimizer': "
         "optimizer.state_dict(), 'step': step} written with torch.save(obj, path): the checks "
         "read it back with torch.load.",
         lambda e: any(s in e.error for s in ("unpickl", "pickle", "zip", "Error(s) in loading",
                                              "not subscriptable", "indices", "AttributeError"))),
    when("the step saved is not the step given: store `step` as it was passed.", _wrong_step),
    when("the resumed run does not continue the loss curve exactly: the checkpoint must hold the "
         "model's state_dict, the optimizer's state_dict (AdamW's moments and step counts) and the "
         "step.", _jump),
]

LOAD_DIAGNOSES = [
    when("return the step stored in the checkpoint (ckpt['step']): the training loop continues "
         "from it, and the schedule reads it.", _wrong_step),
    when("the optimizer state was not restored: call optimizer.load_state_dict(ckpt['optimizer']); "
         "without AdamW's moments the resumed run starts Adam afresh and its loss jumps.",
         lambda e: _jump(e) and _first_equal(e)),
    when("the resumed run does not continue the loss curve exactly: load the model's weights "
         "(model.load_state_dict(ckpt['model'])) and the optimizer's state, into the objects "
         "given (not new ones), and return the step.", _jump),
]


def _first_equal(e):
    """The first resumed loss is right (the weights were loaded), later ones differ."""
    return any(len(s) and s[0] == r[0] for _, _, s, r in _resumed_vs_straight(e))


# -- evaluate ----------------------------------------------------------------------------------

def _eval_vals(e, ci):
    lo, pp = e.out(ci, "loss"), e.out(ci, "perplexity")
    return None if lo is None or pp is None else (float(lo), float(pp))


def _ppl_of_sum(e):
    for ci in range(len(e.pd["calls"])):
        got, want = _eval_vals(e, ci), e.want_out(ci, "loss")
        if got and want is not None and abs(got[0] - float(want)) < 1e-4 and \
                not math.isclose(got[1], math.exp(got[0]), rel_tol=1e-4) and \
                (math.isinf(got[1]) or got[1] > 1e6 * math.exp(got[0])):
            return True
    return False


def _ppl_not_exp(e):
    for ci in range(len(e.pd["calls"])):
        got = _eval_vals(e, ci)
        if got and not math.isinf(got[1]) and not math.isclose(got[1], math.exp(got[0]), rel_tol=1e-4):
            return True
    return False


def _mode_left(e):
    return any(e.out(ci, "training_after") is not None and
               bool(e.out(ci, "training_after")) != bool(e.want_out(ci, "training_after"))
               for ci in range(len(e.pd["calls"])))


def _dropout_on(e):
    """The loss is off on a model in training mode only (dropout was on during evaluation)."""
    bad = [ci for ci in range(len(e.pd["calls"])) if _eval_vals(e, ci) and e.want_out(ci, "loss") is not None
           and abs(_eval_vals(e, ci)[0] - float(e.want_out(ci, "loss"))) > 1e-4]
    return bool(bad) and all(e.args(ci)[1].get("train", True) for ci in bad) and \
        any(not e.args(ci)[1].get("train", True) for ci in range(len(e.pd["calls"])))


EVAL_DIAGNOSES = [
    when("fewer than context_length + 1 tokens must raise ValueError (there is no window to "
         "evaluate); yours did not.", lambda e: any(
             k.endswith(".raised") and not bool(v) for k, v in e._got["caps"].items())),
    when("the model returns a tuple (09's ModernDecoderLM gives (logits, cache)): take its first "
         "element as the logits.", lambda e: "tuple" in e.error),
    when("the perplexity is exp of a SUMMED loss: perplexity = exp(mean loss per token).",
         _ppl_of_sum),
    when("the perplexity must be exp(mean_loss), of the mean cross-entropy per predicted token.",
         _ppl_not_exp),
    when("the model was left in another mode than it was in: remember model.training, switch to "
         "model.eval() for the evaluation and back with model.train(was_training).", _mode_left),
    when("dropout was on during evaluation: call model.eval() before the forward passes (and "
         "restore the mode afterwards).", _dropout_on),
    when("the mean loss is off: use the windows data[i : i + T + 1] for i = 0, T+1, 2(T+1), ... "
         "(no token shared, a last partial window dropped), and average the cross-entropy over "
         "EVERY predicted token (a sum over the batches divided by the number of tokens, not a "
         "mean of per-batch means).", lambda e: any(
             _eval_vals(e, ci) and e.want_out(ci, "loss") is not None and
             abs(_eval_vals(e, ci)[0] - float(e.want_out(ci, "loss"))) > 1e-4
             for ci in range(len(e.pd["calls"])))),
]


# -- the exercises -----------------------------------------------------------------------------

def _s(offset):
    """A seed for the procedure, drawn from the run's generator (a plain int in the plan)."""
    return given(lambda g: int(torch.randint(0, 2**31 - 1, (1,), generator=g)) + offset, "a seed")


def _resume(kind, diagnose, seed, steps, what):
    """save_checkpoint or load_checkpoint: one probe, the next 6 losses of a resumed run bit for bit."""
    name = f"{kind}_checkpoint"
    return Exercise(name, ref=f"training.{name}", diagnose=diagnose, graded=grades(resume=1),
                    probes=[Probe("resume", ("resume",), [_run(kind, seed, steps, 6)],
                                  what=f"{what}: the next 6 losses bit for bit")])


EXERCISES = [
    Exercise("get_batch", ref="training.get_batch", diagnose=BATCH_DIAGNOSES,
             graded=grades(shift=1, bounds=(1, 1201), device=1),
             probes=[
        Probe("shift", ("shift",),
              [_run("batch", _s(1), 200, 6, 12), _run("batch", _s(2), 50, 3, 7, numpy=True),
               _run("batch", _s(25), 70000, 5, 9, dtype="uint16")],
              what="x a window of the data, y the same window one token on (a tensor, a NumPy array, "
                   "NumPy uint16 ids as nanoGPT stores them)"),
        Probe("bounds", ("bounds",),
              [_run("batch", _s(3), 20, 8, 15, calls=40), _run("batch", _s(4), 9, 4, 8, calls=10)],
              what="every start from 0 to len(data) - T - 1 drawn, none past the end; the generator followed"),
        Probe("device", (shapes("device"),),
              [_run("batch", _s(5), 40, 2, 5, device="meta")],
              what="x and y on the requested device (here 'meta'), LongTensors (B, T)"),
    ]),
    Exercise("AdamW", ref="training.AdamW", diagnose=ADAMW_DIAGNOSES, shortcuts=("adamw",),
             graded=grades(steps=(2, 1202), weight_decay=1, state=(1, 1206)),
             probes=[
        Probe("steps", ("steps",),
              [_run("optimizer", _s(6), 100, {}),
               _run("optimizer", _s(7), 60, {"lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.0})],
              accept=_cs336_form,
              what="100 steps on a small network, equal to torch.optim.AdamW (defaults; other betas and eps)"),
        Probe("decay", ("weight_decay",),
              [_run("optimizer", _s(8), 25, {"lr": 0.05, "weight_decay": 0.5}),
               _run("optimizer", _s(9), 25, {"lr": 0.02, "betas": (0.9, 0.99), "weight_decay": 2.0})],
              accept=_cs336_form, what="strong weight decay: decoupled, scaled by lr"),
        Probe("state", ("state",),
              [_run("optimizer", _s(22), 40, {"lr": 0.01}, schedule=True),
               _run("optimizer", _s(23), 30, {"lr": 3e-3, "weight_decay": 0.1}, resume_at=12),
               _run("optimizer", _s(24), 20, {"lr": 0.02, "betas": (0.9, 0.95)}, schedule=True, resume_at=8)],
              accept=_cs336_form,
              what="the learning rate of a schedule read at every step; the moments carried by "
                   "state_dict() into a new optimizer"),
    ]),
    Exercise("cosine_schedule", ref="training.cosine_schedule", diagnose=SCHEDULE_DIAGNOSES,
             graded=grades(warmup=1, cosine=(1, 1203)),
             shortcuts=("lr_scheduler",), probes=[
        Probe("warmup", ("warmup",),
              [_run("schedule", [0, 1, 5, 9, 10, 11], 1e-3, 1e-4, 10, 100),
               _run("schedule", [0, 1, 2, 3, 4], 0.5, 0.0, 4, 8)],
              what="warm-up: 0 at step 0, max_lr at warmup_steps"),
        Probe("cosine", ("cosine",),
              [_run("schedule", [10, 25, 55, 70, 99, 100, 101, 150, 1000], 1e-3, 1e-4, 10, 100),
               _run("schedule", list(range(0, 40)), 6e-4, 6e-5, 7, 31)],
              atol=1e-9, rtol=1e-7, what="cosine from max_lr to min_lr at cosine_steps, min_lr after"),
    ]),
    Exercise("clip_grad_norm", ref="training.clip_grad_norm", diagnose=CLIP_DIAGNOSES,
             graded=grades(values=(2, 1204), returns=1),
             shortcuts=("clip_grad_norm",), probes=[
        Probe("values", ("values",),
              [_run("clip", _s(10), 1.0, 1.0), _run("clip", _s(11), 100.0, 1.0),
               _run("clip", _s(12), 0.5, 3.0, as_generator=True)],
              what="one norm over every gradient; clipped when above max_norm only; a generator of parameters"),
        Probe("returns", ("returns",),
              [_run("clip", _s(13), 2.0, 2.0), _run("clip", _s(14), 50.0, 0.5)],
              what="the norm before clipping is returned"),
    ]),
    _resume("save", SAVE_DIAGNOSES, _s(15), 7,
            "saved after 7 AdamW steps, read back into a fresh model and optimizer"),
    _resume("load", LOAD_DIAGNOSES, _s(16), 5,
            "a checkpoint after 5 AdamW steps loaded into a fresh model and optimizer"),
    Exercise("evaluate", ref="training.evaluate", diagnose=EVAL_DIAGNOSES,
             graded=grades(loss=(2, 1205), mode=1),
             probes=[
        Probe("loss", ("loss",),
              [_run("evaluate", _s(17), 11, 300, 9, 4), _run("evaluate", _s(18), 7, 101, 4, 32, tuple_out=True,
                                                          numpy=True),
               _run("evaluate", _s(19), 13, 64, 7, 3, train=False)],
              what="mean loss over non-overlapping windows and every predicted token; perplexity = exp(mean)"),
        Probe("mode", ("mode",),
              [_run("evaluate", _s(20), 9, 60, 5, 2, train=True), _run("evaluate", _s(21), 9, 60, 5, 2, train=False),
               call(fixture("toy_lm", 5, 4), [1, 2, 3], 3, raises=True)],
              what="the mode restored; fewer than T + 1 tokens raise ValueError"),
    ]),
]
