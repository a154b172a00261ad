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
from .engine import Exercise, Probe, call, ctor, fixture, given, grades, like, randn, shapes, when

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
            vm.seed(self.base_seed)
        return super().__getitem__(key)


def _toy(vocab, d, pad_id, base_seed):
    return _Seeded(base_seed, "toy_seq2seq", vocab, d, pad_id)


# -- Transformer mistakes: the reference module wired wrongly --------------------------------

def _wired(ref, method, args, kwargs, scale="mul", pe=1, tgt_table="tgt", enc_mask=True,
           cross_mask=True, causal="tril", mask_pad=None, post=None, own_masks=False):
    """What `ref` (the reference module, the probe's weights) returns for one call when it is
    wired with one mistake: the embedding scale ("none", "div", "after": times sqrt(d) after
    the positions), the positions added `pe` times, the target table, encode dropping its
    mask, forward not passing src_mask to decode, forward's own tgt_mask ("pad": padding
    only, "triu": inverted), forward's masks built from `mask_pad`, a (log-)softmax after
    the generator, encode and decode building padding masks from pad_id when none is given
    (`own_masks`: "encode" or "decode")."""
    from tfscratch.reference import make_decoder_mask, make_padding_mask
    k = math.sqrt(ref.d_model)

    def embed(table, ids):
        x = table(ids)
        x = {"mul": x * k, "none": x, "div": x / k, "after": x}[scale]
        for _ in range(pe):
            x = ref.pos_encoding(x)
        return x * k if scale == "after" else x

    def encode(src, src_mask=None):
        if own_masks == "encode" and src_mask is None:
            src_mask = make_padding_mask(src, ref.pad_id)
        return ref.encoder(embed(ref.src_embed, src), src_mask if enc_mask else None)

    def decode(tgt, memory, src_mask=None, tgt_mask=None):
        table = ref.src_embed if tgt_table == "src" else ref.tgt_embed
        if own_masks == "decode":
            pad = make_padding_mask(tgt, ref.pad_id)
            tgt_mask = pad if tgt_mask is None else tgt_mask & pad
        return ref.decoder(embed(table, tgt), memory, src_mask, tgt_mask)

    def forward(src, tgt, src_mask=None, tgt_mask=None):
        pad = ref.pad_id if mask_pad is None else mask_pad
        src_mask = make_padding_mask(src, pad) if src_mask is None else src_mask
        if tgt_mask is None:
            L = tgt.size(1)
            keys = make_padding_mask(tgt, pad)
            tgt_mask = {"tril": make_decoder_mask(tgt, pad), "pad": keys,
                        "triu": torch.ones(L, L, dtype=torch.bool).triu() & keys}[causal]
        out = ref.generator(decode(tgt, encode(src, src_mask), src_mask if cross_mask else None, tgt_mask))
        return {None: out, "softmax": out.softmax(-1), "log_softmax": out.log_softmax(-1)}[post]
    return {"encode": encode, "decode": decode, None: forward}[method](*args, **kwargs)


def wired(message, probes=(), **mistake):
    """The mistake `_wired(**mistake)`: every call's output equals it, and one call at least
    differs from the right one (so a probe failing for another reason is not taken for it)."""
    def test(e):
        if e.error:
            return False
        ref, shown = e.ref(), False
        for ci, c in enumerate(e.pd["calls"]):
            g, w = e.out(ci), e.want_out(ci)
            if g is None or w is None:
                continue
            args, kwargs = e.args(ci)
            with torch.no_grad():
                r = vm._np(_wired(ref, c["method"], args, kwargs, **mistake)).astype(np.float64)
            g = np.asarray(g, dtype=np.float64)
            if r.shape != g.shape or not np.allclose(g, r, atol=1e-4, rtol=1e-3):
                return False
            shown |= r.shape != w.shape or not np.allclose(r, w, atol=1e-4, rtol=1e-3)
        return shown
    return when(message, test, probes)


def _forward_outs(e):
    """[(student, reference, source length)] of the forward calls (method None)."""
    return [(np.asarray(e.out(ci)), np.asarray(e.want_out(ci)), e.args(ci)[0][0].shape[1])
            for ci, c in enumerate(e.pd["calls"])
            if c["method"] is None and e.out(ci) is not None and e.want_out(ci) is not None]


def _rows_are(e, test):
    outs = [g for g, w, _ in _forward_outs(e) if g.ndim == 3]
    return bool(outs) and all(test(g.astype(np.float64)) for g in outs)


_ONE_TABLE = ("the target is embedded with src_embed, or tgt_embed is the same module as "
              "src_embed: the decoder side needs its own table, tgt_embed = "
              "nn.Embedding(tgt_vocab, d_model), used in decode (the study notes share one `wte` "
              "table for both sides).")

TRANSFORMER_DIAGNOSES = [
    when("your model holds PyTorch's own transformer modules (their parameters are named "
         "in_proj_weight, multihead_attn, ...): nn.Transformer* is the shortcut this exercise "
         "rules out. Build the model from the notebook's Encoder and Decoder.",
         lambda e: any(n in e.error for n in ("in_proj", "multihead_attn", "out_proj"))),
    when(_ONE_TABLE, lambda e: "tgt_embed.weight" in e.error and "has shape" in e.error),
    when(_ONE_TABLE, lambda e: "index out of range" in e.error, probes=("parts",)),
    when("model(src, tgt) has shape (B, Ls, V): the decoder was fed the source, as in the study "
         "notes (`decoder(x, enc_out)` with x the source embeddings). The decoder's input is the "
         "target prefix tgt; it gives one prediction per target position, (B, Lt, tgt_vocab).",
         lambda e: any(g.ndim == 3 and g.shape[1] == ls != w.shape[1] for g, w, ls in _forward_outs(e))),
    when("model(src, tgt) has shape (B, 1, V): it returns the last position only (the study "
         "notes' inference branch, `lm_head(x[:, [-1], :])`). forward returns the logits of every "
         "target position, (B, Lt, tgt_vocab).",
         lambda e: any(g.ndim == 3 and g.shape[1] == 1 < w.shape[1] for g, w, _ in _forward_outs(e))),
    when("model(src, tgt) has shape (B, Lt, d_model): the generator is missing. forward ends with "
         "self.generator(...) -> (B, Lt, tgt_vocab).",
         lambda e: any(g.ndim == 3 and g.shape[:2] == w.shape[:2] and g.shape[2] == e.ref().d_model
                       != w.shape[2] for g, w, _ in _forward_outs(e))),
    when("the model's outputs are <= 0 and exp() of each row sums to 1: the generator ends in "
         "log_softmax (as in some public implementations, whose loss is nn.NLLLoss). forward must "
         "return the generator's raw logits: F.cross_entropy and greedy decoding apply "
         "(log-)softmax themselves.",
         lambda e: _rows_are(e, lambda g: (g <= 1e-6).all()
                             and np.allclose(np.exp(g).sum(-1), 1, atol=1e-4))),
    when("the model's output rows are >= 0 and sum to 1: you applied a softmax. forward must "
         "return the generator's raw logits; F.cross_entropy applies log-softmax itself, so a "
         "softmax layer before it squashes the gradients (a bug in the study notes, whose model "
         "ends in 'a linear layer and a softmax').",
         lambda e: _rows_are(e, lambda g: (g >= 0).all() and np.allclose(g.sum(-1), 1, atol=1e-4))),
    wired("the embeddings are not multiplied by sqrt(d_model): encode and decode feed "
          "pos_encoding(embed(ids) * sqrt(d_model)).", scale="none"),
    wired("sqrt(d_model) multiplies the sum (embedding + positional encoding); scale the "
          "embedding only, then add the positional encoding.", scale="after"),
    wired("the embeddings are divided by sqrt(d_model); multiply them.", scale="div"),
    wired("the positional encoding is missing: add self.pos_encoding after scaling the "
          "embeddings, on both sides.", pe=0),
    wired("the positional encoding is added twice: apply self.pos_encoding once.", pe=2),
    wired(_ONE_TABLE, tgt_table="src"),
    wired("forward builds no causal mask when tgt_mask is None, only a padding mask: position i "
          "sees the tokens after it. Build make_decoder_mask(tgt, self.pad_id), causal AND key "
          "padding.", causal="pad"),
    wired("the causal mask forward builds is inverted (upper-triangular, triu): position i sees "
          "the future and not the past. The decoder mask is lower-triangular, True on and below "
          "the diagonal: make_decoder_mask(tgt, self.pad_id).", causal="triu"),
    wired("the encoder does not mask the padded source positions: pass src_mask to encode (the "
          "padding mask, make_padding_mask(src, self.pad_id)) and on to self.encoder.",
          enc_mask=False),
    wired("the decoder's cross-attention does not mask the padded source positions: pass "
          "src_mask to decode as well as to encode.", cross_mask=False),
    wired("forward builds its masks with pad id 0: use self.pad_id (here token 0 is an ordinary "
          "token and another id pads).", mask_pad=0),
    wired("encode built a padding mask from pad_id although none was given: only forward builds "
          "masks (encode(src, src_mask=None) uses exactly the mask it is given, or none; greedy "
          "decoding and the tests pass their own).", own_masks="encode"),
    wired("decode added a padding mask from pad_id to the masks it was given: only forward "
          "builds masks (decode(tgt, memory, src_mask, tgt_mask) uses exactly the masks it is "
          "given; greedy decoding and the tests pass their own).", own_masks="decode"),
]


# -- the table --------------------------------------------------------------------------------

T_SHAPES, T_INIT, T_EMB = "shapes", "init", "embeddings"
T_CAUSAL, T_PAD = "causal", "padding"
T_TORCH, T_FIT = "matches_torch", "overfit"

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

TRANSFORMER = Exercise("Transformer", ref="transformer.Transformer", shortcuts=("transformer",),
                       graded=grades(shapes=1, init=1, embeddings=2, causal=(2, 3131),
                                     padding=(2, 4711),
                                     matches_torch=(3, 9090),
                                     overfit=2),
                       diagnose=TRANSFORMER_DIAGNOSES, probes=[
    Probe("parts", (shapes(T_SHAPES),),
          [call(_SRC, _SRC_MASK, method="encode"),
           call(_ids(3, 5, 13, 0, [5, 4, 2]), randn(3, 7, 32), _SRC_MASK, _causal(5),
                method="decode"),
           call(_SRC, _ids(3, 5, 11, 0, [5, 4, 2]))],
          make=ctor(11, 13, 32, 4, 2, 64), load="reference", mode="eval", params=True,
          after=("pad_id",), atol=1e-4,
          what="src_vocab=11, tgt_vocab=13: encode, decode and forward of padded rows, and the "
               "parameters (one table per side, an untied generator)"),
    Probe("pad id kept", (shapes(T_SHAPES),), [call(_ids(2, 4, 9, 7, [4, 2]), _ids(2, 3, 9, 7, [3, 2]))],
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
          [call(_ids(3, 5, 12, low=0, zero_at=(1, 2)), method="encode"),
           call(_ids(3, 6, 12, low=0, zero_at=(2, 3)), randn(3, 5, 24), None, _causal(6),
                method="decode")],
          make=ctor(12, 15, 24, 3, 2, 40, norm_first=True), load="reference", mode="eval",
          atol=1e-4, what="encode and decode with norm_first=True, d_model=24, on ids that hold "
                          "the pad id 0 (no mask given: encode and decode must not build one)"),
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

L_VALUE, L_PAD, L_GRAD = ("value", "padding",
                          "gradient")


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

def _ce(logits, labels, **kw):
    import torch.nn.functional as F
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), **kw)


def _tf(fn):
    """A wrong loss written with the model's logits for the right decoder input, `lg`, and the
    right labels, `lab`: fn(model, src, tgt, lg, lab)."""
    return lambda model, src, tgt: fn(model, src, tgt, model(src, tgt[:, :-1]), tgt[:, 1:])


TEACHER_FORCING_DIAGNOSES = [
    when("F.cross_entropy wants the classes on axis 1: flatten to logits (B*L, V) and labels "
         "(B*L,), or pass logits.transpose(1, 2) as (B, V, L).",
         lambda e: "Expected target size" in e.error or "Expected input batch_size" in e.error),
    when("The logits and the labels must line up: the decoder input tgt[:, :-1] and the labels "
         "tgt[:, 1:] both have Lt - 1 positions.",
         lambda e: any(w in e.error for w in ("must match", "doesn't match", "size"))),
    when("teacher_forcing_loss must return a scalar tensor (0-D, for .backward()); it returned a "
         "Python number (.item() or float(...)), which nothing can backpropagate through.",
         lambda e: any((e.meta(f"{ci}.out") or "") in ("float", "int") for ci in range(len(e.pd["calls"])))),
    when("teacher_forcing_loss must return a scalar tensor (0-D, for .backward()): reduce the "
         "per-token losses to their mean.", lambda e: any(g.shape != () for g, _ in e.outs())),
    like("the decoder input is not shifted: it gets the whole target and predicts the same "
         "tokens, so each position can copy its own input. Feed tgt[:, :-1], predict tgt[:, 1:].",
         lambda model, src, tgt: _ce(model(src, tgt), tgt, ignore_index=model.pad_id)),
    like("the labels are not shifted: position i is asked for the token it was given. Feed "
         "tgt[:, :-1] and predict tgt[:, 1:], the NEXT token.",
         _tf(lambda m, s, t, lg, lab: _ce(lg, t[:, :-1], ignore_index=m.pad_id))),
    like("the shift goes the wrong way: feed tgt[:, :-1] (starting with BOS) and predict "
         "tgt[:, 1:] (ending with EOS), not the reverse.",
         lambda model, src, tgt: _ce(model(src, tgt[:, 1:]), tgt[:, :-1], ignore_index=model.pad_id)),
    like("padding is taken to be token 0: use model.pad_id (here another id pads and token 0 is "
         "an ordinary token).",
         _tf(lambda m, s, t, lg, lab: _ce(lg, lab, ignore_index=0) if m.pad_id != 0 else None)),
    like("padding is counted in the loss: pass ignore_index=model.pad_id to F.cross_entropy "
         "(the study notes use ignore_index=-1, which ignores nothing here).",
         _tf(lambda m, s, t, lg, lab: _ce(lg, lab))),
    like("the logits went through a softmax before F.cross_entropy, which applies log-softmax "
         "itself: pass the raw logits.",
         _tf(lambda m, s, t, lg, lab: _ce(lg.softmax(-1), lab, ignore_index=m.pad_id))),
    like("the loss is a sum, not a mean: use the mean over the non-pad target tokens.",
         _tf(lambda m, s, t, lg, lab: _ce(lg, lab, ignore_index=m.pad_id, reduction="sum"))),
    like("the loss is averaged over every position, padding included: divide by the number of "
         "non-pad tokens (what ignore_index with the default mean does).",
         _tf(lambda m, s, t, lg, lab: _ce(lg, lab, ignore_index=m.pad_id, reduction="sum") / lab.numel())),
]

TEACHER_FORCING = Exercise("teacher_forcing_loss", ref="transformer.teacher_forcing_loss",
                           graded=grades(value=(2, 2024), padding=(1, 7707), gradient=1),
                           shortcuts=("transformer",), diagnose=TEACHER_FORCING_DIAGNOSES, probes=[
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


def _smooth(fn):
    """A wrong label-smoothing loss written from float64 parts: fn(nll, uni, logp, keep, eps)
    with nll = -log p(true class), uni = mean_c(-log p_c), keep = target != ignore_index."""
    def wrong(logits, target, smoothing=0.0, ignore_index=-100):
        V = logits.size(-1)
        logp = logits.double().reshape(-1, V).log_softmax(-1)
        t = target.reshape(-1)
        keep = t != ignore_index
        nll = -logp.gather(1, t.masked_fill(~keep, 0)[:, None]).squeeze(1)
        return fn(nll, -logp.mean(-1), logp, keep, smoothing)
    return wrong


def _last_axis_1(logits, target, smoothing=0.0, ignore_index=-100):
    """log_softmax over dim=1, which is the sequence axis of (B, L, V) logits."""
    logp = logits.double().log_softmax(1)
    keep = target != ignore_index
    nll = -logp.gather(-1, target.masked_fill(~keep, 0).unsqueeze(-1)).squeeze(-1)
    return ((1 - smoothing) * nll - smoothing * logp.mean(-1))[keep].mean()


def _kl(logits, target, smoothing=0.0, ignore_index=-100):
    """KL(q || p) to the smoothed target q: the cross-entropy less q's entropy."""
    V = logits.size(-1)
    logp = logits.double().reshape(-1, V).log_softmax(-1)
    t = target.reshape(-1)
    keep = t != ignore_index
    q = (1 - smoothing) * torch.nn.functional.one_hot(t.masked_fill(~keep, 0), V).double() + smoothing / V
    return (q * (q.clamp_min(1e-300).log() - logp)).sum(-1)[keep].mean()


LABEL_SMOOTHING_DIAGNOSES = [
    when("A target equal to ignore_index (-100 by default) is not a class: gather or one_hot "
         "with it fails. Replace the ignored targets by any valid class (target.masked_fill(~keep, "
         "0)) before gathering, and drop those rows after.",
         lambda e: any(w in e.error for w in ("out of bounds", "out of range", "-100"))),
    when("the loss must be a 0-D tensor (the mean over the non-ignored positions).",
         lambda e: any(g.shape != () for g, _ in e.outs())),
    when("the loss is inf or NaN: log(softmax(x)) underflows to log(0) = -inf for very negative "
         "logits (and softmax of huge logits overflows): use torch.log_softmax, which is stable.",
         lambda e: any(not np.isfinite(g).all() and np.isfinite(w).all() for g, w in e.outs())),
    like("the smoothing mass is spread over the V - 1 wrong classes only (smoothing / (V - 1) "
         "each); PyTorch's label_smoothing gives smoothing / V to EVERY class, the true one "
         "included: target = (1 - smoothing) * one_hot + smoothing / V.",
         _smooth(lambda nll, uni, logp, keep, eps: ((1 - eps) * nll + eps * (
             uni * logp.size(-1) - nll) / max(logp.size(-1) - 1, 1))[keep].mean())),
    like("the true class's term is not multiplied by (1 - smoothing): "
         "loss = (1 - smoothing) * nll + smoothing * mean over classes of -log p.",
         _smooth(lambda nll, uni, logp, keep, eps: (nll + eps * uni)[keep].mean())),
    like("this is the KL divergence to the smoothed target, not the cross-entropy: the two "
         "differ by the target's entropy, a constant. Use -sum(target * log_softmax(logits)).",
         _kl),
    like("the mean runs over every position, the ignored ones included (counted as 0): divide by "
         "the number of positions whose target is not ignore_index.",
         _smooth(lambda nll, uni, logp, keep, eps:
                 (((1 - eps) * nll + eps * uni) * keep).sum() / keep.numel())),
    like("positions whose target is ignore_index take part in the loss: drop them (target != "
         "ignore_index) before averaging.",
         _smooth(lambda nll, uni, logp, keep, eps: ((1 - eps) * nll + eps * uni).mean())),
    like("the loss is a sum, not a mean: average over the non-ignored positions.",
         _smooth(lambda nll, uni, logp, keep, eps: ((1 - eps) * nll + eps * uni)[keep].sum())),
    like("the smoothing term uses the SUM of -log p over the classes, not the mean: each class "
         "gets smoothing / V of the target, so the term is smoothing * mean_c(-log p_c).",
         _smooth(lambda nll, uni, logp, keep, eps:
                 ((1 - eps) * nll + eps * uni * logp.size(-1))[keep].mean())),
    like("the log-softmax is taken over axis 1, which for (B, L, V) logits is the sequence axis: "
         "the classes are on the LAST axis (dim=-1).", _last_axis_1),
    like("smoothing is ignored: the result is the plain cross-entropy; add smoothing * "
         "mean_c(-log p_c) and weigh the true class by (1 - smoothing).",
         _smooth(lambda nll, uni, logp, keep, eps: nll[keep].mean() if eps > 0 else None)),
]

LABEL_SMOOTHING = Exercise("label_smoothing_cross_entropy",
                           graded=grades(value=(2, 1717), ignore=2, shapes=1, stable=1, gradient=1,
                                         random=(1, 5150)),
                           ref="transformer.label_smoothing_cross_entropy", shortcuts=("cross_entropy",),
                           diagnose=LABEL_SMOOTHING_DIAGNOSES, probes=[
    Probe("value", ("value",),
          [_ls((12,), 7, 0.1, 3, 2), _ls((2, 5), 9, 0.25, 0, 2), _ls((20,), 13, 0.1, 5, 3),
           _ls((3, 7), 4, 0.5, 1, 4), _ls((2, 2), 30, 0.05, 29, 1)],
          what="(N, V) and (B, L, V) logits, smoothing 0.05 to 0.5, ignore_index a real class id"),
    Probe("ignore", ("ignore",),
          [call(_ls_logits(False), _ls_target(False), 0.0),
           call(_ls_logits(False), _ls_target(False), 0.2),
           call(_ls_logits(True), _ls_target(True), 0.2),
           _ls((7,), 5, 0.3, -100, 6, default_ignore=True)],
          what="the default ignore_index=-100 (not a class id), smoothing 0 and 0.2, and 12 more "
               "ignored positions"),
    Probe("shapes", (shapes("shapes"),),
          [_ls((4, 3), 6, 0.1, -100, 2), _ls((2, 5, 3), 7, 0.2, -100, 3), _ls((1, 1), 4, 0.1, -100, 0)],
          what="(B, L, V) logits (classes on the last axis), (B1, B2, L, V) and (1, 1, V)"),
    Probe("stable", ("stable",),
          [_ls((10,), 5, 0.1, -100, 1, scale=150.0), _ls((2, 4), 6, 0.3, 0, 1, scale=400.0)],
          what="logits of size 150 to 1000 (log_softmax, not log(softmax))"),
    Probe("gradient", ("gradient",),
          [_ls((2, 4), 6, 0.15, -100, 2, grad=(0,), backward=_scalar()),
           _ls((9,), 5, 0.4, 2, 2, grad=(0,), backward=_scalar(2.5))],
          atol=1e-5, rtol=1e-3, what="the gradient with respect to the logits"),
    Probe("random", ("random",),
          [_ls((6,), 5, 0.3, -100, 1), _ls((4, 9), 17, 0.2, -100, 6), _ls((33,), 3, 0.9, 2, 4),
           _ls((1, 5), 28, 0.0, 0, 2), _ls((2, 3), 6, 1.0, -1, 1),
           _ls((5, 4), 11, 0.15, 0, 3, dtype="float64")],
          what="random cases: smoothing 0 to 1, ignore_index -100, -1 or a class id, float64"),
])


# -- greedy_decode ----------------------------------------------------------------------------

G_SCRIPT, G_MAX, G_REF = ("scripted", "max_len",
                          "matches_reference")

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


@torch.no_grad()
def _greedy_wrong(model, src, max_len, bos, eos, pos=-1, src_masked=True, causal=True):
    """Greedy decoding that reads position `pos` of the decoder states, or runs without the
    source padding mask, or without the causal mask."""
    from tfscratch.reference import make_causal_mask, make_padding_mask
    sm = make_padding_mask(src, model.pad_id) if src_masked else None
    memory = model.encode(src, sm)
    ys = torch.full((src.size(0), 1), bos, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    while ys.size(1) < max_len:
        tm = make_causal_mask(ys.size(1)) if causal else None
        nxt = model.generator(model.decode(ys, memory, sm, tm)[:, pos]).argmax(-1)
        nxt = nxt.masked_fill(done, model.pad_id)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos
        if done.all():
            break
    return ys


def _decoded(e):
    """[(student, reference, pad_id, max_len, bos, eos)] of the calls whose outputs are both
    2-D integer arrays."""
    out = []
    for ci in range(len(e.pd["calls"])):
        g, w = e.out(ci), e.want_out(ci)
        if g is None or w is None or np.asarray(g).ndim != 2 or np.asarray(w).ndim != 2:
            continue
        (model, _, max_len, bos, eos), _ = e.args(ci)
        out.append((np.asarray(g).astype(np.int64), np.asarray(w), model.pad_id, max_len, bos, eos))
    return out


def _every(e, test, some=None):
    """test(...) holds for every decoded call (and some(...) for one of them at least)."""
    calls = _decoded(e)
    return bool(calls) and all(test(*c) for c in calls) and (some is None or any(some(*c) for c in calls))


def _after_eos(w, eos):
    """True at the positions after each row's first EOS (in the expected output)."""
    hit = (w == eos).cumsum(1)
    return (hit > 1) | ((hit == 1) & (w != eos))


def _tail(fill):
    """Every call: the tokens up to each row's EOS are right, the positions after it hold
    `fill(pad, eos)` (None: anything)."""
    def test(g, w, pad, max_len, bos, eos):
        if g.shape != w.shape:
            return False
        after = _after_eos(w, eos)
        return (g[~after] == w[~after]).all() and (fill is None or (g[after] == fill(pad, eos)).all())
    return test


def _differs(g, w, *_):
    return g.shape != w.shape or (g != w).any()


def _goes_on(g, pad, eos):
    """Some row produced EOS and then more tokens than padding."""
    after = _after_eos(g[:, 1:], eos)
    return bool((g[:, 1:][after] != pad).any())


def _eos_zero(e):
    """Calls with eos_id != 0 are right; with eos_id == 0 a row goes on after its EOS."""
    calls = _decoded(e)
    same = [(g.shape == w.shape and (g == w).all(), g, pad, eos) for g, w, pad, _, _, eos in calls]
    return (bool(calls) and all(ok for ok, _, _, eos in same if eos != 0)
            and any(not ok and _goes_on(g, pad, eos) for ok, g, pad, eos in same if eos == 0))


GREEDY_DIAGNOSES = [
    when("the code assumes a batch of one row (.item() or int() on a tensor with B entries). "
         "Work on the whole batch at once: argmax(-1) gives one token per row, and a boolean "
         "`done` vector tracks which rows have finished.",
         lambda e: any(w in e.error for w in ("converted to Scalar", "only one element tensors",
                                              "more than one value is ambiguous"))),
    when("greedy_decode must return a (B, T) LongTensor of token ids: argmax gives long, and "
         "torch.full(..., dtype=torch.long) makes the BOS column.",
         lambda e: any((e.meta(f"{ci}.out") or "int64") != "int64" for ci in range(len(e.pd["calls"])))),
    when("the output has more than max_len columns. max_len counts the BOS column: generate at "
         "most max_len - 1 tokens.", lambda e: any(g.shape[1] > ml for g, _, _, ml, _, _ in _decoded(e))),
    when("the BOS column is missing: every row of the output starts with bos_id, then the "
         "generated tokens.", lambda e: any((g[:, 0] != bos).any() for g, _, _, _, bos, _ in _decoded(e))),
    when("here eos_id=0, an id as valid as any other, and the rows do not stop at it: a test such "
         "as `if eos_id:` (False for 0) treats it as no end token. Compare ids (== eos_id), and "
         "test `eos_id is not None` where None is allowed.", _eos_zero),
    when("decoding went on after every row had produced EOS: stop as soon as all rows are "
         "finished, e.g. `if done.all(): break`.",
         lambda e: _every(e, lambda g, w, pad, ml, bos, eos: g.shape[1] >= w.shape[1]
                          and (g[:, :w.shape[1]] == w).all() and (g[:, w.shape[1]:] == pad).all(),
                          lambda g, w, *_: g.shape[1] > w.shape[1])),
    when("the output stops one short of max_len (a column is missing): a row that never "
         "produces EOS grows until T == max_len, BOS included (max_len - 1 generated tokens).",
         lambda e: _every(e, lambda g, w, pad, ml, bos, eos: g.shape[1] == min(w.shape[1], ml - 1)
                          and (g == w[:, :g.shape[1]]).all(), lambda g, w, pad, ml, *_: w.shape[1] == ml)),
    when("decoding stopped before some rows had produced EOS: stop only when EVERY row has "
         "finished (done.all(), not done.any()); finished rows receive padding meanwhile.",
         lambda e: _every(e, lambda g, w, *_: g.shape[1] <= w.shape[1] and (g == w[:, :g.shape[1]]).all(),
                          lambda g, w, *_: g.shape[1] < w.shape[1])),
    when("the positions after EOS hold 0, but this model's pad_id is another id: pad with "
         "model.pad_id.", lambda e: _every(e, _tail(lambda pad, eos: 0), _differs)),
    when("the positions after a row's EOS repeat EOS; they must hold model.pad_id.",
         lambda e: _every(e, _tail(lambda pad, eos: eos), _differs)),
    when("the tokens up to each row's first EOS are right, but the positions after it are not "
         "padding: once a row has produced EOS, append model.pad_id to it (e.g. "
         "next_token.masked_fill(done, model.pad_id)).", lambda e: _every(e, _tail(None), _differs)),
    like("each step took the logits of the FIRST position (logits[:, 0]); the next token comes "
         "from the LAST position, logits[:, -1].",
         lambda m, src, ml, bos, eos: _greedy_wrong(m, src, ml, bos, eos, pos=0)),
    like("the source padding is not masked: build src_mask = make_padding_mask(src, "
         "model.pad_id) and pass it to encode AND decode (or call model(src, prefix), which "
         "builds the masks).",
         lambda m, src, ml, bos, eos: _greedy_wrong(m, src, ml, bos, eos, src_masked=False)),
    like("the decoder ran without the causal mask: with two layers the last position's result "
         "depends on it. Pass tgt_mask=make_causal_mask(T) to decode (or call model(src, "
         "prefix)).", lambda m, src, ml, bos, eos: _greedy_wrong(m, src, ml, bos, eos, causal=False)),
    when("the tokens differ from greedy decoding: each step runs the decoder on the prefix so "
         "far, takes the logits of the LAST position and their argmax over the vocabulary (no "
         "sampling), and appends it; finished rows get model.pad_id.", lambda e: not e.error),
]

GREEDY = Exercise("greedy_decode", ref="transformer.greedy_decode", shortcuts=("transformer",),
                  graded=grades(scripted=(2, 7349), max_len=(1, 5501), matches_reference=(2, 7790)),
                  diagnose=GREEDY_DIAGNOSES, probes=[
    Probe("batch", (G_SCRIPT, G_REF),
          [_greedy(base, eos, pad, 10, 9) for base, eos, pad in _MODELS],
          what="a stand-in model, 10 source rows that end at different steps (EOS 3, and EOS 0 "
               "with pad_id 3)"),
    Probe("few rows", (G_SCRIPT,),
          [_greedy(base, eos, pad, B, 16) for base, eos, pad in _MODELS for B in (3, 2, 1, 1)],
          what="3, 2 and 1 rows with max_len=16: stop as soon as every row has produced EOS"),
    Probe("max_len", (shapes(G_MAX),),
          [_greedy(base, eos, pad, 4, ml) for base, eos, pad in _MODELS for ml in (1, 2, 4)],
          what="max_len 1, 2 and 4 (the BOS column counts)"),
    Probe("max_len none ends", (shapes(G_MAX),),
          [_greedy(26, 5, 4, 3, 7, bos=0), _greedy(39, 2, 3, 3, 6, bos=5)],
          what="EOS ids the model rarely produces: rows run to max_len"),
])

# A stand-in that honours its masks like a two-layer Transformer (`toy_seq2seq_masked`, when
# the probe machine has it): decoding without the source padding mask, or without the causal
# mask, then gives other tokens. `toy_seq2seq` ignores masks, so only this one sees them.
if "toy_seq2seq_masked" in vm.FIXTURES:
    GREEDY.add(Probe(
        "masks", (G_REF,),
        [call(_Seeded(base, "toy_seq2seq_masked", 7, 8, pad), _sources(10, 6, pad, V=7), 8, 1, 2)
         for base, pad in ((51, 0), (52, 3), (53, 0), (54, 5))],
        what="a stand-in model that honours src_mask and tgt_mask like a two-layer "
             "Transformer, padded sources"))

EXERCISES = [TRANSFORMER, TEACHER_FORCING, LABEL_SMOOTHING, GREEDY]
