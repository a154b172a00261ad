"""06_blocks: what the grader runs on the student's `FeedForward`, `EncoderLayer`,
`DecoderLayer`, `Encoder` and `Decoder`, on inputs drawn for each grading run.

Every module is built with the exercise's constructor and given the reference's (perturbed)
parameters by name, so a wrong structure (a missing bias, a swapped or shared LayerNorm, one
attention used twice, layers in a Python list or `[layer] * n`) fails to load, and a wrong
forward gives other values. Values are compared in eval mode (also with dropout > 0: dropout
must be off there) for both norm placements. Train-mode dropout cannot be compared with the
reference (the masks differ between implementations): those probes feed two identical batch
rows and require that their outputs differ (dropout active), see `_dropout_active`; in eval
mode two identical rows must give identical outputs.

When a probe fails, the exercise's diagnoses name the mistake: structural ones read the
"parameters" probes (the module as constructed, nothing loaded: parameter names and shapes,
and for the stacks what `layers` holds), the others compare the student's output with a wrong
forward pass built from the reference's sub-modules (the same loaded parameters), or read the
error the student's code raised.
"""

ASSIGNMENT = "06_blocks"
import re

import numpy as np
import torch

from .engine import (ATOL, Exercise, Probe, RTOL, call, compare_key, ctor, given, grades, like,
                     randn, shapes, when)


# -- inputs ---------------------------------------------------------------------------------

def _x(B, L, d, scale=1.0):
    return randn(B, L, d, scale=scale)


def _twins(L, d):
    """(2, L, d) whose two batch rows are identical: without dropout their outputs are too."""
    return given(lambda g: torch.randn(1, L, d, generator=g).expand(2, L, d).clone(),
                 f"two identical rows (2, {L}, {d})")


def _lengths(g, B, L):
    """Row 0 unpadded, the others padded to a random length in [1, L-2]."""
    return [L] + [int(torch.randint(1, L - 1, (1,), generator=g)) for _ in range(B - 1)]


def _pad_pair(B, L, d):
    """(x, mask): x (B, L, d) with large values at the padded positions, and its (B, 1, L)
    padding mask. Pass them in this order: the mask is drawn while x is built (the same
    generator), and handed over to the mask's builder."""
    made = {}

    def x(g):
        lens = torch.tensor(_lengths(g, B, L))
        m = (torch.arange(L)[None, :] < lens[:, None]).unsqueeze(1)
        made[id(g)] = m
        v = torch.randn(B, L, d, generator=g)
        return torch.where(m[:, 0, :, None], v, v * 30.0)

    return (given(x, f"x ({B}, {L}, {d}) with large values at padded positions"),
            given(lambda g: made.pop(id(g)), f"a padding mask ({B}, 1, {L})"))


def _causal(L):
    return given(lambda g: torch.tril(torch.ones(L, L, dtype=torch.bool)), f"a causal mask ({L}, {L})")


def _causal_b(B, L):
    return given(lambda g: torch.tril(torch.ones(L, L, dtype=torch.bool)).expand(B, L, L).clone(),
                 f"a causal mask ({B}, {L}, {L})")


def _decoder_mask(B, L):
    """(B, L, L): causal AND key padding (no query row is fully masked)."""
    def build(g):
        lens = torch.tensor(_lengths(g, B, L))
        pad = (torch.arange(L)[None, :] < lens[:, None])[:, None, :]
        return torch.tril(torch.ones(L, L, dtype=torch.bool))[None] & pad
    return given(build, f"causal and padding ({B}, {L}, {L})")


def _with_dead_row(B, L, b, i):
    """(B, L, L) mask, all True except query row i of batch b, which may attend nothing."""
    def build(g):
        m = torch.ones(B, L, L, dtype=torch.bool)
        m[b, i] = False
        return m
    return given(build, f"a ({B}, {L}, {L}) mask with a fully masked query row")


# -- special comparisons --------------------------------------------------------------------

def _dropout_active(p: float, what: str):
    """Train mode with dropout: the two identical batch rows must give different outputs
    (and finite ones of the right shape); the reference's own masks are not compared."""
    def compare(key, got, want):
        if not key.endswith(".out"):
            return "default"
        if got.shape != want.shape:
            return f"the output has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if not np.isfinite(got).all():
            return "the output in train mode has NaN or inf values"
        if np.abs(got[0].astype(np.float64) - got[1].astype(np.float64)).max() < 1e-4:
            return (f"in train mode with dropout={p}, two identical inputs gave the same output: "
                    f"dropout is not applied ({what})")
        return None
    return compare


def _skip_rows(rows, atol=ATOL, rtol=RTOL):
    """Outputs at query rows whose keys are all masked must be finite; the spec lets them be
    computed from uniform or all-zero weights, so only the other rows are compared."""
    plain = Probe("rows", (), [], atol=atol, rtol=rtol)

    def compare(key, got, want):
        if not key.endswith(".out") or got.shape != want.shape:
            return "default"
        for b, i in rows:
            if not np.isfinite(got[b, i]).all():
                return (f"the output at a fully masked query row (batch {b}, position {i}) has "
                        "NaN or inf values: a row whose keys are all masked must stay finite")
        g, w = got.copy(), want.copy()
        for b, i in rows:
            g[b, i] = w[b, i]
        return compare_key(key, g, w, plain)
    return compare


# -- diagnoses: what the student's module holds, and wrong forward passes ------------------
# A probe without `load=` and without calls ("parameters") shows the student's parameter names
# and shapes, and for the stacks what `layers` is: the structural mistakes are read from them.

def _said(fn, probes=()):
    """A diagnosis whose message depends on the evidence: `fn(e)` gives it, or None."""
    d = when("", None, probes)

    def test(e):
        d.message = fn(e) or ""
        return bool(d.message)
    d.test = test
    return d


def _names(e):
    """(student's {name: shape}, reference's {name: shape}) of the probe's module."""
    got = {n: tuple(s) for n, s in e.meta("params")}
    return got, e.ref_params()


def _missing(e, pat=r""):
    got, want = _names(e)
    return [n for n in want if n not in got and re.search(pat, n)]


def _aliased(e, pat):
    """The names matching `pat` are all there, but exactly that many tensors fewer exist than
    the specification's: the sub-module they name is another one's alias (shared)."""
    got, want = _names(e)
    names = [n for n in want if re.search(pat, n)]
    g, w = e.meta("param_ids"), e._want["meta"].get(f"{e.p.name}.param_ids")
    return bool(names) and all(n in got for n in names) and g is not None and w is not None \
        and w - g == len(names)


def _unexpected(e, pat=r""):
    got, want = _names(e)
    return [n for n in got if n not in want and re.search(pat, n)]


def _shape(e, suffix):
    """(student's shape, expected shape) of the parameter whose name ends in `suffix`, from the
    parameter list or from the error that loading the reference's parameters raised."""
    m = re.search(r"parameter '([\w.]+)' has shape \(([\d, ]*)\), expected \(([\d, ]*)\)", e.error)
    if m and m.group(1).endswith(suffix):
        return tuple(map(int, m.group(2).split(","))), tuple(map(int, m.group(3).split(",")))
    got, want = _names(e)
    n = next(n for n in want if n.endswith(suffix))
    return got.get(n), want[n]


def _no_bias(e):
    if re.search(r"no parameter named '[\w.]*linear\d\.bias'", e.error):
        return True
    return bool(_missing(e, r"linear\d\.bias$"))


def _twins_differ(e):
    """Eval mode, a call with two identical batch rows: the reference's rows agree, the
    student's do not (dropout still active)."""
    if e.pd.get("mode") != "eval":
        return False
    for g, w in e.outs():
        if w.shape[0] == 2 and np.abs(w[0] - w[1]).max() < 1e-6 \
                and np.abs(g[0] - g[1]).max() > 1e-4:
            return True
    return False


def _dropout_off(e):
    return "dropout is not applied" in e.problem


def _size_error(dim):
    return lambda e: "must match the size of tensor" in e.error and f"dimension {dim}" in e.error


CRASHES = [   # the errors this notebook's mistakes raise, tried after each exercise's own
    when("super().__init__() is misspelt (__int__): without it nn.Module is never set up.",
         lambda e: "'__int__'" in e.error),
    when("nn.ReLU is a module class: nn.ReLU(h) builds a module instead of applying it. Use "
         "torch.relu(h) / F.relu(h), or create nn.ReLU() once in __init__ and call it.",
         lambda e: "not ReLU" in e.error),
    when("The class is spelt nn.ReLU (or use torch.relu / F.relu).", lambda e: "'ReLu'" in e.error),
    when("Loop over range(n_layers), not over the integer n_layers itself.",
         lambda e: "'int' object is not iterable" in e.error),
    when("nn.ModuleList holds modules: build each layer with LayerClass(...), not the class or a "
         "tensor.", lambda e: "is not a Module subclass" in e.error),
    when("A name is undefined: a typo (a class spelt differently from its definition), or a "
         "variable that only exists in another cell.", lambda e: "is not defined" in e.error),
    when("forward uses an attribute that __init__ never created: a typo between the two "
         "(ffn_norm / fnn_norm, attention_norm_1 / attentiion_norm_1) is the usual cause.",
         lambda e: "object has no attribute" in e.error),
]

SHORTCUT = when(
    "Shortcut used: your module holds PyTorch's own transformer blocks (parameters named "
    "in_proj_weight, nn.TransformerEncoderLayer and the like). This exercise asks you to build "
    "it yourself from MultiHeadAttention, FeedForward and LayerNorms.",
    lambda e: bool(_unexpected(e, r"in_proj_weight$")))

NORM_INSIDE = when(
    "the attention module contains a LayerNorm: it adds the residual and normalises inside (as "
    "some public implementations do), so the layer normalises twice, or in the wrong place. The "
    "attention module returns w_o(heads) only; the layer adds the residual and applies its own "
    "norms, in the order norm_first asks for.",
    lambda e: bool(_unexpected(e, r"(self|cross)_attn\..*norm")))

NORM_SHARED = when(
    "one LayerNorm is shared by several sub-layers (a bug found in published study notes): each "
    "sub-layer needs its own LayerNorm with its own weight and bias, so create one nn.LayerNorm "
    "per sub-layer in __init__.",
    lambda e: bool(_missing(e, r"^norm\d\.")) and
    len(_names(e)[0]) < len(_names(e)[1]) and not _missing(e, r"^(?!norm\d\.)"))


# FeedForward --------------------------------------------------------------------------------

def _ffn(F_, x, act=torch.relu, out=lambda h: h):
    return out(F_.linear2(act(F_.linear1(x))))


FF_DIAGNOSES = [
    SHORTCUT,
    when("the layers are swapped: linear1 = nn.Linear(d_model, d_ff) expands, linear2 = "
         "nn.Linear(d_ff, d_model) projects back.",
         lambda e: (lambda g, w: g == w[::-1] and w[0] != w[1])(*_shape(e, "linear1.weight"))),
    when("linear2 maps d_model -> d_ff, the same as linear1: nn.Linear(dim, hidden_dim) written "
         "twice, a bug found in published study notes. It must map back from d_ff to d_model: "
         "linear2 = nn.Linear(d_ff, d_model). It only runs when d_ff == d_model, which hides it.",
         lambda e: (lambda g, w: g == w[::-1] and w[0] != w[1])(*_shape(e, "linear2.weight"))),
    when("linear1 does not have d_ff outputs: the hidden size must come from the d_ff argument, "
         "not be hard-coded (such as 4 * d_model).",
         lambda e: (lambda g, w: g[1] == w[1] and g[0] != w[0])(*_shape(e, "linear1.weight"))),
    when("the layers have no bias. The paper's FFN, max(0, x W1 + b1) W2 + b2, and PyTorch's "
         "TransformerEncoderLayer have biases: keep nn.Linear's default bias=True.", _no_bias),
    like("there is no activation between the two layers: without the ReLU, two linear layers "
         "collapse into one linear map. FFN(x) = max(0, x W1 + b1) W2 + b2.",
         lambda F_, x: _ffn(F_, x, act=lambda h: h)),
    like("the ReLU is also applied to the output (after linear2): the FFN's output is added to "
         "the residual stream and must be able to go negative. Apply ReLU to the hidden layer "
         "only.",
         lambda F_, x: _ffn(F_, x, out=torch.relu)),
    like("you used GELU; the paper and nn.TransformerEncoderLayer (activation='relu', the "
         "default) use ReLU.", lambda F_, x: _ffn(F_, x, act=torch.nn.functional.gelu)),
    when("dropout stays on in eval mode: two identical rows give different outputs after "
         "model.eval(). Use an nn.Dropout module (it switches off in eval mode), or "
         "F.dropout(h, p, training=self.training): F.dropout's training argument defaults to True.",
         _twins_differ),
    when("the dropout argument is ignored: in train mode nothing is dropped. Apply "
         "nn.Dropout(dropout) to the hidden activations, between ReLU and linear2.", _dropout_off),
    *CRASHES,
]


# EncoderLayer -------------------------------------------------------------------------------

def _enc(L, x, m=None, nf=None, sa=None, n1=None, n2=None, body=None):
    """The encoder layer with parts swapped: `sa` the self-attention sub-layer, `body` a whole
    wrong forward (x, sa, ff, n1, n2) for the placement nf."""
    nf = L.norm_first if nf is None else nf
    sa = sa or (lambda h: L.self_attn(h, h, h, m))
    n1, n2 = n1 or L.norm1, n2 or L.norm2
    if body is not None:
        return body(nf)(x, sa, L.ff, n1, n2)
    if nf:
        h = x + sa(n1(x))
        return h + L.ff(n2(h))
    h = n1(x + sa(x))
    return n2(h + L.ff(h))


def _body(pre=None, post=None):
    return lambda nf: (pre if nf else post) or (lambda *a: None)


ENC_LAYER_DIAGNOSES = [
    SHORTCUT, NORM_INSIDE, NORM_SHARED,
    like("it computes the other norm placement: the norm_first argument is ignored. Post-norm "
         "(norm_first=False): x = norm1(x + sa(x)); x = norm2(x + ff(x)). Pre-norm: "
         "x = x + sa(norm1(x)); x = x + ff(norm2(x)).",
         lambda L, x, m=None: _enc(L, x, m, nf=not L.norm_first)),
    like("it uses one LayerNorm (norm1) for both sub-layers, a bug found in published study "
         "notes: the feed-forward sub-layer needs its own norm2.",
         lambda L, x, m=None: _enc(L, x, m, n2=L.norm1)),
    like("it uses norm2 for both sub-layers: the attention sub-layer needs its own norm1.",
         lambda L, x, m=None: _enc(L, x, m, n1=L.norm2)),
    like("norm1 and norm2 are swapped: norm1 belongs to the attention sub-layer, norm2 to the "
         "feed-forward sub-layer.", lambda L, x, m=None: _enc(L, x, m, n1=L.norm2, n2=L.norm1)),
    like("src_mask never reaches the self-attention, so padded keys are attended: pass it on, "
         "self_attn(h, h, h, src_mask).",
         lambda L, x, m=None: None if m is None else _enc(L, x, None)),
    like("the mask is inverted: in this course True means 'may attend' (PyTorch's "
         "key_padding_mask uses True = ignore), so pass src_mask as it is.",
         lambda L, x, m=None: None if m is None else _enc(L, x, ~m)),
    like("there is no residual connection: each sub-layer's input must be added back, "
         "x = x + sublayer(norm(x)) (pre-norm) or norm(x + sublayer(x)) (post-norm).",
         lambda L, x, m=None: _enc(L, x, m, body=_body(
             lambda x, sa, ff, n1, n2: ff(n2(sa(n1(x)))),
             lambda x, sa, ff, n1, n2: n2(ff(n1(sa(x))))))),
    like("the feed-forward residual adds the layer's input x instead of h, the output of the "
         "attention sub-layer: h = x + sa(norm1(x)); out = h + ff(norm2(h)).",
         lambda L, x, m=None: _enc(L, x, m, body=_body(
             lambda x, sa, ff, n1, n2: x + ff(n2(x + sa(n1(x)))),
             lambda x, sa, ff, n1, n2: n2(x + ff(n1(x + sa(x))))))),
    like("x itself was overwritten by norm1(x) (and by norm2), so the residual stream carries "
         "normalised values: keep x and add the sub-layer of a normalised copy, "
         "x = x + sa(norm1(x)); x = x + ff(norm2(x)).",
         lambda L, x, m=None: _enc(L, x, m, body=_body(
             lambda x, sa, ff, n1, n2: (lambda g: g + ff(g))(n2(n1(x) + sa(n1(x))))))),
    like("the residual is added after the norm (x + norm(sublayer(x))): post-norm normalises "
         "the sum, norm(x + sublayer(x)).",
         lambda L, x, m=None: _enc(L, x, m, body=_body(
             None, lambda x, sa, ff, n1, n2: (lambda h: h + n2(ff(h)))(x + n1(sa(x)))))),
    when("the dropout argument is not used: in train mode nothing is dropped. Pass it to the "
         "attention and the feed-forward network, and drop each sub-layer's output before the "
         "residual addition.", _dropout_off),
    when("dropout stays on in eval mode: two identical rows give different outputs after "
         "model.eval(). Use nn.Dropout modules, or pass training=self.training to F.dropout.",
         _twins_differ),
    *CRASHES,
]


# DecoderLayer -------------------------------------------------------------------------------

def _dec(L, x, mem, sm=None, tm=None, nf=None, sa=None, ca=None, n1=None, n2=None, n3=None,
         cross=True):
    nf = L.norm_first if nf is None else nf
    sa = sa or (lambda h: L.self_attn(h, h, h, tm))
    ca = ca or (lambda h: L.cross_attn(h, mem, mem, sm))
    n1, n2, n3 = n1 or L.norm1, n2 or L.norm2, n3 or L.norm3
    if nf:
        h = x + sa(n1(x))
        h = h + ca(n2(h)) if cross else h
        return h + L.ff(n3(h))
    h = n1(x + sa(x))
    h = n2(h + ca(h)) if cross else h
    return n3(h + L.ff(h))


_NO_MEMORY = ("the output does not depend on memory, so the decoder ignores the encoder output "
              "(the cross-attention sub-layer is missing, or it attends over x instead of "
              "memory). Queries come from the decoder, keys and values from memory: "
              "cross_attn(h, memory, memory, src_mask).")

DEC_LAYER_DIAGNOSES = [
    SHORTCUT, NORM_INSIDE, NORM_SHARED,
    when("the masked self-attention and the cross-attention are the same module: they need "
         "their own weights, so create two attention modules.",
         lambda e: (bool(_missing(e, r"^cross_attn\.")) and not _unexpected(e))
         or _aliased(e, r"^cross_attn\.")),
    when("the cross-attention takes its queries from memory, so its output has memory's length: "
         "mind the argument order (query, key, value). Queries come from the decoder, keys and "
         "values from memory: cross_attn(h, memory, memory, src_mask).", _size_error(1)),
    when("a mask has the wrong shape for its attention: check which mask goes where. tgt_mask "
         "(Lt, Lt) or (B, Lt, Lt) goes to the masked self-attention, src_mask (B, 1, Ls) to the "
         "cross-attention: self_attn(h, h, h, tgt_mask), cross_attn(h, memory, memory, src_mask).",
         _size_error(3)),
    when("A view/reshape got the wrong number of elements. In the cross-attention the keys and "
         "values come from memory, whose length Ls differs from the target's Lt: split K and V "
         "into heads with their own length (memory.size(1)), not the query's.",
         lambda e: "invalid for input of size" in e.error),
    like("it computes the other norm placement: the norm_first argument is ignored.",
         lambda L, x, mem, sm=None, tm=None: _dec(L, x, mem, sm, tm, nf=not L.norm_first)),
    like(_NO_MEMORY, lambda L, x, mem, sm=None, tm=None: _dec(
        L, x, mem, sm, tm, ca=lambda h: L.cross_attn(h, h, h))),
    like(_NO_MEMORY, lambda L, x, mem, sm=None, tm=None: _dec(L, x, mem, sm, tm, cross=False)),
    like("the cross-attention takes its queries from memory: mind the argument order (query, "
         "key, value), cross_attn(h, memory, memory, src_mask).",
         lambda L, x, mem, sm=None, tm=None: _dec(
             L, x, mem, sm, tm, ca=lambda h: L.cross_attn(mem, h, h, sm))),
    like("the masked self-attention ignores tgt_mask, so every position looks ahead at later "
         "target tokens: self_attn(h, h, h, tgt_mask).",
         lambda L, x, mem, sm=None, tm=None: None if tm is None else _dec(L, x, mem, sm, None)),
    like("src_mask never reaches the cross-attention, so padded memory positions are attended: "
         "cross_attn(h, memory, memory, src_mask).",
         lambda L, x, mem, sm=None, tm=None: None if sm is None else _dec(L, x, mem, None, tm)),
    like("the masks are swapped: check which mask goes where, tgt_mask to the self-attention, "
         "src_mask to the cross-attention.",
         lambda L, x, mem, sm=None, tm=None: _dec(L, x, mem, tm, sm)),
    like("one LayerNorm (norm1) is used for all three sub-layers, a bug found in published study "
         "notes: each sub-layer has its own norm1, norm2, norm3.",
         lambda L, x, mem, sm=None, tm=None: _dec(L, x, mem, sm, tm, n2=L.norm1, n3=L.norm1)),
    like("the memory is normalised with norm2 inside the decoder layer: only the decoder's own "
         "stream is normalised (the encoder's final LayerNorm already normalised memory): "
         "cross_attn(norm2(x), memory, memory, src_mask).",
         lambda L, x, mem, sm=None, tm=None: None if not L.norm_first else _dec(
             L, x, mem, sm, tm, ca=lambda h: L.cross_attn(h, L.norm2(mem), L.norm2(mem), sm))),
    like("norm2 and norm3 are swapped: norm1 goes with self-attention, norm2 with "
         "cross-attention, norm3 with the feed-forward network.",
         lambda L, x, mem, sm=None, tm=None: _dec(L, x, mem, sm, tm, n2=L.norm3, n3=L.norm2)),
    when("the dropout argument is not used: in train mode nothing is dropped. Pass it to the "
         "attentions and the feed-forward network, and drop each sub-layer's output.",
         _dropout_off),
    when("dropout stays on in eval mode: two identical rows give different outputs after "
         "model.eval(). Use nn.Dropout modules.", _twins_differ),
    *CRASHES,
]


# Encoder and Decoder ------------------------------------------------------------------------

_REPEATED = ("{}.layers holds the same layer object several times: [Layer(...)] * n repeats ONE "
             "layer (one set of weights used n times). Create a new layer in every iteration: "
             "nn.ModuleList(Layer(...) for _ in range(n_layers)).")


def _layers_said(owner):
    """What `layers` is: a Python list, too few layers, or one layer object repeated."""
    def said(e):
        n = int(e.pd["make"]["args"][0])
        kind = e.meta("after.layers")
        if kind is None:
            return None
        if kind.startswith(("list", "tuple")):
            return (f"{owner}.layers is a plain Python {kind.split('[')[0]}: PyTorch does not "
                    "register the layers inside it, so model.parameters() misses them (the "
                    "optimizer never trains them), .to(device) does not move them and state_dict "
                    "does not save them. Use nn.ModuleList([...]).")
        have = sum(not str(e.meta(f"after.layers.{i}") or "missing").startswith("missing")
                   for i in range(n))
        if have != n:
            return (f"{owner}(n_layers={n}, ...) has {have} layers: build exactly n_layers, "
                    "for _ in range(n_layers), in an nn.ModuleList.")
        if _missing(e, r"^layers\.[1-9]") and not _unexpected(e):
            return _REPEATED.format(owner)
        return None
    return _said(said)


def _stack(S, x, *rest, final=True, each=False, nf=None, layer_args=None, repeat=False):
    """The stack's forward with the reference's layers (`layer_args(h, *rest)` gives each
    layer's other arguments), the final norm once, after every layer, or never."""
    layers = [S.layers[-1]] * len(S.layers) if repeat else list(S.layers)
    saved = [lay.norm_first for lay in layers]
    try:
        if nf is not None:
            for lay in layers:
                lay.norm_first = nf
        h = x
        for lay in layers:
            h = lay(h, *(layer_args(h, *rest) if layer_args else rest))
            h = S.norm(h) if each else h
        return S.norm(h) if final and not each else h
    finally:
        for lay, v in zip(layers, saved):
            lay.norm_first = v


def _stack_diagnoses(owner, extra):
    return [
        SHORTCUT, _layers_said(owner),
        like(_REPEATED.format(owner), lambda S, x, *r: _stack(S, x, *r, repeat=True)
             if len(S.layers) > 1 else None),
        like("the final LayerNorm is missing: after the last layer, return self.norm(x) (as "
             "nn.Transformer's encoder and decoder do; pre-norm stacks need it, since their "
             "residual stream is never normalised otherwise).",
             lambda S, x, *r: _stack(S, x, *r, final=False)),
        like("the final norm is applied after every layer: apply it once, after the loop.",
             lambda S, x, *r: _stack(S, x, *r, each=True)),
        like("the layers are built with the default norm_first although another was asked for: "
             "pass norm_first on to every layer.",
             lambda S, x, *r: _stack(S, x, *r, nf=not S.layers[0].norm_first)),
        *extra,
        when("dropout stays on in eval mode: two calls on identical rows differ after "
             "model.eval().", _twins_differ),
        when("the dropout argument is not passed on to the layers: in train mode nothing is "
             "dropped. Pass dropout on to every layer.", _dropout_off),
        *CRASHES,
    ]


ENC_DIAGNOSES = _stack_diagnoses("Encoder", [
    like("src_mask is not passed on to the layers: x = layer(x, src_mask).",
         lambda S, x, m=None: None if m is None else _stack(S, x, None)),
])

DEC_DIAGNOSES = _stack_diagnoses("Decoder", [
    when("A decoder layer was called without memory, the encoder output: call "
         "layer(x, memory, src_mask, tgt_mask) for every layer.",
         lambda e: "argument: 'memory'" in e.error),
    like("the decoder ignores the encoder output (it never reaches the layers): every layer must "
         "get memory, x = layer(x, memory, src_mask, tgt_mask), not layer(x, x, ...).",
         lambda S, x, mem, sm=None, tm=None: _stack(S, x, layer_args=lambda h: (h, None, tm))),
    like("tgt_mask is not passed on to the layers, so the decoder looks ahead.",
         lambda S, x, mem, sm=None, tm=None: None if tm is None else _stack(S, x, mem, sm, None)),
    like("src_mask is not passed on to the layers.",
         lambda S, x, mem, sm=None, tm=None: None if sm is None else _stack(S, x, mem, None, tm)),
    when("the masks reach the layers in the wrong order: x = layer(x, memory, src_mask, "
         "tgt_mask) (that order, or by name).", _size_error(3)),
    like("the masks reach the layers in the wrong order: x = layer(x, memory, src_mask, "
         "tgt_mask) (that order, or by name).",
         lambda S, x, mem, sm=None, tm=None: _stack(S, x, mem, tm, sm)),
])


# -- the table ------------------------------------------------------------------------------

_REF = "reference"
_SC = ("transformer",)   # PyTorch's nn.Transformer* classes are the shortcut here


def _params(make, cell, what, n_layers=None):
    """The module as constructed (no parameters loaded, no call): its parameter names and
    shapes, and for a stack what `layers` holds, for the structural diagnoses."""
    after = () if n_layers is None else ("layers", *(f"layers.{i}" for i in range(n_layers)))
    return Probe(f"parameters{'' if n_layers is None else f' {n_layers}'}", (shapes(cell),), [],
                 make=make, params=True, after=after,
                 what=f"{what}: its parameters' names and shapes")
_STACK_ATOL = 2e-5   # several layers deep (the checks' tolerance too)


def _pm(nf):
    return "pre-norm" if nf else "post-norm"


def _enc_matches(nf, B, L, d, H, d_ff, name):
    x, m = _pad_pair(B, L, d)
    return Probe(f"{name} {_pm(nf)}", ("matches_torch",),
                 [call(x, m)], make=ctor(d, H, d_ff, norm_first=nf), load=_REF, mode="eval",
                 what=f"{_pm(nf)} (norm_first={nf}), d_model={d}, n_heads={H}, d_ff={d_ff}, "
                      f"with a padding mask")


def _enc_padding(nf):
    B, L, d, H, d_ff = 2, 7, 16, 4, 32
    x, m = _pad_pair(B, L, d)
    return Probe(f"padding {_pm(nf)}", ("padding",),
                 [call(x, m), call(_x(B, L, d), _decoder_mask(B, L)), call(_x(B, L, d), _causal(L)),
                  call(_x(1, 4, d), None)],
                 make=ctor(d, H, d_ff, norm_first=nf), load=_REF, mode="eval",
                 what=f"{_pm(nf)}: src_mask of shapes (B, 1, L) with large padded values, "
                      "(B, L, L) and (L, L), and no mask")


def _dec_matches(nf, B, Lt, Ls, d, H, d_ff, batch_tgt, name):
    mem, sm = _pad_pair(B, Ls, d)
    tm = _causal_b(B, Lt) if batch_tgt else _causal(Lt)
    return Probe(f"{name} {_pm(nf)}", ("matches_torch",),
                 [call(_x(B, Lt, d), mem, sm, tm)], make=ctor(d, H, d_ff, norm_first=nf),
                 load=_REF, mode="eval",
                 what=f"{_pm(nf)} (norm_first={nf}), Lt={Lt}, Ls={Ls}, d_model={d}, n_heads={H}, "
                      f"with a causal tgt_mask{' (B, Lt, Lt)' if batch_tgt else ''} and a padded "
                      "src_mask")


def _enc_stack(nf, n, B, L, d, H, d_ff, name):
    x, m = _pad_pair(B, L, d)
    return Probe(f"{name} {_pm(nf)}", ("matches_torch",), [call(x, m)],
                 make=ctor(n, d, H, d_ff, norm_first=nf), load=_REF, mode="eval",
                 atol=_STACK_ATOL,
                 what=f"{n} layers, {_pm(nf)} (norm_first={nf}), d_model={d}, n_heads={H}, "
                      "with a padding mask")


def _dec_stack(nf, n, B, Lt, Ls, d, H, d_ff, batch_tgt, name):
    mem, sm = _pad_pair(B, Ls, d)
    tm = _causal_b(B, Lt) if batch_tgt else _causal(Lt)
    return Probe(f"{name} {_pm(nf)}", ("matches_torch",),
                 [call(_x(B, Lt, d), mem, sm, tm)], make=ctor(n, d, H, d_ff, norm_first=nf),
                 load=_REF, mode="eval", atol=_STACK_ATOL,
                 what=f"{n} layers, {_pm(nf)} (norm_first={nf}), Lt={Lt}, Ls={Ls}, d_model={d}, "
                      "with a causal tgt_mask and a padded src_mask")


def _dec_same_lengths(nf, name, cells, n=None):
    """Lt == Ls, so masks passed in the wrong order do not crash; a causal (Lt, Lt) tgt_mask
    and a padded src_mask, memory with large values at padded positions."""
    B, L, d, H, d_ff = 2, 6, 16, 4, 32
    mem, sm = _pad_pair(B, L, d)
    args = (d, H, d_ff) if n is None else (n, d, H, d_ff)
    return Probe(f"{name} {_pm(nf)}", cells, [call(_x(B, L, d), mem, sm, _causal(L))],
                 make=ctor(*args, norm_first=nf), load=_REF, mode="eval",
                 atol=ATOL if n is None else _STACK_ATOL,
                 what=f"{_pm(nf)}, Lt = Ls = {L}: a causal tgt_mask, a padded src_mask and large "
                      "values at padded memory positions")


def _structure(name: str, *inputs) -> list:
    """The stack's structure with 3 and 1 layers: its parameters, and n_layers distinct layers
    in an nn.ModuleList with a final norm (Encoder and Decoder alike)."""
    cell = "structure"
    return [*[_params(ctor(n, 16, 4, 32), cell, f"{name}({n}, 16, 4, 32)", n) for n in (3, 1)],
            *[Probe(f"structure {n}", (shapes(cell),), [call(*inputs)],
                    make=ctor(n, 16, 4, 32), load=_REF, params=True, mode="eval", atol=_STACK_ATOL,
                    what=f"{name}({n}, 16, 4, 32): n_layers distinct layers in an nn.ModuleList "
                         "and a final norm")
              for n in (3, 1)]]


EXERCISES = [
    Exercise("FeedForward", ref="blocks.FeedForward", shortcuts=_SC, diagnose=FF_DIAGNOSES,
             graded=grades(structure=1, values=(2, 3131), dropout=1),
             probes=[
        _params(ctor(8, 20), "structure", "FeedForward(8, 20)"),
        Probe("structure", (shapes("structure"),), [call(_x(2, 5, 8))],
              make=ctor(8, 20), load=_REF, params=True,
              what="FeedForward(8, 20): linear1, linear2 with biases, on x (2, 5, 8)"),
        Probe("values", ("values",),
              [call(_x(3, 7, 12, scale=2.0)), call(randn(9, 12)), call(_x(1, 1, 12))],
              make=ctor(12, 50), load=_REF, mode="eval",
              what="FeedForward(12, 50) on (3, 7, 12), (9, 12) and (1, 1, 12) inputs"),
        Probe("narrow", ("values",), [call(randn(2, 3, 4, 20, scale=2.0))],
              make=ctor(20, 8), load=_REF, mode="eval",
              what="FeedForward(20, 8) (d_ff < d_model) on a 4-D input"),
        Probe("dropout eval", ("dropout",),
              [call(_twins(6, 8)), call(_x(3, 6, 8)), call(_x(2, 4, 8))],
              make=ctor(8, 32, dropout=0.5), load=_REF, mode="eval",
              what="eval mode with dropout=0.5 (dropout must be off): two identical rows, "
                   "and random inputs"),
        Probe("dropout train", ("dropout",), [call(_twins(6, 8))],
              make=ctor(8, 32, dropout=0.5), load=_REF, mode="train",
              compare=_dropout_active(0.5, "apply nn.Dropout(dropout) to the hidden activations"),
              what="train mode with dropout=0.5"),
        Probe("no dropout train", ("dropout",), [call(_x(3, 6, 8))],
              make=ctor(8, 24), load=_REF, mode="train",
              what="train mode with the default dropout=0.0"),
    ]),
    Exercise("EncoderLayer", ref="blocks.EncoderLayer", shortcuts=_SC,
             graded=grades(structure=1, matches_torch=(3, 4711), padding=1, dropout=1),
             diagnose=ENC_LAYER_DIAGNOSES, probes=[
        _params(ctor(16, 4, 40), "structure", "EncoderLayer(16, 4, 40)"),
        Probe("structure", (shapes("structure"),), [call(_x(2, 5, 16))],
              make=ctor(16, 4, 40), load=_REF, params=True, mode="eval",
              what="EncoderLayer(16, 4, 40): self_attn, ff, norm1, norm2, on x (2, 5, 16)"),
        _enc_matches(False, 3, 9, 24, 6, 40, "large"),
        _enc_matches(True, 3, 9, 24, 6, 40, "large"),
        _enc_matches(False, 1, 4, 12, 3, 20, "small"),
        _enc_matches(True, 2, 6, 12, 3, 20, "small"),
        _enc_padding(False),
        _enc_padding(True),
        Probe("fully masked row", ("padding",),
              [call(_x(2, 5, 16), _with_dead_row(2, 5, 1, 2))],
              make=ctor(16, 4, 32, norm_first=True), load=_REF, mode="eval",
              compare=_skip_rows([(1, 2)]),
              what="a (B, L, L) src_mask with a fully masked query row"),
        *[Probe(f"dropout eval {_pm(nf)}", ("dropout",),
                [call(*_pad_pair(2, 5, 16)), call(_x(2, 5, 16)), call(_twins(5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)} in eval mode with dropout=0.3") for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("dropout",),
                [call(_twins(5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass it to the attention and the feed-forward "
                                             "network, and drop each sub-layer's output"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
    Exercise("DecoderLayer", ref="blocks.DecoderLayer", shortcuts=_SC,
             graded=grades(structure=1, matches_torch=(3, 8128), causal=1, memory=1, dropout=1),
             diagnose=DEC_LAYER_DIAGNOSES, probes=[
        _params(ctor(16, 4, 40), "structure", "DecoderLayer(16, 4, 40)"),
        Probe("structure", (shapes("structure"),), [call(_x(2, 5, 16), _x(2, 7, 16))],
              make=ctor(16, 4, 40), load=_REF, params=True, mode="eval",
              what="DecoderLayer(16, 4, 40): self_attn, cross_attn, ff, norm1..3, on x (2, 5, 16) "
                   "and memory (2, 7, 16)"),
        _dec_matches(False, 3, 6, 4, 24, 6, 40, False, "large"),
        _dec_matches(True, 3, 6, 4, 24, 6, 40, False, "large"),
        _dec_matches(False, 2, 5, 8, 12, 2, 20, True, "small"),
        _dec_matches(True, 2, 5, 8, 12, 2, 20, True, "small"),
        *[Probe(f"causal {_pm(nf)}", ("causal",),
                [call(_x(2, 6, 16), _x(2, 4, 16), None, _causal(6)),
                 call(_x(2, 6, 16), _x(2, 4, 16), None, _causal_b(2, 6))],
                make=ctor(16, 4, 32, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)} with a causal tgt_mask (Lt, Lt) and (B, Lt, Lt), no src_mask")
          for nf in (False, True)],
        *[_dec_same_lengths(nf, "same lengths", ("causal",
                                                 "memory"))
          for nf in (False, True)],
        *[Probe(f"memory {_pm(nf)}", ("memory",),
                [call(_x(2, 5, 16), *_pad_pair(2, 6, 16)), call(_x(1, 3, 16), _x(1, 5, 16))],
                make=ctor(16, 4, 32, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)}: memory with large values at padded positions and a padded "
                     "src_mask, no tgt_mask; and no masks at all")
          for nf in (False, True)],
        *[Probe(f"dropout eval {_pm(nf)}", ("dropout",),
                [call(_x(2, 4, 16), *_pad_pair(2, 5, 16), _causal(4)),
                 call(_x(2, 4, 16), _x(2, 5, 16)), call(_twins(4, 16), _twins(5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)} in eval mode with dropout=0.3") for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("dropout",),
                [call(_twins(4, 16), _twins(5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass it to the attentions and the feed-forward "
                                             "network, and drop each sub-layer's output"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
    Exercise("Encoder", ref="blocks.Encoder", shortcuts=_SC, diagnose=ENC_DIAGNOSES,
             graded=grades(structure=1, matches_torch=(3, 2024), padding_dropout=1),
             probes=[
        *_structure("Encoder", _x(2, 5, 16)),
        _enc_stack(False, 3, 3, 7, 24, 6, 40, "deep"),
        _enc_stack(True, 3, 3, 7, 24, 6, 40, "deep"),
        _enc_stack(False, 1, 1, 5, 12, 2, 20, "one layer"),
        _enc_stack(True, 2, 2, 6, 12, 2, 20, "two layers"),
        *[Probe(f"padding eval {_pm(nf)}", ("padding_dropout",),
                [call(*_pad_pair(2, 6, 16)), call(_x(2, 6, 16), _causal(6))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                atol=_STACK_ATOL,
                what=f"{_pm(nf)} in eval mode with dropout=0.3: a padding mask with large padded "
                     "values, and an (L, L) mask")
          for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("padding_dropout",),
                [call(_twins(6, 16))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass dropout on to every layer"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
    Exercise("Decoder", ref="blocks.Decoder", shortcuts=_SC, diagnose=DEC_DIAGNOSES,
             graded=grades(structure=1, matches_torch=(3, 9901), causal_memory=1),
             probes=[
        *_structure("Decoder", _x(2, 5, 16), _x(2, 7, 16)),
        _dec_stack(False, 3, 3, 6, 4, 24, 6, 40, False, "deep"),
        _dec_stack(True, 3, 3, 6, 4, 24, 6, 40, True, "deep"),
        _dec_stack(False, 2, 2, 5, 7, 16, 4, 32, True, "two layers"),
        _dec_stack(True, 1, 1, 7, 3, 12, 2, 20, False, "one layer"),
        *[_dec_same_lengths(nf, "same lengths", ("causal_memory",), n=2)
          for nf in (False, True)],
        *[Probe(f"eval dropout {_pm(nf)}", ("causal_memory",),
                [call(_x(2, 5, 16), *_pad_pair(2, 6, 16), _causal_b(2, 5)),
                 call(_x(2, 5, 16), _x(2, 6, 16), None, _causal(5))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                atol=_STACK_ATOL,
                what=f"{_pm(nf)} in eval mode with dropout=0.3: causal tgt_mask, padded memory")
          for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("causal_memory",),
                [call(_twins(5, 16), _twins(6, 16), None, _causal(5))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass dropout on to every layer"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
]
