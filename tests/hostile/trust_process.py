"""The check in a process of its own: hostile fixtures that beat the in-kernel check (code the
scan cannot read that switches the guard off, kernel handles taken before the guard, helper
processes) and honest ones that the in-kernel check failed or that must keep every point
(processes an earlier cell left behind, a Colab notebook, torch.jit.script, torch.compile with
the eager backend, float64 by default). All are graded in one class beside the honest and
untouched students (tests/conftest.py, class_trust); tests/test_trust_process.py asserts.

Every hostile softmax below computes the forbidden built-in by a name the scan cannot fold;
where the check's guard is what stops it, the exercise scores 0 and the feedback says
"Shortcut used"; the scan marks the submission `review` with the lines as well."""
import copy

import nbformat

from nbtools import solution_sources, student_notebook

A01 = "01_attention"
_NAME = "bytes([115, 111, 102, 116, 109, 97, 120]).decode()"          # "softmax", unseen

HOSTILE = {
    # 1. a name resolved at run time
    "proc_pydoc": f"""import pydoc as _pydoc

def softmax(x, dim=-1):
    return _pydoc.locate("torch.nn.functional." + {_NAME})(x, dim=dim)
""",
    "proc_pkgutil": f"""import pkgutil as _pkgutil

def softmax(x, dim=-1):
    return _pkgutil.resolve_name("torch:" + {_NAME})(x, dim)
""",
    "proc_pickle": """import pickle as _pickle

def softmax(x, dim=-1):
    return _pickle.loads(b"ctorch\\nsoftmax\\n.")(x, dim)
""",
    "proc_type_hints": """import typing as _typing

def _hint(a: "torch.softmax"):
    pass

def softmax(x, dim=-1):
    return _typing.get_type_hints(_hint, globals())["a"](x, dim)
""",
    # 1. builtins replaced before the check, the guard searched for and left, IPython hooks
    "proc_builtins": f"""import builtins as _b
_exec, _imp = _b.exec, _b.__import__
_b.exec = lambda code, *a, **k: _exec(code.replace("m.kernel_guard(plan, user_ns)", "pass")
                                     if isinstance(code, str) else code, *a, **k)
_b.__import__ = lambda name, *a, **k: _imp(name, *a, **k)

def softmax(x, dim=-1):
    return getattr(torch, {_NAME})(x, dim)
""",
    "proc_gc_exit": f"""import gc as _gc

def softmax(x, dim=-1):
    for o in _gc.get_objects():
        try:
            if hasattr(o, "trips") and hasattr(type(o), "__exit__"):
                o.__exit__(None, None, None)
            elif isinstance(o, torch.library.Library):
                o._destroy()
        except Exception:
            pass
    return getattr(torch, {_NAME})(x, dim)
""",
    "proc_pre_execute": f"""try:
    _ip = get_ipython()
    _ip.events.register("pre_execute", lambda: None)
    _ip.events.register("pre_run_cell", lambda info=None: None)
except Exception:
    pass

def softmax(x, dim=-1):
    return getattr(torch, {_NAME})(x, dim)
""",
    # 2. a kernel handle taken before the exercise, called inside it
    "proc_get_kernel": """_kernel = torch.library.get_kernel("aten::_softmax", "CPU")
_keys = torch._C._dispatch_keyset_full()

def softmax(x, dim=-1):
    return _kernel.call_boxed(_keys, x, dim, False)
""",
    # a fresh interpreter, without the guard, computes it inside the exercise (a stable
    # softmax in plain Python: right answers, from a program the check never saw)
    "proc_fresh_python": f"""import json as _json
import subprocess as _sp
import sys as _sys

_CODE = ("import json, math, sys\\n"
         "out = []\\n"
         "for r in json.load(sys.stdin):\\n"
         "    m = max(r); e = [math.exp(v - m) for v in r]; s = sum(e); out.append([v / s for v in e])\\n"
         "json.dump(out, sys.stdout)\\n")

def softmax(x, dim=-1):
    y = x.detach().movedim(dim, -1)
    rows = y.reshape(-1, y.shape[-1]).double().tolist()
    out = _sp.run([_sys.executable, "-I", "-S", "-c", _CODE], input=_json.dumps(rows),
                  capture_output=True, text=True, timeout=60).stdout
    return torch.tensor(_json.loads(out), dtype=x.dtype).reshape(y.shape).movedim(-1, dim)
""",
    # a daemon started at the top of the cell (a double fork, then a fresh interpreter that
    # imports torch and waits on a pipe); softmax hands it the inputs, and falls back to a
    # naive softmax (which overflows on far-apart logits) when no answer comes within 2 s
    "proc_daemon_server": """import io as _io, os as _os, select as _select, sys as _sys
_to_r, _to_w = _os.pipe()
_back_r, _back_w = _os.pipe()
_SERVE = ("import os, io, sys, torch\\n"
          "r, w = int(sys.argv[1]), int(sys.argv[2])\\n"
          "f = os.fdopen(r, 'rb'); g = os.fdopen(w, 'wb')\\n"
          "while True:\\n"
          "    n = int.from_bytes(f.read(8), 'big'); x, d = torch.load(io.BytesIO(f.read(n)))\\n"
          "    b = io.BytesIO(); torch.save(getattr(torch, 'soft' + 'max')(x, d), b)\\n"
          "    g.write(len(b.getvalue()).to_bytes(8, 'big') + b.getvalue()); g.flush()\\n")
if _os.fork() == 0:
    if _os.fork() == 0:
        _os.execv(_sys.executable, [_sys.executable, "-c", _SERVE, str(_to_r), str(_back_w)])
    _os._exit(0)
_os.wait()

_alive = [True]

def softmax(x, dim=-1):
    b = _io.BytesIO()
    torch.save((x.detach(), dim), b)
    if _alive[0]:
        _os.write(_to_w, len(b.getvalue()).to_bytes(8, "big") + b.getvalue())
    if _alive[0] and _select.select([_back_r], [], [], 2)[0]:
        n = int.from_bytes(_os.read(_back_r, 8), "big")
        data = b""
        while len(data) < n:
            data += _os.read(_back_r, n - len(data))
        return torch.load(_io.BytesIO(data))
    _alive[0] = False
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)
""",
}

# (the exercises that score 0, words the feedback shows, whether the status must be review)
EXPECT = {sid: (("softmax",), "Shortcut used", True) for sid in HOSTILE}
# the raw kernel records no autograd graph: the attention built on it loses its gradient cell too
EXPECT["proc_get_kernel"] = (("softmax", "test_scaled_dot_product_attention_output"), "Shortcut used", True)
# the attention calls that softmax, so its check sees the fresh interpreter too: both score 0
EXPECT["proc_fresh_python"] = (("softmax", "scaled_dot_product_attention"),
                               "another process ran while the independent check", True)
EXPECT["proc_daemon_server"] = (None, None, False)   # scores what NAIVE scores, no more
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


def students():
    s = solution_sources(A01)
    return ([(sid, A01, student_notebook(A01, dict(s, softmax=code)))
             for sid, code in dict(HOSTILE, proc_naive=NAIVE).items()]
            + [(sid, A01, honest(sid)) for sid in HONEST])
