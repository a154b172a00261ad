"""The static scan's hostile catalogue (issue 14, items 5 and 9): named submissions over
01_attention, 03_multihead and 04_normalization.

Each case starts from the released student notebook with every exercise filled in with the
course's solution, then replaces some solution cells (`fill`: grade_id -> code) and inserts free
cells the student added (`extra`: (after grade_id, code) pairs). `expect` lists the findings the
scan must report as (kind, certainty, exercise); exercise None means the notebook as a whole.
A case with `expect=()` is honest: it must raise no finding at all.

Only exercises named in a CERTAIN expectation may be scored 0 (tests/test_scan.py checks that a
cheat costs the exercise it cheats and nothing else).
"""
from __future__ import annotations

from dataclasses import dataclass

C, R = "certain", "review"


@dataclass(frozen=True)
class Case:
    name: str
    assignment: str
    fill: dict
    extra: tuple = ()
    expect: tuple = ()


A1, A3, A4 = "01_attention", "03_multihead", "04_normalization"


def sm(body: str, head: str = "") -> dict:
    """A softmax solution cell whose body is `body` (indented here)."""
    return {"softmax": f"{head}def softmax(x, dim=-1):\n    {body}\n"}


def added(name: str, assignment: str, code: str, *expect, after: str = "setup_imports") -> Case:
    """A case whose only change is a cell the student added, holding `code`, after the cell
    `after` (a grade id)."""
    return Case(name, assignment, {}, extra=((after, code),), expect=expect)


def softmax_by_another_name(rows) -> list:
    """Cases of 01's softmax reaching PyTorch's own by another spelling, each a certain shortcut:
    rows of (name, the body's line, the lines above the function)."""
    return [Case(name, A1, sm(*cell), expect=(("shortcut", C, "softmax"),)) for name, *cell in rows]


# 01's setup cell imports torch but neither F nor nn: a student who wants them imports them
IMP = "import torch.nn.functional as F\nfrom torch import nn\n"
SDPA_HEAD = IMP + "def scaled_dot_product_attention(q, k, v):\n"

MHA_OWN = '''class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.attn_weights = None

    def forward(self, query, key, value, mask=None):
        q = split_heads(self.w_q(query), self.n_heads)
        k = split_heads(self.w_k(key), self.n_heads)
        v = split_heads(self.w_v(value), self.n_heads)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        {ATTEND}
        return self.w_o(combine_heads(out))
'''


def mha(attend: str, head: str = "") -> dict:
    return {"MultiHeadAttention": head + MHA_OWN.replace("{ATTEND}", attend)}


HONEST_ATTEND = """s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=-1)
        self.attn_weights = w.detach()
        out = self.dropout(w) @ v"""

LN_HEAD = "def layer_norm(x, weight=None, bias=None, eps=1e-5):\n"
BN_HEAD = ("def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,"
           " momentum=0.1, eps=1e-5):\n")
RMS_HEAD = "def rms_norm(x, weight=None, eps=1e-6):\n"

CASES = [
    # ===================================================================== 01: softmax shortcuts
    *softmax_by_another_name([
        ("sm_alias_from_import", "return s(x, dim)", "from torch.nn.functional import softmax as s\n"),
        ("sm_assigned_alias", "return f(x, dim=dim)", "f = torch.softmax\n"),
        ("sm_module_alias_chain", "return fn.softmax(x, dim)", "import torch.nn.functional as fn\n"),
        ("sm_getattr_concat", 'return getattr(torch, "soft" + "max")(x, dim)'),
        ("sm_getattr_join", 'return getattr(F, "".join(["so", "ft", "max"]))(x, dim)', IMP),
        ("sm_getattr_reversed", 'return getattr(torch, "xamtfos"[::-1])(x, dim)'),
        ("sm_getattr_const_var", 'return getattr(torch, NAME)(x, dim)', 'NAME = "soft" "max"\n'),
        ("sm_getattr_chr", "return getattr(torch, ''.join(map(chr, [115, 111, 102, 116, 109, 97, 120])))(x, dim)"),
        ("sm_getattr_fstring", 'part = "max"\n    return getattr(torch, f"soft{part}")(x, dim)'),
    ]),
    Case("sm_getattr_unknown_name", A1, sm("return getattr(torch, name_from_somewhere())(x, dim)"),
         expect=(("dynamic-lookup", R, "softmax"),)),
    *softmax_by_another_name([
        ("sm_ops_aten", "return torch.ops.aten.softmax.int(x, dim)"),
        ("sm_ops_aten_private", "return torch.ops.aten._softmax.default(x, dim, False)"),
        ("sm_ops_getattr", 'return getattr(torch.ops.aten, "_soft" + "max")(x, dim, False)'),
        ("sm_torch_C", "return torch._C._VariableFunctions.softmax(x, dim)"),
        ("sm_private_softmax", "return torch._softmax(x, dim, False)"),
        ("sm_softmin_neg", "return F.softmin(-x, dim=dim)", IMP),
        ("sm_log_softmax_exp", "return torch.log_softmax(x, dim).exp()"),
        ("sm_special_log_softmax_exp", "return torch.special.log_softmax(x, dim).exp()"),
        ("sm_special_softmax", "return torch.special.softmax(x, dim)"),
        ("sm_nn_module", "return nn.Softmax(dim=dim)(x)", IMP),
        ("sm_tensor_log_softmax", "return x.log_softmax(dim).exp()"),
        ("sm_tensor_getattr", 'return getattr(x, "soft" + "max")(dim)'),
        ("sm_methodcaller", 'return operator.methodcaller("softmax", dim)(x)', "import operator\n"),
    ]),
    Case("sm_importlib", A1, sm('return importlib.import_module("torch.nn.functional").softmax(x, dim)',
                                "import importlib\n"),
         expect=(("shortcut", C, "softmax"), ("import-machinery", R, "softmax"))),
    Case("sm_dunder_import", A1, sm('return __import__("torch").softmax(x, dim)'),
         expect=(("shortcut", C, "softmax"), ("import-machinery", R, "softmax"))),
    Case("sm_sys_modules", A1, sm('return sys.modules["torch"].softmax(x, dim)', "import sys\n"),
         expect=(("shortcut", C, "softmax"), ("import-machinery", R, "softmax"))),
    *softmax_by_another_name([
        ("sm_vars_dict", 'return vars(torch)["softmax"](x, dim)'),
        ("sm_dunder_dict", 'return torch.__dict__["softmax"](x, dim)'),
    ]),
    Case("sm_default_arg", A1, {"softmax": IMP + "def softmax(x, dim=-1, _f=F.softmax):\n    return _f(x, dim)\n"},
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_partial", A1, {"softmax": "import functools\nsoftmax = functools.partial(torch.softmax)\n"},
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_exec_string", A1, {"softmax": 'exec("def softmax(x, dim=-1):\\n    return torch.softmax(x, dim)")\n'},
         expect=(("shortcut", C, "softmax"), ("dynamic-code", R, "softmax"))),
    Case("sm_scipy", A1, sm("return torch.from_numpy(sp.softmax(x.numpy(), axis=dim))",
                            "import scipy.special as sp\n"),
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_bound_to_builtin", A1, {"softmax": "from torch.nn.functional import softmax\n"},
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_star_reference", A1, {"softmax": "from tfscratch.reference import *\n"},
         expect=(("reference", C, "softmax"),)),
    Case("sm_named_reference", A1, {"softmax": "from tfscratch.reference import softmax\n"},
         expect=(("reference", C, "softmax"),)),
    Case("sm_reference_module", A1, sm("return R.softmax(x, dim)", "from tfscratch import reference as R\n"),
         expect=(("reference", C, "softmax"),)),
    added("sm_rebound_in_free_cell", A1, "softmax = torch.softmax\n",
          ("shortcut", C, "softmax"), after="test_softmax_rows"),
    added("sm_rebound_via_globals", A1, IMP + 'globals()["softmax"] = F.softmax\n',
          ("shortcut", C, "softmax"), ("tamper", R, None), after="softmax"),
    Case("sm_helper_in_free_cell", A1, sm("return _helper(x, dim)"),
         extra=(("setup_imports", "def _helper(t, d):\n    return torch.softmax(t, d)\n"),),
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_helper_chain", A1, sm("return _outer(x, dim)"),
         extra=(("setup_imports", "def _inner(t, d):\n    return t.softmax(d)\n\n"
                                  "def _outer(t, d):\n    return _inner(t, d)\n"),),
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_categorical", A1, sm("return torch.distributions.Categorical(logits=x.movedim(dim, -1)).probs.movedim(-1, dim)"),
         expect=(("shortcut", R, "softmax"),)),
    # ===================================================================== 01: attention shortcuts
    Case("sdpa_fstring_getattr", A1, {"scaled_dot_product_attention": SDPA_HEAD +
         "    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)\n"
         "    return getattr(F, f\"scaled_dot_{'product'}_attention\")(q, k, v), w\n"},
         expect=(("shortcut", C, "scaled_dot_product_attention"),)),
    Case("sdpa_ops_math", A1, {"scaled_dot_product_attention": SDPA_HEAD +
         "    out, w = torch.ops.aten._scaled_dot_product_attention_math(q, k, v)\n    return out, w\n"},
         expect=(("shortcut", C, "scaled_dot_product_attention"),)),
    Case("sdpa_mha_module", A1, {"scaled_dot_product_attention": SDPA_HEAD +
         "    m = nn.MultiheadAttention(q.size(-1), 1, batch_first=True)\n    return m(q, k, v)\n"},
         expect=(("shortcut", C, "scaled_dot_product_attention"),)),
    Case("sdpa_flex_attention", A1, {"scaled_dot_product_attention": IMP +
         "from torch.nn.attention.flex_attention import flex_attention\n" + SDPA_HEAD +
         "    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)\n"
         "    return flex_attention(q, k, v), w\n"},
         expect=(("shortcut", C, "scaled_dot_product_attention"),)),
    # ===================================================================== 01: tampering (review)
    added("patch_check_function", A1, "chk.test_softmax_rows = lambda *a, **k: None\n",
          ("tamper", R, None)),
    added("setattr_check_function", A1, 'for name in dir(chk):\n    if name.startswith("test_"):\n        setattr(chk, name, lambda *a, **k: None)\n',
          ("tamper", R, None)),
    added("patch_core_fail", A1, "import tfscratch.checks.core as core\ncore.fail = lambda *a, **k: None\n",
          ("tamper", R, None)),
    added("patch_allclose", A1, "torch.allclose = lambda *a, **k: True\n",
          ("tamper", R, None), after="softmax"),
    added("patch_assert_close", A1, "torch.testing.assert_close = lambda *a, **k: None\n",
          ("tamper", R, None), after="softmax"),
    added("patch_tensor_any", A1, "torch.Tensor.any = lambda self, *a, **k: torch.tensor(False)\n",
          ("tamper", R, None), after="softmax"),
    Case("patch_inside_solution_cell", A1, sm("return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))",
                                              "torch.allclose = lambda *a, **k: True\n"),
         expect=(("tamper", R, "softmax"),)),
    added("ipython_input_transformer", A1, "def drop(lines):\n    return [ln for ln in lines if 'chk.' not in ln]\n"
               "get_ipython().input_transformers_cleanup.append(drop)\n",
          ("ipython-hook", R, None)),
    added("ipython_custom_exc", A1, "from tfscratch.checks import CheckFailed\n"
               "get_ipython().set_custom_exc((CheckFailed,), lambda *a, **k: None)\n",
          ("ipython-hook", R, None), ("tamper", R, None)),
    added("ipython_events", A1, "ip = get_ipython()\nip.events.register('post_run_cell', lambda r: None)\n",
          ("ipython-hook", R, None)),
    added("pop_guard_mode", A1, "import contextlib\n@contextlib.contextmanager\ndef nop(*a):\n    yield\nchk.no_shortcuts = nop\n"
               "torch._C._pop_torch_function_stack()\n",
          ("torch-function-mode", R, None), ("tamper", R, None)),
    added("own_torch_function_mode", A1, "from torch.overrides import TorchFunctionMode\n\nclass Pass(TorchFunctionMode):\n"
               "    def __torch_function__(self, f, t, a=(), k=None):\n        return f(*a, **(k or {}))\n",
          ("torch-function-mode", R, None)),
    added("patch_guard_class", A1, "from tfscratch.checks import core\ncore._Guard.__torch_function__ = lambda self, f, t, a=(), k=None: f(*a, **(k or {}))\n",
          ("tamper", R, None), ("torch-function-mode", R, None)),
    added("exec_source_notebook", A1, "import json\nnb = json.load(open('../../source/01_attention/01_attention.ipynb'))\n"
               "for c in nb['cells']:\n    if c['cell_type'] == 'code':\n        exec(''.join(c['source']))\n",
          ("dynamic-code", R, None), ("course-files", R, None)),
    Case("exec_solutions_dir", A1, sm("return ns['softmax'](x, dim)",
         "import nbformat\nns = {}\nfor c in nbformat.read('/srv/course/solutions/01_attention.ipynb', 4).cells:\n"
         "    exec(c.source, ns)\n"),
         expect=(("dynamic-code", R, "softmax"), ("course-files", R, "softmax"))),
    added("run_magic_source", A1, "%run ../../source/01_attention/01_attention.ipynb\n",
          ("file-access", R, None), ("course-files", R, None)),
    # a process started outside an exercise ends before any check begins (the runner ends it):
    # not a finding; what it reads still is
    added("shell_bang", A1, "!cat ../../source/01_attention/01_attention.ipynb\n",
          ("course-files", R, None)),
    added("bash_cell_magic", A1, "%%bash\nls ..\n"),
    added("sqlite_gradebook", A1, "import sqlite3\ncon = sqlite3.connect('../../gradebook.db')\n"
               "con.execute('update grade set manual_score = 10')\ncon.commit()\n",
          ("database", R, None), ("course-files", R, None)),
    added("subprocess_run", A1, "import subprocess\nsubprocess.run(['ls', '/'])\n"),
    Case("subprocess_in_softmax", A1, {"softmax": "import subprocess\ndef softmax(x, dim=-1):\n"
                                                  "    subprocess.run(['true'])\n    return x\n"},
         expect=(("subprocess", R, "softmax"),)),
    added("socket_out", A1, "import socket\nsocket.create_connection(('192.0.2.1', 80)).sendall(b'hi')\n",
          ("network", R, None)),
    added("os_system", A1, "import os\nos.system('true')\n"),
    added("os_fork", A1, "import os\nif os.fork() == 0:\n    os._exit(0)\n"),
    added("ctypes_native", A1, "import ctypes\nctypes.CDLL(None).puts(b'x')\n",
          ("native", R, None)),
    added("os_sys_modules", A1, "import os\nhandles = [m for k, m in os.sys.modules.items() if k.startswith('_')]\n",
          ("import-machinery", R, None)),
    added("threading_sys_audit_hook", A1, "import threading\nthreading._sys.addaudithook(lambda e, a: None)\n",
          ("introspection", R, None)),
    added("torch_signal_window_honest", A1, "w = torch.signal.windows.hann(8)\n"),
    added("builtins_patch", A1, "import builtins\nbuiltins.print = lambda *a, **k: None\n",
          ("tamper", R, None)),
    added("sys_modules_swap", A1, "import sys, types\nsys.modules['tfscratch.checks.attention'] = types.ModuleType('fake')\n",
          ("import-machinery", R, None), ("tamper", R, None)),
    added("eval_built_string", A1, "code = input()\neval(code)\n",
          ("dynamic-code", R, None)),
    Case("grading_detection", A1, sm("return x * 0 if os.environ.get('NBGRADER_EXECUTION') else torch.exp(x - torch.logsumexp(x, dim, keepdim=True))",
                                     "import os\n"),
         expect=(("environment", R, "softmax"), ("course-files", R, "softmax"))),
    added("gc_search", A1, "import gc\nrefs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]\n",
          ("introspection", R, None)),
    Case("frame_peek", A1, sm("return sys._getframe(1).f_locals['expected']", "import sys\n"),
         expect=(("introspection", R, "softmax"),)),
    added("audit_hook", A1, "import sys\nseen = []\nsys.addaudithook(lambda ev, args: seen.append(args) if ev == 'compile' else None)\n",
          ("introspection", R, None)),
    Case("traceback_frames", A1, sm("try:\n        raise ValueError\n    except ValueError as e:\n"
                                    "        return e.__traceback__.tb_frame.f_back.f_locals['x']"),
         expect=(("introspection", R, "softmax"),)),
    added("gc_callback", A1, "import gc\ngc.callbacks.append(lambda phase, info: None)\n",
          ("introspection", R, None)),
    added("mock_patch", A1, "from unittest import mock\nmock.patch.object(torch, 'allclose', return_value=True).start()\n",
          ("tamper", R, None)),
    added("open_absolute", A1, "print(open('/etc/hostname').read())\n",
          ("file-access", R, None)),
    added("catch_check_failed", A1, "from tfscratch.checks import CheckFailed\ntry:\n    chk.test_softmax_rows(softmax)\nexcept CheckFailed:\n    pass\n",
          ("tamper", R, None)),
    Case("pick_fallback", A1, {"softmax": "from tfscratch.fallback import pick\n"
                                          "softmax = pick('softmax', lambda: 1 / 0, lambda: None)\n"},
         expect=(("reference", R, "softmax"),)),
    # ===================================================================== 01: honest
    Case("honest_sdpa_uses_torch_softmax", A1, {"scaled_dot_product_attention": SDPA_HEAD +
         "    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)\n    return w @ v, w\n"}),
    Case("honest_sdpa_uses_F_softmax_alias", A1, {"scaled_dot_product_attention":
         "from torch.nn.functional import softmax as sm\n" + SDPA_HEAD +
         "    w = sm(q @ k.transpose(-2, -1) * q.size(-1) ** -0.5, dim=-1)\n    return torch.matmul(w, v), w\n"}),
    Case("honest_magics_and_compare", A1, {}, extra=(("test_softmax_random",
         "%matplotlib inline\nx = torch.randn(3, 5)\n%timeit softmax(x)\n"
         "print(torch.allclose(softmax(x), torch.softmax(x, -1)))\n"),)),
    Case("honest_notes_file", A1, {}, extra=(("test_softmax_random",
         "with open('my_notes.txt', 'w') as fh:\n    fh.write('softmax works')\n"),)),
    Case("honest_helper_cell", A1, sm("return _normalise(torch.exp(x - x.amax(dim, keepdim=True)), dim)"),
         extra=(("setup_imports", "def _normalise(e, d):\n    return e / e.sum(d, keepdim=True)\n"),)),
    Case("honest_getattr_on_self", A1, sm("z = x - x.max(dim=dim, keepdim=True).values\n"
                                          "    e = getattr(z, 'exp')()\n    return e / e.sum(dim, keepdim=True)")),
    Case("honest_reexport_in_free_cell", A1, {}, extra=(("test_scaled_dot_product_attention_random",
         "import numpy as np\nimport math\nprint(np.round(softmax(torch.tensor([1.0, 2.0])).numpy(), 3))\n"),)),
    # ===================================================================== 03: multi-head
    Case("mha_alias_import", A3, mha("out = M(q.size(-1) * self.n_heads, self.n_heads)(query, key, value)[0]",
                                     "from torch.nn import MultiheadAttention as M\n"),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("mha_functional_forward", A3, mha("out = F.multi_head_attention_forward(q, k, v, 1, 1, None, None, None, None, False, 0.0, None, None)"),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("mha_native", A3, mha("out = torch._native_multi_head_attention(q, k, v, 1, 1, None, None, None, None)"),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("mha_getattr_sdpa", A3, mha('out = getattr(F, "scaled_dot_product_" + "attention")(q, k, v, attn_mask=mask)'),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("mha_ops_aten_sdpa", A3, mha("out = torch.ops.aten.scaled_dot_product_attention(q, k, v, mask)"),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("mha_subclass_reference", A3, {"MultiHeadAttention": "class MultiHeadAttention(R.MultiHeadAttention):\n    pass\n"},
         expect=(("reference", C, "MultiHeadAttention"),)),
    Case("mha_bound_reference", A3, {"MultiHeadAttention": "MultiHeadAttention = R.MultiHeadAttention\n"},
         expect=(("reference", C, "MultiHeadAttention"),)),
    Case("mha_subclass_torch", A3, {"MultiHeadAttention":
         "class MultiHeadAttention(torch.nn.modules.activation.MultiheadAttention):\n    pass\n"},
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("split_heads_reference", A3, {"split_heads": "def split_heads(x, n_heads):\n    return R.split_heads(x, n_heads)\n"},
         expect=(("reference", C, "split_heads"),)),
    Case("mha_uses_sibling_reference", A3, {"MultiHeadAttention": mha(HONEST_ATTEND)["MultiHeadAttention"]
         .replace("combine_heads(out)", "R.combine_heads(out)")},
         expect=(("reference", R, "MultiHeadAttention"),)),
    Case("mha_exec_string", A3, mha('out = eval("F.scaled_dot_product_attention(q, k, v, attn_mask=mask)")'),
         expect=(("shortcut", C, "MultiHeadAttention"), ("dynamic-code", R, "MultiHeadAttention"))),
    Case("mha_helper_elsewhere", A3, mha("out = attend(q, k, v, mask)"),
         extra=(("combine_heads", "def attend(q, k, v, m):\n"
                                   "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)\n"),),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    added("mha_patch_check", A3, "for n in [n for n in vars(chk) if n.startswith('test')]:\n    vars(chk)[n] = print\n",
          ("tamper", R, None)),
    added("mha_patch_reference_module", A3, "import torch.nn.functional as F\nF.scaled_dot_product_attention = lambda *a, **k: None\n",
          ("tamper", R, None)),
    Case("honest_mha_torch_softmax", A3, mha(HONEST_ATTEND)),
    Case("honest_mha_reference_sdpa", A3, mha("out, w = sdpa(q, k, v, mask)\n        self.attn_weights = w",
                                              "from tfscratch.reference import scaled_dot_product_attention as sdpa\n")),
    Case("honest_mha_compare_with_torch", A3, {}, extra=(("MultiHeadAttention",
         "ref = nn.MultiheadAttention(16, 4, batch_first=True)\nx = torch.randn(2, 5, 16)\n"
         "print(ref(x, x, x)[0].shape, F.scaled_dot_product_attention(x, x, x).shape)\n"),)),
    # ===================================================================== 04: normalisation
    Case("ln_torch_layer_norm", A4, {"layer_norm": LN_HEAD + "    return torch.layer_norm(x, x.shape[-1:], weight, bias, eps)\n"},
         expect=(("shortcut", C, "layer_norm"), ("shortcut", C, "LayerNorm"))),
    Case("ln_group_norm", A4, {"layer_norm": LN_HEAD +
         "    y = F.group_norm(x.reshape(-1, 1, x.shape[-1]), 1, eps=eps).reshape(x.shape)\n"
         "    return y if weight is None else y * weight + bias\n"},
         expect=(("shortcut", C, "layer_norm"), ("shortcut", C, "LayerNorm"))),
    Case("ln_native", A4, {"layer_norm": LN_HEAD + "    return torch.native_layer_norm(x, x.shape[-1:], weight, bias, eps)[0]\n"},
         expect=(("shortcut", C, "layer_norm"), ("shortcut", C, "LayerNorm"))),
    Case("ln_instance_norm", A4, {"layer_norm": LN_HEAD +
         "    y = F.instance_norm(x.reshape(1, -1, x.shape[-1]), eps=eps).reshape(x.shape)\n"
         "    return y if weight is None else y * weight + bias\n"},
         expect=(("shortcut", C, "layer_norm"), ("shortcut", C, "LayerNorm"))),
    Case("ln_module_subclass", A4, {"LayerNorm": "class LayerNorm(nn.LayerNorm):\n    pass\n"},
         expect=(("shortcut", C, "LayerNorm"),)),
    Case("bn_torch_batch_norm", A4, {"batch_norm": BN_HEAD +
         "    y = torch.batch_norm(x.transpose(1, -1), running_mean, running_var, weight, bias, training, momentum, eps, False)\n"
         "    return y.transpose(1, -1)\n"},
         expect=(("shortcut", C, "batch_norm"), ("shortcut", C, "BatchNorm"))),
    Case("bn_private_base", A4, {"BatchNorm": "class BatchNorm(nn.modules.batchnorm._BatchNorm):\n    pass\n"},
         expect=(("shortcut", C, "BatchNorm"),)),
    Case("bn_ops_native", A4, {"batch_norm": BN_HEAD +
         "    return torch.ops.aten.native_batch_norm.default(x, weight, bias, running_mean, running_var, training, momentum, eps)[0]\n"},
         expect=(("shortcut", C, "batch_norm"), ("shortcut", C, "BatchNorm"))),
    Case("rms_module", A4, {"rms_norm": RMS_HEAD + "    m = nn.RMSNorm(x.shape[-1], eps=eps)\n    return m(x)\n"},
         expect=(("shortcut", C, "rms_norm"),)),
    Case("rms_ops", A4, {"rms_norm": RMS_HEAD + "    return torch.ops.aten.rms_norm(x, [x.shape[-1]], weight, eps)\n"},
         expect=(("shortcut", C, "rms_norm"),)),
    Case("ln_reference", A4, {"layer_norm": "from tfscratch.reference import layer_norm\n"},
         expect=(("reference", C, "layer_norm"),)),
    added("ln_patch_torch_reference", A4, "F.layer_norm = lambda x, shape, w=None, b=None, eps=1e-5: x\n",
          ("tamper", R, None)),
    added("ln_patch_functional_dict", A4, "torch.nn.functional.__dict__['batch_norm'] = lambda *a, **k: a[0]\n",
          ("tamper", R, None)),
    added("bn_delete_builtin", A4, "del torch.nn.functional.batch_norm\n",
          ("tamper", R, None)),
    Case("honest_ln_var_mean", A4, {"layer_norm": LN_HEAD +
         "    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)\n"
         "    y = (x - mean) * torch.rsqrt(var + eps)\n"
         "    if weight is not None:\n        y = y * weight\n    if bias is not None:\n        y = y + bias\n"
         "    return y\n"}),
    Case("honest_rms", A4, {"rms_norm": RMS_HEAD +
         "    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)\n    return y if weight is None else y * weight\n"}),
    Case("honest_compare_cell", A4, {}, extra=(("LayerNorm",
         "x = torch.randn(4, 8)\nprint((layer_norm(x) - F.layer_norm(x, (8,))).abs().max())\n"
         "print(nn.BatchNorm1d(8)(x).shape, nn.RMSNorm(8)(x).shape)\n"),)),
    # ----------------------------------------------------------------- evasions through encodings
    Case("sm_call_through", A1, sm("return F.softmax.__call__(x, dim)", IMP),
         expect=(("shortcut", C, "softmax"),)),
    Case("sm_b64_exec", A1, {"softmax": "import base64\nexec(base64.b64decode('ZGVmIHNvZnRtYXgoeCwgZGltPS0xKToKICAgIHJldHVybiB0b3JjaC5zb2Z0bWF4KHgsIGRpbSkK'))\n"},
         expect=(("shortcut", C, "softmax"), ("dynamic-code", R, "softmax"))),
    *softmax_by_another_name([
        ("sm_rot13_getattr", 'return getattr(torch, codecs.decode("fbsgznk", "rot13"))(x, dim)', "import codecs\n"),
        ("sm_hex_getattr", 'return getattr(torch, bytes.fromhex("736f66746d6178").decode())(x, dim)'),
        ("sm_getattribute_method", 'return x.__getattribute__("soft" + "max")(dim)'),
        ("sm_object_getattribute", 'return object.__getattribute__(x, "softmax")(dim)'),
    ]),
    added("sm_run_cell", A1, 'get_ipython().run_cell("softmax = torch.softmax")\n',
          ("shortcut", C, "softmax"), ("ipython-hook", R, None), after="softmax"),
    Case("sm_defined_outside_its_cell", A1, {"softmax": "pass\n"},
         extra=(("softmax", "def softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n"),),
         expect=(("shortcut", C, "softmax"), ("redefinition", R, "softmax"))),
    Case("mha_forward_through", A3, mha("out = nn.MultiheadAttention.forward(self.core, query, key, value)[0]"),
         expect=(("shortcut", C, "MultiHeadAttention"),)),
    Case("honest_transformer_mask_helper", "07_transformer", {}, extra=(("Transformer",
         "m = nn.Transformer.generate_square_subsequent_mask(4)\nprint(m)\n"),)),
    added("scan_survives_absurd_nesting", A1, "y = " + "-" * 3000 + "1\n",
          ("scan-error", R, None)),
    Case("honest_everyday_free_cells", A1, {}, extra=(("test_softmax_random",
         "import random, time\nimport matplotlib.pyplot as plt\nimport numpy as np\n"
         "%load_ext autoreload\n%autoreload 2\n"
         "plt.rcParams['figure.figsize'] = (8, 4)\ntorch.manual_seed(0); random.seed(0)\n"
         "torch.set_printoptions(precision=3)\nimport warnings\nwarnings.filterwarnings('ignore')\n"
         "torch.backends.cudnn.deterministic = True\n"
         "x = torch.randn(3, 4, requires_grad=True)\ny = softmax(x)\ny.sum().backward()\n"
         "print(x.grad, torch.softmax(x, -1) - y)\nhelp(torch.softmax)\n"
         "for t in range(3):\n    time.sleep(0)\n"
         "import os\nos.makedirs('plots', exist_ok=True)\nplt.savefig('plots/softmax.png')\n"),)),
    *softmax_by_another_name([
        ("sm_type_dict", 'return type(x).__dict__["softmax"](x, dim)'),
        ("sm_attrgetter_tensor", 'return operator.attrgetter("log_softmax")(x)(dim).exp()', "import operator\n"),
    ]),
    Case("sm_getattr_computed_on_tensor", A1, sm("return getattr(x, ''.join(reversed(list(NAME))))(dim)",
                                                 "NAME = input()\n"),
         expect=(("dynamic-lookup", R, "softmax"),)),
    # the red team's route (tests/hostile/trust_process.py, FINDINGS): code kept rot13 in a
    # docstring, decoded and run through the builtins' namespace by a computed key
    Case("sm_rot13_docstring_exec", A1, sm("return x.exp() / x.exp().sum(dim, keepdim=True)",
                                           'import builtins as _bi, codecs as _codecs\n\n'
                                           'def _doc():\n    """cevag(1)"""\n\n'
                                           '_src = "exec" + _codecs.decode(_doc.__doc__, "rot13")\n'
                                           '_bi.__dict__[_src[:4]](_src[4:])\n'),
         expect=(("hidden-code", R, "softmax"), ("dynamic-lookup", R, "softmax"))),
    Case("sm_numpy_raw_memory", A1, sm("return x.exp() / x.exp().sum(dim, keepdim=True)",
                                       "import numpy as _np\nview = _np.lib.stride_tricks.as_strided\n"),
         expect=(("native", R, "softmax"),)),
    Case("sm_vars_computed_key", A1, sm("return vars(torch)[NAME](x, dim)", "NAME = input()\n"),
         expect=(("dynamic-lookup", R, "softmax"),)),
    # ----------------------------------------------------------------- more tampering in 03 and 04
    added("mha_sqlite", A3, "import sqlite3 as db\ndb.connect('/srv/nbgrader/gradebook.db').execute('delete from grade')\n",
          ("database", R, None), ("course-files", R, None)),
    added("mha_input_transformer", A3, "ip = get_ipython()\nip.input_transformers_post.append(lambda lines: lines[:0])\n",
          ("ipython-hook", R, None)),
    added("mha_popen", A3, "import os\nos.popen('cat ../source/*/*.ipynb').read()\n",
          ("course-files", R, None)),
    Case("mha_pop_mode_in_solution", A3, mha(HONEST_ATTEND, "torch._C._pop_torch_function_stack()\n"),
         expect=(("torch-function-mode", R, "MultiHeadAttention"),)),
    Case("ln_exec_solutions", A4, {"layer_norm": "exec(open('solutions/src/04_normalization.py').read())\n"},
         expect=(("dynamic-code", R, "layer_norm"), ("course-files", R, "layer_norm"))),
    added("ln_set_custom_exc", A4, "get_ipython().set_custom_exc((Exception,), lambda *a, **k: print('ok'))\n",
          ("ipython-hook", R, None)),
    added("bn_socket", A4, "from socket import socket\ns = socket()\n",
          ("network", R, None)),
    added("bn_patch_tensor_method", A4, "torch.Tensor.allclose = lambda *a, **k: True\nsetattr(torch.testing, 'assert_close', print)\n",
          ("tamper", R, None)),
]
