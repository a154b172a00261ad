"""The probe machine: runs one exercise's probe plan on an object and captures plain tensors.

The same code runs in two places:

- in the grading sandbox, in the independent check's own process (tfsgrade.check_process):
  a fresh `python -I` forked before any code of the student's exists, where `lock_guard`
  puts the shortcut guard on for good, then the student's cells are run, then the plan with
  its inputs arrives and `run_probes` captures plain tensors, written to the runner as `.npz`
  (never pickle);
- in the coordinator, on the course's reference object, with the same plan: what the
  reference captures is what the student's object should have captured.

In the check's process it imports torch, numpy and the standard library only, never the course
(imported from the package, it imports its stand-ins from `fixtures.py`).

A plan (JSON, plus its tensors in an npz) is a list of probes. A probe may construct the
target (`make`), load named parameters into it (`load`), put it in train or eval mode, then
make calls in order; each call's outputs are captured, optionally the gradients of the
inputs that ask for them for a given upstream gradient (`backward`), and whether it raised
(a call that is expected to raise says `"raises": true`). After the calls, named attributes
(`after`), parameter names and shapes (`params`) and parameter gradients are captured.

While a plan's probes run, the shortcut groups it names (`"forbid"`: the exercise's own
PyTorch built-ins, rows of tfscratch.shortcuts carried by the plan) are refused at the operator level, in every thread (`_Guard`);
a call with `"memory_limit": bytes` measures how much the whole process's resident memory grows
while it runs (every thread counted) and captures the growth when it passes that allowance.
A process running beside a guarded plan is the sandbox runner's to see (it watches the
sandbox's processes from outside the check's process).

Values in args/kwargs: JSON scalars and lists, or {"$t": key} a tensor of the plan,
{"$tuple": [...]}, {"$dtype": "float64"}, {"$prev": [call, output_path]} an earlier call's
output (a KV cache), {"$ns": name} another object of the namespace, {"$fixture": name, ...}
an object built by this machine (`FIXTURES`, fixtures.py: stand-in models for decoding functions),
{"$generator": seed} a seeded torch.Generator.
"""
import base64
import io
import json
import os
import sys
import traceback
import types
import warnings

import numpy as np
import torch

MIME = "application/x-tfs-probe+json"


# -- tensors in and out -------------------------------------------------------------------

def pack(arrays: dict) -> str:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return base64.b64encode(buf.getvalue()).decode()


def unpack(text: str) -> dict:
    if not text:
        return {}
    with np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _np(t):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        t = t.float()
    return t.numpy().copy()


# -- stand-ins and drivers (FIXTURES, DRIVERS): fixtures.py. Imported from the package, this
# module imports them on the next line; the check's process has no such line (tfsgrade.verdict
# drops every line marked PACKAGE_ONLY and puts fixtures.py's text first, in this same module),
# so the machine that checks is the text the coordinator sent, whatever the package holds.
from tfscratch.specs.fixtures import DRIVERS, FIXTURES  # PACKAGE_ONLY


# -- the machine --------------------------------------------------------------------------

class _Ctx:
    def __init__(self, tensors, namespace):
        self.tensors, self.ns, self.outs = tensors, namespace, {}

    def value(self, v, want_grad=False):
        if isinstance(v, dict):
            if "$t" in v:
                t = torch.from_numpy(np.array(self.tensors[v["$t"]]))
                if v.get("cast") in ("bfloat16", "float16"):   # half precision, stored as float32
                    t = t.to(getattr(torch, v["cast"]))
                if v.get("device"):
                    t = t.to(v["device"])
                return t.requires_grad_(True) if want_grad else t
            if "$tuple" in v:
                return tuple(self.value(x) for x in v["$tuple"])
            if "$dtype" in v:
                return getattr(torch, v["$dtype"])
            if "$generator" in v:                    # a seeded generator for sampling functions
                return torch.Generator().manual_seed(int(v["$generator"]))
            if "$prev" in v:
                ci, path = v["$prev"]
                return _get(self.outs[ci], path)
            if "$ns" in v:
                return self.ns[v["$ns"]]
            if "$bytes" in v:                        # a token's bytes
                return bytes(v["$bytes"])
            if "$items" in v:                        # a dict whose keys are not strings ({id: bytes})
                return {k: self.value(x) for k, x in v["$items"]}
            if "$chunks" in v:                       # a text stream that counts what is read
                return Chunks(v["$chunks"], v.get("limit"))
            if "$fixture" in v:
                obj = FIXTURES[v["$fixture"]](*[self.value(a) for a in v.get("args", [])])
                _load(obj, {k: self.value(x) for k, x in v.get("load", {}).items()}, strict=True)
                return obj.eval()
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return v


class StreamReadTooFar(RuntimeError):
    pass


class Chunks:
    """An iterable of text chunks (a file read piece by piece) that refuses to be read past
    `limit` chunks: a call that must stream (yield its first results after reading a few
    chunks) shows that it reads everything first."""

    def __init__(self, chunks, limit=None):
        self.chunks, self.limit = list(chunks), limit

    def __iter__(self):
        for i, c in enumerate(self.chunks):
            if self.limit is not None and i >= self.limit:
                raise StreamReadTooFar(
                    f"read more than {self.limit} of the stream's {len(self.chunks)} chunks before "
                    "the first results were taken: yield as you read (a generator), do not read "
                    "the whole stream first")
            yield c


def _get(out, path):
    for p in str(path).split(".") if path != "" else []:
        if isinstance(out, (tuple, list)):
            out = out[int(p)]
        elif isinstance(out, dict):
            out = out[p]
        else:
            raise TypeError(f"expected a tuple or list (e.g. (output, weights)), got {type(out).__name__}")
    return out


def _load(module, state: dict, strict: bool = False):
    """Copy named tensors into the module's parameters (and buffers) of the same name."""
    own = dict(module.named_parameters(remove_duplicate=False))   # tied weights under both names
    own.update(dict(module.named_buffers()))
    missing = [k for k in state if k not in own]
    if missing:
        raise AttributeError(f"the module has no parameter named {missing[0]!r} "
                             f"(it has {sorted(own)[:8]}{'...' if len(own) > 8 else ''})")
    with torch.no_grad():
        for k, v in state.items():
            if tuple(own[k].shape) != tuple(v.shape):
                raise ValueError(f"parameter {k!r} has shape {tuple(own[k].shape)}, "
                                 f"expected {tuple(v.shape)}")
            own[k].copy_(v)


def _capture(out, prefix, caps, meta):
    """Flatten an output (tensor, number, bool, None, tuple/list/dict of them) into caps."""
    if isinstance(out, torch.Tensor) and out.device.type == "meta":   # no values: shape only
        caps[prefix + ".shape"] = np.asarray(tuple(out.shape), dtype=np.int64)
        meta[prefix] = str(out.dtype).replace("torch.", "") + "@meta"
    elif isinstance(out, torch.Tensor):
        caps[prefix] = _np(out)
        meta[prefix] = str(out.dtype).replace("torch.", "")
    elif isinstance(out, (bool, int, float)):
        caps[prefix] = np.asarray(out)
        meta[prefix] = type(out).__name__
    elif out is None:
        meta[prefix] = "None"
    elif isinstance(out, (bytes, bytearray)):                         # a token's bytes
        caps[prefix] = np.frombuffer(bytes(out), dtype=np.uint8).copy()
        meta[prefix] = "bytes"
    elif isinstance(out, str):                                        # text: its UTF-8 bytes
        caps[prefix] = np.frombuffer(out.encode("utf-8", "surrogatepass"), dtype=np.uint8).copy()
        meta[prefix] = "str"
    elif isinstance(out, list) and all(type(o) is int for o in out):
        caps[prefix] = np.asarray(out, dtype=np.int64)                # token ids: one array
        meta[prefix] = f"list[{len(out)}]"
    elif isinstance(out, (tuple, list)):
        meta[prefix] = f"{type(out).__name__}[{len(out)}]"
        for i, o in enumerate(out):
            _capture(o, f"{prefix}.{i}", caps, meta)
    elif isinstance(out, dict):
        meta[prefix] = f"dict[{len(out)}]"
        for k, o in out.items():
            _capture(o, f"{prefix}.{k}", caps, meta)
    else:
        meta[prefix] = type(out).__name__


def _where(exc) -> str:
    """The student's own line where the exception happened (the deepest notebook frame)."""
    line = ""
    for fr in traceback.extract_tb(exc.__traceback__):
        if "ipykernel" in fr.filename or fr.filename.startswith("<"):
            line = f" (line {fr.lineno}: {(fr.line or '').strip()[:120]})"
    return line


def _error(exc) -> str:
    if isinstance(exc, NotImplementedError):
        return "NotImplementedError: not implemented yet"
    msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}{_where(exc)}"


class _Shapes:
    """Records the shape of every tensor each PyTorch operation creates during a call (a
    dispatch-level hook, factory functions included), for probes about memory: a blockwise
    attention must never create an (Lq, Lk) matrix. Rows of the capture: the shape, padded
    with 0 to 6 axes; at most 20,000 operations."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        rows = self.rows = []
        reduced = self.reduced = []      # reductions over the last axis: how many entries at once

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
                if name in REDUCTIONS and args and isinstance(args[0], torch.Tensor) \
                        and args[0].dim() > 0 and len(reduced) < 20000:
                        if args[0].dim() - 1 in _reduced_dims(args, kwargs, args[0].dim()):
                            reduced.append(int(args[0].shape[-1]))
                out = func(*args, **kwargs)
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(t, torch.Tensor) and len(rows) < 20000:
                        shp = list(t.shape)[-6:]
                        rows.append([0] * (6 - len(shp)) + shp)
                return out
        self.mode = Mode()

    def array(self):
        return np.asarray(self.rows or np.zeros((0, 6)), dtype=np.int64).reshape(-1, 6)


REDUCTIONS = {"amax", "amin", "max", "min", "sum", "mean", "logsumexp", "_softmax",
              "_log_softmax", "softmax", "log_softmax", "cumsum", "cummax", "prod", "argmax",
              "sort", "topk", "norm", "linalg_vector_norm", "nansum", "std", "var"}


def _reduced_dims(args, kwargs, ndim):
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(dim, bool) or not isinstance(dim, (int, list, tuple, type(None))):
        dim = None
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else dim
    try:
        return tuple(sorted(int(d) % max(ndim, 1) for d in dims))
    except TypeError:
        return tuple(range(ndim))


def seed(value: int) -> None:
    """Seed the CPU generator, where probes build and run everything. torch.manual_seed would
    also queue a seed for every accelerator backend, recording the call stack each time (about
    3 ms on a CPU-only build, paid thousands of times by the catalogues)."""
    torch.default_generator.manual_seed(int(value))


# -- the shortcut guard: an exercise's own built-in, refused at the operator level -------------

class ShortcutUsed(RuntimeError):
    """The exercise's own PyTorch built-in ran while its probes did."""


# The shortcut groups come with the plan (`"forbid": {group: [label, aten operators, Python
# functions of torch]}`, the rows of tfscratch.shortcuts the exercise names): this text imports
# nothing of the course package, which the student's code may have patched.
_PUBLIC = {"cross_entropy_loss": "cross_entropy"}    # the name an operator is called by
# the CPU side of the dispatcher (meta tensors hold no values; torch.compile is held eager)
_KEYS = ("CPU", "SparseCPU", "SparseCsrCPU", "MkldnnCPU", "QuantizedCPU", "NestedTensorCPU",
         "CompositeImplicitAutograd", "CompositeExplicitAutograd",
         "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutogradNestedTensor")
_KERNELS: dict = {}


def _kernels(op: str) -> list:
    """[(overload name, dispatch key)] of one aten operator's kernels on the CPU side."""
    if op not in _KERNELS:
        packet, found = getattr(torch.ops.aten, op, None), []
        for ov in (packet.overloads() if packet is not None else []):
            name = op if ov == "default" else f"{op}.{ov}"
            found += [(name, k) for k in _KEYS
                      if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", k)]
        _KERNELS[op] = found
    return _KERNELS[op]


_DECOMPOSITIONS: dict = {}


def _python_functions(paths, ops) -> list:
    """[(name, function)] to refuse: the functions at `paths` (looked up now: the kernel's own
    guard may have put a function of its own there for a while) and the decompositions of
    `ops`, each at the end of its wrapper chain (the function every wrapper calls); torch's
    own only (a function put in torch's place is not torch's code)."""
    found = []
    for path in paths:
        obj = torch
        for part in path.split("."):
            obj = getattr(obj, part, None)
        module = path.endswith(".forward")    # a module's forward: named by its class
        found.append(("torch." + path.removesuffix(".forward") if module else part, obj))
    for op in ops:
        found += _decompositions(op)
    out, seen = [], set()
    for name, fn in found:
        while getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        code = getattr(fn, "__code__", None)
        if code is None or code.co_freevars or id(fn) in seen or \
                not code.co_filename.startswith(_TORCH_DIR):
            continue
        seen.add(id(fn))
        out.append((name, fn))
    return out


def _decompositions(op: str) -> list:
    """[(name, function)]: torch._decomp's Python implementations of an operator's overloads."""
    if op not in _DECOMPOSITIONS:
        import torch._decomp
        packet = getattr(torch.ops.aten, op, None)
        _DECOMPOSITIONS[op] = [(op, torch._decomp.decomposition_table.get(getattr(packet, ov)))
                               for ov in (packet.overloads() if packet is not None else [])]
    return _DECOMPOSITIONS[op]


_TORCH_DIR = os.path.dirname(torch.__file__)


def _refused(*args, _tfs_refuse=None, **kwargs):
    """The code a refused Python function of torch runs while the guard is on. It runs with
    that function's globals (torch's), so what it calls comes in its keyword default: the
    guard's, which records the shortcut and raises ShortcutUsed."""
    _tfs_refuse()


def _shortcut_message(name: str, label: str) -> str:
    """The kernel guard's words (tfscratch.checks.core), whichever lane and thread saw it."""
    if name.startswith("torch.nn.") and name[9:10].isupper():      # a module of torch.nn
        return (f"Shortcut used: your code ran {name[6:]}. This exercise asks you to build it "
                "yourself.")
    return (f"Shortcut used: your code called PyTorch's `{_PUBLIC.get(name, name)}` ({label}). "
            "This exercise asks you to build it yourself from basic tensor operations.")


class _Guard:
    """While a plan's probes run: every CPU kernel of the forbidden aten operators (a
    torch.library override, global to the process, so every thread meets it) and every
    forbidden Python function of torch (its code swapped for one that raises) refuse to run;
    torch.compile'd functions run eagerly. `check()` after each probe says whether a shortcut
    ran (even one the student's code caught) and whether the guard is still as installed.

    `locked` (the check's own process, `lock_guard`): the guard never comes off. The overrides
    are registered through a dispatcher library handle that no Python object keeps (it is
    leaked on purpose: nothing to find with gc and `_destroy`), and the refused functions'
    own code is not kept (nothing to put back)."""

    def __init__(self, forbid=None, preload_compile: bool = False, locked: bool = False):
        if forbid is not None and not isinstance(forbid, dict):   # never a silent empty guard
            raise TypeError("a plan's forbid is {group: [label, aten operators, Python functions]}")
        self.forbid = {g: (row[0], tuple(row[1]), tuple(row[2])) for g, row in (forbid or {}).items()}
        self.groups = list(self.forbid)
        self.preload_compile, self.locked = preload_compile, locked
        self.trips, self.swapped, self.lib, self.stance = [], [], None, None
        self.problem = None

    def __enter__(self):
        if self.groups and self.preload_compile:
            _load_compile()      # before the overrides
        if self.groups:
            try:
                self._install()
            except Exception as e:  # noqa: BLE001 - torch.library or torch changed under us
                self.__exit__()
                self.problem = f"GuardChanged: the shortcut guard could not be installed ({e})"
        return self

    def _install(self):
        if self.locked:     # the C++ handle only: torch.library.Library would keep a Python object
            handle = torch._C._dispatch_library("IMPL", "aten", "", "tfs-check-guard", 0)
            def impl(name, fn, key):
                handle.impl(name, key, fn, False)
        else:
            self.lib = torch.library.Library("aten", "IMPL")
            impl = self.lib.impl
        label = ", ".join(self.forbid[g][0] for g in self.groups)
        with warnings.catch_warnings():   # "overriding a previously registered kernel"
            warnings.simplefilter("ignore")
            for g in self.groups:
                _, ops, paths = self.forbid[g]
                for op in ops:
                    for name, key in _kernels(op):
                        impl(name, self._refuser(op, label), key)
                for name, fn in _python_functions(paths, ops):
                    if all(fn is not f for f, _, _ in self.swapped):
                        own = (None, None) if self.locked else (fn.__code__, fn.__kwdefaults__)
                        self.swapped.append((fn, *own))
                        fn.__code__ = _refused.__code__
                        fn.__kwdefaults__ = {"_tfs_refuse": self._refuser(name, label)}
        if self.locked:
            _leak(handle)   # kept alive by one reference no Python object holds
            del handle, impl
        self.stance, self.compiled = _force_eager(), _compiled()
        self.table = self._table()

    def _refuser(self, name, label):
        trips = self.trips

        def refuse(*args, **kwargs):
            msg = _shortcut_message(name, label)
            trips.append(msg)
            raise ShortcutUsed(msg)
        return refuse

    def _table(self):
        """What the guard installed, as the dispatcher and torch report it now: the kernels
        of the keys it overrode (a kernel registered later for another key, as torch's own
        lazy imports do, changes nothing here) and the refused functions' code."""
        keys = {}
        for g in self.groups:
            for op in self.forbid[g][1]:
                for name, key in _kernels(op):
                    keys.setdefault(name, set()).add(key)
        lines = [ln for name in sorted(keys)
                 for ln in torch._C._dispatch_dump(f"aten::{name}").splitlines()
                 if ln.split(":", 1)[0].removesuffix("[alias]") in keys[name]]
        return lines, [(fn.__code__, fn.__kwdefaults__) for fn, _, _ in self.swapped]

    def start(self) -> None:
        self.trips.clear()

    def check(self) -> str | None:
        """Why the probe that just ran cannot count, or None."""
        if self.problem:
            return self.problem
        if not self.groups:
            return None
        if not _same_table(self._table(), self.table) \
                or (self.stance is not None and _stance() != "force_eager"):
            self.problem = ("GuardChanged: the shortcut guard was changed while your code ran (an "
                            "operator kernel registered or removed, a function of torch given "
                            "other code, or torch.compile's stance changed): the independent "
                            "check cannot vouch for this result")
            return self.problem
        if _compiled() != self.compiled:
            self.problem = ("GuardChanged: torch.compile compiled code while the independent check "
                            "ran (compiled code runs past the shortcut guard): run your code "
                            "without compiling it inside the exercise")
            return self.problem
        if self.stance is None:     # torch.compile was first loaded by the probe just run
            self.stance = _force_eager()
        return f"ShortcutUsed: {self.trips[0]}" if self.trips else None

    def __exit__(self, *exc):
        if self.locked:             # for good: the check's process ends with its plan
            return False
        if self.lib is not None:
            self.lib._destroy()
            self.lib = None
        for fn, code, kwdefaults in self.swapped:
            fn.__code__, fn.__kwdefaults__ = code, kwdefaults
        self.swapped = []
        if self.stance is not None:
            self.stance.__exit__(None, None, None)
            self.stance = None
        return False


def _leak(obj) -> None:
    """One reference to `obj` that no Python object holds: it lives as long as the process."""
    import ctypes
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def lock_guard(forbid) -> _Guard:
    """The check's own process (tfsgrade.check_process): the plan's guard on for good, put on
    before any code of the student's exists in the process, so nothing the student's code
    does later (a `torch.library.get_kernel`, a handle kept from before, a `gc` walk) reaches
    an operator's own kernel. torch.compile is loaded first where the process asked for it."""
    return _Guard(forbid, locked=True).__enter__()


def _same_table(now, then) -> bool:
    """The guard's table as installed: the same dispatcher lines, and the same code and keyword
    defaults (the same objects) on as many refused functions."""
    return now[0] == then[0] and len(now[1]) == len(then[1]) and \
        all(a[0] is b[0] and a[1] is b[1] for a, b in zip(now[1], then[1]))


_CLASS_DICT = type.__dict__["__dict__"]   # a class's own namespace, read without its metaclass


def _names_compile(namespace: dict) -> bool:
    """Whether a function or class of the learner's names `compile` in its code (torch.compile
    called inside an exercise). Then torch.compile is loaded before the guard, so its stance is
    eager from the start and a first torch.compile inside the probe runs through the guard
    instead of compiling past it (which would void the check: an honest student's loss). Only
    the loading depends on this; code that hides the name meets the refusal, as before.
    It runs before the guard, so it calls no code of the learner's: exact type tests
    (`type(v) is ...`, never isinstance, which reads a `__class__` the learner may define), no
    `==` or hashing of the learner's objects, C-level attributes, and a class's own dict read
    through `type`'s descriptor."""
    if type(namespace) is not dict:
        return False
    own = _lookup(namespace, "__name__")
    seen, todo = set(), list(namespace.values())
    while todo and len(seen) < 100_000:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        t = type(v)
        if t is types.FunctionType:
            if _same_module(v.__module__, own):
                todo.append(v.__code__)
        elif t is types.CodeType:
            if any(_is_str(n, "compile") for n in v.co_names):
                return True
            todo += [c for c in v.co_consts if type(c) is types.CodeType]
        elif t is staticmethod or t is classmethod:
            todo.append(v.__func__)
        elif t is property:
            todo += [v.fget, v.fset]
        elif issubclass(t, type):     # a class: its own dict, when the learner defined it
            attrs = list(_CLASS_DICT.__get__(v).items())
            if _same_module(next((x for k, x in attrs if _is_str(k, "__module__")), None), own):
                todo += [x for _, x in attrs]
    return False


def _load_compile() -> None:
    """torch.compile loaded now, so that its stance is eager while the guard is on; where it
    cannot be loaded, the guard goes on without it, as before (a first compile inside the probe
    then voids it, which is what happened before this preload existed)."""
    try:
        __import__("torch._dynamo")
    except Exception:  # noqa: BLE001 - an optional preload
        pass


def _lookup(namespace: dict, name: str):
    """namespace[name] without hashing or comparing any key of the learner's (a key whose
    __eq__ runs code could otherwise run before the guard, the plan on the stack). A kernel's
    namespace is a plain dict; the grader's own mappings (the reference's) are looked up as
    they are."""
    if type(namespace) is not dict:
        return namespace.get(name)
    return next((v for k, v in list(namespace.items()) if _is_str(k, name)), None)


def _is_str(x, text: str) -> bool:
    return type(x) is str and str.__eq__(x, text) is True


def _same_module(mod, own) -> bool:
    """A definition's __module__ is the namespace's __name__ (both None in a plain exec dict)."""
    return mod is own or (type(own) is str and _is_str(mod, own))


def _force_eager():
    """torch.compile'd functions run eagerly (so through the guard) until `.__exit__`; None
    where torch.compile was never loaded (nothing compiled then)."""
    if "torch._dynamo" not in sys.modules:
        return None
    return sys.modules["torch._dynamo"].set_stance("force_eager")


def _stance():
    ef = sys.modules.get("torch._dynamo.eval_frame")
    return None if ef is None else getattr(getattr(ef, "_stance", None), "stance", None)


def _compiled() -> int:
    """How many frames torch.compile has compiled in this process (0 where never loaded)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return int(counters["frames"]["total"]) if counters is not None else 0


# -- the memory rule: the whole process's resident memory, every thread counted --------------

def _resident_peak():
    """VmHWM, the process's peak resident memory in bytes (every thread's allocations; None
    where /proc is not there)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3      # glibc's mallopt parameters


def _libc():
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.malloc_trim, libc.mallopt      # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError, TypeError):   # not glibc: nothing to tune
        return None


def _steady_allocator(on: bool):
    """While `on`, every block of 1 MB or more is its own mapping, returned to the system when
    freed, and the heap's free pages go back first: the resident growth is then what the code
    holds at once. glibc's default raises its mmap threshold each time a large block is freed,
    so (Lq, block_size) blocks freed and re-allocated in a loop land in heap pages that stay
    resident: a blockwise float64 forward + backward measured 31-42 MB that way (14-16 MB with
    this), close to the 48 MB allowance. Afterwards the threshold stays fixed at 32 MB (trim at
    64 MB), the most glibc's adaptive threshold reaches: the adaptive default cannot be
    restored once set, and this keeps the rest of the process near it."""
    libc = _libc()
    if libc is None:
        return
    mmap, trim = (1 << 20, 1 << 20) if on else (32 << 20, 64 << 20)
    libc.mallopt(_M_MMAP_THRESHOLD, mmap)
    libc.mallopt(_M_TRIM_THRESHOLD, trim)
    if on:
        libc.malloc_trim(0)


def _measured(fn, args, kwargs):
    """(fn's output, how much the process's peak resident memory grew while it ran). Free
    heap pages are returned first, and the peak is reset to the current size
    (/proc/self/clear_refs); where it cannot be, the growth past the earlier peak is measured,
    which can only under-count."""
    _steady_allocator(True)
    try:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        before = _resident_peak()
        out = fn(*args, **kwargs)
        after = _resident_peak()
    finally:
        _steady_allocator(False)
    grew = 0 if before is None or after is None else max(0, after - before)
    return out, grew


def run_probe(probe: dict, target, tensors: dict, namespace: dict,
              guard: _Guard | None = None) -> tuple[dict, dict]:
    """Run one probe on `target`; returns (captured arrays, meta). Never raises, except
    KeyboardInterrupt (the grader's time limit). `guard` (run_plan's) is on around it: what it
    finds afterwards (a shortcut that ran, a changed guard, a process) is the probe's error."""
    caps, meta = {}, {}
    ctx = _Ctx(tensors, namespace)
    p = probe["name"]
    if guard is not None:
        guard.start()
    try:
        seed(probe.get("seed", 0))
        obj = _prepare(probe, target, ctx)
        with torch.set_grad_enabled(True):
            for ci, call in enumerate(probe.get("calls", [])):
                _run_call(probe, obj, ci, call, ctx, caps, meta)
        _after(probe, obj, caps, meta)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit too: the student's code ends here
        meta[f"{p}.error"] = _error(e)
        global last_exception
        last_exception = e      # in the kernel, the check's box shows the student's own line
    why = guard.check() if guard is not None else None
    if why:                     # a shortcut the code caught, a thread's, or a changed guard
        meta[f"{p}.error"] = why
    return caps, meta


def _prepare(probe: dict, target, ctx: "_Ctx"):
    """The object the calls go to: `target`, or what it makes; weights loaded, mode set."""
    obj = target
    if probe.get("make") is not None:
        mk = probe["make"]
        obj = target(*ctx.value(mk.get("args", [])), **ctx.value(mk.get("kwargs", {})))
    if probe.get("load"):
        _load(obj, {k: ctx.value(v) for k, v in probe["load"].items()})
    if probe.get("mode") in ("train", "eval"):
        obj.train(probe["mode"] == "train")
    return obj


def _invoke(call: dict, fn, args, kwargs, key: str, caps: dict):
    """The call itself: plain, with its tensors' shapes recorded, or its memory measured."""
    if call.get("shapes"):
        rec = _Shapes()
        with rec.mode:
            out = fn(*args, **kwargs)
        caps[f"{key}.shapes"] = rec.array()
        caps[f"{key}.reduced"] = np.asarray(rec.reduced, dtype=np.int64)
        return out
    if call.get("memory_limit"):
        # the growth past the call's allowance, or 0 (the reference's: always 0, so what is
        # stored and compared does not depend on the machine)
        out, grew = _measured(fn, args, kwargs)
        caps[f"{key}.memory"] = np.asarray(grew if grew > call["memory_limit"] else 0, dtype=np.int64)
        return out
    return fn(*args, **kwargs)


def _run_call(probe: dict, obj, ci: int, call: dict, ctx: "_Ctx", caps: dict, meta: dict):
    key = f"{probe['name']}.{ci}"
    method = call.get("method")
    fn = (obj if method is None else getattr(obj, method) if not method.startswith("@")
          else (lambda *a, _d=DRIVERS[method[1:]], **k: _d(obj, *a, **k)))
    grads = set(call.get("grad", []))
    args = [ctx.value(a, want_grad=i in grads) for i, a in enumerate(call.get("args", []))]
    kwargs = {k: ctx.value(v, want_grad=k in grads) for k, v in call.get("kwargs", {}).items()}
    seed(probe.get("seed", 0) + 1 + ci)
    if call.get("raises"):
        try:
            fn(*args, **kwargs)
            caps[f"{key}.raised"] = np.asarray(False)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - any exception type counts
            caps[f"{key}.raised"] = np.asarray(True)
            meta[f"{key}.raised"] = _error(e)
        return
    out = _invoke(call, fn, args, kwargs, key, caps)
    if call.get("take") is not None:   # an iterator: its first `take` items (0: all)
        items = []
        for item in out:
            items.append(item)
            if call["take"] and len(items) >= call["take"]:
                break
        out = items
    ctx.outs[ci] = out
    _capture(out, f"{key}.out", caps, meta)
    for i in call.get("keep", []):     # arguments updated in place (running stats)
        a = kwargs.get(i) if isinstance(i, str) else args[i]
        if isinstance(a, torch.Tensor):
            caps[f"{key}.arg.{i}"] = _np(a)
    if call.get("backward") is not None:
        y = _get(out, call.get("backward_of", ""))
        y.backward(ctx.value(call["backward"]))
        for name, a in list(enumerate(args)) + list(kwargs.items()):
            if name in grads and a.grad is not None:
                caps[f"{key}.grad.{name}"] = _np(a.grad)


def _after(probe: dict, obj, caps: dict, meta: dict):
    """What the probe reads from the object after its calls: attributes, parameters, grads."""
    p = probe["name"]
    for name in probe.get("after", []):
        try:
            _capture(_get_attr(obj, name), f"{p}.after.{name}", caps, meta)
        except AttributeError as e:
            meta[f"{p}.after.{name}"] = f"missing: {e}"
    if probe.get("params"):
        named = list(obj.named_parameters(remove_duplicate=False))  # aliases under every name
        meta[f"{p}.params"] = [[n, list(t.shape)] for n, t in named]
        meta[f"{p}.param_ids"] = len({id(t) for _, t in named})
        for n, t in named:
            if t.grad is not None and probe.get("param_grads"):
                caps[f"{p}.pgrad.{n}"] = _np(t.grad)


last_exception = None


def _get_attr(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _guarded(plan: dict) -> bool:
    """Whether the plan has rules a process beside it could dodge: forbidden shortcuts or a
    memory allowance."""
    return bool(plan.get("forbid")) or any(c.get("memory_limit") for p in plan.get("probes", ())
                                           for c in p.get("calls", []))


def head(plan: dict) -> dict:
    """What the guard needs of a plan, and nothing drawn for the submission: the exercise, its
    target's name, the forbidden groups and whether the plan is guarded. In the grading
    sandbox the check's process gets it first, and its inputs only after the student's cells."""
    return {"exercise": plan["exercise"], "target": plan["target"],
            "forbid": plan.get("forbid"), "guarded": _guarded(plan)}


def open_guard(plan_head: dict, namespace: dict) -> _Guard:
    """The plan's shortcut guard, on (entered): `.__exit__()` takes it off."""
    forbid = plan_head.get("forbid")
    return _Guard(forbid, preload_compile=bool(forbid) and _names_compile(namespace)).__enter__()


def run_plan(plan: dict, namespace: dict, tensors: dict | None = None, emit=None) -> dict:
    """Run every probe of a plan on `namespace[plan['target']]`, with the shortcut guard of
    the plan's `forbid` groups on for the while. `emit(doc)` is called after each probe.
    Returns {"caps": arrays, "meta": {...}} merged over all probes."""
    guard = open_guard(head(plan), namespace)
    try:
        return run_probes(plan, namespace, tensors, emit, guard)
    finally:
        guard.__exit__()


def run_probes(plan: dict, namespace: dict, tensors, emit, guard: _Guard) -> dict:
    """The plan's probes under a guard that is already on (run_plan's, or the check process's
    `lock_guard`); `tensors` None: the plan's own packed inputs."""
    tensors = unpack(plan.get("tensors", "")) if tensors is None else tensors
    caps, meta = {}, {}
    target = _lookup(namespace, plan["target"])
    for probe in plan["probes"]:
        if target is None:
            c, m = {}, {f"{probe['name']}.error": f"NameError: {plan['target']!r} is not defined"}
        else:
            c, m = run_probe(probe, target, tensors, namespace, guard)
        caps.update(c)
        meta.update(m)
        if emit is not None:
            emit({"exercise": plan["exercise"], "probe": probe["name"], "caps": pack(c),
                  "meta": m})
    return {"caps": caps, "meta": meta}

