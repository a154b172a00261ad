"""Catalogue for 12_training: realistic mistakes and correct variants.

Each entry is a solution cell of solutions/src/12_training.py with one change (`_edit`), so an
entry reads as the mistake it makes: the line that is wrong and what it should be.
"""
import re

from . import REPO, Mistake, Variant

ASSIGNMENT = "12_training"
EXERCISES = ["get_batch", "AdamW", "cosine_schedule", "clip_grad_norm", "save_checkpoint",
             "load_checkpoint", "evaluate"]


def _solution(name):
    src = (REPO / "solutions" / "src" / "12_training.py").read_text(encoding="utf-8")
    cell = re.search(rf"^# %% \[solution\] {name}\n(.*?)(?=^# %%)", src, re.S | re.M).group(1)
    return "\n".join(ln for ln in cell.splitlines() if "### BEGIN SOLUTION" not in ln
                     and "### END SOLUTION" not in ln) + "\n"


BATCH, ADAM, SCHED, CLIP, SAVE, LOAD, EVAL = (_solution(n) for n in EXERCISES)


def _edit(code, *swaps):
    for old, new in zip(swaps[::2], swaps[1::2]):
        assert old in code, f"catalogue edit does not apply: {old!r}"
        code = code.replace(old, new, 1)
    return code


_STARTS = "starts = torch.randint(0, len(data) - context_length, (batch_size,), generator=generator)"
_Y = "y = data[starts[:, None] + offsets + 1]      # (B, T): the next token of each position"
_DECAY = "p.mul_(1 - lr * wd)                                # decoupled decay, first"
_M = "m.mul_(b1).add_(p.grad, alpha=1 - b1)"
_V = "v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)"
_STEP = ("denom = (v / (1 - b2 ** t)).sqrt_().add_(eps)\n"
         "                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))")
_COS = "progress = (step - warmup_steps) / (cosine_steps - warmup_steps)"
_GRADS = "grads = [p.grad for p in parameters if p.grad is not None]"
_TOTAL = "total = torch.sqrt(sum((g.detach().float() ** 2).sum() for g in grads))"
_SAVE = 'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)'
_CE = ('total += F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), w[:, 1:].reshape(-1),\n'
       '                                         reduction="sum").item()')

MISTAKES = [
    # get_batch
    Mistake("get_batch", "targets not shifted (y = x)", r"not shifted",
            _edit(BATCH, _Y, "y = x.clone()")),
    Mistake("get_batch", "windows that run past the end (starts up to len(data) - T)", r"past the end",
            _edit(BATCH, _STARTS, "starts = torch.randint(0, len(data) - context_length + 1, (batch_size,), generator=generator)")),
    Mistake("get_batch", "the last valid start never drawn (exclusive bound taken as inclusive)",
            r"last valid start",
            _edit(BATCH, _STARTS, "starts = torch.randint(0, len(data) - context_length - 1, (batch_size,), generator=generator)")),
    Mistake("get_batch", "y shifted by two tokens", r"not x shifted by one",
            _edit(BATCH, _Y, "y = data[starts[:, None] + offsets + 2]")),
    Mistake("get_batch", "the generator ignored (global RNG)", r"generator",
            _edit(BATCH, _STARTS, "starts = torch.randint(0, len(data) - context_length, (batch_size,))")),
    Mistake("get_batch", "the device ignored", r"device",
            _edit(BATCH, "return x.to(device), y.to(device)", "return x, y")),
    Mistake("get_batch", "y taken from the window before (shifted the wrong way)", r"not x shifted by one|not shifted",
            _edit(BATCH, _Y, "y = data[(starts[:, None] + offsets - 1).clamp(min=0)]")),
    Mistake("get_batch", "one start drawn for the whole batch (every row the same window)", r"same offset",
            _edit(BATCH, _STARTS, "starts = torch.randint(0, len(data) - context_length, (1,), generator=generator)"
                  ".expand(batch_size)")),
    Mistake("get_batch", "only starts at multiples of the context length (non-overlapping windows)",
            r"multiples of context_length",
            _edit(BATCH, _STARTS, "starts = torch.randint(0, (len(data) - 1) // context_length, (batch_size,), "
                  "generator=generator) * context_length")),
    Mistake("get_batch", "NumPy windows turned into tensors of the data's own dtype (uint16 ids stay uint16)",
            r"LongTensors",
            _edit(BATCH, "data = torch.as_tensor(data, dtype=torch.long)\n", "import numpy as np\n",
                  "x = data[starts[:, None] + offsets]          # (B, T)",
                  "x = torch.as_tensor(np.asarray(data)[(starts[:, None] + offsets).numpy()])",
                  _Y, "y = torch.as_tensor(np.asarray(data)[(starts[:, None] + offsets + 1).numpy()])")),
    # AdamW
    Mistake("AdamW", "Adam's bias correction missing", r"bias correction",
            _edit(ADAM, _STEP, "p.addcdiv_(m, v.sqrt() + eps, value=-lr)")),
    Mistake("AdamW", "weight decay coupled to the gradient (L2) instead of decoupled", r"coupled to the gradient",
            _edit(ADAM, _DECAY, "g = p.grad + wd * p", _M, "m.mul_(b1).add_(g, alpha=1 - b1)",
                  _V, "v.mul_(b2).addcmul_(g, g, value=1 - b2)")),
    Mistake("AdamW", "the learning rate read from self.defaults (a schedule does nothing)", r"read once",
            _edit(ADAM, 'lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]',
                  'lr, (b1, b2), eps, wd = self.defaults["lr"], group["betas"], group["eps"], group["weight_decay"]')),
    Mistake("AdamW", "the learning rate kept in __init__ (self.lr)", r"read once",
            _edit(ADAM, "super().__init__(params, defaults)", "super().__init__(params, defaults)\n        self.lr = lr",
                  'lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]',
                  'lr, (b1, b2), eps, wd = self.lr, group["betas"], group["eps"], group["weight_decay"]')),
    Mistake("AdamW", "the moments kept in an attribute of the optimizer, not in self.state",
            r"not in self\.state|moments were lost",
            _edit(ADAM, "super().__init__(params, defaults)", "super().__init__(params, defaults)\n        self.moments = {}",
                  "state = self.state[p]", "state = self.moments.setdefault(p, {})")),
    Mistake("AdamW", "weight decay forgotten", r"weight decay is missing",
            _edit(ADAM, _DECAY, "pass")),
    Mistake("AdamW", "weight decay not scaled by the learning rate", r"not scaled by the learning rate",
            _edit(ADAM, _DECAY, "p.mul_(1 - wd)")),
    Mistake("AdamW", "the optimizer built without super().__init__", r"torch.optim.Optimizer|param_groups|defaults",
            _edit(ADAM, "super().__init__(params, defaults)", "self.params = list(params)\n        self.defaults = defaults")),
    # cosine_schedule
    Mistake("cosine_schedule", "warm-up off by one ((t + 1) / warmup_steps)", r"off by one",
            _edit(SCHED, "return max_lr * step / warmup_steps", "return max_lr * (step + 1) / warmup_steps")),
    Mistake("cosine_schedule", "warm-up divided by warmup_steps - 1", r"off by one",
            _edit(SCHED, "return max_lr * step / warmup_steps", "return max_lr * step / (warmup_steps - 1)")),
    Mistake("cosine_schedule", "cosine not reaching the minimum (progress over cosine_steps)",
            r"does not reach min_lr",
            _edit(SCHED, _COS, "progress = (step - warmup_steps) / cosine_steps")),
    Mistake("cosine_schedule", "cosine started at step 0", r"starts at step 0",
            _edit(SCHED, _COS, "progress = step / cosine_steps")),
    Mistake("cosine_schedule", "min_lr left out of the cosine", r"min_lr is missing",
            _edit(SCHED, "return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
                  "return 0.5 * (1 + math.cos(math.pi * progress)) * max_lr")),
    Mistake("cosine_schedule", "no floor after cosine_steps", r"stay at min_lr",
            _edit(SCHED, "    if step > cosine_steps:\n        return min_lr\n", "")),
    Mistake("cosine_schedule", "a whole cosine period (2 pi)", r"whole period",
            _edit(SCHED, "math.cos(math.pi * progress)", "math.cos(2 * math.pi * progress)")),
    # clip_grad_norm
    Mistake("clip_grad_norm", "clipping per parameter instead of globally", r"each parameter on its own",
            "def clip_grad_norm(parameters, max_norm):\n"
            "    total = 0.0\n"
            "    for p in parameters:\n"
            "        if p.grad is None:\n            continue\n"
            "        n = p.grad.norm()\n"
            "        total += n.item() ** 2\n"
            "        p.grad.mul_(torch.clamp(max_norm / (n + 1e-6), max=1.0))\n"
            "    return total ** 0.5\n"),
    Mistake("clip_grad_norm", "returning the norm after clipping", r"after clipping",
            _edit(CLIP, "    return total\n", "    return torch.sqrt(sum((g ** 2).sum() for g in grads))\n")),
    Mistake("clip_grad_norm", "always rescaling to max_norm", r"below max_norm",
            _edit(CLIP, "scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)", "scale = max_norm / (total + 1e-6)")),
    Mistake("clip_grad_norm", "total norm as the sum of the parameters' norms", r"sum of the parameters' norms",
            _edit(CLIP, _TOTAL, "total = sum(g.norm() for g in grads)")),
    Mistake("clip_grad_norm", "a generator of parameters gone through twice", r"generator",
            "def clip_grad_norm(parameters, max_norm):\n"
            "    total = torch.sqrt(sum((p.grad ** 2).sum() for p in parameters if p.grad is not None))\n"
            "    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)\n"
            "    for p in parameters:\n        if p.grad is not None:\n            p.grad.mul_(scale)\n"
            "    return total\n"),
    Mistake("clip_grad_norm", "gradients scaled out of place (p.grad unchanged)", r"in place|not changed",
            _edit(CLIP, "g.mul_(scale.to(g.dtype))", "g = g * scale")),
    Mistake("clip_grad_norm", "the norm of the weights instead of their gradients", r"norm of the parameters",
            "def clip_grad_norm(parameters, max_norm):\n"
            "    params = [p for p in parameters if p.grad is not None]\n"
            "    total = torch.sqrt(sum((p.detach() ** 2).sum() for p in params))\n"
            "    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)\n"
            "    for p in params:\n        p.grad.mul_(scale)\n"
            "    return total\n"),
    Mistake("clip_grad_norm", "clipping by value (clamp each entry), not by norm", r"clipping by value",
            _edit(CLIP, "    for g in grads:\n        g.mul_(scale.to(g.dtype))",
                  "    for g in grads:\n        g.clamp_(-max_norm, max_norm)")),
    Mistake("clip_grad_norm", "the squared norm returned", r"squared norm",
            _edit(CLIP, "    return total\n", "    return total ** 2\n")),
    Mistake("clip_grad_norm", "parameters without a gradient not skipped", r"without a gradient",
            _edit(CLIP, _GRADS, "grads = [p.grad for p in parameters]")),
    # save_checkpoint
    Mistake("save_checkpoint", "a checkpoint without the optimizer state", r"no optimizer state",
            _edit(SAVE, _SAVE, 'torch.save({"model": model.state_dict(), "step": step}, path)')),
    Mistake("save_checkpoint", "a checkpoint without the step", r"no step",
            _edit(SAVE, _SAVE, 'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)')),
    Mistake("save_checkpoint", "the model object saved, not its state_dict", r"model|torch.save|state_dict",
            _edit(SAVE, _SAVE, 'torch.save({"model": model, "optimizer": optimizer.state_dict(), "step": step}, path)')),
    Mistake("save_checkpoint", "the step saved one too far", r"step saved is not the step given",
            _edit(SAVE, _SAVE, 'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, path)')),
    Mistake("save_checkpoint", "the optimizer's param_groups only (no moments)", r"continue the loss curve|optimizer",
            _edit(SAVE, _SAVE, 'torch.save({"model": model.state_dict(), "optimizer": {"state": {}, '
                  '"param_groups": optimizer.state_dict()["param_groups"]}, "step": step}, path)')),
    Mistake("save_checkpoint", "the state saved as a tuple, not the stated dict", r"dict|torch.save",
            _edit(SAVE, _SAVE, 'torch.save((model.state_dict(), optimizer.state_dict(), step), path)')),
    # load_checkpoint
    Mistake("load_checkpoint", "the optimizer state not restored", r"optimizer state was not restored",
            _edit(LOAD, '    optimizer.load_state_dict(ckpt["optimizer"])\n', "")),
    Mistake("load_checkpoint", "the step not returned", r"return the step",
            _edit(LOAD, 'return ckpt["step"]', "return 0")),
    Mistake("load_checkpoint", "the model weights not restored", r"continue the loss curve",
            _edit(LOAD, '    model.load_state_dict(ckpt["model"])\n', "")),
    Mistake("load_checkpoint", "the weights loaded into a copy of the model", r"continue the loss curve",
            _edit(LOAD, 'model.load_state_dict(ckpt["model"])',
                  'import copy\n    copy.deepcopy(model).load_state_dict(ckpt["model"])')),
    Mistake("load_checkpoint", "the step returned one too far", r"return the step",
            _edit(LOAD, 'return ckpt["step"]', 'return ckpt["step"] + 1')),
    Mistake("load_checkpoint", "the optimizer's moments restored but not its step counts", r"continue the loss curve|optimizer",
            _edit(LOAD, 'optimizer.load_state_dict(ckpt["optimizer"])',
                  'sd = ckpt["optimizer"]\n    for s in sd["state"].values():\n'
                  '        s["step"] = s["step"] * 0\n    optimizer.load_state_dict(sd)')),
    # evaluate
    Mistake("evaluate", "perplexity as exp of a summed loss", r"SUMMED",
            _edit(EVAL, "return mean, math.exp(mean)", "return mean, float(torch.exp(torch.tensor(total)))")),
    Mistake("evaluate", "a mean of per-batch means", r"mean loss is off",
            _edit(EVAL, _CE, "total += F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), w[:, 1:].reshape(-1)).item()",
                  "count += w[:, 1:].numel()", "count += 1")),
    Mistake("evaluate", "overlapping windows (stride T instead of T + 1)", r"mean loss is off",
            _edit(EVAL, "windows = data[: n * (T + 1)].view(n, T + 1)",
                  "windows = data.unfold(0, T + 1, T)\n    n = len(windows)")),
    Mistake("evaluate", "dropout left on (no model.eval())", r"dropout was on|mode|mean loss is off",
            _edit(EVAL, "    model.eval()\n", "")),
    Mistake("evaluate", "the model left in eval mode", r"left in another mode",
            _edit(EVAL, "model.train(was_training)", "pass")),
    Mistake("evaluate", "a tuple output used as the logits", r"tuple",
            _edit(EVAL, "logits = out[0] if isinstance(out, (tuple, list)) else out", "logits = out")),
    Mistake("evaluate", "no ValueError on too little data", r"ValueError",
            _edit(EVAL, "    if n == 0:\n", "    if n < 0:\n", "mean = total / count", "mean = total / max(count, 1)")),
    Mistake("evaluate", "perplexity as the mean of exp(loss) per batch", r"exp\(mean_loss\)|mean cross-entropy",
            _edit(EVAL, "    total, count = 0.0, 0\n", "    total, count, pp = 0.0, 0, []\n",
                  "count += w[:, 1:].numel()", "count += w[:, 1:].numel()\n                pp.append(math.exp(F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1)).item()))",
                  "return mean, math.exp(mean)", "return mean, sum(pp) / len(pp)")),
    # the shortcuts the notebook forbids: the kernel's guard and the grader's scan both name them
    Mistake("AdamW", "shortcut: PyTorch's own torch.optim.AdamW under the exercise's name", r"shortcut|torch\.optim\.AdamW", """
class AdamW(torch.optim.AdamW):
    \"\"\"Decoupled weight decay: PyTorch's own.\"\"\"
"""),
    Mistake("clip_grad_norm", "shortcut: calls torch.nn.utils.clip_grad_norm_", r"shortcut|clip_grad_norm_", """
def clip_grad_norm(parameters, max_norm):
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
"""),
    Mistake("cosine_schedule", "shortcut: steps a torch.optim.lr_scheduler.CosineAnnealingLR", r"shortcut|lr_scheduler", """
def cosine_schedule(step, max_lr, min_lr, warmup_steps, cosine_steps):
    if step < warmup_steps:
        return max_lr * step / warmup_steps
    if step > cosine_steps:
        return min_lr
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=max_lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cosine_steps - warmup_steps, eta_min=min_lr)
    for _ in range(step - warmup_steps):
        opt.step()
        sched.step()
    return opt.param_groups[0]["lr"]
"""),
]

_ADAM_METHOD = '''class AdamW(torch.optim.Optimizer):
    """AdamW with the per-parameter update in a method of its own."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def _update(self, p, hp):
        st = self.state[p]
        if "step" not in st:
            st.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
        st["step"] += 1
        beta1, beta2 = hp["betas"]
        g, k = p.grad, st["step"]
        st["exp_avg"].lerp_(g, 1 - beta1)
        st["exp_avg_sq"].mul_(beta2).add_(g * g * (1 - beta2))
        m_hat = st["exp_avg"] / (1 - beta1 ** k)
        v_hat = st["exp_avg_sq"] / (1 - beta2 ** k)
        p.sub_(hp["lr"] * hp["weight_decay"] * p)
        p.sub_(hp["lr"] * m_hat / (v_hat.sqrt() + hp["eps"]))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for hp in self.param_groups:
            for p in hp["params"]:
                if p.grad is not None:
                    self._update(p, hp)
        return loss
'''


VARIANTS = [
    # AdamW in the other documented forms (the checks accept them and name them)
    Variant("AdamW", "weight decay after the Adam step (Hugging Face's order)",
            _edit(ADAM, _DECAY, "pass", "p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))",
                  "p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))\n                p.mul_(1 - lr * wd)")),
    Variant("AdamW", "the CS336 handout's AdamW: bias corrections folded into the step size, decay after",
            _edit(ADAM, _DECAY, "pass", _STEP,
                  "alpha = lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)\n"
                  "                p.addcdiv_(m, v.sqrt().add_(eps), value=-alpha)\n"
                  "                p.sub_(lr * wd * p)")),
    Variant("AdamW", "the bias corrections folded into the step size (Kingma and Ba, section 2), decay first",
            _edit(ADAM, _STEP, "alpha = lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)\n"
                  "                p.addcdiv_(m, v.sqrt().add_(eps), value=-alpha)")),
    # get_batch
    Variant("get_batch", "a list comprehension of slices and torch.stack",
            _edit(BATCH, "offsets = torch.arange(context_length)\n", "\n",
                  "x = data[starts[:, None] + offsets]          # (B, T)",
                  "x = torch.stack([data[s:s + context_length] for s in starts.tolist()])",
                  _Y, "y = torch.stack([data[s + 1:s + 1 + context_length] for s in starts.tolist()])")),
    Variant("get_batch", "one window of T + 1 tokens, split", _edit(
        BATCH, "x = data[starts[:, None] + offsets]          # (B, T)",
        "w = data[starts[:, None] + torch.arange(context_length + 1)]\n    x = w[:, :-1]", _Y, "y = w[:, 1:]")),
    Variant("get_batch", "NumPy indexing, then torch.from_numpy", _edit(
        BATCH, "data = torch.as_tensor(data, dtype=torch.long)\n", "import numpy as np\n    arr = np.asarray(data)\n",
        _STARTS, "starts = torch.randint(0, len(arr) - context_length, (batch_size,), generator=generator).numpy()",
        "offsets = torch.arange(context_length)", "offsets = np.arange(context_length)",
        "x = data[starts[:, None] + offsets]          # (B, T)", "x = torch.from_numpy(arr[starts[:, None] + offsets].astype(np.int64))",
        _Y, "y = torch.from_numpy(arr[starts[:, None] + offsets + 1].astype(np.int64))")),
    # AdamW
    Variant("AdamW", "out-of-place tensor arithmetic, moments replaced each step", _edit(
        ADAM, _DECAY, "p.copy_(p * (1 - lr * wd))", _M, 'state["exp_avg"] = m = b1 * m + (1 - b1) * p.grad',
        _V, 'state["exp_avg_sq"] = v = b2 * v + (1 - b2) * p.grad ** 2',
        _STEP, "p.copy_(p - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps))")),
    Variant("AdamW", "the update in a method of its own, bias-corrected moments named", _ADAM_METHOD),
    Variant("AdamW", "lerp for both moments, the step count as a tensor, out-of-place step", _edit(
        ADAM, 'state["step"] = 0', 'state["step"] = torch.tensor(0.0)',
        "t, m, v = state[\"step\"], state[\"exp_avg\"], state[\"exp_avg_sq\"]",
        "t, m, v = state[\"step\"].item(), state[\"exp_avg\"], state[\"exp_avg_sq\"]",
        _M, "m.lerp_(p.grad, 1 - b1)", _V, "v.lerp_(p.grad * p.grad, 1 - b2)",
        _STEP, "p.add_(-lr / (1 - b1 ** t) * m / ((v / (1 - b2 ** t)).sqrt() + eps))",
        _DECAY, "p.sub_(lr * wd * p)")),
    # cosine_schedule
    Variant("cosine_schedule", "one expression per phase, with numpy", _edit(
        SCHED, "return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
        "import numpy as np\n    return float(min_lr + (max_lr - min_lr) * (1 + np.cos(np.pi * progress)) / 2)")),
    Variant("cosine_schedule", "progress clamped to [0, 1] instead of a branch", _edit(
        SCHED, "    if step > cosine_steps:\n        return min_lr\n", "",
        _COS, "progress = min(1.0, (step - warmup_steps) / (cosine_steps - warmup_steps))")),
    Variant("cosine_schedule", "cos^2 form: (1 + cos x) / 2 = cos^2(x / 2)", _edit(
        SCHED, "return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)",
        "return min_lr + math.cos(math.pi * progress / 2) ** 2 * (max_lr - min_lr)")),
    # clip_grad_norm
    Variant("clip_grad_norm", "torch.linalg.vector_norm of the per-parameter norms", _edit(
        CLIP, _TOTAL, "total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))")),
    Variant("clip_grad_norm", "a Python float norm and an if", _edit(
        CLIP, _TOTAL, "total = math.sqrt(sum(float((g * g).sum()) for g in grads))",
        "scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)\n    for g in grads:\n        g.mul_(scale.to(g.dtype))",
        "if total > max_norm:\n        for g in grads:\n            g.mul_(max_norm / (total + 1e-6))")),
    Variant("clip_grad_norm", "concatenated gradients, float64 inside", _edit(
        CLIP, _TOTAL, "total = torch.cat([g.reshape(-1).double() for g in grads]).norm().float()")),
    # save_checkpoint
    Variant("save_checkpoint", "dict() with keywords, an int step and an extra key", _edit(
        SAVE, _SAVE, 'torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(), '
        'step=int(step), note="run 1"), path)')),
    Variant("save_checkpoint", "deep copies of the state dicts", _edit(
        SAVE, _SAVE, 'import copy\n    ck = dict(model=copy.deepcopy(model.state_dict()), '
        'optimizer=copy.deepcopy(optimizer.state_dict()), step=step)\n    torch.save(ck, path)')),
    Variant("save_checkpoint", "an older pickle protocol", _edit(
        SAVE, _SAVE, 'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), '
        '"step": step}, path, pickle_protocol=2)')),
    # load_checkpoint
    Variant("load_checkpoint", "map_location='cpu', the keys read one by one", _edit(
        LOAD, "ckpt = torch.load(path, weights_only=False)",
        'ckpt = torch.load(path, map_location="cpu", weights_only=False)\n    step = ckpt.get("step")',
        'return ckpt["step"]', "return step")),
    Variant("load_checkpoint", "weights_only=True (plain tensors and numbers only)", _edit(
        LOAD, "ckpt = torch.load(path, weights_only=False)", "ckpt = torch.load(path, weights_only=True)")),
    Variant("load_checkpoint", "strict loading and an int step", _edit(
        LOAD, 'model.load_state_dict(ckpt["model"])', 'model.load_state_dict(ckpt["model"], strict=True)',
        'return ckpt["step"]', 'return int(ckpt["step"])')),
    # evaluate
    Variant("evaluate", "log_softmax and gather, float64 sums", _edit(
        EVAL, _CE, "lp = torch.log_softmax(logits.double(), -1)\n"
        "                total += -lp.gather(-1, w[:, 1:, None]).sum().item()")),
    Variant("evaluate", "all windows in one list, torch.inference_mode", _edit(
        EVAL, "with torch.no_grad():", "with torch.inference_mode():")),
    Variant("evaluate", "a list of per-token losses, averaged at the end", _edit(
        EVAL, "    total, count = 0.0, 0\n", "    losses = []\n",
        _CE, 'losses.append(F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="none"))',
        "                count += w[:, 1:].numel()\n", "",
        "mean = total / count", "mean = torch.cat(losses).double().mean().item()")),
]
