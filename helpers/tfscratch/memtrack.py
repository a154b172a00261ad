"""See every tensor a piece of PyTorch code creates (notebook 10).

PyTorch routes every operation through its dispatcher; a `TorchDispatchMode` is a hook on it
that sees each operation (`aten.mm`, `aten.exp`, `aten.tril`, factory functions such as
`aten.ones` included) together with the tensors it produced. Two tools are built on it:

- `TensorRecorder` keeps, for every operation, its name and the shapes of its outputs (and,
  for reductions, the shape and axes of the input). The checks of notebook 10 use it to prove
  that blockwise attention never creates an (Lq, Lk) matrix.
- `peak_memory(fn, *args)` runs `fn` and returns its result and the peak of the bytes held by
  the tensors it created and that were still alive (a tensor counts from the operation that
  makes it until Python frees it; views share their base's bytes). CPU PyTorch has no
  allocator statistics of its own (`torch.cuda.max_memory_allocated` is CUDA only), and
  `tracemalloc` does not see tensor memory; this measures what the tensors themselves hold.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["TensorRecorder", "OpRecord", "peak_memory", "REDUCTIONS"]

# reductions whose input size along the reduced axis tells how much a step "looks at"
REDUCTIONS = {"amax", "amin", "max", "min", "sum", "mean", "logsumexp", "_softmax",
              "_log_softmax", "softmax", "log_softmax", "cumsum", "cummax", "prod", "argmax",
              "sort", "topk", "norm", "linalg_vector_norm", "nansum", "std", "var"}


@dataclass
class OpRecord:
    op: str  # e.g. "aten.mm.default"
    out_shapes: list = field(default_factory=list)  # shapes of the output tensors
    in_shape: tuple | None = None  # reductions: the input's shape
    dims: tuple | None = None  # reductions: the reduced axes (non-negative), all when None

    @property
    def base(self) -> str:
        parts = self.op.split(".")
        return parts[1] if len(parts) > 1 else parts[0]


def _dims(func, args, kwargs, ndim):
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(dim, bool):  # e.g. a keepdim passed positionally after a full reduction
        dim = None
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    try:
        return tuple(sorted(d % max(ndim, 1) for d in dim))
    except TypeError:
        return tuple(range(ndim))


class TensorRecorder(TorchDispatchMode):
    """Record every operation run inside the `with` block and the shapes it produced."""

    def __init__(self):
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rec = OpRecord(str(func))
        flat, _ = tree_flatten(out)
        rec.out_shapes = [tuple(t.shape) for t in flat if isinstance(t, torch.Tensor)]
        if rec.base in REDUCTIONS and args and isinstance(args[0], torch.Tensor):
            rec.in_shape = tuple(args[0].shape)
            rec.dims = _dims(func, args, kwargs, args[0].dim())
        self.records.append(rec)
        return out


class _PeakMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live: dict = {}  # storage pointer -> [bytes, number of live tensors using it]
        self.current = 0
        self.peak = 0

    def _release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        for t in flat:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key == 0:
                continue
            if key not in self.live:
                self.live[key] = [st.nbytes(), 0]
                self.current += st.nbytes()
                self.peak = max(self.peak, self.current)
            self.live[key][1] += 1
            weakref.finalize(t, self._release, key)
        return out


def peak_memory(fn, *args, grad=False, **kwargs):
    """(result, peak bytes held by tensors that `fn` created), run under torch.no_grad(), or
    with autograd on when `grad=True` (then what autograd saves for the backward pass counts,
    and a `backward()` inside `fn` is measured too)."""
    mode = _PeakMode()
    with torch.set_grad_enabled(grad), mode:
        result = fn(*args, **kwargs)
    peak = mode.peak
    mode.live.clear()
    return result, peak
