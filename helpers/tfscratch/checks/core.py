"""Shared machinery for the checks that notebook test cells call.

Every check either prints one line starting with a tick and returns None, or raises
`CheckFailed` whose message says what is wrong, shows actual against expected, and names the
likely mistake. Nothing here writes to stderr (nbgrader scores a test cell with stderr as 0),
and nothing returns a number (a number as a cell's last value becomes partial credit).

What the student sees (`tfscratch.checks.display`): in IPython, a `CheckFailed` renders as one
compact box (the check, its message, the student's own failing line) instead of a traceback
through this package, and an exercise that still raises NotImplementedError becomes `NotDone`,
one grey line. Both are still exceptions, so the cell still has an error output and nbgrader
still scores it 0.
"""
from __future__ import annotations

import contextlib
import random
import warnings

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..shortcuts import GROUPS as _ROWS

__all__ = [
    "CheckFailed", "ShortcutUsed", "fail", "passed", "seeded", "no_shortcuts", "call",
    "SHORTCUTS", "describe", "copy_mha_to_torch", "NotDone",
]


class CheckFailed(AssertionError):
    """A check found a difference. The message says what and the likely mistake."""

    def _render_traceback_(self):
        """IPython shows this instead of the traceback: one compact box (see display.py)."""
        from .display import render_failure
        return render_failure(self)


class NotDone(NotImplementedError):
    """The exercise still raises NotImplementedError: not done yet, which is not a mistake.
    Still an exception (the test cell fails and scores 0), shown as one grey line."""

    def __init__(self, name: str):
        super().__init__(f"{name}: not implemented yet")
        self.name = name

    def _render_traceback_(self):
        from .display import render_not_done
        return render_not_done(self)


class ShortcutUsed(CheckFailed):
    """The student's code called the PyTorch function this exercise asks you to write."""


def fail(msg: str):
    raise CheckFailed(msg)


def passed(msg: str) -> None:
    from .display import green
    print(green(f"\u2714 {msg}"))


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch and random inside the block, and restore the previous RNG states after it."""
    cpu_state = torch.random.get_rng_state()
    py_state = random.getstate()
    torch.default_generator.manual_seed(int(seed))  # CPU only: see specs.vm.seed
    random.seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu_state)
        random.setstate(py_state)


# What this guard refuses for each shortcut group, from the one table (tfscratch.shortcuts): the
# function names (matched on __name__, so torch.softmax, F.softmax, Tensor.softmax and
# nn.Softmax are all caught however imported), in the calling thread, and the nn classes whose
# forward raises. The probe machine (specs/vm.py) refuses the operators themselves, in every
# thread, in the kernel's checks and in the grader alike, so a spelling missing here is still
# caught there.
SHORTCUTS = {g: set(grp.names) for g, grp in _ROWS.items() if grp.names}
MODULE_SHORTCUTS = {g: grp.nn_classes for g, grp in _ROWS.items() if grp.nn_classes}
_HUMAN = {g: grp.label for g, grp in _ROWS.items()}


class _Guard(TorchFunctionMode):
    def __init__(self, names, label):
        super().__init__()
        self.names, self.label = names, label

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.names:
            raise ShortcutUsed(
                f"Shortcut used: your code called PyTorch's `{name}` ({self.label}). "
                "This exercise asks you to build it yourself from basic tensor operations.")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def no_shortcuts(*exercises: str):
    """While the block runs, the PyTorch shortcuts for `exercises` raise ShortcutUsed, and
    warnings are silenced so that nothing reaches stderr."""
    names = set().union(*(SHORTCUTS.get(e, set()) for e in exercises)) if exercises else set()
    label = ", ".join(_HUMAN[e] for e in exercises if e in _HUMAN)
    patched = []
    for e in exercises:
        for cls_name in MODULE_SHORTCUTS.get(e, ()):
            cls = getattr(nn, cls_name)

            def _blocked(self, *a, _n=cls_name, **k):
                raise ShortcutUsed(f"Shortcut used: your code ran nn.{_n}. This exercise asks "
                                   "you to build it yourself.")
            patched.append((cls, cls.__dict__["forward"]))
            cls.forward = _blocked
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if names:
                with _Guard(names, label):
                    yield
            else:
                yield
    finally:
        for cls, fwd in patched:
            cls.forward = fwd


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    return f"{type(x).__name__}"


def call(fn, *args, shortcuts=(), what=None, **kwargs):
    """Call the student's `fn` with the shortcut guard on. NotImplementedError becomes NotDone
    (the exercise is not done yet: one grey line, still a failure); any other exception becomes
    a CheckFailed that says which call failed (its box shows the student's failing line)."""
    what = what or getattr(fn, "__name__", "your code")
    try:
        with no_shortcuts(*shortcuts):
            return fn(*args, **kwargs)
    except (NotDone, CheckFailed):
        raise
    except NotImplementedError as e:
        from .display import raised_by_student, stub_name
        if raised_by_student(e):  # a stub, not PyTorch saying an op is unsupported
            raise NotDone(stub_name(e, fn)) from e
        shapes = ", ".join(describe(a) for a in args)
        raise CheckFailed(f"{what} raised {type(e).__name__}: {e}\n  called with: {shapes}") from e
    except Exception as e:  # noqa: BLE001 - report any crash in the student's code
        shapes = ", ".join(describe(a) for a in args)
        raise CheckFailed(f"{what} raised {type(e).__name__}: {e}\n  called with: {shapes}"
                          + _error_hint(e)) from e


_ERROR_HINTS = [
    ("must match the size of tensor", "Two shapes did not broadcast: a reduction without "
     "keepdim=True, or a transpose/view over the wrong axes, is the usual cause."),
    ("shapes cannot be multiplied", "A matrix product got incompatible shapes: check which "
     "axes you transposed and the in/out sizes of each nn.Linear."),
    ("view size is not compatible", "view() needs contiguous memory: call .contiguous() after "
     "a transpose, or use .reshape()."),
    ("is not defined", "A name is undefined: a typo, or a variable that only exists in another "
     "cell (restart the kernel and run all cells to catch these)."),
    ("Expected all tensors to be on the same device", "Create new tensors on the input's device "
     "(device=x.device) or register them as buffers."),
]


def _error_hint(e: Exception) -> str:
    text = str(e)
    for pat, hint in _ERROR_HINTS:
        if pat in text:
            return "\n" + hint
    return ""


def copy_mha_to_torch(mha, torch_mha: nn.MultiheadAttention):
    """Copy a course MultiHeadAttention (w_q, w_k, w_v, w_o) into nn.MultiheadAttention, whose
    in_proj_weight stacks [W_q; W_k; W_v] along dim 0."""
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([mha.w_q.weight, mha.w_k.weight, mha.w_v.weight]))
        if torch_mha.in_proj_bias is not None:
            torch_mha.in_proj_bias.copy_(torch.cat([mha.w_q.bias, mha.w_k.bias, mha.w_v.bias]))
        torch_mha.out_proj.weight.copy_(mha.w_o.weight)
        if torch_mha.out_proj.bias is not None:
            torch_mha.out_proj.bias.copy_(mha.w_o.bias)
