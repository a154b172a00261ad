"""07_transformer: what the grader runs on the student's `Transformer`, `teacher_forcing_loss`,
`label_smoothing_cross_entropy` and `greedy_decode`, on inputs drawn for each grading run.

`Transformer` probes get the reference's (perturbed) weights by name, so they compare the whole
wiring (embeddings times sqrt(d_model) before the positions, one table per side, the masks built
from `pad_id`, raw logits) with the reference on padded batches, both norm placements and eval
mode with dropout; the parameter list (names, shapes, distinct tensors) shows a shared table.
The initialisation probe builds the model without loading anything and measures the spread of
its weight matrices against the Xavier scale sqrt(2 / (fan_in + fan_out)): only what
`__init__` does counts. The loss and decoding exercises run on the probe machine's stand-in
encoder-decoder (`toy_seq2seq`), so they are graded alone."""
import math

import numpy as np
import torch

from . import vm
from .engine import Exercise, Probe, call, ctor, fixture, given, randn

ASSIGNMENT = "07_transformer"


# -- inputs -----------------------------------------------------------------------------------

def _ids(B, L, V, pad=None, lengths=None, low=0, zero_at=None):
    """(B, L) random ids in [low, V), never `pad` except in each row's padded tail
    (`lengths`: real tokens per row). `zero_at=(b, t)` puts an ordinary 0 there (so that code
    which takes 0 for padding shows)."""
    def build(g):
        skip = pad is not None and low <= pad < V
        t = torch.randint(low, V - int(skip), (B, L), generator=g)
        if skip:
            t = t + (t >= pad).long()
        if zero_at is not None:
            t[zero_at] = 0
        if lengths is not None:
            for b, n in enumerate(lengths):
                t[b, n:] = pad
        return t
    tail = f", padded with {pad} to lengths {list(lengths)}" if lengths is not None else ""
    return given(build, f"ids{(B, L)} < {V}{tail}")


def _pad_mask(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    return (tokens != pad).unsqueeze(1)


def _src_and_mask(B, L, V, pad, lengths):
    """Token ids and the matching (B, 1, L) padding mask, drawn once (two Inputs that agree)."""
    cache = {}

    def ids(g):
        cache["t"] = _ids(B, L, V, pad, lengths).build(g)
        return cache["t"]

    def mask(g):
        return _pad_mask(cache["t"], pad)
    return given(ids, f"ids{(B, L)} padded with {pad}"), given(mask, "its padding mask (B, 1, L)")


def _causal(L):
    return given(lambda g: torch.ones(L, L, dtype=torch.bool).tril(), f"causal mask ({L}, {L})")


def _scalar(value=1.0):
    return given(lambda g: torch.tensor(value), f"upstream gradient {value:g}")


# -- comparisons ------------------------------------------------------------------------------

def _xavier(key, got, want):
    """An `after` capture of a weight matrix: its spread must be the Xavier scale (the values
    themselves are random on both sides)."""
    if ".after." not in key:
        return "default"
    name = key.split(".after.", 1)[1]
    if got.shape != want.shape:
        return f"`{name}` has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    fan_out, fan_in = want.shape[0], int(np.prod(want.shape[1:]))
    scale = math.sqrt(2.0 / (fan_in + fan_out))
    std = float(np.asarray(got, dtype=np.float64).std())
    if not 0.75 * scale <= std <= 1.33 * scale:
        why = (" (nn.Embedding's default N(0, 1): times sqrt(d_model) the token signal drowns "
               "the positions)" if "embed" in name and abs(std - 1.0) < 0.15 else "")
        return (f"a freshly built model's `{name}` {tuple(want.shape)} has std {std:.3f}{why}; "
                f"Xavier (Glorot) gives {scale:.3f}. Transformer.__init__ itself must apply "
                "nn.init.xavier_uniform_ to every parameter with more than one dimension, after "
                "building all parts (an initialisation done outside the class is not part of "
                "the model)")
    return None


# -- stand-in models --------------------------------------------------------------------------

class _Seeded(dict):
    """`fixture(...)` whose base weights are drawn under a fixed torch seed.

    The engine draws a fixture's base weights from the global RNG before perturbing them with
    the run's generator; unseeded, the student's plan and the reference's plan (built
    separately) would carry different models. The engine reads `v["args"]` right before it
    builds the fixture, so the seed is set there. The base is the same in every run; the
    perturbation (20% of each tensor's spread) comes from the run's seed. Harmless once the
    engine seeds fixtures itself."""

    def __init__(self, base_seed: int, name: str, *args):
        super().__init__(fixture(name, *args))
        self.base_seed = base_seed

    def __getitem__(self, key):
        if key == "args":
            torch.manual_seed(self.base_seed)
        return super().__getitem__(key)


def _toy(vocab, d, pad_id, base_seed):
    return _Seeded(base_seed, "toy_seq2seq", vocab, d, pad_id)


# -- the table --------------------------------------------------------------------------------

T_SHAPES, T_INIT, T_EMB = "test_Transformer_shapes", "test_Transformer_init", "test_Transformer_embeddings"
T_CAUSAL, T_PAD = "test_Transformer_causal", "test_Transformer_padding"
T_TORCH, T_FIT = "test_Transformer_matches_torch", "test_Transformer_overfit"

_INIT_WEIGHTS = ("src_embed.weight", "tgt_embed.weight", "generator.weight",
                 "encoder.layers.0.self_attn.w_q.weight", "encoder.layers.1.ff.linear1.weight",
                 "encoder.layers.1.ff.linear2.weight", "decoder.layers.0.cross_attn.w_k.weight",
                 "decoder.layers.1.self_attn.w_o.weight", "decoder.layers.1.ff.linear1.weight")


def _forward_case(name, cells, V_s, V_t, d, H, n, d_ff, pad, norm_first=False, dropout=0.0,
                  B=3, Ls=7, Lt=5, what=""):
    """forward(src, tgt) with padded rows and the masks left to the model."""
    ls = [Ls, max(1, Ls - 2), max(1, Ls - 4)][:B] + [Ls] * max(0, B - 3)
    lt = [Lt, Lt, max(1, Lt - 3)][:B] + [Lt] * max(0, B - 3)
    return Probe(name, cells, [call(_ids(B, Ls, V_s, pad, ls), _ids(B, Lt, min(V_s, V_t), pad, lt))],
                 make=ctor(V_s, V_t, d, H, n, d_ff, dropout=dropout, max_len=64,
                           norm_first=norm_first, pad_id=pad),
                 load="reference", mode="eval", atol=1e-4, rtol=1e-4, what=what)


_SRC, _SRC_MASK = _src_and_mask(3, 7, 11, 0, [7, 5, 3])

TRANSFORMER = Exercise("Transformer", ref="transformer.Transformer", probes=[
    Probe("parts", (T_SHAPES,),
          [call(_SRC, _SRC_MASK, method="encode"),
           call(_ids(3, 5, 13, 0, [5, 4, 2]), randn(3, 7, 32), _SRC_MASK, _causal(5),
                method="decode"),
           call(_SRC, _ids(3, 5, 11, 0, [5, 4, 2]))],
          make=ctor(11, 13, 32, 4, 2, 64), load="reference", mode="eval", params=True,
          after=("pad_id",), atol=1e-4,
          what="src_vocab=11, tgt_vocab=13: encode, decode and forward of padded rows, and the "
               "parameters (one table per side, an untied generator)"),
    Probe("pad id kept", (T_SHAPES,), [call(_ids(2, 4, 9, 7, [4, 2]), _ids(2, 3, 9, 7, [3, 2]))],
          make=ctor(9, 9, 16, 2, 1, 32, pad_id=7), load="reference", mode="eval",
          after=("pad_id",), atol=1e-4, what="Transformer(..., pad_id=7): self.pad_id and forward"),
    Probe("xavier", (T_INIT,), [], make=ctor(40, 24, 64, 4, 2, 96, max_len=64),
          after=_INIT_WEIGHTS, compare=_xavier,
          what="a freshly built Transformer(40, 24, 64, 4, 2, 96): the spread of its weight matrices"),
    Probe("embed", (T_EMB,),
          [call(_ids(2, 6, 16, low=1), method="encode"),
           call(_ids(2, 4, 16, low=1), randn(2, 6, 32), None, _causal(4), method="decode")],
          make=ctor(20, 16, 32, 4, 1, 64), load="reference", mode="eval", atol=1e-4,
          what="encode(src) and decode(tgt, memory, None, causal) without padding: "
               "src_embed / tgt_embed times sqrt(d_model), then the positional encoding"),
    Probe("embed pre-norm", (T_EMB,),
          [call(_ids(3, 5, 12, low=0), method="encode"),
           call(_ids(3, 6, 12, low=0), randn(3, 5, 24), None, _causal(6), method="decode")],
          make=ctor(12, 15, 24, 3, 2, 40, norm_first=True), load="reference", mode="eval",
          atol=1e-4, what="encode and decode with norm_first=True, d_model=24"),
    Probe("causal", (T_CAUSAL,),
          [call(_ids(2, 6, 15, low=1), _ids(2, 6, 15, low=1)),
           call(_ids(2, 6, 15, low=1), _ids(2, 6, 15, low=1), tgt_mask=_causal(6))],
          make=ctor(15, 15, 32, 4, 2, 64), load="reference", mode="eval", atol=1e-4,
          what="forward without padding, the causal mask built by forward, then an explicit "
               "tgt_mask"),
    Probe("causal pre-norm", (T_CAUSAL,), [call(_ids(2, 7, 15, low=1), _ids(2, 6, 15, low=1))],
          make=ctor(15, 15, 32, 4, 2, 64, norm_first=True), load="reference", mode="eval",
          atol=1e-4, what="forward with norm_first=True"),
    _forward_case("padding", (T_PAD,), 14, 14, 32, 4, 2, 48, pad=0, B=3, Ls=6, Lt=5,
                  what="padded source and target rows, pad_id=0"),
    Probe("padding id 3", (T_PAD,),
          [call(_ids(3, 6, 14, 3, [6, 4, 2], zero_at=(1, 1)), _ids(3, 5, 14, 3, [5, 3, 4], zero_at=(0, 1))),
           call(_ids(2, 9, 14, 3, [5, 2]), _ids(2, 7, 14, 3, [7, 3]))],
          make=ctor(14, 14, 32, 4, 2, 48, pad_id=3), load="reference", mode="eval", atol=1e-4,
          what="pad_id=3 (token 0 is an ordinary token), padding in source and target"),
    _forward_case("padding id 2", (T_PAD,), 19, 19, 24, 3, 3, 40, pad=2, B=3, Ls=8, Lt=6,
                  what="pad_id=2, three layers, d_model=24 with 3 heads"),
    _forward_case("torch 1", (T_TORCH,), 17, 13, 32, 4, 2, 64, pad=0,
                  what="17 -> 13 tokens, 2 layers, post-norm, padded"),
    _forward_case("torch 2", (T_TORCH,), 23, 19, 48, 6, 3, 80, pad=0, norm_first=True,
                  what="23 -> 19 tokens, 3 layers of d_model=48, pre-norm"),
    _forward_case("torch 3", (T_TORCH,), 11, 29, 24, 3, 1, 24, pad=5,
                  what="11 -> 29 tokens, 1 layer, pad_id=5"),
    _forward_case("torch 4", (T_TORCH,), 31, 17, 40, 8, 2, 56, pad=2, norm_first=True, dropout=0.3,
                  what="eval mode with dropout=0.3, pre-norm, pad_id=2"),
    Probe("gradients", (T_FIT,),
          [call(_ids(3, 6, 12, low=1), _ids(3, 5, 12, low=1), backward=randn(3, 5, 12))],
          make=ctor(12, 12, 32, 4, 1, 64), load="reference", mode="train", param_grads=True,
          atol=1e-4, rtol=1e-3,
          what="training mode: the gradient of every parameter for a random upstream gradient "
               "(raw logits, every part registered and trained, nothing detached)"),
])


# -- teacher_forcing_loss ---------------------------------------------------------------------

L_VALUE, L_PAD, L_GRAD = ("test_teacher_forcing_loss_value", "test_teacher_forcing_loss_padding",
                          "test_teacher_forcing_loss_gradient")


def _pair(V, pad, src_lengths, tgt_lengths, Ls, Lt, zero_at=None):
    return (_ids(len(src_lengths), Ls, V, pad, src_lengths),
            _ids(len(tgt_lengths), Lt, V, pad, tgt_lengths, zero_at=zero_at))


def _widened(V, pad, lengths, Lt, extra):
    """A target batch and the same batch with `extra` more pad columns (two Inputs that agree)."""
    cache = {}

    def base(g):
        cache["t"] = _ids(len(lengths), Lt, V, pad, lengths, zero_at=(0, 2)).build(g)
        return cache["t"]

    def wide(g):
        t = cache["t"]
        return torch.cat([t, torch.full((t.size(0), extra), pad)], 1)
    return given(base, f"targets padded with {pad}"), given(wide, f"the same with {extra} more pad columns")


_TGT, _TGT_WIDE = _widened(11, 3, [7, 5, 3], 7, 3)

TEACHER_FORCING = Exercise("teacher_forcing_loss", ref="transformer.teacher_forcing_loss", probes=[
    Probe("value", (L_VALUE,),
          [call(_toy(11, 16, 0, 701), *_pair(11, 0, [6, 4, 3], [7, 5, 3], 6, 7))],
          atol=1e-5, rtol=1e-4, what="a stand-in model, padded targets (pad_id=0)"),
    Probe("value pad 4", (L_VALUE,),
          [call(_toy(11, 16, 4, 702), *_pair(11, 4, [6, 6, 2, 5], [8, 4, 6, 2], 6, 8, zero_at=(1, 2)))],
          atol=1e-5, rtol=1e-4, what="pad_id=4: padding ignored by the model's own pad id"),
    Probe("padding", (L_PAD,),
          [call(_toy(11, 16, 3, 703), _ids(3, 6, 11, 3, [6, 4, 3]), _TGT),
           call(_toy(11, 16, 3, 703), _ids(3, 6, 11, 3, [6, 4, 3]), _TGT_WIDE)],
          atol=1e-5, rtol=1e-4,
          what="pad_id=3 with an ordinary token 0 among the labels, then 3 more pad columns"),
    Probe("gradient", (L_GRAD,),
          [call(_toy(9, 12, 0, 704), *_pair(9, 0, [5, 5], [6, 4], 5, 6), backward=_scalar())],
          atol=1e-5, rtol=1e-4,
          what="the loss is a 0-D tensor that backpropagates (loss.backward())"),
])


# -- label_smoothing_cross_entropy ------------------------------------------------------------

S = "test_label_smoothing_cross_entropy"


def _targets(shape, V, ignore_index, n_ignored):
    """Class ids with `n_ignored` positions set to ignore_index (a class id or not)."""
    def build(g):
        t = torch.randint(0, V, shape, generator=g)
        flat = t.view(-1)
        flat[torch.randperm(flat.numel(), generator=g)[:n_ignored]] = ignore_index
        return t
    return given(build, f"targets{tuple(shape)} < {V}, {n_ignored} equal to {ignore_index}")


def _ls(shape, V, eps, ign, n_ign, scale=3.0, dtype="float32", default_ignore=False, **kw):
    args = (randn(*shape, V, scale=scale, dtype=dtype), _targets(shape, V, ign, n_ign), eps)
    return call(*args, **kw) if default_ignore else call(*args, ignore_index=ign, **kw)


_LS_BASE = {}


def _ls_logits(wide):
    def build(g):
        if not wide:
            _LS_BASE["x"] = torch.randn(3, 6, 8, generator=g) * 3
            return _LS_BASE["x"]
        return torch.cat([_LS_BASE["x"], torch.randn(3, 4, 8, generator=g) * 3], 1)
    return given(build, "logits (3, 6, 8)" + (" with 4 more positions per row" if wide else ""))


def _ls_target(wide):
    def build(g):
        if not wide:
            t = torch.randint(0, 8, (3, 6), generator=g)
            t.view(-1)[torch.randperm(18, generator=g)[:5]] = -100
            _LS_BASE["t"] = t
            return t
        return torch.cat([_LS_BASE["t"], torch.full((3, 4), -100)], 1)
    return given(build, "targets with 5 positions equal to -100" + (", 12 more" if wide else ""))


LABEL_SMOOTHING = Exercise("label_smoothing_cross_entropy",
                           ref="transformer.label_smoothing_cross_entropy", probes=[
    Probe("value", (f"{S}_value",),
          [_ls((12,), 7, 0.1, 3, 2), _ls((2, 5), 9, 0.25, 0, 2), _ls((20,), 13, 0.1, 5, 3),
           _ls((3, 7), 4, 0.5, 1, 4), _ls((2, 2), 30, 0.05, 29, 1)],
          what="(N, V) and (B, L, V) logits, smoothing 0.05 to 0.5, ignore_index a real class id"),
    Probe("ignore", (f"{S}_ignore",),
          [call(_ls_logits(False), _ls_target(False), 0.0),
           call(_ls_logits(False), _ls_target(False), 0.2),
           call(_ls_logits(True), _ls_target(True), 0.2),
           _ls((7,), 5, 0.3, -100, 6, default_ignore=True)],
          what="the default ignore_index=-100 (not a class id), smoothing 0 and 0.2, and 12 more "
               "ignored positions"),
    Probe("shapes", (f"{S}_shapes",),
          [_ls((4, 3), 6, 0.1, -100, 2), _ls((2, 5, 3), 7, 0.2, -100, 3), _ls((1, 1), 4, 0.1, -100, 0)],
          what="(B, L, V) logits (classes on the last axis), (B1, B2, L, V) and (1, 1, V)"),
    Probe("stable", (f"{S}_stable",),
          [_ls((10,), 5, 0.1, -100, 1, scale=150.0), _ls((2, 4), 6, 0.3, 0, 1, scale=400.0)],
          what="logits of size 150 to 1000 (log_softmax, not log(softmax))"),
    Probe("gradient", (f"{S}_gradient",),
          [_ls((2, 4), 6, 0.15, -100, 2, grad=(0,), backward=_scalar()),
           _ls((9,), 5, 0.4, 2, 2, grad=(0,), backward=_scalar(2.5))],
          atol=1e-5, rtol=1e-3, what="the gradient with respect to the logits"),
    Probe("random", (f"{S}_random",),
          [_ls((6,), 5, 0.3, -100, 1), _ls((4, 9), 17, 0.2, -100, 6), _ls((33,), 3, 0.9, 2, 4),
           _ls((1, 5), 28, 0.0, 0, 2), _ls((2, 3), 6, 1.0, -1, 1),
           _ls((5, 4), 11, 0.15, 0, 3, dtype="float64")],
          what="random cases: smoothing 0 to 1, ignore_index -100, -1 or a class id, float64"),
])


# -- greedy_decode ----------------------------------------------------------------------------

G_SCRIPT, G_MAX, G_REF = ("test_greedy_decode_scripted", "test_greedy_decode_max_len",
                          "test_greedy_decode_matches_reference")

# The stand-in models: vocabulary 6, d=8, BOS 1. Their base weights (seeds 26 and 39) were
# chosen so that, whatever the run's perturbation and sources, rows tend to end with the EOS
# id at different steps (or not at all): EOS 3 for model 26, EOS 0 for model 39.
_V, _D, _BOS = 6, 8, 1
_MODELS = ((26, 3, 4), (39, 0, 3))     # (base seed, eos_id, pad_id)


def _sources(B, L, pad, V=_V):
    """(B, L) source ids (no pad inside), each row padded to a random length in 1..L."""
    def build(g):
        t = torch.randint(0, V - 1, (B, L), generator=g)
        t = t + (t >= pad).long()
        for b in range(B):
            t[b, int(torch.randint(1, L + 1, (1,), generator=g)):] = pad
        return t
    return given(build, f"sources{(B, L)} padded with {pad}")


def _greedy(base, eos, pad, B, max_len, L=5, bos=_BOS):
    return call(_toy(_V, _D, pad, base), _sources(B, L, pad), max_len, bos, eos)


GREEDY = Exercise("greedy_decode", ref="transformer.greedy_decode", probes=[
    Probe("batch", (G_SCRIPT, G_REF),
          [_greedy(base, eos, pad, 10, 9) for base, eos, pad in _MODELS],
          what="a stand-in model, 10 source rows that end at different steps (EOS 3, and EOS 0 "
               "with pad_id 3)"),
    Probe("few rows", (G_SCRIPT,),
          [_greedy(base, eos, pad, B, 16) for base, eos, pad in _MODELS for B in (3, 2, 1, 1)],
          what="3, 2 and 1 rows with max_len=16: stop as soon as every row has produced EOS"),
    Probe("max_len", (G_MAX,),
          [_greedy(base, eos, pad, 4, ml) for base, eos, pad in _MODELS for ml in (1, 2, 4)],
          what="max_len 1, 2 and 4 (the BOS column counts)"),
    Probe("max_len none ends", (G_MAX,),
          [_greedy(26, 5, 4, 3, 7, bos=0), _greedy(39, 2, 3, 3, 6, bos=5)],
          what="EOS ids the model rarely produces: rows run to max_len"),
])

# A stand-in that honours its masks like a two-layer Transformer (`toy_seq2seq_masked`, when
# the probe machine has it): decoding without the source padding mask, or without the causal
# mask, then gives other tokens. `toy_seq2seq` ignores masks, so only this one sees them.
if "toy_seq2seq_masked" in vm.FIXTURES:
    GREEDY.probes.append(Probe(
        "masks", (G_REF,),
        [call(_Seeded(base, "toy_seq2seq_masked", 7, 8, pad), _sources(10, 6, pad, V=7), 8, 1, 2)
         for base, pad in ((51, 0), (52, 3), (53, 0), (54, 5))],
        what="a stand-in model that honours src_mask and tgt_mask like a two-layer "
             "Transformer, padded sources"))

EXERCISES = [TRANSFORMER, TEACHER_FORCING, LABEL_SMOOTHING, GREEDY]
