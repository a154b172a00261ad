"""06_blocks: what the grader runs on the student's `FeedForward`, `EncoderLayer`,
`DecoderLayer`, `Encoder` and `Decoder`, on inputs drawn for each grading run.

Every module is built with the exercise's constructor and given the reference's (perturbed)
parameters by name, so a wrong structure (a missing bias, a swapped or shared LayerNorm, one
attention used twice, layers in a Python list or `[layer] * n`) fails to load, and a wrong
forward gives other values. Values are compared in eval mode (also with dropout > 0: dropout
must be off there) for both norm placements. Train-mode dropout cannot be compared with the
reference (the masks differ between implementations): those probes feed two identical batch
rows and require that their outputs differ (dropout active), see `_dropout_active`.
"""

ASSIGNMENT = "06_blocks"
import numpy as np
import torch

from .engine import ATOL, RTOL, Exercise, Probe, _compare_key, call, ctor, given, randn


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
        return _compare_key(key, g, w, plain)
    return compare


# -- the table ------------------------------------------------------------------------------

_REF = "reference"
_STACK_ATOL = 2e-5   # several layers deep (the checks' tolerance too)


def _pm(nf):
    return "pre-norm" if nf else "post-norm"


def _enc_matches(nf, B, L, d, H, d_ff, name):
    x, m = _pad_pair(B, L, d)
    return Probe(f"{name} {_pm(nf)}", ("test_EncoderLayer_matches_torch",),
                 [call(x, m)], make=ctor(d, H, d_ff, norm_first=nf), load=_REF, mode="eval",
                 what=f"{_pm(nf)} (norm_first={nf}), d_model={d}, n_heads={H}, d_ff={d_ff}, "
                      f"with a padding mask")


def _enc_padding(nf):
    B, L, d, H, d_ff = 2, 7, 16, 4, 32
    x, m = _pad_pair(B, L, d)
    return Probe(f"padding {_pm(nf)}", ("test_EncoderLayer_padding",),
                 [call(x, m), call(_x(B, L, d), _decoder_mask(B, L)), call(_x(B, L, d), _causal(L)),
                  call(_x(1, 4, d), None)],
                 make=ctor(d, H, d_ff, norm_first=nf), load=_REF, mode="eval",
                 what=f"{_pm(nf)}: src_mask of shapes (B, 1, L) with large padded values, "
                      "(B, L, L) and (L, L), and no mask")


def _dec_matches(nf, B, Lt, Ls, d, H, d_ff, batch_tgt, name):
    mem, sm = _pad_pair(B, Ls, d)
    tm = _causal_b(B, Lt) if batch_tgt else _causal(Lt)
    return Probe(f"{name} {_pm(nf)}", ("test_DecoderLayer_matches_torch",),
                 [call(_x(B, Lt, d), mem, sm, tm)], make=ctor(d, H, d_ff, norm_first=nf),
                 load=_REF, mode="eval",
                 what=f"{_pm(nf)} (norm_first={nf}), Lt={Lt}, Ls={Ls}, d_model={d}, n_heads={H}, "
                      f"with a causal tgt_mask{' (B, Lt, Lt)' if batch_tgt else ''} and a padded "
                      "src_mask")


def _enc_stack(nf, n, B, L, d, H, d_ff, name):
    x, m = _pad_pair(B, L, d)
    return Probe(f"{name} {_pm(nf)}", ("test_Encoder_matches_torch",), [call(x, m)],
                 make=ctor(n, d, H, d_ff, norm_first=nf), load=_REF, mode="eval",
                 atol=_STACK_ATOL,
                 what=f"{n} layers, {_pm(nf)} (norm_first={nf}), d_model={d}, n_heads={H}, "
                      "with a padding mask")


def _dec_stack(nf, n, B, Lt, Ls, d, H, d_ff, batch_tgt, name):
    mem, sm = _pad_pair(B, Ls, d)
    tm = _causal_b(B, Lt) if batch_tgt else _causal(Lt)
    return Probe(f"{name} {_pm(nf)}", ("test_Decoder_matches_torch",),
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


EXERCISES = [
    Exercise("FeedForward", ref="blocks.FeedForward", probes=[
        Probe("structure", ("test_FeedForward_structure",), [call(_x(2, 5, 8))],
              make=ctor(8, 20), load=_REF, params=True,
              what="FeedForward(8, 20): linear1, linear2 with biases, on x (2, 5, 8)"),
        Probe("values", ("test_FeedForward_values",),
              [call(_x(3, 7, 12, scale=2.0)), call(randn(9, 12)), call(_x(1, 1, 12))],
              make=ctor(12, 50), load=_REF, mode="eval",
              what="FeedForward(12, 50) on (3, 7, 12), (9, 12) and (1, 1, 12) inputs"),
        Probe("narrow", ("test_FeedForward_values",), [call(randn(2, 3, 4, 20, scale=2.0))],
              make=ctor(20, 8), load=_REF, mode="eval",
              what="FeedForward(20, 8) (d_ff < d_model) on a 4-D input"),
        Probe("dropout eval", ("test_FeedForward_dropout",),
              [call(_x(3, 6, 8)), call(_x(2, 4, 8))],
              make=ctor(8, 32, dropout=0.5), load=_REF, mode="eval",
              what="eval mode with dropout=0.5 (dropout must be off)"),
        Probe("dropout train", ("test_FeedForward_dropout",), [call(_twins(6, 8))],
              make=ctor(8, 32, dropout=0.5), load=_REF, mode="train",
              compare=_dropout_active(0.5, "apply nn.Dropout(dropout) to the hidden activations"),
              what="train mode with dropout=0.5"),
        Probe("no dropout train", ("test_FeedForward_dropout",), [call(_x(3, 6, 8))],
              make=ctor(8, 24), load=_REF, mode="train",
              what="train mode with the default dropout=0.0"),
    ]),
    Exercise("EncoderLayer", ref="blocks.EncoderLayer", probes=[
        Probe("structure", ("test_EncoderLayer_structure",), [call(_x(2, 5, 16))],
              make=ctor(16, 4, 40), load=_REF, params=True, mode="eval",
              what="EncoderLayer(16, 4, 40): self_attn, ff, norm1, norm2, on x (2, 5, 16)"),
        _enc_matches(False, 3, 9, 24, 6, 40, "large"),
        _enc_matches(True, 3, 9, 24, 6, 40, "large"),
        _enc_matches(False, 1, 4, 12, 3, 20, "small"),
        _enc_matches(True, 2, 6, 12, 3, 20, "small"),
        _enc_padding(False),
        _enc_padding(True),
        Probe("fully masked row", ("test_EncoderLayer_padding",),
              [call(_x(2, 5, 16), _with_dead_row(2, 5, 1, 2))],
              make=ctor(16, 4, 32, norm_first=True), load=_REF, mode="eval",
              compare=_skip_rows([(1, 2)]),
              what="a (B, L, L) src_mask with a fully masked query row"),
        *[Probe(f"dropout eval {_pm(nf)}", ("test_EncoderLayer_dropout",),
                [call(*_pad_pair(2, 5, 16)), call(_x(2, 5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)} in eval mode with dropout=0.3") for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("test_EncoderLayer_dropout",),
                [call(_twins(5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass it to the attention and the feed-forward "
                                             "network, and drop each sub-layer's output"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
    Exercise("DecoderLayer", ref="blocks.DecoderLayer", probes=[
        Probe("structure", ("test_DecoderLayer_structure",), [call(_x(2, 5, 16), _x(2, 7, 16))],
              make=ctor(16, 4, 40), load=_REF, params=True, mode="eval",
              what="DecoderLayer(16, 4, 40): self_attn, cross_attn, ff, norm1..3, on x (2, 5, 16) "
                   "and memory (2, 7, 16)"),
        _dec_matches(False, 3, 6, 4, 24, 6, 40, False, "large"),
        _dec_matches(True, 3, 6, 4, 24, 6, 40, False, "large"),
        _dec_matches(False, 2, 5, 8, 12, 2, 20, True, "small"),
        _dec_matches(True, 2, 5, 8, 12, 2, 20, True, "small"),
        *[Probe(f"causal {_pm(nf)}", ("test_DecoderLayer_causal",),
                [call(_x(2, 6, 16), _x(2, 4, 16), None, _causal(6)),
                 call(_x(2, 6, 16), _x(2, 4, 16), None, _causal_b(2, 6))],
                make=ctor(16, 4, 32, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)} with a causal tgt_mask (Lt, Lt) and (B, Lt, Lt), no src_mask")
          for nf in (False, True)],
        *[_dec_same_lengths(nf, "same lengths", ("test_DecoderLayer_causal",
                                                 "test_DecoderLayer_memory"))
          for nf in (False, True)],
        *[Probe(f"memory {_pm(nf)}", ("test_DecoderLayer_memory",),
                [call(_x(2, 5, 16), *_pad_pair(2, 6, 16)), call(_x(1, 3, 16), _x(1, 5, 16))],
                make=ctor(16, 4, 32, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)}: memory with large values at padded positions and a padded "
                     "src_mask, no tgt_mask; and no masks at all")
          for nf in (False, True)],
        *[Probe(f"dropout eval {_pm(nf)}", ("test_DecoderLayer_dropout",),
                [call(_x(2, 4, 16), *_pad_pair(2, 5, 16), _causal(4)), call(_x(2, 4, 16), _x(2, 5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                what=f"{_pm(nf)} in eval mode with dropout=0.3") for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("test_DecoderLayer_dropout",),
                [call(_twins(4, 16), _twins(5, 16))],
                make=ctor(16, 2, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass it to the attentions and the feed-forward "
                                             "network, and drop each sub-layer's output"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
    Exercise("Encoder", ref="blocks.Encoder", probes=[
        *[Probe(f"structure {n}", ("test_Encoder_structure",), [call(_x(2, 5, 16))],
                make=ctor(n, 16, 4, 32), load=_REF, params=True, mode="eval", atol=_STACK_ATOL,
                what=f"Encoder({n}, 16, 4, 32): n_layers distinct layers in an nn.ModuleList "
                     "and a final norm")
          for n in (3, 1)],
        _enc_stack(False, 3, 3, 7, 24, 6, 40, "deep"),
        _enc_stack(True, 3, 3, 7, 24, 6, 40, "deep"),
        _enc_stack(False, 1, 1, 5, 12, 2, 20, "one layer"),
        _enc_stack(True, 2, 2, 6, 12, 2, 20, "two layers"),
        *[Probe(f"padding eval {_pm(nf)}", ("test_Encoder_padding_dropout",),
                [call(*_pad_pair(2, 6, 16)), call(_x(2, 6, 16), _causal(6))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                atol=_STACK_ATOL,
                what=f"{_pm(nf)} in eval mode with dropout=0.3: a padding mask with large padded "
                     "values, and an (L, L) mask")
          for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("test_Encoder_padding_dropout",),
                [call(_twins(6, 16))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass dropout on to every layer"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
    Exercise("Decoder", ref="blocks.Decoder", probes=[
        *[Probe(f"structure {n}", ("test_Decoder_structure",), [call(_x(2, 5, 16), _x(2, 7, 16))],
                make=ctor(n, 16, 4, 32), load=_REF, params=True, mode="eval", atol=_STACK_ATOL,
                what=f"Decoder({n}, 16, 4, 32): n_layers distinct layers in an nn.ModuleList "
                     "and a final norm")
          for n in (3, 1)],
        _dec_stack(False, 3, 3, 6, 4, 24, 6, 40, False, "deep"),
        _dec_stack(True, 3, 3, 6, 4, 24, 6, 40, True, "deep"),
        _dec_stack(False, 2, 2, 5, 7, 16, 4, 32, True, "two layers"),
        _dec_stack(True, 1, 1, 7, 3, 12, 2, 20, False, "one layer"),
        *[_dec_same_lengths(nf, "same lengths", ("test_Decoder_causal_memory",), n=2)
          for nf in (False, True)],
        *[Probe(f"eval dropout {_pm(nf)}", ("test_Decoder_causal_memory",),
                [call(_x(2, 5, 16), *_pad_pair(2, 6, 16), _causal_b(2, 5)),
                 call(_x(2, 5, 16), _x(2, 6, 16), None, _causal(5))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="eval",
                atol=_STACK_ATOL,
                what=f"{_pm(nf)} in eval mode with dropout=0.3: causal tgt_mask, padded memory")
          for nf in (False, True)],
        *[Probe(f"dropout train {_pm(nf)}", ("test_Decoder_causal_memory",),
                [call(_twins(5, 16), _twins(6, 16), None, _causal(5))],
                make=ctor(2, 16, 4, 32, dropout=0.3, norm_first=nf), load=_REF, mode="train",
                compare=_dropout_active(0.3, "pass dropout on to every layer"),
                what=f"{_pm(nf)} in train mode with dropout=0.3") for nf in (False, True)],
    ]),
]
