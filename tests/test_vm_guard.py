"""Issue 26, classes 3 and 4, in the probe machine itself (tfscratch/specs/vm.py).

3. A forbidden shortcut by another name: while a plan's probes run, the exercise's own PyTorch
   built-in is refused at the operator level (the plan's rows of `tfscratch.shortcuts`), in every thread: softmin(-x),
   log_softmax(x).exp(), a name assembled at run time, torch.ops.aten, torch._refs... each is
   caught in the calling thread, in a threading.Thread (even when the thread swallows the
   error), through a ThreadPoolExecutor and in a thread started earlier that waits on a queue;
   honest code (exp/sum/max, masked_fill, einsum, float64 inside, earlier built-ins) is not.
4. Notebook 10's memory rule covers every thread: a call with `memory_limit` measures the
   whole process's resident memory, so naive attention in any thread shows. (A process beside
   a guarded plan is the sandbox runner's to see: tests/test_check_process.py.)

Against the probe machine before this change (vm.run_plan ignored `forbid` and `memory_limit`;
HEAD's helpers/ first on PYTHONPATH) every case fails except the honest ones, which must pass
there too."""
import concurrent.futures as cf
import json
import math
import queue
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tfscratch import shortcuts
from tfscratch.specs import vm

# ------------------------------------------------------------------------------- harness


def _run(groups, fn, *args, memory_limit=0):
    """`fn(*args)` as the one call of a one-probe plan that forbids `groups`: (the probe's
    error or None, its captures)."""
    tensors = {f"t{i}": np.asarray(a) for i, a in enumerate(args)}
    call = {"args": [{"$t": f"t{i}"} for i in range(len(args))], "kwargs": {}}
    if memory_limit:
        call["memory_limit"] = memory_limit
    plan = {"exercise": "f", "target": "f", "probes": [{"name": "p", "calls": [call]}]}
    if groups:
        plan["forbid"] = shortcuts.plan_rows(groups)
    res = vm.run_plan(plan, {"f": fn}, tensors=tensors)
    return res["meta"].get("p.error"), res["caps"]


def _in_thread(fn):
    """fn run by a threading.Thread that swallows every error (the caller gets zeros)."""
    def run(*args):
        box = []

        def work():
            try:
                box.append(fn(*args))
            except Exception:  # noqa: BLE001 - the cheat hides the refusal
                pass
        t = threading.Thread(target=work)
        t.start()
        t.join()
        return box[0] if box else torch.zeros(())
    return run


def _in_pool(fn):
    pool = cf.ThreadPoolExecutor(1)
    return lambda *args: pool.submit(fn, *args).result()


def _in_waiting_thread(fn):
    """fn run by a thread started now (before the plan runs) that waits on a queue."""
    jobs = queue.Queue()

    def serve():
        while True:
            args, out = jobs.get()
            try:
                out.put(fn(*args))
            except Exception as e:  # noqa: BLE001
                out.put(e)
    threading.Thread(target=serve, daemon=True).start()

    def run(*args):
        out = queue.Queue()
        jobs.put((args, out))
        got = out.get()
        if isinstance(got, Exception):
            raise got
        return got
    return run


WAYS = {"main thread": lambda f: f, "threading.Thread": _in_thread, "ThreadPoolExecutor": _in_pool,
        "a thread waiting on a queue": _in_waiting_thread}

X = torch.randn(2, 6, 8).numpy()      # every spelling below takes this one tensor

# ------------------------------------------------------------------------------- spellings
SOFTMAX_NAME = bytes([115, 111, 102, 116, 109, 97, 120]).decode()    # no scan folds this


def _mha(x):
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    return m(x, x, x)[0]


def _mha_forward(x):
    m = torch.nn.MultiheadAttention(8, 2)
    return F.multi_head_attention_forward(x, x, x, 8, 2, m.in_proj_weight, m.in_proj_bias, None, None,
                                          False, 0.0, m.out_proj.weight, m.out_proj.bias)[0]


def _mha_fast_path(x):
    with torch.no_grad():
        return torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()(x, x, x, need_weights=False)[0]


def _native_mha(x):
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    return torch._native_multi_head_attention(x, x, x, 8, 2, m.in_proj_weight, m.in_proj_bias,
                                              m.out_proj.weight, m.out_proj.bias)[0]


def _softmax_by_attention(x):
    """softmax(x) as the fused attention gives it (its flash kernel for the CPU, float32)."""
    y = x.float().reshape(1, 1, -1, x.shape[-1]).contiguous()
    eye = torch.eye(x.shape[-1]).reshape(1, 1, x.shape[-1], x.shape[-1])
    return F.scaled_dot_product_attention(y, eye, eye, scale=1.0).reshape(x.shape).to(x.dtype)


SPELLINGS = {   # group: {spelling: fn(x)}
    "softmax": {
        "torch.softmax": lambda x: torch.softmax(x, -1),
        "Tensor.softmax": lambda x: x.softmax(-1),
        "nn.Softmax": lambda x: torch.nn.Softmax(-1)(x),
        "F.softmin(-x)": lambda x: F.softmin(-x, -1),
        "log_softmax(x).exp()": lambda x: torch.log_softmax(x, -1).exp(),
        "a name assembled at run time": lambda x: getattr(torch, SOFTMAX_NAME)(x, -1),
        "torch.ops.aten._softmax": lambda x: torch.ops.aten._softmax(x, -1, False),
        "torch.ops.aten._softmax.out": lambda x: torch.ops.aten._softmax.out(
            x, -1, False, out=torch.empty_like(x)),
        "torch.special.softmax": lambda x: torch.special.softmax(x, -1),
        # the fused attention computes a softmax inside: attention(q=x, k=v=I, scale=1)
        "F.scaled_dot_product_attention(x, I, I)": lambda x: _softmax_by_attention(x),
        "float64 inside": lambda x: torch.softmax(x.double(), -1).float(),
        "with autograd": lambda x: torch.softmax(x.requires_grad_(), -1),
        "Categorical(logits=x).probs": lambda x: torch.distributions.Categorical(logits=x).probs,
        "torch.sparse.softmax": lambda x: torch.sparse.softmax(x.to_sparse(), -1).to_dense(),
        "torch._masked_softmax": lambda x: torch._masked_softmax(x, torch.zeros_like(x, dtype=torch.bool)),
        "torch._refs.softmax": lambda x: torch._refs.softmax(x, -1),
        "torch._decomp's _softmax": lambda x: torch._decomp.decompositions._softmax(x, -1, False),
    },
    "flash_attention": {
        "F.scaled_dot_product_attention": lambda x: F.scaled_dot_product_attention(x, x, x),
        "causal, with autograd": lambda x: F.scaled_dot_product_attention(
            x.requires_grad_(), x, x, is_causal=True),
        "a name assembled at run time": lambda x: getattr(F, "".join(
            chr(c) for c in b"scaled_dot_product_attention"))(x, x, x),
        "torch.ops.aten._scaled_dot_product_attention_math": lambda x:
            torch.ops.aten._scaled_dot_product_attention_math(x, x, x)[0],
        "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu": lambda x:
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(x[None], x[None], x[None])[0],
        "nn.MultiheadAttention": _mha,
        "F.multi_head_attention_forward": lambda x: _mha_forward(x.transpose(0, 1)),
        "nn.MultiheadAttention, eval fast path": lambda x: _mha_fast_path(x),
        "torch._native_multi_head_attention": lambda x: _native_mha(x),
    },
    "layer_norm": {
        "F.layer_norm": lambda x: F.layer_norm(x, (8,)),
        "nn.LayerNorm": lambda x: torch.nn.LayerNorm(8)(x),
        "torch.native_layer_norm": lambda x: torch.native_layer_norm(x, (8,), None, None, 1e-5)[0],
        "F.group_norm": lambda x: F.group_norm(x, 2),
        "F.rms_norm": lambda x: F.rms_norm(x.requires_grad_(), (8,)),
        "torch._refs's layer_norm": lambda x: torch._refs.nn.functional.layer_norm(x, (8,)),
    },
    "batch_norm": {
        "F.batch_norm, training": lambda x: F.batch_norm(x.reshape(-1, 8), torch.zeros(8), torch.ones(8),
                                                         training=True),
        "nn.BatchNorm1d, eval": lambda x: torch.nn.BatchNorm1d(8).eval()(x.reshape(-1, 8)),
        "torch.batch_norm": lambda x: torch.batch_norm(x.reshape(-1, 8), None, None, None, None,
                                                       True, 0.1, 1e-5, False),
        "F.instance_norm": lambda x: F.instance_norm(x),
        "torch.native_batch_norm": lambda x: torch.native_batch_norm(
            x.reshape(-1, 8), None, None, None, None, True, 0.1, 1e-5)[0],
    },
    "rms_norm": {
        "F.rms_norm": lambda x: F.rms_norm(x, (8,)),
        "nn.RMSNorm": lambda x: torch.nn.RMSNorm(8)(x),
        "nn.LayerNorm": lambda x: torch.nn.LayerNorm(8, bias=False)(x),
    },
    "cross_entropy": {
        "F.cross_entropy with label_smoothing": lambda x: F.cross_entropy(
            x.reshape(-1, 8), torch.arange(12) % 8, label_smoothing=0.1),
        "nn.CrossEntropyLoss": lambda x: torch.nn.CrossEntropyLoss()(x.reshape(-1, 8), torch.arange(12) % 8),
    },
    "transformer": {
        "nn.TransformerEncoderLayer": lambda x: torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)(x),
        "nn.TransformerEncoderLayer, eval fast path": lambda x: _fast_path(x),
        "nn.TransformerDecoderLayer": lambda x: torch.nn.TransformerDecoderLayer(8, 2, 16, batch_first=True)(x, x),
    },
}


def _fast_path(x):
    with torch.no_grad():
        return torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()(x)


CASES = [(g, s, way) for g, spellings in SPELLINGS.items() for s in spellings for way in WAYS]


@pytest.mark.parametrize("group,spelling,way", CASES, ids=[f"{g}:{s}:{w}" for g, s, w in CASES])
def test_every_spelling_is_refused_in_every_thread(group, spelling, way):
    error, _ = _run((group,), WAYS[way](SPELLINGS[group][spelling]), X)
    assert error and error.startswith("ShortcutUsed: Shortcut used: your code "), error


def test_the_message_is_the_kernel_guards():
    """The probe machine says what the kernel's own guard (tfscratch.checks.core) says."""
    from tfscratch.checks import core
    for group, row in shortcuts.GROUPS.items():
        assert row.label == core._HUMAN[group], group
    error, _ = _run(("softmax",), lambda x: F.softmin(-x, -1), X)
    assert error == ("ShortcutUsed: Shortcut used: your code called PyTorch's `softmax` (torch.softmax "
                     "/ F.softmax / Tensor.softmax / nn.Softmax). This exercise asks you to build it "
                     "yourself from basic tensor operations.")
    error, _ = _run(("multihead",), _mha, X)
    assert error == ("ShortcutUsed: Shortcut used: your code ran nn.MultiheadAttention. This exercise "
                     "asks you to build it yourself.")


def test_every_operator_of_the_table_exists_in_this_torch():
    """A renamed operator would silently leave a hole: each one of the table (tfscratch.shortcuts)
    is an aten operator with a kernel on the CPU side, and each Python function is torch's own."""
    for group, (_, ops, paths) in shortcuts.plan_rows(shortcuts.GROUPS).items():
        for op in ops:
            assert vm._kernels(op), (group, op)
        assert len(vm._python_functions(paths, ())) == len(paths), group


# ------------------------------------------------------------------------------- honest code
def _softmax(x, dim=-1):
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)


def _blockwise(q, k, v, bs=64):
    """Blockwise attention: keys in blocks, an online softmax."""
    m = torch.full(q.shape[:-1] + (1,), -1e30, dtype=q.dtype)
    l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
    for s in range(0, k.size(-2), bs):
        sc = q @ k[..., s:s + bs, :].mT / math.sqrt(q.size(-1))
        m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
        p, alpha = (sc - m_new).exp(), (m - m_new).exp()
        l, acc, m = l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v[..., s:s + bs, :], m_new
    return acc / l


HONEST = {
    "softmax": {
        "exp / sum / max": _softmax,
        "masked_fill with -inf": lambda x: _softmax(x.masked_fill(x > 1.5, float("-inf"))),
        "float64 inside": lambda x: _softmax(x.double()).float(),
        "einsum for the sum": lambda x: (lambda e: e / torch.einsum("...j->...", e)[..., None])(
            (x - x.max(-1, keepdim=True).values).exp()),
        "x - logsumexp(x)": lambda x: (x - torch.logsumexp(x, -1, keepdim=True)).exp(),
    },
    "flash_attention": {
        "blockwise, float64 inside": lambda x: _blockwise(x.double(), x.double(), x.double(), 2).float(),
        "torch.softmax (an earlier built-in)": lambda x: torch.softmax(x @ x.mT, -1) @ x,
        "einsum scores, masked_fill causal": lambda x: torch.einsum(
            "...qk,...kd->...qd", _softmax(torch.einsum("...qd,...kd->...qk", x, x).masked_fill(
                torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))), x),
    },
    "layer_norm": {
        "mean and var": lambda x: (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt(),
        "var_mean, float64 inside": lambda x: (lambda vm_: (x.double() - vm_[1]) / (vm_[0] + 1e-5).sqrt())(
            torch.var_mean(x.double(), -1, unbiased=False, keepdim=True)).float(),
    },
    "batch_norm": {
        "mean and var over every axis but the last": lambda x: (x - x.mean((0, 1))) / (x.var((0, 1), unbiased=False) + 1e-5).sqrt(),
    },
    "rms_norm": {
        "pow, mean, rsqrt": lambda x: x * x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt(),
        "x.norm": lambda x: x / (x.norm(dim=-1, keepdim=True) / math.sqrt(8) + 1e-6),
    },
    "cross_entropy": {
        "log_softmax and gather (earlier built-ins)": lambda x: -torch.log_softmax(x.reshape(-1, 8), -1).gather(
            1, (torch.arange(12) % 8)[:, None]).mean(),
        "F.nll_loss": lambda x: F.nll_loss(torch.log_softmax(x.reshape(-1, 8), -1), torch.arange(12) % 8),
    },
    "transformer": {
        "nn.MultiheadAttention and nn.LayerNorm (earlier built-ins)": lambda x: torch.nn.LayerNorm(8)(x + _mha(x)),
    },
}
HONEST_CASES = [(g, s, way) for g, variants in HONEST.items() for s in variants
                for way in ("main thread", "ThreadPoolExecutor")]


@pytest.mark.parametrize("group,variant,way", HONEST_CASES, ids=[f"{g}:{s}:{w}" for g, s, w in HONEST_CASES])
def test_honest_code_is_not_refused(group, variant, way):
    error, caps = _run((group,), WAYS[way](HONEST[group][variant]), X)
    assert error is None and "p.0.out" in caps, error


def test_later_exercises_may_use_earlier_built_ins_and_the_guard_is_gone_afterwards():
    _PY = shortcuts.GROUPS["attention"].python + shortcuts.GROUPS["softmax"].python
    before = [torch._C._dispatch_dump(f"aten::{n}") for n in ("_softmax", "softmax.int", "layer_norm")]
    codes = [f.__code__ for _, f in vm._python_functions(_PY, shortcuts.GROUPS["softmax"].aten)]
    error, _ = _run(("softmax",), lambda x: torch.softmax(x, -1), X)
    assert error and "Shortcut used" in error
    assert [torch._C._dispatch_dump(f"aten::{n}") for n in ("_softmax", "softmax.int", "layer_norm")] == before
    assert [f.__code__ for _, f in vm._python_functions(_PY, shortcuts.GROUPS["softmax"].aten)] == codes
    x = torch.from_numpy(X)
    assert torch.allclose(torch.softmax(x, -1), _softmax(x))
    assert _run(("flash_attention",), lambda x: torch.softmax(x, -1), X)[0] is None
    assert _run((), lambda x: F.scaled_dot_product_attention(x, x, x), X)[0] is None


# ------------------------------------------------------------------------------- tampering
def test_a_kernel_registered_during_the_call_voids_the_probe():
    libs = []

    def tamper(x):
        lib = torch.library.Library("aten", "IMPL")
        libs.append(lib)
        lib.impl("_softmax", lambda *a: _softmax(a[0], a[1]), "CPU")
        return torch.softmax(x, -1)
    try:
        error, _ = _run(("softmax",), tamper, X)
    finally:
        for lib in libs:
            lib._destroy()
    assert error and error.startswith("GuardChanged:"), error


def test_a_refused_function_given_its_code_back_voids_the_probe():
    fn = vm._python_functions(("nn.functional.multi_head_attention_forward",), ())[0][1]
    original = fn.__code__

    def tamper(x):
        fn.__code__ = original
        return _mha(x)
    error, _ = _run(("multihead",), tamper, X)
    assert error and error.startswith("GuardChanged:"), error
    assert fn.__code__ is original


def test_a_shortcut_the_code_catches_still_counts():
    def caught(x):
        try:
            return torch.softmax(x, -1)
        except Exception:  # noqa: BLE001
            return _softmax(x)
    error, _ = _run(("softmax",), caught, X)
    assert error and error.startswith("ShortcutUsed:"), error


# ------------------------------------------------------------------------------- memory, notebook 10
L, BLOCK = 4096, 64
ALLOWANCE = L * L * 3          # as specs/efficient_attention.py: 3/4 of one float32 (L, L)
QKV = [torch.randn(L, 8).numpy() for _ in range(3)]


def _naive(q, k, v):
    return torch.softmax(q @ k.mT / math.sqrt(q.size(-1)), -1) @ v


@pytest.mark.parametrize("way", list(WAYS))
def test_naive_attention_shows_in_the_memory_of_the_process(way):
    fn = WAYS[way](_naive)
    error, caps = _run(("flash_attention",), fn, *QKV, memory_limit=ALLOWANCE)
    assert error is None
    assert int(caps["p.0.memory"]) > ALLOWANCE, f"{way}: {int(caps['p.0.memory'])}"


@pytest.mark.parametrize("way", ["main thread", "ThreadPoolExecutor"])
def test_blockwise_attention_stays_within_the_allowance(way):
    _run(("flash_attention",), lambda q, k, v: _blockwise(q, k, v, BLOCK), QKV[0], QKV[1][:256], QKV[2][:256])
    error, caps = _run(("flash_attention",), WAYS[way](lambda q, k, v: _blockwise(q, k, v, BLOCK)), *QKV,
                       memory_limit=ALLOWANCE)
    assert error is None and int(caps["p.0.memory"]) == 0, int(caps["p.0.memory"])


THREAD_NAIVE = '''
import concurrent.futures as _cf
_pool = _cf.ThreadPoolExecutor(1)

def _attend(q, k, v, causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v

def flash_attention(q, k, v, block_size=64, causal=False):
    return _pool.submit(_attend, q, k, v, causal).result()
'''


@pytest.mark.slow     # the whole spec of flash_attention, the reference's run included (8 s)
def test_the_spec_fails_naive_attention_in_a_thread_on_the_memory_cells_only():
    """Through the grader's judgement (in-process): the memory and random cells fail and say
    why; the values, causal and gradient cells keep their points (the values are right)."""
    import catalogue
    verdicts = catalogue.independent("10_efficient_attention", "flash_attention", THREAD_NAIVE)
    failed = {g for g, v in verdicts.items() if not v.passed}
    assert failed == {"test_flash_attention_memory", "test_flash_attention_random"}, failed
    msg = verdicts["test_flash_attention_memory"].message
    assert "memory grew by" in msg and "every thread" in msg and "Lq x Lk" in msg, msg


# ------------------------------------------------------------------------------- torch.compile
@pytest.mark.slow     # loads torch.compile and compiles with inductor (seconds)
def test_compiled_code_runs_through_the_guard():
    """A function torch.compile'd in an earlier cell runs its own kernels, past the operators:
    while the guard is on it runs eagerly; a stance changed back inside the call voids the
    probe; flex_attention (eager) is attention too."""
    shortcut = torch.compile(lambda x: torch.ops.aten._softmax(x, -1, False) * 2)
    x = torch.from_numpy(X)
    shortcut(x)                                         # compiled before the plan runs
    error, _ = _run(("softmax",), shortcut, X)
    assert error and error.startswith("ShortcutUsed:"), error
    late = torch.compile(lambda x: torch.ops.aten._log_softmax(x, -1, False).exp())
    error, _ = _run(("softmax",), late, X)             # compiled inside the call
    assert error and error.startswith("ShortcutUsed:"), error

    def unstance(x):
        torch.compiler.set_stance("default")
        return shortcut(x)
    error, _ = _run(("softmax",), unstance, X)
    assert error and error.startswith("GuardChanged:"), error
    from torch.nn.attention.flex_attention import flex_attention
    error, _ = _run(("flash_attention",), lambda x: flex_attention(x[None], x[None], x[None])[0], X)
    assert error and error.startswith("ShortcutUsed:"), error


@pytest.mark.slow     # a fresh interpreter, which loads torch.compile (seconds)
def test_a_first_torch_compile_inside_the_exercise_is_honest():
    """In a fresh process (as in the sandbox), where torch.compile was never loaded: an honest
    softmax that torch.compile's its own helper inside the exercise earns every cell, because
    the probe loads torch.compile first (its stance eager) when the learner's code names it.
    Before, the first compile happened inside the probe, compiled past the guard, and voided
    every cell of the exercise."""
    code = ("import sys\nsys.path.insert(0, 'tests')\nimport catalogue\n"
            "v = next(v for v in catalogue.modules()[0].VARIANTS if 'torch.compile' in v.description)\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "r = catalogue.independent('01_attention', 'softmax', v.code)\n"
            "print(sorted((g, x.passed) for g, x in r.items()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "False" not in out.stdout and "True" in out.stdout, out.stdout


def test_the_probe_loads_torch_compile_only_for_code_that_names_it():
    ns = {"__name__": "__main__"}
    exec("import torch\ndef f(x):\n    return x.exp()\nclass M:\n    def forward(self, x):\n"
         "        return x\n", ns)
    assert not vm._names_compile(ns)
    exec("class N:\n    @staticmethod\n    def go(x):\n        def inner(y):\n"
         "            return torch.compile(lambda z: z)(y)\n        return inner(x)\n", ns)
    assert vm._names_compile(ns)
    assert not vm._names_compile({"__name__": "__main__", "nn": torch.nn, "Module": torch.nn.Module})


def test_the_walk_before_the_guard_calls_no_code_of_the_learners():
    """_names_compile runs before the guard is installed, with the hidden inputs on the stack:
    a `__class__` property, a metaclass's attribute hooks or a str subclass's __eq__ in the
    namespace must never run (the red-team read: they could read the plan's tensors)."""
    calls = []

    class Meta(type):
        def __getattribute__(cls, name):
            calls.append(f"meta {name}")
            return type.__getattribute__(cls, name)

    class Sneaky:
        @property
        def __class__(self):
            calls.append("__class__")
            return type

        def __getattr__(self, name):
            calls.append(name)
            raise AttributeError(name)

    class Evil(str):
        def __eq__(self, other):
            calls.append("eq")
            return False
        __hash__ = str.__hash__

    def compiles(x):
        return torch.compile(x)
    compiles.__module__ = Evil("__main__")
    ns = {"__name__": "__main__", "s": Sneaky(), "M": Meta("M", (), {"__module__": Evil("__main__")}),
          Evil("__name__"): 1, "f": compiles}
    calls.clear()                     # building the dict compared Evil("__name__") itself
    assert vm._names_compile(ns) is False and calls == []


def test_the_target_is_found_without_running_a_key_of_the_learners():
    """run_plan finds the exercise before the guard goes on: a key whose hash collides with the
    exercise's name and whose __eq__ runs code must not be called (the red-team read)."""
    calls = []

    class Collide:
        def __hash__(self):
            return hash("softmax")

        def __eq__(self, other):
            calls.append("eq")
            return False
    ns = {Collide(): 1, "softmax": torch.softmax}
    calls.clear()
    assert vm._lookup(ns, "softmax") is torch.softmax and calls == []
    assert vm._lookup({"__name__": "x"}, "softmax") is None

