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

# a helper process that leaves the kernel (a double fork: its parent exits at once, so it is
# reparented to the sandbox's init and the kernel has no child to see), alive while the checks run
DOUBLE_FORK = """import os as _os, time as _time
_pid = _os.fork()
if _pid == 0:
    if _os.fork() == 0:
        _time.sleep(600)
    _os._exit(0)
_os.waitpid(_pid, 0)

def softmax(x, dim=-1):
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)
"""

MEMORY_CELLS = ("test_flash_attention_memory", "test_flash_attention_random")

EXPECT = {  # (assignment, student): (the graded cells that score 0, what the feedback says)
    (A01, "guard_softmin"): (("softmax",), "Shortcut used"),
    (A01, "guard_pool"): (("softmax",), "Shortcut used"),
    (A01, "guard_aten_queue"): (("softmax",), "Shortcut used"),
    (A10, "guard_naive_pool"): (MEMORY_CELLS, "every thread counted"),
    (A10, "guard_naive_queue"): (MEMORY_CELLS, "every thread counted"),
    # alive beside every later check: all of 01's exercises lose their points
    (A01, "guard_double_fork"): (("softmax", "scaled_dot_product_attention"), "double fork"),
}


def students():
    s01, s10 = solution_sources(A01), solution_sources(A10)
    return [("guard_softmin", A01, student_notebook(A01, dict(s01, softmax=SOFTMIN))),
            ("guard_pool", A01, student_notebook(A01, dict(s01, softmax=LOG_SOFTMAX_POOL))),
            ("guard_aten_queue", A01, student_notebook(A01, dict(s01, softmax=ATEN_QUEUE))),
            ("guard_double_fork", A01, student_notebook(A01, dict(s01, softmax=DOUBLE_FORK))),
            ("guard_naive_pool", A10, student_notebook(A10, dict(s10, flash_attention=NAIVE_POOL))),
            ("guard_naive_queue", A10, student_notebook(A10, dict(s10, flash_attention=NAIVE_QUEUE)))]
