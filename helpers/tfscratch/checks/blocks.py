"""Checks for notebook 06_blocks: `FeedForward`, `EncoderLayer`, `DecoderLayer`, `Encoder` and
`Decoder`.

The layers and stacks are compared with PyTorch's own `nn.TransformerEncoderLayer`,
`nn.TransformerDecoderLayer`, `nn.TransformerEncoder` and `nn.TransformerDecoder` (batch_first,
ReLU, both norm placements) after copying the student's weights INTO PyTorch's modules. The
student's LayerNorms first get distinctive random weights, so a swapped or shared norm shows.
Sub-modules are reached only through the names the course fixes (self_attn, cross_attn, ff with
linear1/linear2, norm1..norm3, layers, norm); their classes are never required.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .core import (CheckFailed, ShortcutUsed, call, check_close, check_shape, copy_mha_to_torch,
                   fail, passed, seeded)

TR = ("transformer",)  # PyTorch's nn.Transformer* classes are the shortcut here

__all__ = [
    "check_feedforward_structure", "check_feedforward_values", "check_feedforward_dropout",
    "check_encoder_layer_structure", "check_encoder_layer_matches_torch",
    "check_encoder_layer_padding", "check_encoder_layer_dropout",
    "check_decoder_layer_structure", "check_decoder_layer_matches_torch",
    "check_decoder_layer_causal", "check_decoder_layer_memory", "check_decoder_layer_dropout",
    "check_encoder_structure", "check_encoder_matches_torch", "check_encoder_padding_dropout",
    "check_decoder_structure", "check_decoder_matches_torch", "check_decoder_causal_memory",
    "copy_encoder_layer_to_torch", "copy_decoder_layer_to_torch", "torch_attn_mask",
]


# --------------------------------------------------------------------------- plumbing
_HINTS = [  # (substring of the error, hint); the first match wins
    ("'super' object has no attribute '__int__'",
     "super().__init__() is misspelt (__int__): without it nn.Module is never set up."),
    ("required positional argument: 'memory'",
     "A decoder layer was called without memory, the encoder output: call "
     "layer(x, memory, src_mask, tgt_mask) for every layer."),
    ("must be Tensor, not ReLU",
     "nn.ReLU is a module class: nn.ReLU(h) builds a module instead of applying it. Use "
     "torch.relu(h) / F.relu(h), or create nn.ReLU() once in __init__ and call it."),
    ("has no attribute 'ReLu'", "The class is spelt nn.ReLU (or use torch.relu / F.relu)."),
    ("'int' object is not iterable",
     "Loop over range(n_layers), not over the integer n_layers itself."),
    ("is not a Module subclass",
     "nn.ModuleList holds modules: build each layer with LayerClass(...), not the class or a "
     "tensor."),
    ("object has no attribute",
     "forward uses an attribute that __init__ never created: a typo between the two "
     "(ffn_norm / fnn_norm, attention_norm_1 / attentiion_norm_1) is the usual cause."),
]


_KV_LENGTH = ("A view/reshape got the wrong number of elements. In the cross-attention the keys "
              "and values come from memory, whose length Ls differs from the target's Lt: split "
              "K and V into heads with their own length (memory.size(1)), not the query's.")


def _call(fn, *args, what, hint="", **kwargs):
    """core.call with the shortcut guard for nn.Transformer*, plus hints for the errors that
    this notebook's mistakes raise."""
    try:
        return call(fn, *args, shortcuts=TR, what=what, **kwargs)
    except NotImplementedError:
        raise
    except CheckFailed as e:
        msg = str(e)
        extra = [h for pat, h in _HINTS if pat in msg][:1]
        if not extra and "invalid for input of size" in msg and "Decoder" in what:
            extra.append(_KV_LENGTH)
        if hint and not extra and not msg.startswith("Shortcut used"):
            extra.append(hint)
        if extra:
            raise CheckFailed(msg + "\n" + "\n".join(extra)) from e
        raise


def _match(actual, candidates: dict, atol=1e-4, rtol=1e-3):
    """The first hint whose wrong-but-plausible result equals `actual`, or None."""
    for hint, cand in candidates.items():
        try:
            c = cand() if callable(cand) else cand
        except Exception:  # noqa: BLE001 - a candidate that cannot be formed is no match
            continue
        if isinstance(c, torch.Tensor) and actual.shape == c.shape and torch.allclose(
                actual.detach().double(), c.detach().double(), atol=atol, rtol=rtol):
            return hint
    return None


def _close(a, b, atol=1e-5, rtol=1e-4):
    """allclose that tolerates another float dtype (float64 inside is allowed) and says False
    for tensors of different shapes."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a.detach().double(), b.detach().double(), atol=atol, rtol=rtol))


def _get(module, path: str, owner: str):
    obj = module
    for part in path.split("."):
        if not hasattr(obj, part):
            fail(f"{owner} has no attribute `{path}`. The tests reach the sub-modules through "
                 "the names the course fixes: self_attn, cross_attn, ff (with linear1 and "
                 "linear2), norm1, norm2, norm3, and for the stacks layers and norm.")
        obj = getattr(obj, part)
    return obj


def _registered(module, paths, owner):
    """Every parameter reachable through `paths` must be in module.parameters()."""
    ids = {id(p) for p in module.parameters()}
    for path in paths:
        sub = _get(module, path, owner)
        if isinstance(sub, (list, tuple, dict)):
            fail(f"{owner}.{path} is a plain Python {type(sub).__name__}: PyTorch does not see "
                 "the modules inside it (model.parameters(), .to(device), state_dict and the "
                 "optimizer miss them). Use nn.ModuleList.")
        params = list(sub.parameters()) if isinstance(sub, nn.Module) else [sub]
        if not params:
            fail(f"{owner}.{path} has no parameters; expected a layer with weights.")
        missing = [p for p in params if id(p) not in ids]
        if missing:
            fail(f"{len(missing)} parameters of {owner}.{path} are not registered in "
                 f"{owner}.parameters(): sub-modules must be attributes of type nn.Module (and "
                 "stacks of them an nn.ModuleList, not a Python list), or the optimizer never "
                 "trains them and .to(device) never moves them.")


def _distinct(module, paths, owner, why):
    objs = [(p, _get(module, p, owner)) for p in paths]
    for i in range(len(objs)):
        for j in range(i + 1, len(objs)):
            if objs[i][1] is objs[j][1]:
                fail(f"{owner}.{objs[i][0]} and {owner}.{objs[j][0]} are the same object: {why}")


_NORM_SHARED = ("one LayerNorm is shared by several sub-layers (a bug found in published "
                "study notes). Each sub-layer needs its own LayerNorm with its own weight and "
                "bias: create one nn.LayerNorm per sub-layer in __init__.")


def _perturb_norms(module, paths, owner):
    """Give each LayerNorm distinctive weights so that a swapped or shared norm shows."""
    with torch.no_grad():
        for i, path in enumerate(paths):
            n = _get(module, path, owner)
            w, b = getattr(n, "weight", None), getattr(n, "bias", None)
            if w is None or b is None:
                fail(f"{owner}.{path} has no `weight` and `bias`: use nn.LayerNorm(d_model) "
                     "(learned scale and shift, as the paper and PyTorch do).")
            gen = torch.Generator().manual_seed(1000 + i)
            w.copy_(1.0 + 0.5 * torch.randn(w.shape, generator=gen))
            b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def _copy_param(src, dst, what):
    if src is None or dst is None:
        if src is None and dst is not None:
            fail(f"{what} has no bias; PyTorch's layer (and the paper) has one: keep "
                 "nn.Linear's default bias=True.")
        return
    if tuple(src.shape) != tuple(dst.shape):
        fail(f"{what} has shape {tuple(src.shape)}; PyTorch's matching parameter has shape "
             f"{tuple(dst.shape)}.")
    dst.copy_(src.detach().to(dst.dtype))


def _copy_linear(src, dst, what):
    _copy_param(getattr(src, "weight", None), dst.weight, f"{what}.weight")
    _copy_param(getattr(src, "bias", None), dst.bias, f"{what}.bias")


def _copy_mha(src, dst, what):
    for name in ("w_q", "w_k", "w_v", "w_o"):
        _get(src, name, what)
    if tuple(src.w_q.weight.shape) != tuple(dst.out_proj.weight.shape):
        fail(f"{what}.w_q.weight has shape {tuple(src.w_q.weight.shape)}; expected "
             f"{tuple(dst.out_proj.weight.shape)} (d_model, d_model).")
    copy_mha_to_torch(src, dst)


def copy_encoder_layer_to_torch(ours, theirs: nn.TransformerEncoderLayer, owner="EncoderLayer"):
    """Copy a course EncoderLayer (self_attn, ff.linear1/2, norm1/2) into PyTorch's layer."""
    with torch.no_grad():
        _copy_mha(_get(ours, "self_attn", owner), theirs.self_attn, f"{owner}.self_attn")
        _copy_linear(_get(ours, "ff.linear1", owner), theirs.linear1, f"{owner}.ff.linear1")
        _copy_linear(_get(ours, "ff.linear2", owner), theirs.linear2, f"{owner}.ff.linear2")
        for n in ("norm1", "norm2"):
            _copy_linear(_get(ours, n, owner), getattr(theirs, n), f"{owner}.{n}")
    return theirs


def copy_decoder_layer_to_torch(ours, theirs: nn.TransformerDecoderLayer, owner="DecoderLayer"):
    """Copy a course DecoderLayer (self_attn, cross_attn, ff, norm1..3) into PyTorch's layer,
    whose cross-attention is called `multihead_attn`."""
    with torch.no_grad():
        _copy_mha(_get(ours, "self_attn", owner), theirs.self_attn, f"{owner}.self_attn")
        _copy_mha(_get(ours, "cross_attn", owner), theirs.multihead_attn, f"{owner}.cross_attn")
        _copy_linear(_get(ours, "ff.linear1", owner), theirs.linear1, f"{owner}.ff.linear1")
        _copy_linear(_get(ours, "ff.linear2", owner), theirs.linear2, f"{owner}.ff.linear2")
        for n in ("norm1", "norm2", "norm3"):
            _copy_linear(_get(ours, n, owner), getattr(theirs, n), f"{owner}.{n}")
    return theirs


def torch_attn_mask(mask, B, H, Lq, Lk):
    """Course mask (True = may attend; (Lq, Lk), (B, Lq, Lk), (B, 1, Lk) or 4-D) -> the boolean
    attn_mask nn.MultiheadAttention takes, where True means NOT allowed: (Lq, Lk) or
    (B * H, Lq, Lk)."""
    if mask is None:
        return None
    m = mask.to(torch.bool)
    if m.dim() == 2:
        return ~m
    if m.dim() == 3:
        m = m.unsqueeze(1)
    return ~m.expand(B, H, Lq, Lk).reshape(B * H, Lq, Lk)


def _torch_ref(fn):
    """Run a PyTorch reference with autograd on (so the fused inference fast path, which may
    treat padded positions differently, is never taken) and warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.enable_grad():
            return fn().detach()


def _padding_mask(lengths, L):
    return (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]).unsqueeze(1)  # (B, 1, L)


def _causal(L):
    return torch.tril(torch.ones(L, L, dtype=torch.bool))


def _placement(nf):
    return "pre-norm (norm_first=True)" if nf else "post-norm (norm_first=False)"


# --------------------------------------------------------------------------- FeedForward
_FF_CRASH = ("In FeedForward, linear1 maps d_model -> d_ff and linear2 maps d_ff -> d_model: "
             "nn.Linear(d_model, d_ff) then nn.Linear(d_ff, d_model).")


def _ff_formula(ff, x):
    W1, b1 = ff.linear1.weight, ff.linear1.bias
    W2, b2 = ff.linear2.weight, ff.linear2.bias
    return F.linear(F.relu(F.linear(x, W1, b1)), W2, b2)


def _ff_make(FeedForward, d, d_ff, **kw):
    ff = _call(FeedForward, d, d_ff, what=f"FeedForward({d}, {d_ff}"
               + "".join(f", {k}={v}" for k, v in kw.items()) + ")", **kw)
    _ff_shapes(ff, d, d_ff)
    return ff


def _ff_shapes(ff, d, d_ff, owner="FeedForward"):
    l1, l2 = _get(ff, "linear1", owner), _get(ff, "linear2", owner)
    w1, w2 = getattr(l1, "weight", None), getattr(l2, "weight", None)
    if w1 is None or w2 is None:
        fail(f"{owner}.linear1 and .linear2 must be linear layers with a `weight` (nn.Linear).")
    if tuple(w1.shape) == (d, d_ff) and d_ff != d:
        fail(f"{owner}.linear1 maps d_ff -> d_model (weight shape {tuple(w1.shape)}): the two "
             "layers are swapped. linear1 = nn.Linear(d_model, d_ff) expands, "
             "linear2 = nn.Linear(d_ff, d_model) projects back.")
    if tuple(w2.shape) == (d_ff, d) and d_ff != d:
        fail(f"{owner}.linear2 maps d_model -> d_ff (weight shape {tuple(w2.shape)}), the same as "
             "linear1: nn.Linear(dim, hidden_dim) written twice, a bug found in published study "
             "notes. It must map back from d_ff to d_model: linear2 = nn.Linear(d_ff, d_model), "
             f"weight shape ({d}, {d_ff}). It only runs when d_ff == d_model, which hides the bug.")
    if w1.shape[-1] == d and w1.shape[0] != d_ff:
        fail(f"{owner}.linear1 has {w1.shape[0]} outputs but d_ff={d_ff}: the hidden size must "
             "come from the d_ff argument, not be hard-coded (such as 4 * d_model).")
    if tuple(w1.shape) != (d_ff, d) or tuple(w2.shape) != (d, d_ff):
        fail(f"{owner} weight shapes are linear1 {tuple(w1.shape)}, linear2 {tuple(w2.shape)}; "
             f"expected ({d_ff}, {d}) and ({d}, {d_ff}) for d_model={d}, d_ff={d_ff} "
             "(nn.Linear(in, out) stores weight as (out, in)).")
    for name, lin, n in (("linear1", l1, d_ff), ("linear2", l2, d)):
        b = getattr(lin, "bias", None)
        if b is None:
            fail(f"{owner}.{name} has no bias. The paper's FFN, max(0, x W1 + b1) W2 + b2, and "
                 "PyTorch's TransformerEncoderLayer have biases: keep nn.Linear's default "
                 "bias=True (bias=False, as in LLaMA-style code, is a different model).")
        if tuple(b.shape) != (n,):
            fail(f"{owner}.{name}.bias has shape {tuple(b.shape)}; expected ({n},).")


def check_feedforward_structure(FeedForward):
    """linear1 (d_model -> d_ff) and linear2 (d_ff -> d_model) with biases, registered, and an
    output of the input's shape."""
    d, d_ff = 8, 20
    with seeded(0):
        ff = _ff_make(FeedForward, d, d_ff)
        x = torch.randn(2, 5, d)
    if not isinstance(ff, nn.Module):
        fail("FeedForward must be an nn.Module subclass (class FeedForward(nn.Module)) and call "
             "super().__init__() first.")
    _registered(ff, ["linear1", "linear2"], "FeedForward")
    n_params = sum(p.numel() for p in ff.parameters())
    expected = 2 * d * d_ff + d_ff + d
    if n_params != expected:
        fail(f"FeedForward({d}, {d_ff}) has {n_params} parameters; expected {expected} "
             "(two weight matrices and two bias vectors, nothing else).")
    y = _call(ff, x, what="FeedForward(8, 20)(x)", hint=_FF_CRASH)
    check_shape(y, (2, 5, d), "FeedForward(8, 20) applied to x of shape (2, 5, 8)",
                "The network expands to d_ff and projects back: its output has the input's shape.")
    passed("FeedForward: linear1 (d_model -> d_ff) and linear2 (d_ff -> d_model) with biases, "
           "all parameters registered")


def _ff_diagnose(ff, x, y):
    W1, b1, W2, b2 = ff.linear1.weight, ff.linear1.bias, ff.linear2.weight, ff.linear2.bias
    h = F.linear(x, W1, b1)
    return _match(y, {
        "there is no activation between the two layers: without the ReLU, two linear layers "
        "collapse into one linear map. FFN(x) = max(0, x W1 + b1) W2 + b2.":
            lambda: F.linear(h, W2, b2),
        "the ReLU is also applied to the output (after linear2): the output of the FFN is added "
        "to the residual stream and must be able to go negative. Apply ReLU only to the hidden "
        "layer.": lambda: F.relu(F.linear(F.relu(h), W2, b2)),
        "you used GELU; the paper and nn.TransformerEncoderLayer (activation='relu', the "
        "default) use ReLU.": lambda: F.linear(F.gelu(h), W2, b2),
        "the ReLU is applied to the input before linear1 instead of to the hidden layer.":
            lambda: F.linear(F.linear(F.relu(x), W1, b1), W2, b2),
        "the ReLU is applied to the output of linear2, not between the layers.":
            lambda: F.relu(F.linear(h, W2, b2)),
    })


def check_feedforward_values(FeedForward, seed=0, cases=((2, 5, 8, 20),)):
    """Output = linear2(relu(linear1(x))) with the module's own weights, for (B, L, d_model)
    inputs and any leading axes; cases are (B, L, d_model, d_ff), B=None for a 2-D input."""
    for B, L, d, d_ff in cases:
        with seeded(seed):
            ff = _ff_make(FeedForward, d, d_ff)
            x = torch.randn(*((B,) if B else ()), L, d) * 2.0
        ff.eval()
        expected = _ff_formula(ff, x).detach()
        shape = tuple(x.shape)
        y = _call(ff, x, what=f"FeedForward({d}, {d_ff})(x) for x of shape {shape}",
                  hint=_FF_CRASH + " Use only the last axis (nn.Linear does), so any leading "
                  "axes work.")
        check_shape(y, expected.shape, f"FeedForward output for x of shape {shape}")
        if not _close(y.detach(), expected, atol=1e-5, rtol=1e-4):
            why = _ff_diagnose(ff, x, y)
            if why:
                fail(f"FeedForward({d}, {d_ff}) gives the wrong values: {why}")
        check_close(y, expected, f"FeedForward({d}, {d_ff}) output for x of shape {shape}",
                    "Expected linear2(relu(linear1(x))) with your own weights.")
        # position-wise: one token's output depends on that token only
        if x.dim() == 3 and L > 2:
            x2 = x.clone()
            x2[:, 0] += 5.0
            y2 = _call(ff, x2, what="FeedForward(x)")
            if not _close(y2[:, 1:], y[:, 1:], atol=1e-5):
                fail("changing token 0 changed the FeedForward output at other positions: the "
                     "network must act on each position separately (nn.Linear acts on the last "
                     "axis only); do not mix positions (no reshape across L, no sum over L).")
    passed(f"FeedForward: linear2(relu(linear1(x))), position by position, on {len(cases)} "
           "case(s)")


def check_feedforward_dropout(FeedForward):
    """With dropout > 0: random in train mode, deterministic and dropout-free in eval mode."""
    d, d_ff = 8, 32
    with seeded(5):
        ff = _ff_make(FeedForward, d, d_ff, dropout=0.5)
        x = torch.randn(3, 6, d)
        ff.eval()
        expected = _ff_formula(ff, x).detach()
        y1 = _call(ff, x, what="FeedForward(8, 32, dropout=0.5) in eval mode")
        check_shape(y1, x.shape, "FeedForward(8, 32) output for x of shape (3, 6, 8)")
        y2 = _call(ff, x, what="FeedForward(8, 32, dropout=0.5) in eval mode")
        if torch.equal(y1, y2) and not _close(y1, expected, atol=1e-5, rtol=1e-4):
            # deterministic, so dropout is off: the values themselves are wrong
            why = _ff_diagnose(ff, x, y1) or ("it does not equal linear2(relu(linear1(x))) with "
                                             "your own weights (see test_FeedForward_values).")
            fail(f"FeedForward(8, 32, dropout=0.5) in eval mode is deterministic (dropout is "
                 f"off, as it should be) but gives the wrong values: {why}")
        if not torch.equal(y1, y2) or not _close(y1, expected, atol=1e-5, rtol=1e-4):
            fail("in eval mode (model.eval()) FeedForward with dropout=0.5 must be deterministic "
                 "and dropout-free, but two calls differ or do not equal "
                 "linear2(relu(linear1(x))). Use an nn.Dropout module (it switches off in eval "
                 "mode), or F.dropout(h, p, training=self.training): F.dropout's training "
                 "argument defaults to True.")
        ff.train()
        t1 = _call(ff, x, what="FeedForward(8, 32, dropout=0.5) in train mode")
        t2 = _call(ff, x, what="FeedForward(8, 32, dropout=0.5) in train mode")
    if _close(t1, t2) or _close(t1, expected):
        fail("FeedForward(8, 32, dropout=0.5) in train mode gives the same output as without "
             "dropout: the dropout argument is ignored. Apply nn.Dropout(dropout) to the hidden "
             "activations, between ReLU and linear2.")
    with seeded(6):
        ff0 = _ff_make(FeedForward, d, d_ff)
    ff0.train()
    y0 = _call(ff0, x, what="FeedForward(8, 32) in train mode")
    check_close(y0, _ff_formula(ff0, x).detach(), "FeedForward(8, 32) (dropout=0.0) in train mode",
                "With the default dropout=0.0 training mode must change nothing.")
    passed("FeedForward: dropout is active in train mode and off in eval mode")


# --------------------------------------------------------------------------- EncoderLayer
_ENC_PATHS = ["self_attn", "ff", "ff.linear1", "ff.linear2", "norm1", "norm2"]
_ENC_CRASH = ("An encoder layer is x -> self-attention (query = key = value = x, mask src_mask) "
              "-> feed-forward, each wrapped in a residual and a LayerNorm; the output has the "
              "input's shape (B, L, d_model).")


_TORCH_BLOCKS = (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder,
                 nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def _no_torch_blocks(module, owner):
    """A module that holds PyTorch's own encoder/decoder classes is the forbidden shortcut,
    whatever else it holds (its parameter count is off too, but that is not the point)."""
    inner = next((type(m).__name__ for m in module.modules() if isinstance(m, _TORCH_BLOCKS)),
                 None) if isinstance(module, nn.Module) else None
    if inner:
        raise ShortcutUsed(f"Shortcut used: {owner} contains PyTorch's nn.{inner}. This exercise "
                           "asks you to build the layer yourself from your attention, "
                           "feed-forward network and LayerNorms.")


def _mask_probe(layer, x, mask, y, run, owner):
    """Outputs at real positions that depend on padded positions: the mask is either ignored
    or inverted. Tell which (None when the padding is respected)."""
    real = mask[:, 0, :]  # (B, L) True at real positions
    if bool(real.all()):
        return None
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(11)) * 3
    y2 = run(torch.where(real[..., None], x, x + noise), mask)
    if _close(y[real], y2[real], atol=1e-5, rtol=1e-4):
        return None
    if _close(y, run(x, None), atol=1e-5, rtol=1e-4):
        return (f"{owner} gives the same output with and without src_mask: the mask never "
                "reaches the self-attention, so padded keys are attended. Pass it on: "
                "self_attn(h, h, h, src_mask).")
    xn = torch.where(real[..., None], x, x + noise)
    if _close(run(x, ~mask)[real], run(xn, ~mask)[real], atol=1e-5, rtol=1e-4):
        return (f"{owner}: the outputs at real positions depend on the padded positions while "
                "src_mask is given: the mask is inverted. In this course True means 'may attend' "
                "(PyTorch's key_padding_mask uses True = ignore), so pass src_mask as it is.")
    return None


_NO_MEMORY_LAYER = ("(the cross-attention sub-layer is missing, or it attends over x instead of "
                    "memory). Queries come from the decoder, keys and values from memory: "
                    "cross_attn(h, memory, memory, src_mask).")


def _memory_probe(run, x, mem, owner, cause=_NO_MEMORY_LAYER):
    noise = torch.randn(mem.shape, generator=torch.Generator().manual_seed(12))
    if _close(run(x, mem), run(x, mem + noise), atol=1e-6):
        return (f"{owner}: a completely different memory gives the same output, so the decoder "
                f"ignores the encoder output {cause}")
    return None


def _enc_make(EncoderLayer, d, H, d_ff, dropout=0.0, nf=False):
    what = f"EncoderLayer({d}, {H}, {d_ff}, dropout={dropout}, norm_first={nf})"
    layer = _call(EncoderLayer, d, H, d_ff, dropout=dropout, norm_first=nf, what=what)
    _no_torch_blocks(layer, what)
    for p in _ENC_PATHS:
        _get(layer, p, "EncoderLayer")
    _norm_inside_attention(layer, ["self_attn"], "EncoderLayer")
    _distinct(layer, ["norm1", "norm2"], "EncoderLayer", _NORM_SHARED)
    return layer


def _norm_inside_attention(layer, names, owner):
    for name in names:
        attn = getattr(layer, name, None)
        if isinstance(attn, nn.Module) and any(isinstance(x, (nn.LayerNorm, nn.RMSNorm))
                                               for x in attn.modules()):
            fail(f"{owner}.{name} contains a LayerNorm: the attention module adds the residual "
                 "and normalises inside (as some public implementations do), so this layer "
                 "normalises twice, or in the wrong place. The attention module returns "
                 "w_o(heads) only; the layer adds the residual and applies norm1/norm2 (and "
                 "norm3 in the decoder) itself, in the order norm_first asks for.")


def check_encoder_layer_structure(EncoderLayer):
    """Named sub-modules, two distinct LayerNorms, every parameter registered, as many
    parameters as nn.TransformerEncoderLayer."""
    d, H, d_ff = 16, 4, 40
    with seeded(0):
        layer = _enc_make(EncoderLayer, d, H, d_ff)
    if not isinstance(layer, nn.Module):
        fail("EncoderLayer must be an nn.Module subclass.")
    _ff_shapes(layer.ff, d, d_ff, "EncoderLayer.ff")
    _registered(layer, ["self_attn", "ff", "norm1", "norm2"], "EncoderLayer")
    n = sum(p.numel() for p in layer.parameters())
    ref = sum(p.numel() for p in nn.TransformerEncoderLayer(d, H, d_ff, batch_first=True).parameters())
    if n != ref:
        fail(f"EncoderLayer({d}, {H}, {d_ff}) has {n} parameters; nn.TransformerEncoderLayer has "
             f"{ref} (one attention, one feed-forward network, two LayerNorms).")
    with seeded(1):
        x = torch.randn(2, 5, d)
    y = _call(layer, x, what="EncoderLayer(x)", hint=_ENC_CRASH)
    check_shape(y, x.shape, "EncoderLayer output for x of shape (2, 5, 16)", _ENC_CRASH)
    passed("EncoderLayer: self_attn, ff, norm1 and norm2 are separate, registered modules")


def _enc_candidates(t, x, am, nf):
    """Wrong-but-plausible encoder layers built from PyTorch's layer `t` (weights copied)."""
    sa = lambda h, m=am: t.self_attn(h, h, h, attn_mask=m, need_weights=False)[0]  # noqa: E731
    ff = lambda h: t.linear2(F.relu(t.linear1(h)))  # noqa: E731
    n1, n2 = t.norm1, t.norm2

    def post(x, sa=sa, n1=n1, n2=n2):
        h = n1(x + sa(x))
        return n2(h + ff(h))

    def pre(x, sa=sa, n1=n1, n2=n2):
        h = x + sa(n1(x))
        return h + ff(n2(h))

    right, other = (pre, post) if nf else (post, pre)
    inv = None if am is None else ~am
    c = {
        f"it computes the {_placement(not nf)} layer although norm_first={nf}: the norm_first "
        "argument is ignored. Post-norm: x = norm1(x + sa(x)); x = norm2(x + ff(x)). Pre-norm: "
        "x = x + sa(norm1(x)); x = x + ff(norm2(x)).": lambda: other(x),
        "it uses one LayerNorm (norm1) for both sub-layers, a bug found in published study "
        "notes: the feed-forward sub-layer needs its own norm2.": lambda: right(x, n2=n1),
        "it uses norm2 for both sub-layers: the attention sub-layer needs its own norm1.":
            lambda: right(x, n1=n2),
        "norm1 and norm2 are swapped: norm1 belongs to the attention sub-layer, norm2 to the "
        "feed-forward sub-layer.": lambda: right(x, n1=n2, n2=n1),
        "src_mask never reaches the self-attention, so padded keys are attended: pass it on, "
        "self_attn(h, h, h, src_mask).": lambda: right(x, sa=lambda h: sa(h, None)),
        "the mask is inverted: in this course True means 'may attend' (PyTorch's "
        "key_padding_mask uses True = ignore).": lambda: right(x, sa=lambda h: sa(h, inv)),
    }
    if nf:
        c.update({
            "there is no residual connection: each sub-layer's input must be added back, "
            "x = x + sublayer(norm(x)).": lambda: ff(n2(sa(n1(x)))),
            "the feed-forward residual adds the layer's input x instead of h, the output of the "
            "attention sub-layer: h = x + sa(norm1(x)); out = h + ff(norm2(h)).":
                lambda: x + ff(n2(x + sa(n1(x)))),
            "x itself was overwritten by norm1(x) (and by norm2), so the residual stream carries "
            "normalised values: keep x and add the sub-layer of a normalised copy, "
            "x = x + sa(norm1(x)); x = x + ff(norm2(x)).":
                lambda: (lambda g: g + ff(g))(n2(n1(x) + sa(n1(x)))),
            "x itself was overwritten by norm1(x), so the residual stream carries the normalised "
            "x: keep x and add the sub-layer of a normalised copy, x + sa(norm1(x)).":
                lambda: (lambda h: h + ff(n2(h)))(n1(x) + sa(n1(x))),
        })
    else:
        c.update({
            "there is no residual connection: the paper's sub-layer is "
            "LayerNorm(x + Sublayer(x)), with the input x added back.":
                lambda: n2(ff(n1(sa(x)))),
            "the feed-forward residual adds the layer's input x instead of h = norm1(x + sa(x)).":
                lambda: n2(x + ff(n1(x + sa(x)))),
            "the residual is added after the norm (x + norm(sublayer(x))): post-norm normalises "
            "the sum, norm(x + sublayer(x)).":
                lambda: (lambda h: h + n2(ff(h)))(x + n1(sa(x))),
        })
    return c


def _enc_compare(EncoderLayer, B, L, d, H, d_ff, nf, seed, dropout=0.0, lengths=None):
    with seeded(seed):
        layer = _enc_make(EncoderLayer, d, H, d_ff, dropout, nf)
        x = torch.randn(B, L, d)
    lengths = lengths or [L] + [max(1, L - 2 - i) for i in range(B - 1)]
    mask = _padding_mask(lengths, L)
    _perturb_norms(layer, ["norm1", "norm2"], "EncoderLayer")
    layer.eval()
    t = nn.TransformerEncoderLayer(d, H, d_ff, dropout=dropout, batch_first=True, norm_first=nf)
    t.eval()
    copy_encoder_layer_to_torch(layer, t)
    am = torch_attn_mask(mask, B, H, L, L)
    expected = _torch_ref(lambda: t(x, src_mask=am))
    what = f"EncoderLayer({d}, {H}, {d_ff}, norm_first={nf}) on x {tuple(x.shape)} with a padding mask"
    y = _call(layer, x, mask, what=what, hint=_ENC_CRASH)
    check_shape(y, expected.shape, what, _ENC_CRASH)
    if not _close(y.detach(), expected, atol=1e-5, rtol=1e-4):
        why = _match(y, {k: (lambda f=f: _torch_ref(f)) for k, f in
                         _enc_candidates(t, x, am, nf).items()})
        if why:
            fail(f"{what} does not match nn.TransformerEncoderLayer: {why}")
        why = _mask_probe(layer, x, mask, y.detach(), lambda xx, mm: _call(
            layer, xx, mm, what=what, hint=_ENC_CRASH).detach(), "EncoderLayer")
        if why:
            fail(f"{what} does not match nn.TransformerEncoderLayer: {why}")
    check_close(y, expected, f"{what}, against nn.TransformerEncoderLayer with your weights",
                f"Compare your forward with the {_placement(nf)} equations in the text.")


def check_encoder_layer_matches_torch(EncoderLayer, seed=0, cases=((2, 6, 16, 4, 40),),
                                      dropout=0.0):
    """Weights copied into nn.TransformerEncoderLayer (batch_first, ReLU): the same output for
    both norm placements, with a padding mask. Cases are (B, L, d_model, n_heads, d_ff)."""
    for i, (B, L, d, H, d_ff) in enumerate(cases):
        for nf in (False, True):
            _enc_compare(EncoderLayer, B, L, d, H, d_ff, nf, seed + i, dropout)
    passed(f"EncoderLayer: matches nn.TransformerEncoderLayer for post-norm and pre-norm on "
           f"{len(cases)} size(s)")


def check_encoder_layer_padding(EncoderLayer, seed=3):
    """Real positions ignore what stands at padded positions, and equal the unpadded run."""
    B, L, d, H, d_ff = 2, 7, 16, 4, 32
    lengths = [7, 4]
    for nf in (False, True):
        with seeded(seed):
            layer = _enc_make(EncoderLayer, d, H, d_ff, 0.0, nf)
            x = torch.randn(B, L, d)
            noise = torch.randn(B, L, d) * 3
        layer.eval()
        mask = _padding_mask(lengths, L)
        pad = ~mask[:, 0, :, None]  # (B, L, 1) True at padded positions
        y1 = _call(layer, x, mask, what="EncoderLayer(x, src_mask)", hint=_ENC_CRASH)
        check_shape(y1, x.shape, "EncoderLayer output", _ENC_CRASH)
        y2 = _call(layer, torch.where(pad, x + noise, x), mask, what="EncoderLayer(x, src_mask)")
        real = mask[:, 0, :]
        if not _close(y1[real], y2[real], atol=1e-5, rtol=1e-4):
            fail(f"{_placement(nf)}: outputs at real positions changed when only the padded "
                 "positions of x changed: src_mask is not applied in the self-attention (pass it "
                 "on: self_attn(h, h, h, src_mask)), or it is inverted (True = may attend).")
        short = _call(layer, x[1:, :lengths[1]], None, what="EncoderLayer(x) on the unpadded sequence")
        check_close(y1[1, :lengths[1]], short[0],
                    f"{_placement(nf)}: outputs of a padded sequence at its real positions "
                    "against the same sequence run without padding",
                    "Padding plus src_mask must give the same result as no padding at all: "
                    "pass src_mask to the self-attention.")
    passed("EncoderLayer: padded positions do not change the outputs at real positions")


def check_encoder_layer_dropout(EncoderLayer, seed=4):
    """dropout > 0: random in train mode; in eval mode deterministic and equal to PyTorch's."""
    B, L, d, H, d_ff = 2, 5, 16, 2, 32
    for nf in (False, True):
        _enc_compare(EncoderLayer, B, L, d, H, d_ff, nf, seed, dropout=0.3)
        with seeded(seed):
            layer = _enc_make(EncoderLayer, d, H, d_ff, 0.3, nf)
            x = torch.randn(B, L, d)
            layer.eval()
            e1 = _call(layer, x, what="EncoderLayer in eval mode")
            e2 = _call(layer, x, what="EncoderLayer in eval mode")
            layer.train()
            t1 = _call(layer, x, what="EncoderLayer in train mode")
            t2 = _call(layer, x, what="EncoderLayer in train mode")
        if not torch.equal(e1, e2):
            fail("EncoderLayer(dropout=0.3) in eval mode gives different outputs on two calls: "
                 "dropout must be off in eval mode (use nn.Dropout modules, or pass "
                 "training=self.training to F.dropout).")
        if _close(t1, t2):
            fail("EncoderLayer(dropout=0.3) in train mode gives the same output twice: the "
                 "dropout argument is not used. Pass it to the attention and the feed-forward "
                 "network and drop each sub-layer's output before the residual addition.")
    passed("EncoderLayer: eval mode with dropout=0.3 matches PyTorch and is deterministic; "
           "train mode is random")


# --------------------------------------------------------------------------- DecoderLayer
_DEC_PATHS = ["self_attn", "cross_attn", "ff", "ff.linear1", "ff.linear2", "norm1", "norm2",
              "norm3"]
_DEC_CRASH = ("A decoder layer runs masked self-attention over x (mask tgt_mask, (Lt, Lt) or "
              "(B, Lt, Lt)), then cross-attention with queries from x and keys and values from "
              "memory (mask src_mask, (B, 1, Ls)): cross_attn(h, memory, memory, src_mask). "
              "Check which mask goes where and the argument order (query, key, value).")


def _dec_make(DecoderLayer, d, H, d_ff, dropout=0.0, nf=False):
    what = f"DecoderLayer({d}, {H}, {d_ff}, dropout={dropout}, norm_first={nf})"
    layer = _call(DecoderLayer, d, H, d_ff, dropout=dropout, norm_first=nf, what=what)
    _no_torch_blocks(layer, what)
    for p in _DEC_PATHS:
        _get(layer, p, "DecoderLayer")
    _norm_inside_attention(layer, ["self_attn", "cross_attn"], "DecoderLayer")
    _distinct(layer, ["norm1", "norm2", "norm3"], "DecoderLayer", _NORM_SHARED)
    _distinct(layer, ["self_attn", "cross_attn"], "DecoderLayer",
              "the masked self-attention and the cross-attention need their own weights: create "
              "two attention modules.")
    return layer


def check_decoder_layer_structure(DecoderLayer):
    """Named sub-modules, distinct attentions and norms, parameters registered and counted."""
    d, H, d_ff = 16, 4, 40
    with seeded(0):
        layer = _dec_make(DecoderLayer, d, H, d_ff)
        x, mem = torch.randn(2, 5, d), torch.randn(2, 7, d)
    if not isinstance(layer, nn.Module):
        fail("DecoderLayer must be an nn.Module subclass.")
    _ff_shapes(layer.ff, d, d_ff, "DecoderLayer.ff")
    _registered(layer, ["self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"], "DecoderLayer")
    n = sum(p.numel() for p in layer.parameters())
    ref = sum(p.numel() for p in nn.TransformerDecoderLayer(d, H, d_ff, batch_first=True).parameters())
    if n != ref:
        fail(f"DecoderLayer({d}, {H}, {d_ff}) has {n} parameters; nn.TransformerDecoderLayer has "
             f"{ref} (two attentions, one feed-forward network, three LayerNorms).")
    y = _call(layer, x, mem, what="DecoderLayer(x, memory) with x (2, 5, 16), memory (2, 7, 16)",
              hint=_DEC_CRASH)
    check_shape(y, x.shape, "DecoderLayer output for x (2, 5, 16) and memory (2, 7, 16)",
                "The decoder keeps the target's length: cross-attention takes its QUERIES from x "
                "and only keys and values from memory.")
    passed("DecoderLayer: self_attn, cross_attn, ff and norm1..3 are separate, registered modules")


def _dec_candidates(t, x, mem, tm, sm, nf):
    def sa(h, m=tm):
        return t.self_attn(h, h, h, attn_mask=m, need_weights=False)[0]

    def ca(h, m=sm, kv=None):
        kv = mem if kv is None else kv
        return t.multihead_attn(h, kv, kv, attn_mask=m, need_weights=False)[0]

    ff = lambda h: t.linear2(F.relu(t.linear1(h)))  # noqa: E731
    n1, n2, n3 = t.norm1, t.norm2, t.norm3

    def layer(x, nf=nf, sa=sa, ca=ca, n1=n1, n2=n2, n3=n3):
        if nf:
            h = x + sa(n1(x))
            h = h + ca(n2(h))
            return h + ff(n3(h))
        h = n1(x + sa(x))
        h = n2(h + ca(h))
        return n3(h + ff(h))

    return {
        f"it computes the {_placement(not nf)} layer although norm_first={nf}: the norm_first "
        "argument is ignored.": lambda: layer(x, nf=not nf),
        "the output does not depend on memory: the cross-attention attends over x itself. It "
        "must take its keys and values from the encoder output: cross_attn(h, memory, memory, "
        "src_mask).": lambda: layer(x, ca=lambda h: t.multihead_attn(
            h, h, h, need_weights=False)[0]),
        "the masked self-attention ignores tgt_mask, so every position looks ahead at later "
        "target tokens: self_attn(h, h, h, tgt_mask).": lambda: layer(x, sa=lambda h: sa(h, None)),
        "src_mask never reaches the cross-attention, so padded memory positions are attended: "
        "cross_attn(h, memory, memory, src_mask).": lambda: layer(x, ca=lambda h: ca(h, None)),
        "one LayerNorm (norm1) is used for all three sub-layers, a bug found in published "
        "study notes: each sub-layer has its own norm1, norm2, norm3.": lambda: layer(x, n2=n1, n3=n1),
        "the memory is normalised with norm2 inside the decoder layer: only the decoder's own "
        "stream is normalised (the encoder's final LayerNorm already normalised memory): "
        "cross_attn(norm2(x), memory, memory, src_mask).":
            lambda: layer(x, ca=lambda h: ca(h, kv=n2(mem))),
        "norm2 and norm3 are swapped: norm1 goes with self-attention, norm2 with "
        "cross-attention, norm3 with the feed-forward network.": lambda: layer(x, n2=n3, n3=n2),
    }


def _dec_masks(B, Lt, Ls, src_lengths, batch_tgt=False):
    src_mask = _padding_mask(src_lengths, Ls)  # (B, 1, Ls)
    tgt_mask = _causal(Lt)
    if batch_tgt:
        tgt_mask = tgt_mask.expand(B, Lt, Lt).clone()
    return src_mask, tgt_mask


def _dec_compare(DecoderLayer, B, Lt, Ls, d, H, d_ff, nf, seed, dropout=0.0, batch_tgt=False):
    with seeded(seed):
        layer = _dec_make(DecoderLayer, d, H, d_ff, dropout, nf)
        x, mem = torch.randn(B, Lt, d), torch.randn(B, Ls, d)
    src_mask, tgt_mask = _dec_masks(B, Lt, Ls, [Ls] + [max(1, Ls - 2 - i) for i in range(B - 1)],
                                    batch_tgt)
    _perturb_norms(layer, ["norm1", "norm2", "norm3"], "DecoderLayer")
    layer.eval()
    t = nn.TransformerDecoderLayer(d, H, d_ff, dropout=dropout, batch_first=True, norm_first=nf)
    t.eval()
    copy_decoder_layer_to_torch(layer, t)
    tm = torch_attn_mask(tgt_mask, B, H, Lt, Lt)
    sm = torch_attn_mask(src_mask, B, H, Lt, Ls)
    expected = _torch_ref(lambda: t(x, mem, tgt_mask=tm, memory_mask=sm))
    what = (f"DecoderLayer({d}, {H}, {d_ff}, norm_first={nf}) on x {tuple(x.shape)}, memory "
            f"{tuple(mem.shape)}, tgt_mask {tuple(tgt_mask.shape)}, src_mask {tuple(src_mask.shape)}")
    y = _call(layer, x, mem, src_mask, tgt_mask, what=what, hint=_DEC_CRASH)
    if isinstance(y, torch.Tensor) and tuple(y.shape) == (B, Ls, d) and Ls != Lt:
        fail(f"{what} returned shape {tuple(y.shape)} = (B, Ls, d_model): the cross-attention "
             "takes its queries from memory. Queries come from the decoder, keys and values from "
             "memory: cross_attn(h, memory, memory, src_mask).")
    check_shape(y, expected.shape, what, _DEC_CRASH)
    if not _close(y.detach(), expected, atol=1e-5, rtol=1e-4):
        why = _memory_probe(lambda xx, mm: _call(layer, xx, mm, src_mask, tgt_mask, what=what,
                                                 hint=_DEC_CRASH).detach(), x, mem, "DecoderLayer")
        if why:
            fail(f"{what} does not match nn.TransformerDecoderLayer: {why}")
        why = _match(y, {k: (lambda f=f: _torch_ref(f)) for k, f in
                         _dec_candidates(t, x, mem, tm, sm, nf).items()})
        if why:
            fail(f"{what} does not match nn.TransformerDecoderLayer: {why}")
    check_close(y, expected, f"{what}, against nn.TransformerDecoderLayer with your weights",
                f"Compare your forward with the {_placement(nf)} decoder equations in the text.")


def check_decoder_layer_matches_torch(DecoderLayer, seed=0, cases=((2, 5, 7, 16, 4, 40),)):
    """Weights copied into nn.TransformerDecoderLayer: the same output for both norm
    placements, with a causal tgt_mask (2-D and 3-D) and a padded src_mask. Cases are
    (B, Lt, Ls, d_model, n_heads, d_ff)."""
    for i, (B, Lt, Ls, d, H, d_ff) in enumerate(cases):
        for nf in (False, True):
            _dec_compare(DecoderLayer, B, Lt, Ls, d, H, d_ff, nf, seed + i, batch_tgt=bool(i % 2))
    passed(f"DecoderLayer: matches nn.TransformerDecoderLayer for post-norm and pre-norm on "
           f"{len(cases)} size(s)")


def check_decoder_layer_causal(DecoderLayer, seed=5):
    """With a causal tgt_mask, changing target position j changes no output before j."""
    B, Lt, Ls, d, H, d_ff = 2, 6, 4, 16, 4, 32
    for nf in (False, True):
        for batch_tgt in (False, True):
            with seeded(seed):
                layer = _dec_make(DecoderLayer, d, H, d_ff, 0.0, nf)
                x, mem = torch.randn(B, Lt, d), torch.randn(B, Ls, d)
            layer.eval()
            src_mask, tgt_mask = _dec_masks(B, Lt, Ls, [Ls, Ls], batch_tgt)
            y = _call(layer, x, mem, src_mask, tgt_mask, what="DecoderLayer(x, memory, src_mask, "
                      "tgt_mask)", hint=_DEC_CRASH)
            check_shape(y, x.shape, "DecoderLayer output", _DEC_CRASH)
            for j in (Lt - 1, 2):
                x2 = x.clone()
                x2[:, j] += 3.0
                y2 = _call(layer, x2, mem, src_mask, tgt_mask, what="DecoderLayer")
                diff = (y2 - y).abs().amax(dim=(0, 2))  # (Lt,)
                if (diff[:j] > 1e-5).any():
                    why = _memory_probe(lambda xx, mm: _call(
                        layer, xx, mm, src_mask, tgt_mask, what="DecoderLayer").detach(), x, mem,
                        "DecoderLayer")
                    if why:  # an unmasked attention over x itself is what looks ahead
                        fail(f"{_placement(nf)}: changing target position {j} changed earlier "
                             f"outputs, and {why}")
                    i = int((diff[:j] > 1e-5).nonzero()[0])
                    fail(f"{_placement(nf)}, tgt_mask of shape {tuple(tgt_mask.shape)}: changing "
                         f"target position {j} changed the output at position {i} < {j}, so the "
                         "decoder looks ahead. The masked self-attention must use tgt_mask: "
                         "self_attn(h, h, h, tgt_mask).")
                if diff[j] <= 1e-6:
                    fail(f"changing target position {j} did not change the output at position "
                         f"{j}: the layer must use its input x (and add it back as the residual).")
    passed("DecoderLayer: causal (a later target token never changes an earlier output)")


def check_decoder_layer_memory(DecoderLayer, seed=6):
    """The output depends on memory, but not on memory positions that src_mask hides."""
    B, Lt, Ls, d, H, d_ff = 2, 5, 6, 16, 4, 32
    for nf in (False, True):
        with seeded(seed):
            layer = _dec_make(DecoderLayer, d, H, d_ff, 0.0, nf)
            x, mem, noise = torch.randn(B, Lt, d), torch.randn(B, Ls, d), torch.randn(B, Ls, d)
        layer.eval()
        src_mask, tgt_mask = _dec_masks(B, Lt, Ls, [Ls, 3])
        y = _call(layer, x, mem, src_mask, tgt_mask, what="DecoderLayer(x, memory, src_mask, "
                  "tgt_mask)", hint=_DEC_CRASH)
        check_shape(y, x.shape, "DecoderLayer output", _DEC_CRASH)
        y_other = _call(layer, x, mem + noise, src_mask, tgt_mask, what="DecoderLayer")
        if _close(y, y_other, atol=1e-6):
            fail(f"{_placement(nf)}: a completely different memory gives the same output: the "
                 "decoder ignores the encoder output. The cross-attention must take its keys and "
                 "values from memory: cross_attn(h, memory, memory, src_mask).")
        hidden = ~src_mask[:, 0, :, None]  # (B, Ls, 1) True at padded memory positions
        y_pad = _call(layer, x, torch.where(hidden, mem + noise, mem), src_mask, tgt_mask,
                      what="DecoderLayer")
        if not _close(y, y_pad, atol=1e-5, rtol=1e-4):
            fail(f"{_placement(nf)}: changing only the padded memory positions (hidden by "
                 "src_mask) changed the output: pass src_mask to the cross-attention, "
                 "cross_attn(h, memory, memory, src_mask), with True = may attend.")
    passed("DecoderLayer: uses memory through cross-attention and ignores padded memory positions")


def check_decoder_layer_dropout(DecoderLayer, seed=7):
    """dropout > 0: random in train mode; eval mode deterministic and equal to PyTorch's."""
    B, Lt, Ls, d, H, d_ff = 2, 4, 5, 16, 2, 32
    for nf in (False, True):
        _dec_compare(DecoderLayer, B, Lt, Ls, d, H, d_ff, nf, seed, dropout=0.3)
        with seeded(seed):
            layer = _dec_make(DecoderLayer, d, H, d_ff, 0.3, nf)
            x, mem = torch.randn(B, Lt, d), torch.randn(B, Ls, d)
            layer.eval()
            e1 = _call(layer, x, mem, what="DecoderLayer in eval mode")
            e2 = _call(layer, x, mem, what="DecoderLayer in eval mode")
            layer.train()
            t1 = _call(layer, x, mem, what="DecoderLayer in train mode")
            t2 = _call(layer, x, mem, what="DecoderLayer in train mode")
        if not torch.equal(e1, e2):
            fail("DecoderLayer(dropout=0.3) in eval mode gives different outputs on two calls: "
                 "dropout must be off in eval mode (nn.Dropout modules do that).")
        if _close(t1, t2):
            fail("DecoderLayer(dropout=0.3) in train mode gives the same output twice: the "
                 "dropout argument is not used.")
    passed("DecoderLayer: eval mode with dropout=0.3 matches PyTorch and is deterministic; "
           "train mode is random")


# --------------------------------------------------------------------------- stacks
def _stack_structure(stack, n, owner, layer_paths):
    layers = _get(stack, "layers", owner)
    if isinstance(layers, (list, tuple)):
        fail(f"{owner}.layers is a plain Python {type(layers).__name__}: PyTorch does not "
             "register the layers inside it, so model.parameters() misses them (the optimizer "
             "never trains them), .to(device) does not move them and state_dict does not save "
             "them. Use nn.ModuleList([...]).")
    if not isinstance(layers, nn.Module):
        fail(f"{owner}.layers must be an nn.ModuleList, got {type(layers).__name__}.")
    if len(layers) != n:
        fail(f"{owner}(n_layers={n}, ...) has {len(layers)} layers: build exactly n_layers, "
             "for _ in range(n_layers).")
    if n > 1 and len({id(m) for m in layers}) < n:
        fail(f"{owner}.layers holds the same layer object several times: [Layer(...)] * n "
             "repeats ONE layer (one set of weights used n times). Create a new layer in every "
             "iteration: nn.ModuleList(Layer(...) for _ in range(n_layers)).")
    seen = {}
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            if id(p) in seen and seen[id(p)] != i:
                fail(f"{owner}.layers[{seen[id(p)]}] and layers[{i}] share parameters: every "
                     "layer needs its own weights.")
            seen[id(p)] = i
        for path in layer_paths:
            _get(layer, path, f"{owner}.layers[{i}]")
    _registered(stack, ["layers"], owner)
    norm = _get(stack, "norm", owner)
    if not isinstance(norm, nn.Module) or getattr(norm, "weight", None) is None:
        fail(f"{owner}.norm must be the final LayerNorm (nn.LayerNorm(d_model)), as in "
             "nn.Transformer's encoder and decoder.")
    _registered(stack, ["norm"], owner)


def _stack_make(cls, owner, n, d, H, d_ff, dropout, nf, layer_paths):
    what = f"{owner}({n}, {d}, {H}, {d_ff}, dropout={dropout}, norm_first={nf})"
    stack = _call(cls, n, d, H, d_ff, dropout=dropout, norm_first=nf, what=what)
    _no_torch_blocks(stack, what)
    _stack_structure(stack, n, owner, layer_paths)
    return stack


def _stack_perturb(stack, norms, owner):
    for i, layer in enumerate(stack.layers):
        _perturb_norms(layer, norms, f"{owner}.layers[{i}]")
    with torch.no_grad():
        gen = torch.Generator().manual_seed(77)
        stack.norm.weight.copy_(1.0 + 0.5 * torch.randn(stack.norm.weight.shape, generator=gen))
        stack.norm.bias.copy_(0.3 * torch.randn(stack.norm.bias.shape, generator=gen))


def _torch_encoder(stack, n, d, H, d_ff, dropout, nf):
    layer = nn.TransformerEncoderLayer(d, H, d_ff, dropout=dropout, batch_first=True, norm_first=nf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = nn.TransformerEncoder(layer, n, norm=nn.LayerNorm(d), enable_nested_tensor=False)
    for i in range(n):
        copy_encoder_layer_to_torch(stack.layers[i], t.layers[i], f"Encoder.layers[{i}]")
    with torch.no_grad():
        _copy_linear(stack.norm, t.norm, "Encoder.norm")
    return t.eval()


def _torch_decoder(stack, n, d, H, d_ff, dropout, nf):
    layer = nn.TransformerDecoderLayer(d, H, d_ff, dropout=dropout, batch_first=True, norm_first=nf)
    t = nn.TransformerDecoder(layer, n, norm=nn.LayerNorm(d))
    for i in range(n):
        copy_decoder_layer_to_torch(stack.layers[i], t.layers[i], f"Decoder.layers[{i}]")
    with torch.no_grad():
        _copy_linear(stack.norm, t.norm, "Decoder.norm")
    return t.eval()


_ENC_STACK_CRASH = ("Encoder.forward runs x through every layer, passing src_mask on "
                    "(x = layer(x, src_mask)), then applies the final norm once.")
_DEC_STACK_CRASH = ("Decoder.forward runs x through every layer with the encoder output: "
                    "x = layer(x, memory, src_mask, tgt_mask) (that order, or by name), then "
                    "applies the final norm once.")


def check_encoder_structure(Encoder):
    """layers is an nn.ModuleList of n_layers distinct layers; a final norm; all registered."""
    for n in (3, 1):
        with seeded(0):
            _stack_make(Encoder, "Encoder", n, 16, 4, 32, 0.0, False, ["self_attn", "ff", "norm1",
                                                                      "norm2"])
    passed("Encoder: n_layers distinct layers in an nn.ModuleList and a final LayerNorm, all "
           "registered")


def _enc_stack_compare(Encoder, n, B, L, d, H, d_ff, nf, seed, dropout=0.0, atol=2e-5):
    with seeded(seed):
        enc = _stack_make(Encoder, "Encoder", n, d, H, d_ff, dropout, nf,
                          ["self_attn", "ff", "norm1", "norm2"])
        x = torch.randn(B, L, d)
    _stack_perturb(enc, ["norm1", "norm2"], "Encoder")
    enc.eval()
    t = _torch_encoder(enc, n, d, H, d_ff, dropout, nf)
    mask = _padding_mask([L] + [max(1, L - 2 - i) for i in range(B - 1)], L)
    am = torch_attn_mask(mask, B, H, L, L)
    expected = _torch_ref(lambda: t(x, mask=am))
    what = (f"Encoder({n}, {d}, {H}, {d_ff}, norm_first={nf}) on x {tuple(x.shape)} with a "
            "padding mask")
    y = _call(enc, x, mask, what=what, hint=_ENC_STACK_CRASH)
    check_shape(y, expected.shape, what)
    if not _close(y.detach(), expected, atol=atol, rtol=1e-4):
        def run(layers_mask=am, final=True, each=False, tt=t):
            h = x
            for lay in tt.layers:
                h = lay(h, src_mask=layers_mask)
                if each:
                    h = tt.norm(h)
            return tt.norm(h) if final and not each else h

        def other():
            return _torch_encoder(enc, n, d, H, d_ff, dropout, not nf)(x, mask=am)

        why = _match(y, {k: (lambda f=f: _torch_ref(f)) for k, f in {
            "the final LayerNorm is missing: after the last layer, return self.norm(x) (as "
            "nn.Transformer's encoder does; pre-norm stacks need it, since their residual stream "
            "is never normalised otherwise).": lambda: run(final=False),
            "the final norm is applied after every layer: apply it once, after the loop.":
                lambda: run(each=True),
            "src_mask is not passed on to the layers: x = layer(x, src_mask).":
                lambda: run(layers_mask=None),
            f"the layers are built with the default norm_first although norm_first={nf} was "
            "asked for: pass norm_first on to every layer.": other,
        }.items()})
        if why:
            fail(f"{what} does not match nn.TransformerEncoder: {why}")
    check_close(y, expected, f"{what}, against nn.TransformerEncoder with your weights",
                "Run every layer in order with src_mask, then the final norm once.", atol=atol)


def check_encoder_matches_torch(Encoder, seed=0, cases=((2, 2, 6, 16, 4, 32),)):
    """Weights copied into nn.TransformerEncoder(layer, n, norm=LayerNorm,
    enable_nested_tensor=False): the same output for both norm placements. Cases are
    (n_layers, B, L, d_model, n_heads, d_ff). Tolerance atol=2e-5 (several layers deep)."""
    for i, (n, B, L, d, H, d_ff) in enumerate(cases):
        for nf in (False, True):
            _enc_stack_compare(Encoder, n, B, L, d, H, d_ff, nf, seed + i)
    passed(f"Encoder: matches nn.TransformerEncoder with a final norm, post-norm and pre-norm, "
           f"on {len(cases)} size(s)")


def check_encoder_padding_dropout(Encoder, seed=8):
    """Padding invariance through the stack; dropout random in train mode, off in eval mode."""
    n, B, L, d, H, d_ff = 2, 2, 6, 16, 4, 32
    for nf in (False, True):
        with seeded(seed):
            enc = _stack_make(Encoder, "Encoder", n, d, H, d_ff, 0.3, nf, ["self_attn", "ff"])
            x, noise = torch.randn(B, L, d), torch.randn(B, L, d) * 3
            enc.eval()
            mask = _padding_mask([L, 3], L)
            pad = ~mask[:, 0, :, None]
            y1 = _call(enc, x, mask, what="Encoder(x, src_mask)", hint=_ENC_STACK_CRASH)
            check_shape(y1, x.shape, "Encoder output", _ENC_STACK_CRASH)
            y2 = _call(enc, torch.where(pad, x + noise, x), mask, what="Encoder(x, src_mask)")
            if not torch.equal(y1, _call(enc, x, mask, what="Encoder in eval mode")):
                fail("Encoder(dropout=0.3) in eval mode gives different outputs on two calls: "
                     "dropout must be off in eval mode.")
            real = mask[:, 0, :]
            if not _close(y1[real], y2[real], atol=1e-5, rtol=1e-4):
                fail(f"{_placement(nf)}: Encoder outputs at real positions changed when only "
                     "padded positions changed: src_mask is not passed on to every layer "
                     "(x = layer(x, src_mask)).")
            enc.train()
            t1 = _call(enc, x, mask, what="Encoder in train mode")
            t2 = _call(enc, x, mask, what="Encoder in train mode")
        if _close(t1, t2):
            fail("Encoder(dropout=0.3) in train mode gives the same output twice: the dropout "
                 "argument is not passed on to the layers.")
    passed("Encoder: padding invariant through the stack; dropout only in train mode")


def check_decoder_structure(Decoder):
    for n in (3, 1):
        with seeded(0):
            _stack_make(Decoder, "Decoder", n, 16, 4, 32, 0.0, False,
                        ["self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"])
    passed("Decoder: n_layers distinct layers in an nn.ModuleList and a final LayerNorm, all "
           "registered")


def _dec_stack_compare(Decoder, n, B, Lt, Ls, d, H, d_ff, nf, seed, batch_tgt=False, atol=2e-5):
    with seeded(seed):
        dec = _stack_make(Decoder, "Decoder", n, d, H, d_ff, 0.0, nf,
                          ["self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"])
        x, mem = torch.randn(B, Lt, d), torch.randn(B, Ls, d)
    _stack_perturb(dec, ["norm1", "norm2", "norm3"], "Decoder")
    dec.eval()
    t = _torch_decoder(dec, n, d, H, d_ff, 0.0, nf)
    src_mask, tgt_mask = _dec_masks(B, Lt, Ls, [Ls] + [max(1, Ls - 2 - i) for i in range(B - 1)],
                                    batch_tgt)
    tm = torch_attn_mask(tgt_mask, B, H, Lt, Lt)
    sm = torch_attn_mask(src_mask, B, H, Lt, Ls)
    expected = _torch_ref(lambda: t(x, mem, tgt_mask=tm, memory_mask=sm))
    what = (f"Decoder({n}, {d}, {H}, {d_ff}, norm_first={nf}) on x {tuple(x.shape)}, memory "
            f"{tuple(mem.shape)}")
    y = _call(dec, x, mem, src_mask, tgt_mask, what=what, hint=_DEC_STACK_CRASH)
    check_shape(y, expected.shape, what)
    if not _close(y.detach(), expected, atol=atol, rtol=1e-4):
        why = _memory_probe(lambda xx, mm: _call(dec, xx, mm, src_mask, tgt_mask, what=what,
                                                 hint=_DEC_STACK_CRASH).detach(), x, mem, "Decoder",
                            "(it never reaches the layers). Every layer must get memory: "
                            "x = layer(x, memory, src_mask, tgt_mask), not layer(x, x, ...).")
        if why:
            fail(f"{what} does not match nn.TransformerDecoder: {why}")

        def run(final=True, each=False, tmask=tm, smask=sm, memory=mem):
            h = x
            for lay in t.layers:
                h = lay(h, memory, tgt_mask=tmask, memory_mask=smask)
                if each:
                    h = t.norm(h)
            return t.norm(h) if final and not each else h

        def other():
            return _torch_decoder(dec, n, d, H, d_ff, 0.0, not nf)(x, mem, tgt_mask=tm,
                                                                     memory_mask=sm)

        why = _match(y, {k: (lambda f=f: _torch_ref(f)) for k, f in {
            "the final LayerNorm is missing: after the last layer, return self.norm(x).":
                lambda: run(final=False),
            "the final norm is applied after every layer: apply it once, after the loop.":
                lambda: run(each=True),
            "tgt_mask is not passed on to the layers, so the decoder looks ahead.":
                lambda: run(tmask=None),
            "src_mask is not passed on to the layers.": lambda: run(smask=None),
            f"the layers are built with the default norm_first although norm_first={nf} was "
            "asked for: pass norm_first on to every layer.": other,
        }.items()})
        if why:
            fail(f"{what} does not match nn.TransformerDecoder: {why}")
    check_close(y, expected, f"{what}, against nn.TransformerDecoder with your weights",
                "Run every layer in order with memory and both masks, then the final norm once.",
                atol=atol)


def check_decoder_matches_torch(Decoder, seed=0, cases=((2, 2, 5, 7, 16, 4, 32),)):
    """Weights copied into nn.TransformerDecoder(layer, n, norm=LayerNorm): the same output for
    both norm placements. Cases are (n_layers, B, Lt, Ls, d_model, n_heads, d_ff)."""
    for i, (n, B, Lt, Ls, d, H, d_ff) in enumerate(cases):
        for nf in (False, True):
            _dec_stack_compare(Decoder, n, B, Lt, Ls, d, H, d_ff, nf, seed + i,
                               batch_tgt=bool(i % 2))
    passed(f"Decoder: matches nn.TransformerDecoder with a final norm, post-norm and pre-norm, "
           f"on {len(cases)} size(s)")


def check_decoder_causal_memory(Decoder, seed=9):
    """Through the stack: causal, uses memory, ignores padded memory, dropout off in eval."""
    n, B, Lt, Ls, d, H, d_ff = 2, 2, 5, 6, 16, 4, 32
    for nf in (False, True):
        with seeded(seed):
            dec = _stack_make(Decoder, "Decoder", n, d, H, d_ff, 0.3, nf, ["self_attn", "cross_attn"])
            x, mem, noise = torch.randn(B, Lt, d), torch.randn(B, Ls, d), torch.randn(B, Ls, d)
            dec.eval()
            src_mask, tgt_mask = _dec_masks(B, Lt, Ls, [Ls, 3])
            args = dict(what="Decoder(x, memory, src_mask, tgt_mask)", hint=_DEC_STACK_CRASH)
            y = _call(dec, x, mem, src_mask, tgt_mask, **args)
            check_shape(y, x.shape, "Decoder output", _DEC_STACK_CRASH)
            if not torch.equal(y, _call(dec, x, mem, src_mask, tgt_mask, **args)):
                fail("Decoder(dropout=0.3) in eval mode gives different outputs on two calls: "
                     "dropout must be off in eval mode.")
            if _close(y, _call(dec, x, mem + noise, src_mask, tgt_mask, **args), atol=1e-6):
                fail(f"{_placement(nf)}: a completely different memory gives the same output: "
                     "the decoder ignores the encoder output. Every layer must get memory: "
                     "x = layer(x, memory, src_mask, tgt_mask) (not layer(x, x, ...)).")
            hidden = ~src_mask[:, 0, :, None]
            y_pad = _call(dec, x, torch.where(hidden, mem + noise, mem), src_mask, tgt_mask, **args)
            if not _close(y, y_pad, atol=1e-5, rtol=1e-4):
                fail(f"{_placement(nf)}: changing padded memory positions changed the output: "
                     "src_mask must reach every layer's cross-attention (check the mask order: "
                     "layer(x, memory, src_mask, tgt_mask)).")
            x2 = x.clone()
            x2[:, Lt - 2] += 3.0
            y2 = _call(dec, x2, mem, src_mask, tgt_mask, **args)
            if not _close(y2[:, :Lt - 2], y[:, :Lt - 2], atol=1e-5, rtol=1e-4):
                fail(f"{_placement(nf)}: changing target position {Lt - 2} changed earlier "
                     "outputs: tgt_mask must reach every layer's masked self-attention (check the "
                     "mask order: layer(x, memory, src_mask, tgt_mask)).")
            dec.train()
            t1 = _call(dec, x, mem, src_mask, tgt_mask, **args)
            t2 = _call(dec, x, mem, src_mask, tgt_mask, **args)
        if _close(t1, t2):
            fail("Decoder(dropout=0.3) in train mode gives the same output twice: the dropout "
                 "argument is not passed on to the layers.")
    passed("Decoder: causal, uses memory, ignores padded memory; dropout only in train mode")
