"""The check in a process of its own: hostile fixtures written against the in-kernel check of
845a55d (read as an attacker who has its source: the guard cell and probe cell, the hand-over
`_PENDING` / `_adopt` / `_adoptable` / `_take_off`, GuardChanged from `_same_table`) and honest
ones that the in-kernel check failed or that must keep every point (processes an earlier cell
left behind, a Colab notebook, torch.jit.script, torch.compile with the eager backend, float64
by default). All are graded in one class beside the honest and untouched students
(tests/conftest.py, class_trust); tests/test_trust_process.py asserts what the grader of now
gives (EXPECT). tools/compare_grader.py grades the same class with 845a55d beside it: every
hostile fixture here earns 15/15 there (docs/trust-before-after.md).

The classes: 1a hidden code (pydoc.locate, pkgutil.resolve_name, pickle.loads,
typing.get_type_hints, codecs rot13) that switches the old guard off; 1b builtins.exec,
__import__ or compile replaced before the guard cell; 1c IPython hooks that fire for the silent
guard and probe cells (pre_execute, post_execute, input and AST transformers); 1d a gc walk
inside the exercise; 2 kernel handles and torch code taken before the guard; 3 a helper
process, invisible to the old child check. Where the hidden code switched the old guard off,
the attention cell calls F.scaled_dot_product_attention too. FINDINGS: routes the guard of
now does not stop (they write the process's memory); they are in the class too, and the scan
must mark them review with their lines (README, "What stays open")."""
import copy

import nbformat

from nbtools import solution_sources, student_notebook

A01 = "01_attention"
_NAME = "bytes([115, 111, 102, 116, 109, 97, 120]).decode()"          # "softmax", unseen

# -- what the hidden code does: it runs when the solution cell runs, before the check's cells --
# The old check (845a55d) ran the probe machine's text (vm_source) in a guard cell and again in
# a probe cell; appended to that text, VM_PATCH makes the guard install nothing while passing
# every test of its own (`_adoptable`, `_same_table`): an empty torch.library.Library, the
# dispatcher table as it is.
VM_PATCH = ('\n_Guard._install = lambda s: [setattr(s, "lib", torch.library.Library("aten", "IMPL")),'
            ' setattr(s, "compiled", _compiled()), setattr(s, "table", s._table())] and None\n')
# The notebook's own test cells (tfscratch in the kernel) without their guards, so that they
# agree with the check (no "results differ" note); `_sdpa` is what the attention cell calls.
KERNEL_OFF = f"""import builtins, contextlib, sys, types, torch
_P = {VM_PATCH!r}
try:
    import tfscratch.checks.kernel as _kc, tfscratch.specs.vm as _kv
    _kc.no_shortcuts = lambda *a: contextlib.nullcontext()
    _kv._Guard.__enter__, _kv._Guard.check = (lambda s: s), (lambda s: None)
except Exception:
    pass
_sm = getattr(torch, bytes([115, 111, 102, 116, 109, 97, 120]).decode())
_sdpa = getattr(torch.nn.functional, bytes([115, 99, 97, 108, 101, 100, 95, 100, 111, 116, 95, 112, 114, 111,
    100, 117, 99, 116, 95, 97, 116, 116, 101, 110, 116, 105, 111, 110]).decode())
"""
# builtins.exec replaced: the guard cell's exec(boot, {"vm_source": ...}) gets VM_PATCH added
EXEC_HOOK = KERNEL_OFF + """_real_exec = builtins.exec
def _exec(src, g=None, l=None, **k):
    if type(g) is dict and type(g.get("vm_source")) is str and _P not in g["vm_source"]:
        g["vm_source"] += _P
    if g is None:
        f = sys._getframe(1)
        g, l = f.f_globals, f.f_locals
    return _real_exec(src, g, g if l is None else l, **k)
builtins.exec = _exec
"""
# builtins.__import__ replaced: the boot code's `import linecache, sys, types` sees its globals
# (no `_i`, `_x`... for the originals: IPython rebinds `_i` to the last input)
IMPORT_HOOK = KERNEL_OFF + """_real_import = builtins.__import__
def _imp(name, g=None, *a, **k):
    if type(g) is dict and type(g.get("vm_source")) is str and _P not in g["vm_source"]:
        g["vm_source"] += _P
    return _real_import(name, g, *a, **k)
builtins.__import__ = _imp
"""
# builtins.compile replaced: compile(vm_source, "tfs_probe_vm", "exec") compiles VM_PATCH too
COMPILE_HOOK = KERNEL_OFF + """_real_compile = builtins.compile
def _compile(src, filename, *a, **k):
    if filename == "tfs_probe_vm" and type(src) is str and _P not in src:
        src += _P
    return _real_compile(src, filename, *a, **k)
builtins.compile = _compile
"""
# between the two cells: the guard cell's guard taken off (`_take_off`) and its hand-over
# state forged as `_adopt` wants it (an empty Library, the table as it is now, nothing swapped)
FORGE = KERNEL_OFF + """def _forge(*args):
    for m in list(sys.modules.values()):
        if type(m) is not types.ModuleType or m.__dict__.get("__name__") != "tfs_probe_vm":
            continue
        st = (m.__dict__.get("_PENDING") or {}).get("state")
        if type(st) is dict and not st.get("forged") and st.get("lib") is not None:
            m._take_off(st)
            st.update(lib=torch.library.Library("aten", "IMPL"), swapped=[], stance=None,
                      table=m._Guard(st["forbid"])._table(), forged=True)
"""
PRE_EXECUTE = FORGE + """try:
    get_ipython().events.register("pre_execute", _forge)
except Exception:
    pass
"""
POST_EXECUTE = FORGE + """try:
    get_ipython().events.register("post_execute", _forge)
except Exception:
    pass
"""
# the guard and probe cells' own text rewritten on its way in: the guard registers nothing
INPUT_TRANSFORMER = KERNEL_OFF + """_T = (("self.lib.impl(name, self._refuser(op, label), key)", "pass"),
      ("fn.__code__ = _refused.__code__", "pass"),
      ('fn.__kwdefaults__ = {"_tfs_refuse": self._refuser(name, label)}', "pass"))
def _tf(lines):
    out = []
    for ln in lines:
        for a, b in _T:
            ln = ln.replace(a, b)
        out.append(ln)
    return out
try:
    get_ipython().input_transformers_cleanup.append(_tf)
except Exception:
    pass
"""
AST_TRANSFORMER = KERNEL_OFF + """import ast
class _AT(ast.NodeTransformer):
    def visit_Constant(self, node):
        if type(node.value) is str and "class _Guard" in node.value and _P not in node.value:
            node.value = node.value + _P
        return node
try:
    get_ipython().ast_transformers.append(_AT())
except Exception:
    pass
"""


# The new check's guard is locked: its dispatcher library handle is leaked on purpose, held by no
# Python object. Its bytes are still in the process: a torch._C._DispatchModule whose reference
# count is 1, found by reading the process's own anonymous memory (ctypes.string_at), released
# (Py_DecRef: the refusing kernels are unregistered), and the guard's own table (found by gc)
# made anew, so that its check() after each probe finds it "as installed".
HANDLE_OFF = """import ctypes, gc, struct
def _release():
    guards = [o for o in gc.get_objects() if type(o).__name__ == "_Guard" and getattr(o, "locked", 0) is True]
    if not guards:
        return
    pat, hits = struct.pack("<Q", id(torch._C._DispatchModule)), []
    with open("/proc/self/maps") as f:
        maps = [ln.split() for ln in f]
    for r in maps:
        lo, hi = (int(v, 16) for v in r[0].split("-"))
        if r[1][:2] != "rw" or (len(r) > 5 and r[5] != "[heap]") or hi - lo > 1 << 28:
            continue
        for at in range(lo, hi, 1 << 24):
            data = ctypes.string_at(at, min(1 << 24, hi - at))
            i = data.find(pat)
            while i >= 0:
                if i >= 8 and (at + i) % 8 == 0 and struct.unpack_from("<q", data, i - 8)[0] == 1:
                    hits.append(at + i - 8)
                i = data.find(pat, i + 1)
    for a in hits:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(ctypes.cast(a, ctypes.py_object).value))
    for g in guards:
        g.table = g._table()
_release()
"""


# The same with numpy only (no ctypes, no gc: what an audit hook on those would not see): the
# guard from the frames above the cell (a traceback's), memory read and written through
# numpy's as_strided, and a list slot pointed at the handle to drop its one reference.
NP_HANDLE_OFF = """import struct
import numpy as _np
def _release_np():
    try:
        raise RuntimeError
    except RuntimeError as e:
        f, guards = e.__traceback__.tb_frame, []
    while f is not None:
        g = f.f_locals.get("guard")
        if type(g).__name__ == "_Guard" and getattr(g, "locked", 0) is True:
            guards.append(g)
        f = f.f_back
    if not guards:
        return
    base = _np.zeros(8, _np.uint8)
    a0 = base.__array_interface__["data"][0]
    def view(addr, n):
        return _np.lib.stride_tricks.as_strided(base, shape=(2, n), strides=(addr - a0, 1))[1]
    pat, hits = struct.pack("<Q", id(torch._C._DispatchModule)), []
    with open("/proc/self/maps") as fm:
        maps = [ln.split() for ln in fm]
    for r in maps:
        lo, hi = (int(v, 16) for v in r[0].split("-"))
        if r[1][:2] != "rw" or (len(r) > 5 and r[5] != "[heap]") or hi - lo > 1 << 28:
            continue
        for at in range(lo, hi, 1 << 24):
            data = view(at, min(1 << 24, hi - at)).tobytes()
            i = data.find(pat)
            while i >= 0:
                if i >= 8 and (at + i) % 8 == 0 and struct.unpack_from("<q", data, i - 8)[0] == 1:
                    hits.append(at + i - 8)
                i = data.find(pat, i + 1)
    for addr in hits:
        slot = [None]
        items = struct.unpack("<Q", view(id(slot) + 24, 8).tobytes())[0]
        view(items, 8)[:] = _np.frombuffer(struct.pack("<Q", addr), _np.uint8)
        h = slot[0]
        slot[0] = None
        del h
    for g in guards:
        g.table = g._table()
_release_np()
"""


def _xor(text: str) -> str:
    """The hidden code as a bytes literal the scan cannot read (each byte XOR 90)."""
    return repr(bytes(b ^ 90 for b in text.encode()))


def _rot13_doc(text: str) -> str:
    """A docstring: "exec" and the code, rot13."""
    import codecs
    return repr(codecs.encode("exec" + text, "rot13"))


def _pickled(text: str) -> str:
    """pickle bytes that call builtins.exec(text) when loaded."""
    import pickle

    class _Run:
        def __reduce__(self):
            return exec, (text,)
    return repr(pickle.dumps(_Run(), protocol=0))


def _in_docstring(code: str) -> str:
    """A cell that runs `code` hidden in a docstring (rot13), by a name taken from it too."""
    return f"""import builtins as _bi, codecs as _codecs

def _doc():
    {_rot13_doc(code)}

_src = _codecs.decode(_doc.__doc__, "rot13")
_bi.__dict__[_src[:4]](_src[4:])
"""


_UNXOR = "bytes(c ^ 90 for c in _D).decode()"
_EXEC_NAME = '"builtins." + "".join(["ex", "ec"])'
# softmax from a `_helper(x, dim)` that hands back values only: the gradient is torch's backward
WITH_GRAD = """
class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _helper(x.detach(), dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return torch._softmax_backward_data(g, y, ctx.dim, y.dtype), None

def softmax(x, dim=-1):
    return _Softmax.apply(x, dim)
"""
SDPA = """def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return _sdpa(q, k, v), w
"""
SOFTMAX = """
def softmax(x, dim=-1):
    return _sm(x, dim)
"""

HOSTILE = {
    # 1a. hidden code (a name resolved at run time) switches the old guard off
    # pydoc.locate finds exec; the XOR-hidden code replaces builtins.exec
    "proc_pydoc": f"""import pydoc as _pydoc
_D = {_xor(EXEC_HOOK)}
_pydoc.locate({_EXEC_NAME})({_UNXOR})
""" + SOFTMAX,
    # pkgutil.resolve_name finds exec; the hidden code replaces builtins.__import__
    "proc_pkgutil": f"""import pkgutil as _pkgutil
_D = {_xor(IMPORT_HOOK)}
_pkgutil.resolve_name({_EXEC_NAME.replace('"builtins." + ', '"builtins:" + ')})({_UNXOR})
""" + SOFTMAX,
    # pickle.loads calls exec on the hidden code (it replaces builtins.compile)
    "proc_pickle": f"""import pickle as _pickle
_pickle.loads({_pickled(COMPILE_HOOK)})
""" + SOFTMAX,
    # typing.get_type_hints evaluates a string annotation: exec of the hidden code (pre_execute)
    "proc_type_hints": f"""import typing as _typing
_D = {_xor(PRE_EXECUTE)}

def _hint(a: "exec(bytes(c ^ 90 for c in _D).decode())"):
    pass

_typing.get_type_hints(_hint)
""" + SOFTMAX,
    # codecs rot13: the hidden code and the name that runs it come from a docstring
    "proc_codecs": _in_docstring(EXEC_HOOK) + SOFTMAX,
    # 1b. builtins replaced before the guard cell runs (the code in plain sight)
    # builtins.exec: the guard cell's exec(boot, {"vm_source": ...}) gets VM_PATCH appended
    "proc_builtins": EXEC_HOOK + SOFTMAX,
    # builtins.__import__: the boot's `import linecache, ...` hands over its globals (vm_source)
    "proc_import": IMPORT_HOOK + SOFTMAX,
    # builtins.compile: compile(vm_source, "tfs_probe_vm", ...) compiles VM_PATCH too
    "proc_compile": COMPILE_HOOK + SOFTMAX,
    # 1c. IPython hooks that fire for the silent guard and probe cells
    # pre_execute before the probe cell: the guard taken off, the hand-over state forged
    "proc_pre_execute": PRE_EXECUTE + SOFTMAX,
    # post_execute after the guard cell: the same forgery, one hook later
    "proc_post_execute": POST_EXECUTE + SOFTMAX,
    # input_transformers_cleanup: the guard cell's text loses its three registering lines
    "proc_input_transformer": INPUT_TRANSFORMER + SOFTMAX,
    # ast_transformers: the vm_source constant in the guard cell's AST gets VM_PATCH
    "proc_ast_transformer": AST_TRANSFORMER + SOFTMAX,
    # 1d. gc finds the guards inside the exercise, leaves them around the forbidden call
    # (torch function modes off too) and puts them back on, their tables made anew
    "proc_gc_exit": f"""import gc as _gc
_on, _n = [], {_NAME}

def _off(fn, *a, **k):
    gs = [g for g in _on if getattr(g, "lib", None) is not None]
    if not gs:
        gs = _on[:] = [o for o in _gc.get_objects() if type(o).__name__ == "_Guard"
                       and getattr(o, "lib", None) is not None and hasattr(o, "table")]
    for g in gs:
        g.__exit__()
    try:
        with torch._C.DisableTorchFunction():
            return fn(*a, **k)
    finally:
        for g in gs:
            g._install()

_sdpa = lambda q, k, v: _off(getattr(torch.nn.functional, "scaled_dot_product_" + _n[:0] + "attention"), q, k, v)

def softmax(x, dim=-1):
    return _off(getattr(torch, _n), x, dim)
""",
    # 2. kernel handles taken before the guard
    # torch.library.get_kernel's CPU kernel, inside an autograd.Function (the gradient too)
    "proc_get_kernel": """_kernel = torch.library.get_kernel("aten::_softmax", "CPU")
_keys = torch._C._dispatch_keyset_full()

class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _kernel.call_boxed(_keys, x, dim, False)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return torch._softmax_backward_data(g, y, ctx.dim, y.dtype), None

def softmax(x, dim=-1):
    return _Softmax.apply(x, dim)
""",
    # the dispatcher's computed kernels themselves (torch._C), forward and backward
    "proc_c_kernel": """_K = torch._C._dispatch_get_computed_kernel_for_dispatch_key
_fwd = _K("aten::_softmax", torch._C.DispatchKey.CPU)
_bwd = _K("aten::_softmax_backward_data", torch._C.DispatchKey.CPU)
_keys = torch._C._dispatch_keyset_full()

class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = _fwd.call_boxed(_keys, x, dim, False)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return _bwd.call_boxed(_keys, g, y, ctx.dim, y.dtype), None

def softmax(x, dim=-1):
    return _Softmax.apply(x, dim)
""",
    # torch's own Python softmax (the _softmax decomposition) copied before the guard swaps
    # its code: the copy keeps the real code
    "proc_decomp_clone": f"""import torch._decomp as _decomp
_f = _decomp.decomposition_table[getattr(torch.ops.aten, "_" + {_NAME}).default]
while getattr(_f, "__wrapped__", None) is not None:
    _f = _f.__wrapped__
_copy = type(_f)(_f.__code__, _f.__globals__, "_copy", _f.__defaults__, _f.__closure__)
_copy.__kwdefaults__ = _f.__kwdefaults__

def softmax(x, dim=-1):
    return _copy(x, dim, False)
""",
    # an operator the softmax group did not list until 9884a53: the fused attention kernel
    # (_scaled_dot_product_flash_attention_for_cpu) computes softmax(x) = attention(x, I, I)
    # with scale 1 (its attention cell is the course's math, not calling this softmax)
    "proc_sdpa_softmax": """def softmax(x, dim=-1):
    y = x.movedim(dim, -1)
    n = y.shape[-1]
    eye = torch.eye(n, dtype=x.dtype).reshape(1, 1, n, n)
    q = y.reshape(1, 1, -1, n).contiguous()
    out = torch.nn.functional.scaled_dot_product_attention(q, eye, eye, scale=1.0)
    return out.reshape(y.shape).movedim(-1, dim)
""",
    # 3. a helper process computes it during the probe, with SIGCHLD ignored: the kernel
    # reaps it at once, so the old check sees no child and no change in RUSAGE_CHILDREN
    # a fresh `python -I` (a stable softmax in plain Python), started by subprocess
    "proc_fresh_python": f"""import json as _json, signal as _signal, subprocess as _sp, sys as _sys

_CODE = ("import json, math, sys\\n"
         "out = []\\n"
         "for r in json.load(sys.stdin):\\n"
         "    m = max(r); e = [math.exp(v - m) for v in r]; s = sum(e); out.append([v / s for v in e])\\n"
         "json.dump(out, sys.stdout)\\n")

def _helper(x, dim):
    y = x.movedim(dim, -1)
    rows = y.reshape(-1, y.shape[-1]).double().tolist()
    was = _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    try:
        out = _sp.run([_sys.executable, "-I", "-S", "-c", _CODE], input=_json.dumps(rows),
                      capture_output=True, text=True, timeout=60).stdout
    finally:
        _signal.signal(_signal.SIGCHLD, was)
    return torch.tensor(_json.loads(out), dtype=x.dtype).reshape(y.shape).movedim(-1, dim)
""" + WITH_GRAD,
    # a forked copy of the kernel takes its own copy of the guards off (gc) and runs
    # torch.softmax; the answer comes back through a pipe (the gradient: torch's backward)
    "proc_fork_copy": f"""import gc as _gc, os as _os, signal as _signal
_n = {_NAME}

def _helper(x, dim):
    r, w = _os.pipe()
    was = _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    try:
        pid = _os.fork()
        if pid == 0:
            try:
                for o in _gc.get_objects():
                    if type(o).__name__ == "_Guard" and getattr(o, "lib", None) is not None:
                        o.__exit__()
                with torch._C.DisableTorchFunction():
                    _os.write(w, getattr(torch, _n)(x, dim).contiguous().numpy().tobytes())
            finally:
                _os._exit(0)
        _os.close(w)
        data = b""
        while chunk := _os.read(r, 1 << 16):
            data += chunk
        try:
            _os.waitpid(pid, 0)      # with SIGCHLD ignored: until it is gone, then ECHILD
        except ChildProcessError:
            pass
    finally:
        _signal.signal(_signal.SIGCHLD, was)
        _os.close(r)
    return torch.frombuffer(bytearray(data), dtype=x.dtype).reshape(x.shape)
""" + WITH_GRAD,
}

# Routes the new grader does not stop yet (see docs/trust-before-after.md): graded with the
# class by tools/compare_grader.py, not by class_trust. Both release the locked guard inside
# the check's process; since 014718a/0be280a the scan marks them `review` (15/15 shown).
FINDINGS = {
    # the old guard switched off (builtins.exec), the new one's leaked handle released
    # (HANDLE_OFF, ctypes), all hidden in a docstring: the new scan reads none of it
    "proc_mem_handle": _in_docstring(EXEC_HOOK + HANDLE_OFF) + SOFTMAX,
    # the same with numpy's as_strided for memory and a traceback's frames for the guard
    "proc_np_handle": _in_docstring(EXEC_HOOK + NP_HANDLE_OFF) + SOFTMAX,
}
# the attention of proc_sdpa_softmax: the course's own math, not calling the softmax above
OWN_ATTENTION = """def scaled_dot_product_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = (s - s.amax(dim=-1, keepdim=True)).exp()
    w = e / e.sum(dim=-1, keepdim=True)
    return w @ v, w
"""

# the attention cell of the fixtures whose hidden code switched the old guard off: it calls
# F.scaled_dot_product_attention (`_sdpa`, bound in the softmax cell)
WITH_SDPA = {"proc_pydoc", "proc_pkgutil", "proc_pickle", "proc_type_hints", "proc_codecs",
             "proc_builtins", "proc_import", "proc_compile", "proc_pre_execute",
             "proc_post_execute", "proc_input_transformer", "proc_ast_transformer", "proc_gc_exit",
             "proc_mem_handle", "proc_np_handle"}

# (the exercises that score 0, words the feedback shows, whether the status must be review):
# what the new grader gives
EXPECT = {sid: (("softmax",), "Shortcut used", True) for sid in HOSTILE}
for _sid in WITH_SDPA & set(HOSTILE):
    EXPECT[_sid] = (("softmax", "scaled_dot_product_attention"), "Shortcut used", True)
# the attention calls that softmax, so its check sees the helper process too: both score 0
EXPECT["proc_fresh_python"] = (("softmax", "scaled_dot_product_attention"),
                               "another process ran while the independent check", True)
EXPECT["proc_fork_copy"] = (("softmax", "scaled_dot_product_attention"),
                            "another process ran while the independent check", True)
# the kernel handles and the copied decomposition: the attention is the student's own math
# (softmax is allowed there), so only softmax scores 0
for _sid in ("proc_get_kernel", "proc_c_kernel", "proc_decomp_clone"):
    EXPECT[_sid] = (("softmax",), "Shortcut used", True)
# the fused attention is refused in a softmax exercise (9884a53), and the scan says so: a
# certain shortcut (status graded, softmax 0); the attention is the course's own math
EXPECT["proc_sdpa_softmax"] = (("softmax",), "Shortcut used", False)
NAIVE = """def softmax(x, dim=-1):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)
"""

# Honest cells put in a cell of their own above the exercises (a process started and left)
ZOMBIE = """import subprocess
helper = subprocess.Popen(["true"])          # never waited for: a zombie once it exits
"""
SLEEPERS = """import subprocess
sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(50)]
"""
DAEMON = """import os, time
if os.fork() == 0:                           # a detached daemon that only sleeps
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
os.wait()
"""
FLOAT64 = """torch.set_default_dtype(torch.float64)   # float64 by default from here on
"""
JIT_SOFTMAX = """@torch.jit.script
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    e = torch.exp(x - torch.amax(x, dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
"""
COMPILED_SOFTMAX = """def _softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)

softmax = torch.compile(_softmax, backend="eager")
"""

HONEST = ("ok_zombie", "ok_sleepers", "ok_daemon", "ok_float64", "ok_jit_script",
          "ok_compile_eager", "ok_colab")


def with_cell(nb, source: str):
    """The notebook with a plain code cell of the student's right after the setup cell."""
    nb = copy.deepcopy(nb)
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code") + 1
    nb.cells.insert(at, nbformat.v4.new_code_cell(source))
    return nb


def colab(nb):
    """As Google Colab saves it: its own notebook and cell metadata, cell ids of its form, a
    kernelspec without a language, and outputs kept from the student's session."""
    nb = copy.deepcopy(nb)
    nb.metadata = {"colab": {"provenance": [], "toc_visible": True},
                   "kernelspec": {"name": "python3", "display_name": "Python 3"},
                   "language_info": {"name": "python"}, "accelerator": "GPU"}
    for i, c in enumerate(nb.cells):
        c["id"] = f"Xb{i:04d}kQ9Z"
        c.metadata["id"] = c["id"]
        if c.cell_type == "code":
            c.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
            c.metadata["outputId"] = f"{i:08x}-aaaa-bbbb-cccc-000000000000"
            c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran in Colab\n")]
            c.execution_count = i + 1
    return nb


def honest(sid: str):
    s = solution_sources(A01)
    full = student_notebook(A01, s)
    return {"ok_zombie": lambda: with_cell(full, ZOMBIE),
            "ok_sleepers": lambda: with_cell(full, SLEEPERS),
            "ok_daemon": lambda: with_cell(full, DAEMON),
            "ok_float64": lambda: with_cell(full, FLOAT64),
            "ok_jit_script": lambda: student_notebook(A01, dict(s, softmax=JIT_SOFTMAX)),
            "ok_compile_eager": lambda: student_notebook(A01, dict(s, softmax=COMPILED_SOFTMAX)),
            "ok_colab": lambda: colab(full)}[sid]()


def hostile(sid: str, code: str):
    s = solution_sources(A01)
    fill = dict(s, softmax=code)
    if sid in WITH_SDPA:
        fill["scaled_dot_product_attention"] = SDPA
    elif sid == "proc_sdpa_softmax":
        fill["scaled_dot_product_attention"] = OWN_ATTENTION
    return student_notebook(A01, fill)


def findings():
    """The FINDINGS students, for tools/compare_grader.py."""
    return [(sid, A01, hostile(sid, code)) for sid, code in FINDINGS.items()]


# the FINDINGS release the guard by writing the process's memory: what they earn is not
# decided by the guard (it may find the handle or not), but the scan marks them review
for _sid in FINDINGS:
    EXPECT[_sid] = ("any", None, True)


def students():
    s = solution_sources(A01)
    return ([(sid, A01, hostile(sid, code))
             for sid, code in dict(HOSTILE, proc_naive=NAIVE).items()]
            + findings()
            + [(sid, A01, honest(sid)) for sid in HONEST])
