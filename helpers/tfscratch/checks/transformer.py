"""Checks for notebook 07_transformer: `Transformer`, `teacher_forcing_loss`, `greedy_decode`."""
from __future__ import annotations

import math
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..reference import Transformer as RefTransformer
from ..reference import make_causal_mask, sinusoidal_positional_encoding
from .core import (CheckFailed, call, check_close, check_shape, check_true, copy_mha_to_torch,
                   fail, passed, seeded)

TF = ("transformer",)  # nn.Transformer* classes are blocked while the student's code runs

__all__ = [
    "copy_transformer_to_torch", "torch_reference_logits",
    "check_transformer_shapes", "check_transformer_init", "check_transformer_embeddings",
    "check_transformer_causal", "check_transformer_padding", "check_transformer_against_torch",
    "check_transformer_overfit",
    "check_loss_value", "check_loss_padding", "check_loss_gradient",
    "check_ls_value", "check_ls_ignore", "check_ls_shapes", "check_ls_stable", "check_ls_gradient",
    "check_ls_against_torch", "smoothed_target",
    "check_greedy_scripted", "check_greedy_max_len", "check_greedy_against_reference",
]


# --------------------------------------------------------------------------- helpers
def _match(actual, candidates: dict, atol=1e-4, rtol=1e-3):
    """The description of the first wrong-but-plausible result that `actual` equals, or None."""
    for hint, cand in candidates.items():
        if cand is None:
            continue
        try:
            if actual.shape == cand.shape and torch.allclose(
                    actual.detach().double(), cand.detach().double(), atol=atol, rtol=rtol):
                return hint
        except (RuntimeError, TypeError):
            continue
    return None


def _build(Transformer, seed, *args, **kw):
    """Construct the student's model (guarded) under a fixed seed, in eval mode."""
    sig = ", ".join([str(a) for a in args] + [f"{k}={v!r}" for k, v in kw.items()])
    with seeded(seed):
        model = call(Transformer, *args, shortcuts=TF, what=f"Transformer({sig})", **kw)
    check_true(isinstance(model, nn.Module), f"Transformer({sig}) did not return an nn.Module.")
    return model.eval()


def _tokens(seed, B, L, vocab, pad_id, lengths=None, low=0):
    """(B, L) random non-pad tokens in [low, vocab), right-padded with pad_id to `lengths`."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(low, vocab - 1, (B, L), generator=g)
    t = t + (t >= pad_id).long() if low <= pad_id < vocab else t  # skip the pad id itself
    if lengths is not None:
        for b, n in enumerate(lengths):
            t[b, n:] = pad_id
    return t


def _attr(model, path):
    obj = model
    for name in path.split("."):
        if not hasattr(obj, name):
            fail(f"the model has no `{path}`. The tests reach the parts through the names the "
                 "exercise fixes: src_embed, tgt_embed, pos_encoding, encoder, decoder, generator "
                 "(and encoder.layers[i].self_attn ... as in notebook 06's blocks).")
        obj = getattr(obj, name)
    return obj


def _ln(src, dst):
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def copy_transformer_to_torch(model, torch_tf: nn.Transformer):
    """Copy the course model's encoder and decoder weights into `nn.Transformer` (batch_first).
    nn.Transformer has no embeddings and no generator: those stay in the course model."""
    with torch.no_grad():
        enc, dec = _attr(model, "encoder"), _attr(model, "decoder")
        for mine, theirs in zip(enc.layers, torch_tf.encoder.layers):
            copy_mha_to_torch(mine.self_attn, theirs.self_attn)
            _ln(mine.ff.linear1, theirs.linear1)
            _ln(mine.ff.linear2, theirs.linear2)
            _ln(mine.norm1, theirs.norm1)
            _ln(mine.norm2, theirs.norm2)
        for mine, theirs in zip(dec.layers, torch_tf.decoder.layers):
            copy_mha_to_torch(mine.self_attn, theirs.self_attn)
            copy_mha_to_torch(mine.cross_attn, theirs.multihead_attn)
            _ln(mine.ff.linear1, theirs.linear1)
            _ln(mine.ff.linear2, theirs.linear2)
            _ln(mine.norm1, theirs.norm1)
            _ln(mine.norm2, theirs.norm2)
            _ln(mine.norm3, theirs.norm3)
        _ln(enc.norm, torch_tf.encoder.norm)
        _ln(dec.norm, torch_tf.decoder.norm)


def torch_reference_logits(model, src, tgt, n_heads, n_layers, d_ff, pad_id, norm_first=False,
                           *, scale=True, pe=True, src_table="src", causal=True, src_pad=True,
                           memory_pad=True, tgt_pad=True):
    """The logits of `nn.Transformer` carrying `model`'s weights, with the model's own
    embeddings and generator: what model(src, tgt) must return. The keyword switches build
    the known wrong variants that the checks recognise."""
    d = model.src_embed.weight.size(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tt = nn.Transformer(d, n_heads, n_layers, n_layers, d_ff, dropout=0.0, batch_first=True,
                            norm_first=norm_first)
    copy_transformer_to_torch(model, tt)
    tt.train()  # dropout is 0, so this only keeps PyTorch off its fused inference path
    Ls, Lt = src.size(1), tgt.size(1)
    table = sinusoidal_positional_encoding(max(Ls, Lt), d)
    k = math.sqrt(d) if scale else 1.0
    p_s = table[:Ls] if pe else 0.0
    p_t = table[:Lt] if pe else 0.0
    xs = model.src_embed.weight[src] * k + p_s
    tgt_w = model.src_embed.weight if src_table == "tgt_uses_src" else model.tgt_embed.weight
    xt = tgt_w[tgt] * k + p_t
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = tt(xs, xt,
                 tgt_mask=torch.triu(torch.ones(Lt, Lt, dtype=torch.bool), 1) if causal else None,
                 src_key_padding_mask=(src == pad_id) if src_pad else None,
                 tgt_key_padding_mask=(tgt == pad_id) if tgt_pad else None,
                 memory_key_padding_mask=(src == pad_id) if memory_pad else None)
        return F.linear(out, model.generator.weight, model.generator.bias)


def _logits(model, src, tgt, what="model(src, tgt)", **kw):
    out = call(model, src, tgt, shortcuts=TF, what=what, **kw)
    if isinstance(out, (tuple, list)):
        fail(f"{what} returned a {type(out).__name__} of {len(out)} items; forward must return "
             "the logits tensor (B, Lt, tgt_vocab) only (no loss, no extra outputs).")
    if not isinstance(out, torch.Tensor):
        fail(f"{what} returned {type(out).__name__}; it must return the logits tensor.")
    return out


def _softmax_hint(out):
    o = out.detach()
    if o.dim() == 3 and (o >= 0).all() and torch.allclose(o.sum(-1), torch.ones_like(o[..., 0]),
                                                           atol=1e-4):
        fail("the model's output rows are >= 0 and sum to 1: you applied a softmax. forward must "
             "return the generator's raw logits; F.cross_entropy applies log-softmax itself, so a "
             "softmax layer before it squashes the gradients (a bug in the study notes, whose "
             "model ends in 'a linear layer and a softmax').")
    if o.dim() == 3 and (o <= 1e-6).all() and torch.allclose(
            o.exp().sum(-1), torch.ones_like(o[..., 0]), atol=1e-4):
        fail("the model's outputs are <= 0 and exp() of each row sums to 1: the generator ends "
             "in log_softmax (as in some public implementations, whose loss is nn.NLLLoss). "
             "forward must return the generator's raw logits: F.cross_entropy and greedy "
             "decoding apply (log-)softmax themselves.")


# --------------------------------------------------------------------------- Transformer
def check_transformer_shapes(Transformer):
    """Parts, types and output shapes, with src_vocab != tgt_vocab and Ls != Lt."""
    V_s, V_t, d, H, n, d_ff = 11, 13, 32, 4, 2, 64
    model = _build(Transformer, 0, V_s, V_t, d, H, n, d_ff)
    for name in ("src_embed", "tgt_embed", "pos_encoding", "encoder", "decoder", "generator"):
        _attr(model, name)
    check_true(isinstance(model.src_embed, nn.Embedding) and isinstance(model.tgt_embed, nn.Embedding),
               "src_embed and tgt_embed must be nn.Embedding tables.")
    check_true(tuple(model.src_embed.weight.shape) == (V_s, d),
               f"src_embed.weight has shape {tuple(model.src_embed.weight.shape)}; expected "
               f"(src_vocab, d_model) = {(V_s, d)}.")
    check_true(tuple(model.tgt_embed.weight.shape) == (V_t, d),
               f"tgt_embed.weight has shape {tuple(model.tgt_embed.weight.shape)}; expected "
               f"(tgt_vocab, d_model) = {(V_t, d)}. The target side needs its own table (the study "
               "notes reuse one `wte` table for both sides).")
    check_true(model.src_embed is not model.tgt_embed,
               "src_embed and tgt_embed are the same module; give each side its own table.")
    g = model.generator
    check_true(isinstance(g, nn.Linear) and g.in_features == d and g.out_features == V_t,
               f"generator must be nn.Linear(d_model, tgt_vocab) = nn.Linear({d}, {V_t}); got {g}.")
    check_true(g.weight.data_ptr() != model.tgt_embed.weight.data_ptr(),
               "generator.weight is tied to tgt_embed.weight; this exercise keeps them separate.")
    check_true(getattr(model, "pad_id", None) == 0, "the model must keep `self.pad_id` (default 0): "
               "greedy_decode and the loss read it.")
    m7 = _build(Transformer, 0, V_s, V_t, d, H, n, d_ff, pad_id=7)
    check_true(getattr(m7, "pad_id", None) == 7, "Transformer(..., pad_id=7).pad_id is "
               f"{getattr(m7, 'pad_id', None)!r}; store the pad_id argument.")
    for part, expected in (("encoder.layers", n), ("decoder.layers", n)):
        got = len(_attr(model, part))
        check_true(got == n, f"model.{part} has {got} layers; n_layers={n} of each.")

    src = _tokens(1, 3, 7, V_s, 0, lengths=[7, 5, 3])
    tgt = _tokens(2, 3, 5, V_t, 0, lengths=[5, 4, 2])
    src_mask = (src != 0).unsqueeze(1)
    mem = call(model.encode, src, src_mask, shortcuts=TF, what="model.encode(src, src_mask)")
    check_shape(mem, (3, 7, d), "model.encode(src (3, 7), src_mask)",
                "encode returns the encoder's output, the memory (B, Ls, d_model).")
    tgt_mask = make_causal_mask(5)
    states = call(model.decode, tgt, mem, src_mask, tgt_mask, shortcuts=TF,
                  what="model.decode(tgt, memory, src_mask, tgt_mask)")
    check_shape(states, (3, 5, d), "model.decode(tgt (3, 5), memory, src_mask, tgt_mask)",
                "decode returns the decoder states (B, Lt, d_model), before the generator.")
    out = _logits(model, src, tgt)
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 1, V_t):
        fail("model(src, tgt) has shape (3, 1, tgt_vocab): it returns the last position only (the "
             "study notes' inference branch, `lm_head(x[:, [-1], :])`). forward returns the "
             "logits of every target position, (B, Lt, tgt_vocab).")
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 7, V_t):
        fail("model(src, tgt) has shape (3, 7, tgt_vocab) = (B, Ls, V): the decoder was fed the "
             "source, as in the study notes (`decoder(x, enc_out)` with x the source embeddings). "
             "The decoder's input is the target prefix tgt; it gives one prediction per target "
             "position.")
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 5, d):
        fail("model(src, tgt) has shape (B, Lt, d_model): the generator is missing. forward ends "
             "with self.generator(...) -> (B, Lt, tgt_vocab).")
    check_shape(out, (3, 5, V_t), "model(src (3, 7), tgt (3, 5))",
                "forward returns logits (B, Lt, tgt_vocab).")
    _softmax_hint(out)
    passed("Transformer: parts, separate embeddings, untied generator; encode (B, Ls, D), "
           "decode (B, Lt, D), forward (B, Lt, V)")


_XAVIER = ("xavier_uniform_", "xavier_normal_", "xavier_uniform", "xavier_normal")


def _xavier_scaled(model):
    for p in model.parameters():
        if p.dim() >= 2:
            want = math.sqrt(2.0 / (p.shape[0] + p[0].numel()))
            if not 0.75 * want <= p.detach().float().std().item() <= 1.33 * want:
                return False
    return True


def _names_xavier(code) -> bool:
    """Does this code object (or one nested in it) call nn.init.xavier_*?"""
    if any(n in _XAVIER for n in code.co_names):
        return True
    return any(_names_xavier(c) for c in code.co_consts if hasattr(c, "co_names"))


def _init_outside(Transformer):
    """Where the notebook initialises Transformer weights outside the class, in words, or None:
    a function of the notebook that calls nn.init.xavier_* while the class never does, or a
    Transformer built in the notebook whose weights have the Xavier scale that the class alone
    does not give."""
    cls_code = [f.__code__ for f in vars(Transformer).values() if hasattr(f, "__code__")]
    if any(_names_xavier(c) for c in cls_code):
        return None
    ns = getattr(getattr(Transformer, "__init__", None), "__globals__", {}) or {}
    for name, obj in list(ns.items()):
        if name.startswith("_"):
            continue
        if isinstance(obj, Transformer) and _xavier_scaled(obj):
            return (f"the notebook's `{name}` has Xavier-scaled weights, set by code after "
                    "Transformer(...) was built")
        code = getattr(obj, "__code__", None)
        if code is not None and getattr(obj, "__module__", None) == ns.get("__name__") and \
                _names_xavier(code):
            return f"the notebook's function `{name}` calls nn.init.xavier_*, outside the class"
    return None


def check_transformer_init(Transformer):
    """Every weight matrix has the Glorot (Xavier) scale std = sqrt(2 / (fan_in + fan_out)),
    given by the class itself: an initialisation applied outside it is not part of the model."""
    model = _build(Transformer, 3, 40, 24, 64, 4, 2, 96)
    bad = []
    for name, p in model.named_parameters():
        if p.dim() < 2:
            continue
        fan_out, fan_in = p.shape[0], p[0].numel()
        want = math.sqrt(2.0 / (fan_in + fan_out))
        got = p.detach().float().std().item()
        if not 0.75 * want <= got <= 1.33 * want:
            bad.append((name, tuple(p.shape), got, want))
    if bad:
        lines = "\n".join(f"  {n} {s}: std {g:.3f}, Xavier {w:.3f}" for n, s, g, w in bad[:6])
        outside = _init_outside(Transformer)
        if outside:
            fail("Transformer(...) does not initialise its own weights: the Xavier "
                 f"initialisation is applied outside the class ({outside}). Initialisation "
                 "outside the class is not part of the model: every Transformer(...) built "
                 "elsewhere (by the tests, by a training script) starts from PyTorch's default "
                 f"init:\n{lines}\nMove the loop into __init__, after building all parts: for p "
                 "in self.parameters(): if p.dim() > 1: nn.init.xavier_uniform_(p) (as "
                 "nn.Transformer does).")
        emb = [b for b in bad if "embed" in b[0]]
        why = ("The embeddings keep nn.Embedding's default N(0, 1): multiplied by sqrt(d_model) "
               "they are ~8x larger than the positional encoding, which is then lost in the noise. "
               if emb and all(abs(g - 1.0) < 0.15 for _, _, g, _ in emb) else "")
        fail(f"{len(bad)} weight matrices are not initialised at the Xavier (Glorot) scale:\n{lines}\n"
             + why + "Loop over self.parameters() and apply nn.init.xavier_uniform_ to every "
             "parameter with p.dim() > 1 (what nn.Transformer does), after building all parts.")
    passed("Transformer: every weight matrix starts at the Xavier scale sqrt(2 / (fan_in + fan_out))")


def check_transformer_embeddings(Transformer):
    """encode/decode feed the encoder/decoder emb(tokens) * sqrt(d_model) + PE, each side its table."""
    V_s, V_t, d, H, n, d_ff = 20, 16, 32, 4, 1, 64
    model = _build(Transformer, 4, V_s, V_t, d, H, n, d_ff)
    src = _tokens(5, 2, 6, V_t, 0, low=1)  # ids valid in both tables, no padding
    tgt = _tokens(6, 2, 4, V_t, 0, low=1)
    pe = sinusoidal_positional_encoding(6, d)
    enc, dec = _attr(model, "encoder"), _attr(model, "decoder")
    es, et = model.src_embed.weight.detach(), model.tgt_embed.weight.detach()
    k = math.sqrt(d)
    with torch.no_grad():
        run_e = lambda x: enc(x, None)
        expected = run_e(es[src] * k + pe[:6])
        cands = {
            "the embeddings are not multiplied by sqrt(d_model).": run_e(es[src] + pe[:6]),
            "sqrt(d_model) multiplies the sum (embedding + PE); scale the embedding only, then add "
            "the positional encoding.": run_e((es[src] + pe[:6]) * k),
            "the embeddings are divided by sqrt(d_model); multiply them.": run_e(es[src] / k + pe[:6]),
            "the embeddings are multiplied by d_model; the factor is sqrt(d_model).":
                run_e(es[src] * d + pe[:6]),
            "the positional encoding is missing: add self.pos_encoding after scaling.":
                run_e(es[src] * k),
            "the positional encoding is added twice.": run_e(es[src] * k + 2 * pe[:6]),
            "the source is embedded with tgt_embed; use src_embed.": run_e(et[src] * k + pe[:6]),
        }
    mem = call(model.encode, src, shortcuts=TF, what="model.encode(src)")
    check_shape(mem, expected.shape, "model.encode(src)")
    if not torch.allclose(mem, expected, atol=1e-5, rtol=1e-4):
        why = _match(mem, cands)
        if why:
            fail("model.encode(src) feeds the encoder the wrong input: " + why)
        check_close(mem, expected, "model.encode(src)",
                    "encode(src, src_mask) = encoder(pos_encoding(src_embed(src) * sqrt(d_model)), "
                    "src_mask).")
    causal = make_causal_mask(4)
    with torch.no_grad():
        run_d = lambda x: dec(x, expected, None, causal)
        expected_d = run_d(et[tgt] * k + pe[:4])
        cands = {
            "the target is embedded with src_embed; the decoder side uses tgt_embed (the study "
            "notes share one `wte` table for both).": run_d(es[tgt] * k + pe[:4]),
            "the target embeddings are not multiplied by sqrt(d_model).": run_d(et[tgt] + pe[:4]),
            "the positional encoding is missing on the target side.": run_d(et[tgt] * k),
            "sqrt(d_model) multiplies the sum (embedding + PE) on the target side.":
                run_d((et[tgt] + pe[:4]) * k),
        }
    states = call(model.decode, tgt, expected, None, causal, shortcuts=TF,
                  what="model.decode(tgt, memory, None, tgt_mask)")
    check_shape(states, expected_d.shape, "model.decode(tgt, memory, None, tgt_mask)")
    if not torch.allclose(states, expected_d, atol=1e-5, rtol=1e-4):
        why = _match(states, cands)
        if why:
            fail("model.decode feeds the decoder the wrong input: " + why)
        if _match(states, {"x": dec(et[tgt] * k + pe[:4], expected, None, None)}):
            fail("model.decode ignores its tgt_mask argument: pass it on to the decoder.")
        check_close(states, expected_d, "model.decode(tgt, memory, None, tgt_mask)",
                    "decode = decoder(pos_encoding(tgt_embed(tgt) * sqrt(d_model)), memory, "
                    "src_mask, tgt_mask).")
    passed("Transformer: encode/decode embed with their own table, times sqrt(d_model), plus PE")


def check_transformer_causal(Transformer, seed=7, norm_first=False):
    """Changing target tokens at positions >= t leaves the logits before t unchanged."""
    V, d, H, n, d_ff = 15, 32, 4, 2, 64
    model = _build(Transformer, seed, V, V, d, H, n, d_ff, norm_first=norm_first)
    src = _tokens(seed + 1, 2, 6, V, 0, low=1)
    tgt = _tokens(seed + 2, 2, 6, V, 0, low=1)
    out = _logits(model, src, tgt)
    check_shape(out, (2, 6, V), "model(src, tgt)")
    for t in (1, 3, 5):
        tgt2 = tgt.clone()
        tgt2[:, t:] = _tokens(seed + 10 + t, 2, 6 - t, V, 0, low=1)
        out2 = _logits(model, src, tgt2)
        diff = (out2[:, :t] - out[:, :t]).abs().max().item()
        if diff > 1e-5:
            fail(f"changing the target tokens from position {t} on changed the logits at positions "
                 f"< {t} (max change {diff:.3g}): position i sees the future. When tgt_mask is None, "
                 "forward must build the causal mask itself, causal AND key padding, e.g. "
                 "make_decoder_mask(tgt, self.pad_id) (lower-triangular: True on and below the "
                 "diagonal). A triu mask, or an inverted one, lets each position see the tokens "
                 "after it.")
    explicit = _logits(model, src, tgt, what="model(src, tgt, tgt_mask=causal)",
                       tgt_mask=make_causal_mask(6))
    check_close(explicit, out, "model(src, tgt, tgt_mask=make_causal_mask(Lt))",
                "With no padding in tgt, an explicit causal tgt_mask must give the same logits as "
                "the mask forward builds itself; use the tgt_mask you are given.")
    passed("Transformer: the logits at position i do not depend on target tokens after i")


def check_transformer_padding(Transformer, seed=11, pad_id=0, V=14, d=32, H=4, n=2, d_ff=48):
    """Extra padding (source or target, pad_id respected) leaves the real positions unchanged."""
    model = _build(Transformer, seed, V, V, d, H, n, d_ff, pad_id=pad_id)
    src = _tokens(seed + 1, 3, 6, V, pad_id, lengths=[6, 4, 2])
    tgt = _tokens(seed + 2, 3, 5, V, pad_id, lengths=[5, 3, 4])
    out = _logits(model, src, tgt)
    check_shape(out, (3, 5, V), "model(src, tgt)")
    pad_cols = lambda t, k: torch.cat([t, torch.full((t.size(0), k), pad_id)], 1)
    wider = _logits(model, pad_cols(src, 3), tgt, what="model(src with 3 more pad columns, tgt)")
    real_t = tgt != pad_id
    diff = (wider - out).abs()[real_t].max().item()
    if diff > 1e-4:
        zero_hint = (" You compare tokens with 0: use self.pad_id (here pad_id="
                     f"{pad_id}; token 0 is an ordinary token)." if pad_id != 0 else "")
        fail(f"adding padding to the source changed the logits (max change {diff:.3g}): padded "
             "source positions are attended to. forward must build the source padding mask "
             "from self.pad_id when src_mask is None, make_padding_mask(src, self.pad_id) "
             "(B, 1, Ls), and pass it to the encoder AND to the decoder's cross-attention."
             + zero_hint)
    taller = _logits(model, src, pad_cols(tgt, 2), what="model(src, tgt with 2 more pad columns)")
    diff = (taller[:, :5] - out).abs()[real_t].max().item()
    if diff > 1e-4:
        fail(f"adding padding to the target changed the logits at real positions (max change "
             f"{diff:.3g}). Build the target mask from self.pad_id when tgt_mask is None: "
             "make_decoder_mask(tgt, self.pad_id) (causal AND key padding).")
    # one row alone, without any padding, gives the same logits as inside the padded batch
    alone = _logits(model, src[2:3, :2], tgt[2:3, :4], what="model(src row, tgt row) unpadded")
    check_close(alone[0], out[2, :4], "the logits of a row decoded alone vs inside a padded batch",
                "Padding must not change a sequence's result: mask padded keys in the encoder, "
                "the decoder self-attention and the cross-attention.", atol=1e-4)
    passed(f"Transformer: padding (pad_id={pad_id}) in the source or target changes nothing at "
           "real positions")


def check_transformer_against_torch(Transformer, seed=0, cases=((17, 13, 32, 4, 2, 64, 0, False),)):
    """Weights copied into nn.Transformer (+ the same embeddings, PE and generator) give the
    same logits, with padding and masks built by forward. Case: (V_s, V_t, d, H, n, d_ff,
    pad_id, norm_first)."""
    for i, (V_s, V_t, d, H, n, d_ff, pad_id, nf) in enumerate(cases):
        model = _build(Transformer, seed + i, V_s, V_t, d, H, n, d_ff, norm_first=nf,
                       pad_id=pad_id)
        B, Ls, Lt = 3, 7, 5
        src = _tokens(seed + 100 + i, B, Ls, V_s, pad_id, lengths=[7, 5, 3])
        tgt = _tokens(seed + 200 + i, B, Lt, min(V_s, V_t), pad_id, lengths=[5, 5, 2])
        out = _logits(model, src, tgt)
        if tuple(out.shape) == (B, Ls, V_t):
            fail("model(src, tgt) has shape (B, Ls, V): the decoder was fed the source (the study "
                 "notes' `decoder(x, enc_out)`). Feed it the embedded target prefix.")
        check_shape(out, (B, Lt, V_t), "model(src, tgt)")
        _softmax_hint(out)
        ref = lambda **kw: torch_reference_logits(model, src, tgt, H, n, d_ff, pad_id, nf, **kw)
        expected = ref()
        keep = tgt != pad_id  # compare the real target positions
        a, e = out.detach()[keep], expected[keep]
        if not torch.allclose(a, e, atol=1e-4, rtol=1e-3):
            why = _match(a, {
                "the embeddings are not multiplied by sqrt(d_model).": ref(scale=False)[keep],
                "the positional encoding is missing.": ref(pe=False)[keep],
                "the target is embedded with src_embed instead of tgt_embed.":
                    ref(src_table="tgt_uses_src")[keep],
                "there is no causal mask: forward must build one when tgt_mask is None.":
                    ref(causal=False, tgt_pad=False)[keep],
                "the decoder's cross-attention does not mask the padded source positions: pass "
                "src_mask to decode as well as to encode.": ref(memory_pad=False)[keep],
                "the encoder does not mask the padded source positions: pass src_mask to encode.":
                    ref(src_pad=False)[keep],
                "no padding masks are used at all: build them from self.pad_id.":
                    ref(src_pad=False, memory_pad=False, tgt_pad=False)[keep],
                "the logits went through a softmax: return the generator's raw logits.":
                    expected.softmax(-1)[keep],
                "the logits went through a log-softmax: return the generator's raw logits.":
                    expected.log_softmax(-1)[keep],
            })
            if why:
                fail(f"model(src, tgt) differs from nn.Transformer with the same weights "
                     f"(norm_first={nf}, pad_id={pad_id}): " + why)
            check_close(a, e, f"logits at the real target positions (norm_first={nf})",
                        "Compared with nn.Transformer(batch_first=True) carrying your weights, fed "
                        "src_embed(src) * sqrt(d) + PE and tgt_embed(tgt) * sqrt(d) + PE, with the "
                        "causal and padding masks, then your generator.", atol=1e-4, rtol=1e-3)
    passed(f"Transformer: matches nn.Transformer with copied weights on {len(cases)} case(s)")


def check_transformer_overfit(Transformer, steps=120, target=0.05, time_budget=20.0):
    """A tiny fixed batch is memorised: teacher-forcing loss < `target` within `steps` Adam steps."""
    V, d, H, n, d_ff = 12, 32, 4, 1, 64
    model = _build(Transformer, 21, V, V, d, H, n, d_ff).train()
    src = _tokens(22, 4, 6, V, 0, lengths=[6, 5, 4, 3], low=3)
    tgt = _tokens(23, 4, 6, V, 0, lengths=[6, 6, 5, 4], low=3)
    tgt[:, 0] = 1  # BOS
    for b, n_real in enumerate([6, 6, 5, 4]):
        tgt[b, n_real - 1] = 2  # EOS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and steady on a busy machine
    try:
        with seeded(24):
            opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses, t0 = [], time.perf_counter()
        for _ in range(steps):
            logits = _logits(model, src, tgt[:, :-1], what="model(src, tgt[:, :-1]) in training")
            check_shape(logits, (4, 5, V), "model(src, tgt[:, :-1])")
            loss = F.cross_entropy(logits.reshape(-1, V), tgt[:, 1:].reshape(-1), ignore_index=0)
            check_true(loss.requires_grad, "the logits are cut off from autograd (no .detach(), "
                       "torch.no_grad() or .item() inside forward).")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if losses[-1] < target or time.perf_counter() - t0 > time_budget:
                break
    finally:
        torch.set_num_threads(threads)
        model.eval()
    if losses[-1] >= target:
        out = _logits(model, src, tgt[:, :-1])
        _softmax_hint(out)
        fail(f"a batch of 4 short sequences was not memorised: the teacher-forcing loss went from "
             f"{losses[0]:.3f} to {losses[-1]:.3f} in {len(losses)} Adam steps (lr 3e-3); it should "
             f"fall below {target}. Check that forward returns raw logits (no softmax), that the "
             "parameters are registered (nn.Module attributes, nn.ModuleList) and that nothing is "
             "detached.")
    passed(f"Transformer: memorises a tiny batch (loss {losses[0]:.2f} -> {losses[-1]:.3f} in "
           f"{len(losses)} steps)")


# --------------------------------------------------------------------------- loss
def _loss_setup(seed, pad_id, V=11, d=16):
    with seeded(seed):
        model = RefTransformer(V, V, d, 2, 1, 32, pad_id=pad_id).eval()
        with torch.no_grad():
            model.generator.weight.mul_(3.0)  # spread the logits: mistakes change the loss a lot
    src = _tokens(seed + 1, 3, 6, V, pad_id, lengths=[6, 4, 3])
    tgt = _tokens(seed + 2, 3, 7, V, pad_id, lengths=[7, 5, 3])
    return model, src, tgt


def _ce(logits, labels, **kw):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), **kw)


def _loss_candidates(model, src, tgt, pad_id):
    with torch.no_grad():
        lg = model(src, tgt[:, :-1])
        lab = tgt[:, 1:]
        c = {
            "the decoder input is not shifted: it gets the whole target and predicts the same "
            "tokens, so each position can copy its own input. Feed tgt[:, :-1], predict tgt[:, 1:].":
                _ce(model(src, tgt), tgt, ignore_index=pad_id),
            "the labels are not shifted: position i is asked for the token it was given. Feed "
            "tgt[:, :-1] and predict tgt[:, 1:], the NEXT token.":
                _ce(lg, tgt[:, :-1], ignore_index=pad_id),
            "the shift goes the wrong way: feed tgt[:, :-1] (starting with BOS) and predict "
            "tgt[:, 1:] (ending with EOS), not the reverse.":
                _ce(model(src, tgt[:, 1:]), tgt[:, :-1], ignore_index=pad_id),
            "padding is counted in the loss: pass ignore_index=model.pad_id to F.cross_entropy "
            "(the study notes use ignore_index=-1, which ignores nothing here).": _ce(lg, lab),
            "the logits went through a softmax before F.cross_entropy, which applies log-softmax "
            "itself: pass the raw logits.": _ce(lg.softmax(-1), lab, ignore_index=pad_id),
            "the loss is a sum, not a mean: use the mean over the non-pad target tokens.":
                _ce(lg, lab, ignore_index=pad_id, reduction="sum"),
            "the loss is averaged over every position, padding included: divide by the number of "
            "non-pad tokens (what ignore_index with the default mean does).":
                _ce(lg, lab, ignore_index=pad_id, reduction="sum") / lab.numel(),
        }
        if pad_id != 0:
            c["padding is taken to be token 0: use model.pad_id (here "
              f"{pad_id}; token 0 is an ordinary token)."] = _ce(lg, lab, ignore_index=0)
    return c


def _loss_call(fn, model, src, tgt):
    try:
        loss = call(fn, model, src, tgt, shortcuts=TF, what="teacher_forcing_loss(model, src, tgt)")
    except CheckFailed as e:
        msg = str(e)
        if "Expected target size" in msg or "Expected input batch_size" in msg:
            fail(msg + "\nF.cross_entropy wants the classes on axis 1: flatten to logits (B*L, V) "
                 "and labels (B*L,), or pass logits.transpose(1, 2) as (B, V, L).")
        if "must match" in msg or "doesn't match" in msg or "size" in msg:
            fail(msg + "\nThe logits and the labels must line up: the decoder input tgt[:, :-1] "
                 "and the labels tgt[:, 1:] both have Lt - 1 positions.")
        raise
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        fail(f"teacher_forcing_loss must return a scalar tensor (0-D, for .backward()); got "
             f"{loss.shape if isinstance(loss, torch.Tensor) else type(loss).__name__}.")
    return loss


def check_loss_value(teacher_forcing_loss, seed=0, pad_id=0):
    """The mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1], padding ignored."""
    model, src, tgt = _loss_setup(seed, pad_id)
    from ..reference import teacher_forcing_loss as ref_loss
    with torch.no_grad():
        expected = ref_loss(model, src, tgt)
    loss = _loss_call(teacher_forcing_loss, model, src, tgt)
    if not torch.allclose(loss.detach(), expected, atol=1e-5, rtol=1e-4):
        why = _match(loss.detach(), _loss_candidates(model, src, tgt, pad_id), atol=1e-5, rtol=1e-4)
        if why:
            fail(f"teacher_forcing_loss = {loss.item():.5f}, expected {expected.item():.5f} "
                 f"(pad_id={pad_id}): " + why)
        check_close(loss.detach(), expected, f"teacher_forcing_loss (pad_id={pad_id})",
                    "loss = F.cross_entropy(model(src, tgt[:, :-1]) flattened to (B*(Lt-1), V), "
                    "tgt[:, 1:] flattened, ignore_index=model.pad_id).")
    passed(f"teacher_forcing_loss: mean cross-entropy of the next target token, padding ignored "
           f"(pad_id={pad_id})")


def check_loss_padding(teacher_forcing_loss, seed=5, pad_id=3):
    """Extra pad columns change nothing; pad_id is read from the model, token 0 is ordinary."""
    model, src, tgt = _loss_setup(seed, pad_id)
    base = _loss_call(teacher_forcing_loss, model, src, tgt).detach()
    more = torch.cat([tgt, torch.full((tgt.size(0), 3), pad_id)], 1)
    wider = _loss_call(teacher_forcing_loss, model, src, more).detach()
    if not torch.allclose(base, wider, atol=1e-5, rtol=1e-4):
        cands = _loss_candidates(model, src, tgt, pad_id)
        why = _match(base, cands, atol=1e-5, rtol=1e-4)
        fail(f"three extra pad columns in tgt changed the loss from {base.item():.5f} to "
             f"{wider.item():.5f}: padding takes part in the loss. "
             + (why or "Ignore the labels equal to model.pad_id (ignore_index=model.pad_id)."))
    check_loss_value(teacher_forcing_loss, seed=seed, pad_id=pad_id)


def check_loss_gradient(teacher_forcing_loss, seed=9, pad_id=0):
    """The loss is a 0-D tensor whose gradient matches the reference for every parameter."""
    model, src, tgt = _loss_setup(seed, pad_id)
    from ..reference import teacher_forcing_loss as ref_loss
    model.zero_grad()
    ref_loss(model, src, tgt).backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    loss = _loss_call(teacher_forcing_loss, model, src, tgt)
    check_true(loss.requires_grad, "the loss does not require grad: it is cut off from the model "
               "(no torch.no_grad(), .item(), .detach() or torch.tensor(...) around it).")
    loss.backward()
    with torch.no_grad():
        value_ok = loss.shape == () and torch.allclose(
            loss.detach(), ref_loss(model, src, tgt).detach(), atol=1e-5, rtol=1e-4)
    hint = ("The value is right but not the gradient: compute the loss from the logits with "
            "differentiable operations." if value_ok else
            "The loss value is wrong too (see the other teacher_forcing_loss tests): fix it "
            "first; the gradient follows from the value.")
    for k, g in want.items():
        p = dict(model.named_parameters())[k]
        check_true(p.grad is not None, f"no gradient reached {k}.")
        check_close(p.grad, g, f"the gradient of the loss with respect to {k}", hint,
                    atol=1e-5, rtol=1e-3)
    passed("teacher_forcing_loss: a scalar whose gradients match for every parameter")


# --------------------------------------------------------------------------- label smoothing
LS = ("cross_entropy",)  # F.cross_entropy / nn.CrossEntropyLoss are blocked inside the exercise


def smoothed_target(target, V, smoothing):
    """(N, V) target distribution: (1 - smoothing) on the true class plus smoothing / V on every
    class (the true one included), as F.cross_entropy(label_smoothing=...) defines it."""
    return (1 - smoothing) * F.one_hot(target, V).double() + smoothing / V


def _ls_reference(logits, target, smoothing, ignore_index):
    V = logits.size(-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return F.cross_entropy(logits.detach().double().reshape(-1, V), target.reshape(-1),
                               label_smoothing=smoothing, ignore_index=ignore_index)


def _ls_candidates(logits, target, smoothing, ignore_index):
    """What the usual mistakes compute (float64)."""
    V = logits.size(-1)
    lg = logits.detach().double().reshape(-1, V)
    t = target.reshape(-1)
    keep = t != ignore_index
    safe = t.masked_fill(~keep, 0)
    logp = lg.log_softmax(-1)
    nll = -logp.gather(1, safe[:, None]).squeeze(1)
    uni = -logp.mean(-1)
    others = (-logp.sum(-1) - nll) / max(V - 1, 1)  # the mean over the V - 1 wrong classes
    q = smoothed_target(safe, V, smoothing)
    entropy = -(q * q.clamp_min(1e-300).log()).sum(-1)
    right = (1 - smoothing) * nll + smoothing * uni
    kf = keep.double()
    c = {
        "the smoothing mass is spread over the V - 1 wrong classes only (smoothing / (V - 1) each); "
        "PyTorch's label_smoothing gives smoothing / V to EVERY class, the true one included: "
        "target = (1 - smoothing) * one_hot + smoothing / V.":
            ((1 - smoothing) * nll + smoothing * others)[keep].mean(),
        "the true class's term is not multiplied by (1 - smoothing): "
        "loss = (1 - smoothing) * nll + smoothing * mean over classes of -log p.":
            (nll + smoothing * uni)[keep].mean(),
        "this is the KL divergence to the smoothed target, not the cross-entropy: the two differ "
        "by the target's entropy, a constant. Use -sum(target * log_softmax(logits)).":
            (right - entropy)[keep].mean(),
        "the mean runs over every position, the ignored ones included (counted as 0): divide by "
        "the number of positions whose target is not ignore_index.":
            (right * kf).sum() / t.numel(),
        "positions whose target is ignore_index take part in the loss: drop them "
        "(target != ignore_index) before averaging.": right.mean() if bool((t >= 0).all()) else None,
        "the loss is a sum, not a mean: average over the non-ignored positions.":
            right[keep].sum(),
        "the smoothing term uses the SUM of -log p over the classes, not the mean: each class "
        "gets smoothing / V of the target, so the term is smoothing * mean_c(-log p_c).":
            ((1 - smoothing) * nll + smoothing * (-logp.sum(-1)))[keep].mean(),
        "smoothing is ignored: the result is the plain cross-entropy.": nll[keep].mean(),
    }
    if logits.dim() == 3:  # (B, L, V): the softmax taken over the sequence axis
        lp1 = logits.detach().double().log_softmax(1)
        t3 = target.masked_fill(target == ignore_index, 0)
        nll1 = -lp1.gather(-1, t3.unsqueeze(-1)).squeeze(-1)
        c["the log-softmax is taken over axis 1, which for (B, L, V) logits is the sequence "
          "axis: the classes are on the LAST axis (dim=-1)."] = \
            ((1 - smoothing) * nll1 - smoothing * lp1.mean(-1))[target != ignore_index].mean()
    return {k: v for k, v in c.items() if v is not None}


def _ls_call(fn, logits, target, smoothing, ignore_index, what=None):
    what = what or (f"label_smoothing_cross_entropy(logits {tuple(logits.shape)}, target "
                    f"{tuple(target.shape)}, smoothing={smoothing}, ignore_index={ignore_index})")
    try:
        loss = call(fn, logits, target.clone(), smoothing=smoothing, ignore_index=ignore_index,
                    shortcuts=LS, what=what)
    except CheckFailed as e:
        msg = str(e)
        if "out of bounds" in msg or "out of range" in msg or "index" in msg.lower() and "-100" in msg:
            fail(msg + "\nA target equal to ignore_index (-100 by default) is not a class: gather "
                 "or one_hot with it fails. Replace the ignored targets by any valid class "
                 "(target.masked_fill(~keep, 0)) before gathering, and drop those rows after.")
        raise
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        fail(f"{what} must return a 0-D tensor (the mean loss); got "
             f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}.")
    return loss, what


def _ls_compare(loss, logits, target, smoothing, ignore_index, what, atol=1e-5, rtol=1e-4):
    expected = _ls_reference(logits, target, smoothing, ignore_index)
    if not torch.isfinite(loss).all():
        fail(f"{what} = {loss.item()}, expected {expected.item():.5f}. log(softmax(x)) underflows "
             "to log(0) = -inf for very negative logits (and softmax of huge logits overflows): "
             "use torch.log_softmax, which is stable.")
    if not torch.allclose(loss.detach().double(), expected, atol=atol, rtol=rtol):
        why = _match(loss.detach(), _ls_candidates(logits, target, smoothing, ignore_index),
                     atol=atol, rtol=rtol)
        if why:
            fail(f"{what} = {loss.item():.5f}, expected {expected.item():.5f}: {why}")
        check_close(loss.detach().double(), expected, what,
                    "Expected F.cross_entropy(logits, target, label_smoothing=smoothing, "
                    "ignore_index=ignore_index): (1 - smoothing) * (-log p_true) + smoothing * "
                    "mean_c(-log p_c), averaged over the non-ignored positions.", atol=atol,
                    rtol=rtol)


def _ls_inputs(seed, shape, V, scale=3.0, ignore_index=-100, n_ignored=2):
    with seeded(seed):
        logits = torch.randn(*shape, V) * scale
        target = torch.randint(0, V, shape)
        flat = target.view(-1)
        idx = torch.randperm(flat.numel())[:n_ignored]
        flat[idx] = ignore_index
    return logits, target


def check_ls_value(label_smoothing_cross_entropy, seed=0,
                   cases=(((12,), 7, 0.1, 3), ((2, 5), 9, 0.25, 0))):
    """Equal to F.cross_entropy(..., label_smoothing, ignore_index) on (N, V) and (B, L, V)
    logits. cases: (target shape, V, smoothing, ignore_index); ignore_index is a real class id
    here, and a few targets equal it."""
    for i, (shape, V, eps, ign) in enumerate(cases):
        logits, target = _ls_inputs(seed + i, shape, V, ignore_index=ign)
        loss, what = _ls_call(label_smoothing_cross_entropy, logits, target, eps, ign)
        _ls_compare(loss, logits, target, eps, ign, what)
    passed("label_smoothing_cross_entropy equals F.cross_entropy(label_smoothing=..., "
           "ignore_index=...) on " + ", ".join(f"{len(s) + 1}-D logits with smoothing {e}"
                                              for s, _, e, _ in cases))


def check_ls_ignore(label_smoothing_cross_entropy, seed=3):
    """The default ignore_index=-100 (not a class id), smoothing 0 and > 0, and the mean over the
    non-ignored positions only (more ignored positions change nothing)."""
    logits, target = _ls_inputs(seed, (3, 6), 8, ignore_index=-100, n_ignored=5)
    for eps in (0.0, 0.2):
        loss, what = _ls_call(label_smoothing_cross_entropy, logits, target, eps, -100)
        _ls_compare(loss, logits, target, eps, -100, what)
    wider_l = torch.cat([logits, torch.randn(3, 4, 8) * 3], 1)  # four more positions per row ...
    wider_t = torch.cat([target, torch.full((3, 4), -100)], 1)  # ... all of them ignored
    more, what = _ls_call(label_smoothing_cross_entropy, wider_l, wider_t, 0.2, -100)
    base, _ = _ls_call(label_smoothing_cross_entropy, logits, target, 0.2, -100)
    if not torch.allclose(more.detach(), base.detach(), atol=1e-5, rtol=1e-4):
        fail(f"{what}: appending 12 ignored positions changed the loss from {base.item():.5f} to "
             f"{more.item():.5f}. Ignored positions must not count, neither in the sum nor in the "
             "number you divide by.")
    passed("label_smoothing_cross_entropy: ignore_index=-100 by default, ignored positions "
           "excluded from the mean")


def check_ls_shapes(label_smoothing_cross_entropy, seed=5):
    """(B, L, V) logits give the same loss as the same values flattened to (B*L, V)."""
    logits, target = _ls_inputs(seed, (4, 3), 6, ignore_index=-100)
    a, what = _ls_call(label_smoothing_cross_entropy, logits, target, 0.1, -100)
    b, _ = _ls_call(label_smoothing_cross_entropy, logits.reshape(-1, 6), target.reshape(-1), 0.1,
                    -100)
    if not torch.allclose(a.detach(), b.detach(), atol=1e-5, rtol=1e-4):
        fail(f"{what} = {a.item():.5f}, but the same logits flattened to (12, 6) give "
             f"{b.item():.5f}. With (B, L, V) logits the classes are on the LAST axis: take "
             "log_softmax over dim=-1 (or flatten to (B*L, V) first).")
    _ls_compare(a, logits, target, 0.1, -100, what)
    passed("label_smoothing_cross_entropy: (B, L, V) and (B*L, V) logits give the same loss")


def check_ls_stable(label_smoothing_cross_entropy, seed=7):
    """Logits of size 100 and more give a finite, correct loss (log_softmax, not log(softmax))."""
    logits, target = _ls_inputs(seed, (10,), 5, scale=150.0, ignore_index=-100, n_ignored=1)
    loss, what = _ls_call(label_smoothing_cross_entropy, logits, target, 0.1, -100,
                          what="label_smoothing_cross_entropy(logits of size ~150, smoothing=0.1)")
    _ls_compare(loss, logits, target, 0.1, -100, what, rtol=1e-4)
    passed("label_smoothing_cross_entropy is finite and right for logits of size ~150")


def check_ls_gradient(label_smoothing_cross_entropy, seed=9):
    """The gradient with respect to the logits is softmax(logits) - smoothed target, averaged."""
    logits, target = _ls_inputs(seed, (2, 4), 6, ignore_index=-100)
    mine = logits.clone().requires_grad_(True)
    loss, what = _ls_call(label_smoothing_cross_entropy, mine, target, 0.15, -100)
    check_true(loss.requires_grad, f"{what} does not require grad: keep the computation "
               "differentiable (no .item(), .detach(), torch.no_grad() or torch.tensor(...)).")
    loss.backward()
    ref = logits.clone().double().requires_grad_(True)
    F.cross_entropy(ref.reshape(-1, 6), target.reshape(-1), label_smoothing=0.15).backward()
    check_true(mine.grad is not None, "no gradient reached the logits.")
    check_close(mine.grad, ref.grad.float(), "the gradient of the loss with respect to the logits",
                "The value is right but not the gradient: compute the loss with differentiable "
                "tensor operations.", atol=1e-5, rtol=1e-3)
    passed("label_smoothing_cross_entropy: gradient = (softmax - smoothed target) / #positions")


def check_ls_against_torch(label_smoothing_cross_entropy, seed=0,
                           cases=(((6,), 5, 0.3, -100, 1),), dtype=torch.float32):
    """Random cases against F.cross_entropy. cases: (target shape, V, smoothing, ignore_index,
    number of ignored positions)."""
    for i, (shape, V, eps, ign, n_ign) in enumerate(cases):
        logits, target = _ls_inputs(seed + i, shape, V, ignore_index=ign, n_ignored=n_ign)
        logits = logits.to(dtype)
        loss, what = _ls_call(label_smoothing_cross_entropy, logits, target, eps, ign)
        _ls_compare(loss, logits, target, eps, ign, what)
    passed(f"label_smoothing_cross_entropy matches F.cross_entropy on {len(cases)} random case(s)")


# --------------------------------------------------------------------------- greedy decoding
class ScriptedModel(nn.Module):
    """A stand-in model whose next token is known by hand: after BOS it spells the source's
    non-pad tokens in reverse, then EOS, then keeps saying `after` (a token that must NOT
    appear in the output: rows are padded after their EOS). A source that contains
    `endless` never produces EOS. It offers encode, decode, generator and forward like the
    Transformer; the answer depends only on the source row and the position."""

    def __init__(self, vocab=10, pad_id=0, eos_id=2, after=5, endless=None):
        super().__init__()
        self.vocab, self.pad_id, self.eos_id, self.after = vocab, pad_id, eos_id, after
        self.endless = endless
        self.generator = nn.Linear(vocab, vocab)
        with torch.no_grad():
            self.generator.weight.copy_(torch.eye(vocab))
            self.generator.bias.zero_()

    def script(self, row_tokens):
        toks = [t for t in row_tokens if t != self.pad_id][::-1]
        return toks + ([] if self.endless in toks else [self.eos_id])

    def encode(self, src, src_mask=None):
        return F.one_hot(src, self.vocab).float()  # (B, Ls, V): the memory carries the source

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        B, T = tgt.shape
        src = memory.argmax(-1)
        states = torch.zeros(B, T, self.vocab)
        for b in range(B):
            s = self.script(src[b].tolist())
            for t in range(T):
                states[b, t, s[t] if t < len(s) else self.after] = 10.0
        return states

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.generator(self.decode(tgt, self.encode(src)))


def _greedy_call(fn, model, src, max_len, bos, eos):
    model.eval()
    try:
        with seeded(1234):  # deterministic even if the code samples
            out = call(fn, model, src, max_len, bos, eos, shortcuts=TF,
                       what=f"greedy_decode(model, src, max_len={max_len}, bos_id={bos}, eos_id={eos})")
    except CheckFailed as e:
        if any(k in str(e) for k in ("converted to Scalar", "only one element tensors",
                                       "more than one value is ambiguous")):
            fail(f"{e}\nThe code assumes a batch of one row (.item() or int() on a tensor with B "
                 "entries). Work on the whole batch at once: argmax(-1) gives one token per row, "
                 "and a boolean `done` vector tracks which rows have finished.")
        raise
    if not isinstance(out, torch.Tensor):
        fail(f"greedy_decode returned {type(out).__name__}; it must return a (B, T) LongTensor.")
    check_true(out.dtype == torch.long, f"greedy_decode returned dtype {out.dtype}; token ids are "
               "torch.long (argmax gives long; torch.full(..., dtype=torch.long) for the BOS column).")
    check_true(out.dim() == 2 and out.size(0) == src.size(0),
               f"greedy_decode returned shape {tuple(out.shape)}; expected (B, T) with B = "
               f"{src.size(0)}, one row per source sequence.")
    return out


def _explain_greedy(out, expected, pad_id, bos, eos, max_len, extra=None):
    """Name the mistake behind a wrong greedy output (expected: the right (B, T) tensor)."""
    B = expected.size(0)
    if out.size(1) > max_len:
        return (f"the output has {out.size(1)} columns, more than max_len={max_len}. max_len counts "
                "the BOS column: generate at most max_len - 1 tokens.")
    if not (out[:, 0] == bos).all():
        if out.size(1) + 1 >= expected.size(1) and torch.equal(out[:, : expected.size(1) - 1],
                                                               expected[:, 1:out.size(1) + 1]):
            return "the BOS column is missing: the output starts with bos_id, then the tokens."
        return f"the rows do not start with bos_id={bos}: begin the output with the BOS column."
    if out.size(1) > expected.size(1):
        tail = out[:, expected.size(1):]
        if (tail == pad_id).all() and torch.equal(out[:, : expected.size(1)], expected):
            return (f"decoding went on to {out.size(1)} columns after every row had produced EOS "
                    f"(the longest row needs {expected.size(1)}): stop as soon as all rows are "
                    "finished, e.g. `if done.all(): break`.")
    if out.size(1) == max_len - 1 and expected.size(1) == max_len:
        return (f"the output stops at {out.size(1)} columns, one short of max_len={max_len}: a row "
                "that never produces EOS grows until T == max_len, BOS included (max_len - 1 "
                "generated tokens).")
    if out.size(1) < expected.size(1):
        return (f"decoding stopped after {out.size(1)} columns but some rows need "
                f"{expected.size(1)}: stop only when EVERY row has produced EOS (done.all(), not "
                "done.any()); finished rows receive padding meanwhile.")
    T = min(out.size(1), expected.size(1))
    o, e = out[:, :T], expected[:, :T]
    after_eos = torch.zeros_like(e, dtype=torch.bool)
    for b in range(B):
        hits = (e[b] == eos).nonzero()
        if len(hits):
            after_eos[b, int(hits[0]) + 1:] = True
    if torch.equal(o[~after_eos], e[~after_eos]):
        if (o[after_eos] == 0).all() and pad_id != 0:
            return (f"the positions after EOS hold 0, but this model's pad_id is {pad_id}: pad "
                    "with model.pad_id.")
        if (o[after_eos] == eos).all():
            return ("the positions after a row's EOS repeat EOS; they must hold model.pad_id.")
        return ("the tokens up to each row's first EOS are right, but the positions after it are "
                "not padding: once a row has produced EOS, append model.pad_id to it (e.g. "
                "next_token.masked_fill(done, model.pad_id)).")
    for hint, cand in (extra or {}).items():
        if cand is not None and cand.shape == out.shape and torch.equal(cand, out):
            return hint
    return None


def _show(t):
    return "\n".join("    " + " ".join(f"{v:2d}" for v in row) for row in t.tolist())


def _compare(out, expected, pad_id, bos, eos, max_len, what, extra=None):
    if out.shape == expected.shape and torch.equal(out, expected):
        return
    why = _explain_greedy(out, expected, pad_id, bos, eos, max_len, extra)
    fail(f"greedy_decode is wrong on {what}.\n  yours {tuple(out.shape)}:\n{_show(out)}\n"
         f"  expected {tuple(expected.shape)}:\n{_show(expected)}\n"
         + (why or "Each step: run the decoder on the prefix so far, take the logits of the LAST "
            "position, argmax over the vocabulary, append; finished rows get model.pad_id."))


def _scripted_expected(model, src, max_len, bos):
    rows = []
    for b in range(src.size(0)):
        s = model.script(src[b].tolist())
        s = s + [model.after] * max_len if s[-1] != model.eos_id else s
        rows.append(([bos] + s)[:max_len])
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), model.pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r)
    return out


def _scripted_wrong(model, src, max_len, bos, eos):
    """What the common mistakes return on the scripted model."""
    B = src.size(0)
    scripts = [model.script(src[b].tolist()) for b in range(B)]
    first = torch.tensor([[bos] + [s[0]] * (max_len - 1) for s in scripts])  # logits[:, 0]
    return {"each step took the logits of the FIRST position (logits[:, 0]); the next token comes "
            "from the LAST position, logits[:, -1].": first}


def check_greedy_scripted(greedy_decode, pad_id=0, bos=1, eos=2):
    """On a model whose answer is known by hand: BOS first, the argmax of the last position each
    step, one EOS per row, padding after it, and a stop once every row is finished."""
    V = 10
    after = 5 if pad_id != 5 else 6
    model = ScriptedModel(V, pad_id=pad_id, eos_id=eos, after=after)
    toks = [t for t in range(V) if t not in (pad_id, bos, eos, after)]
    rows = [[toks[0], toks[1], toks[2]], [toks[3]], [toks[4], toks[1], toks[3], toks[0], toks[2]]]
    L = max(len(r) for r in rows)
    src = torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
    max_len = 12
    expected = _scripted_expected(model, src, max_len, bos)  # rows of 5, 3 and 7 tokens
    out = _greedy_call(greedy_decode, model, src, max_len, bos, eos)
    try:
        _compare(out, expected, pad_id, bos, eos, max_len,
                 f"a batch of 3 rows that finish after 5, 3 and 7 tokens (pad_id={pad_id})",
                 _scripted_wrong(model, src, max_len, bos, eos))
    except CheckFailed as e:
        goes_on = isinstance(out, torch.Tensor) and out.dim() == 2 and any(
            bool((r[1:] == eos).any()) and bool(
                (r[1:][int((r[1:] == eos).nonzero()[0]) + 1:] != pad_id).any()) for r in out)
        if eos == 0 and goes_on:
            raise CheckFailed(f"{e}\nHere eos_id=0, an id as valid as any other, and the rows "
                              "do not stop at it: a test such as `if eos_id:` (False for 0) "
                              "treats it as no end token. Compare ids (== eos_id), and test "
                              "`eos_id is not None` where None is allowed.") from None
        raise
    one = _greedy_call(greedy_decode, model, src[1:2, :1], max_len, bos, eos)
    _compare(one, expected[1:2, :3], pad_id, bos, eos, max_len, "a batch of one row")
    passed(f"greedy_decode: BOS first, one EOS per row, {'pad' if pad_id == 0 else f'pad_id={pad_id}'} "
           "after it, stops once all rows are done")


def check_greedy_max_len(greedy_decode, pad_id=0, bos=1, eos=2):
    """T <= max_len: a row that never says EOS stops at max_len; max_len=1 gives BOS only."""
    V = 10
    model = ScriptedModel(V, pad_id=pad_id, eos_id=eos, after=6, endless=9)
    src = torch.tensor([[3, 4, 7, 8, 9], [8, 3, pad_id, pad_id, pad_id]])  # row 0 never ends
    for max_len in (9, 4, 1):
        expected = _scripted_expected(model, src, max_len, bos)
        out = _greedy_call(greedy_decode, model, src, max_len, bos, eos)
        _compare(out, expected, pad_id, bos, eos, max_len,
                 f"max_len={max_len} with a row that never produces EOS",
                 _scripted_wrong(model, src, max_len, bos, eos))
    passed("greedy_decode: never longer than max_len (BOS included), even when a row never ends")


def _slow_greedy(model, src, max_len, bos, eos):
    """The hand computation: one row at a time, the row without its padding, no batching."""
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            s = src[b:b + 1, src[b] != model.pad_id]
            ys = [bos]
            while len(ys) < max_len:
                logits = model(s, torch.tensor([ys]))[0, -1]
                ys.append(int(logits.argmax()))
                if ys[-1] == eos:
                    break
            rows.append(ys)
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), model.pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r)
    return out


def _wrong_greedy(model, src, max_len, bos, eos, src_masked=True, causal=True):
    from ..reference.masks import make_padding_mask
    with torch.no_grad():
        sm = make_padding_mask(src, model.pad_id) if src_masked else None
        mem = model.encode(src, sm)
        ys = torch.full((src.size(0), 1), bos, dtype=torch.long)
        done = torch.zeros(src.size(0), dtype=torch.bool)
        while ys.size(1) < max_len:
            tm = make_causal_mask(ys.size(1)) if causal else None
            nxt = model.generator(model.decode(ys, mem, sm, tm)[:, -1]).argmax(-1)
            nxt = nxt.masked_fill(done, model.pad_id)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done |= nxt == eos
            if done.all():
                break
    return ys


def _small_model(seed, V, d, H, n, d_ff, pad_id, eos, nudge):
    """A small reference Transformer with fixed weights. `nudge` raises the EOS logit so that,
    for the test's source batch, some rows stop early and others run to max_len."""
    with seeded(seed):
        model = RefTransformer(V, V, d, H, n, d_ff, pad_id=pad_id).eval()
    with torch.no_grad():
        model.generator.weight.mul_(2.0)  # spread the logits: no near-ties in the argmax
        model.generator.bias[eos] += nudge
        model.generator.bias[pad_id] -= 10.0  # the model never proposes the pad token
    return model


GREEDY_CASE = (0, 13, 32, 4, 2, 64, 0, 1, 2, 3.5)  # rows of 3, 4, 9 and 9 tokens


def check_greedy_against_reference(greedy_decode, cases=(GREEDY_CASE,)):
    """A small Transformer with fixed weights and a padded batch: the same tokens as decoding
    each row on its own by hand. Case: (seed, V, d, H, n_layers, d_ff, pad_id, bos, eos, nudge)."""
    for seed, V, d, H, n, d_ff, pad_id, bos, eos, nudge in cases:
        low = max(pad_id, bos, eos) + 1
        src = _tokens(seed + 50, 4, 7, V, pad_id, lengths=[7, 3, 5, 1], low=low)
        max_len = 9
        model = _small_model(seed, V, d, H, n, d_ff, pad_id, eos, nudge)
        expected = _slow_greedy(model, src, max_len, bos, eos)
        out = _greedy_call(greedy_decode, model, src, max_len, bos, eos)
        extra = {
            "the source padding is not masked: build src_mask = make_padding_mask(src, "
            "model.pad_id) and pass it to encode AND decode (or call model(src, prefix), which "
            "builds the masks).": _wrong_greedy(model, src, max_len, bos, eos, src_masked=False),
            "the decoder ran without the causal mask: with two layers the last position's result "
            "depends on it. Pass tgt_mask=make_causal_mask(T) to decode (or call model(src, "
            "prefix)).": _wrong_greedy(model, src, max_len, bos, eos, causal=False),
        }
        _compare(out, expected, pad_id, bos, eos, max_len,
                 f"a small Transformer with fixed weights ({n} layers, pad_id={pad_id}, bos={bos}, "
                 f"eos={eos})", extra)
    passed(f"greedy_decode: matches decoding each row by hand on {len(cases)} fixed model(s)")
