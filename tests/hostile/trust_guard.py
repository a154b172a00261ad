"""Issue 26, classes 3 and 4: a forbidden shortcut by another name, and notebook 10's memory
rule in another thread. Every name below is assembled at run time from bytes, so the static
scan can only flag a dynamic lookup for review (it scores nothing); what decides is the probe
machine in the sandbox: the shortcut refused at the operator level in every thread, and the
whole process's memory measured while flash_attention runs. Each cheat loses the points of
the exercise it cheats (flash_attention: the memory cells, which the rule backs) and no other."""
from nbtools import solution_sources, student_notebook

A01, A10 = "01_attention", "10_efficient_attention"

# softmin(-x), by a name the scan cannot fold
SOFTMIN = """import torch.nn.functional as _F
_name = bytes([115, 111, 102, 116, 109, 105, 110]).decode()       # "softmin"

def softmax(x, dim=-1):
    return getattr(_F, _name)(-x, dim=dim)
"""

# log_softmax(x).exp(), in a ThreadPoolExecutor's thread
LOG_SOFTMAX_POOL = """import concurrent.futures as _cf
_pool = _cf.ThreadPoolExecutor(1)
_name = bytes([108, 111, 103, 95, 115, 111, 102, 116, 109, 97, 120]).decode()   # "log_softmax"

def _work(x, dim):
    return getattr(torch, _name)(x, dim).exp()

def softmax(x, dim=-1):
    return _pool.submit(_work, x, dim).result()
"""

# the operator itself (torch.ops.aten._softmax), in a thread started here that waits on a queue
ATEN_QUEUE = """import queue as _queue
import threading as _threading
_jobs = _queue.Queue()
_op = getattr(torch.ops.aten, bytes([95, 115, 111, 102, 116, 109, 97, 120]).decode())   # "_softmax"

def _serve():
    while True:
        x, dim, out = _jobs.get()
        try:
            out.put(_op(x, dim, False))
        except Exception as e:
            out.put(e)

_threading.Thread(target=_serve, daemon=True).start()

def softmax(x, dim=-1):
    out = _queue.Queue()
    _jobs.put((x, dim, out))
    y = out.get()
    if isinstance(y, Exception):
        raise y
    return y
"""

# naive attention (the whole L x L score matrix), in a ThreadPoolExecutor's thread
from test_vm_guard import THREAD_NAIVE as NAIVE_POOL  # noqa: E402 (one fixture for both lanes)

# the same, in a thread started when the cell ran, waiting on a queue
NAIVE_QUEUE = """import queue as _queue
import threading as _threading
_jobs = _queue.Queue()

def _serve():
    while True:
        q, k, v, causal, out = _jobs.get()
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        out.put(torch.softmax(s, dim=-1) @ v)

_threading.Thread(target=_serve, daemon=True).start()

def flash_attention(q, k, v, block_size=64, causal=False):
    out = _queue.Queue()
    _jobs.put((q, k, v, causal, out))
    return out.get()
"""

# Both cheats below give the forbidden built-in's values and a naive softmax's gradient; on
# their own (the cheat foiled) they are that naive softmax, which overflows on far-apart logits.
_NAIVE = """import torch.nn.functional as _F

def _naive(x, dim):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)

def _key(x, dim):
    try:
        return (x.detach().numpy().tobytes(), tuple(x.shape), dim)
    except Exception:
        return None
"""

# an audit hook, set before the check, that reads the check's packed inputs wherever code is
# compiled and computes F.softmax on every one of them, along every axis, at once; softmax
# then hands out those answers. The inputs never reach the kernel, and in the check's own
# process they arrive as data, never compiled: softmax is left with its naive softmax.
AUDIT_HOOK = _NAIVE + """import base64 as _b64, io as _io, re as _re, sys as _sys
import numpy as _np
_SEEN = {}

_softmax = getattr(_F, bytes([115, 111, 102, 116, 109, 97, 120]).decode())   # F.softmax, unseen

def _peek(event, args):
    if event != "compile" or not args or type(args[0]) not in (str, bytes):
        return
    text = args[0] if type(args[0]) is str else args[0].decode("utf-8", "replace")
    try:
        for m in _re.finditer(r'"tensors": "([A-Za-z0-9+/=]{8,})"', text):
            with _np.load(_io.BytesIO(_b64.b64decode(m.group(1)))) as z:
                for k in z.files:
                    a = z[k]
                    for d in range(-a.ndim, a.ndim) if a.dtype.kind == "f" else ():
                        try:
                            _SEEN[(a.tobytes(), a.shape, d)] = _softmax(torch.from_numpy(a), dim=d)
                        except Exception:
                            pass
    except Exception:
        pass

_sys.addaudithook(_peek)

def softmax(x, dim=-1):
    y = _naive(x, dim)
    got = _SEEN.get(_key(x, dim))
    return y if got is None or got.dtype != x.dtype else got + (y - y.detach()).nan_to_num(0.0)
"""

# softmax keeps every input it is called with on disk; the next exercise's cell computes
# F.softmax on them (no guard on then), stores the answers and kills the kernel, so that the
# runner replays the cells done so far in a fresh kernel, where softmax hands out the answers.
# The check's inputs were never in the kernel, so the answers are for other inputs: softmax
# keeps the naive softmax's grades, and the cell that killed the kernel loses its exercise.
REPLAY = _NAIVE + """import os as _os
_SEEN = []

def softmax(x, dim=-1):
    y, key = _naive(x, dim), _key(x, dim)
    if key is None:
        return y
    if _os.path.exists("_answers.pt"):
        got = torch.load("_answers.pt", weights_only=False).get(key)
        return y if got is None or got.dtype != x.dtype else got + (y - y.detach()).nan_to_num(0.0)
    _SEEN.append((x.detach().clone(), dim))
    torch.save(_SEEN, "_seen.pt")
    return y
"""
CRASH = """import os as _os2
if _os2.path.exists("_seen.pt") and not _os2.path.exists("_answers.pt"):
    _sm = getattr(torch, bytes([115, 111, 102, 116, 109, 97, 120]).decode())   # torch.softmax, unseen
    torch.save({(a.numpy().tobytes(), tuple(a.shape), d): _sm(a, dim=d)
                for a, d in torch.load("_seen.pt", weights_only=False)}, "_answers.pt")
    _os2._exit(1)

"""

MEMORY_CELLS = ("test_flash_attention_memory", "test_flash_attention_random")

EXPECT = {  # (assignment, student): (the graded cells that score 0, what the feedback says)
    (A01, "guard_softmin"): (("softmax",), "Shortcut used"),
    (A01, "guard_pool"): (("softmax",), "Shortcut used"),
    (A01, "guard_aten_queue"): (("softmax",), "Shortcut used"),
    (A10, "guard_naive_pool"): (MEMORY_CELLS, "every thread counted"),
    (A10, "guard_naive_queue"): (MEMORY_CELLS, "every thread counted"),
    (A01, "guard_audit_hook"): (("test_softmax_stable", "test_softmax_random"), None),
    (A01, "guard_replay"): (("test_softmax_stable", "test_softmax_random", "scaled_dot_product_attention"),
                            "kernel died"),
}


def students():
    s01, s10 = solution_sources(A01), solution_sources(A10)
    return [("guard_softmin", A01, student_notebook(A01, dict(s01, softmax=SOFTMIN))),
            ("guard_pool", A01, student_notebook(A01, dict(s01, softmax=LOG_SOFTMAX_POOL))),
            ("guard_aten_queue", A01, student_notebook(A01, dict(s01, softmax=ATEN_QUEUE))),
            ("guard_audit_hook", A01, student_notebook(A01, dict(s01, softmax=AUDIT_HOOK))),
            ("guard_replay", A01, student_notebook(A01, dict(
                s01, softmax=REPLAY,
                scaled_dot_product_attention=CRASH + s01["scaled_dot_product_attention"]))),
            ("guard_naive_pool", A10, student_notebook(A10, dict(s10, flash_attention=NAIVE_POOL))),
            ("guard_naive_queue", A10, student_notebook(A10, dict(s10, flash_attention=NAIVE_QUEUE)))]
