"""05_positional_encoding: what the grader runs on the student's
`sinusoidal_positional_encoding`, `pe_shift_matrix` and `PositionalEncoding`, on inputs drawn
for each grading run.

- Tables and the values a `PositionalEncoding` adds are compared with a float32-appropriate
  tolerance that grows with the position (a float32 angle loses about 1e-7 * pos, as the
  checks allow: atol 1e-5 + 4e-7 * pos), and must be float32 (a float64 table upcasts the
  whole model downstream), see `_close_by_position`.
- `PositionalEncoding.pe` is read with `get_buffer` where the buffer cell asks for a
  registered buffer (a plain attribute, a parameter or no table at all fails), as an
  attribute elsewhere; it may be `(max_len, d)`, `(1, max_len, d)` or `(max_len, 1, d)`:
  it is compared after reshaping to `(max_len, d)`, see `_buffer`.
  The buffer probe first asks `get_parameter('pe')`, which must raise: a table kept as an
  nn.Parameter and one kept as a plain attribute fail `get_buffer` alike, and this tells the
  diagnoses which it is.
- Dropout is compared in eval mode; in train mode (`_dropout`) only what every correct
  implementation shares is required: about p of the outputs are 0, and wherever both the
  student's and the reference's outputs are kept they are equal ((x + pe) / (1 - p)).
- An input longer than `max_len` must raise (any exception): only the probes of
  `test_PositionalEncoding_max_len` try one.
- Diagnoses: the wrong tables, shift matrices and forwards written once in float64
  (`_pe64`, `_shift64`), plus what an error or the dropout statistics say.
"""

ASSIGNMENT = "05_positional_encoding"
import math
import re

import numpy as np
import torch

from .engine import (ATOL, Exercise, Probe, RTOL, batch, call, ctor, grades, label, like,
                     part, randn, shapes, variants, when)


# -- special comparisons --------------------------------------------------------------------

def _dtype(key, got, want):
    if want.dtype == np.float32 and got.dtype != want.dtype:
        return (f"{label(key)} has dtype {got.dtype}, expected float32: build the table in "
                "float32 (or compute in float64 and return .float()); a float64 table upcasts "
                "everything it is added to")
    return None


def _f32(key, got, want):
    """The default comparison, float32 required."""
    return _dtype(key, got, want) or "default"


def _close_by_position(key, got, want, atol=ATOL, rtol=RTOL, per_pos=4e-7, dtype=True):
    """Values whose axis -2 is the position (tables (L, d), activations (B, L, d)): the
    tolerance grows with the position, as float32 angles drift. `dtype`: float32 required."""
    msg = _dtype(key, got, want) if dtype else None
    if msg or key.endswith(".raised") or want.dtype.kind != "f":
        return msg or "default"
    if got.shape != want.shape:
        return "default"
    g, w = got.astype(np.float64), want.astype(np.float64)
    pos = np.arange(w.shape[-2]).reshape(-1, 1) if w.ndim >= 2 else np.zeros(1)
    tol = atol + per_pos * pos + rtol * np.abs(w)
    diff = np.abs(g - w)
    bad = ~(diff <= tol)          # NaN counts as bad
    if not bad.any():
        return None
    over = np.where(bad, np.nan_to_num(diff, nan=np.inf), 0.0)
    at = tuple(int(i) for i in np.unravel_index(np.argmax(over), over.shape))
    where = f"position {at[-2]}, dimension {at[-1]}" if w.ndim >= 2 else f"index {at}"
    return (f"{label(key)} differs from the expected values at {where}: got {g[at]:.6g}, "
            f"expected {w[at]:.6g} ({int(bad.sum())} of {bad.size} values outside "
            f"{atol:g} + {per_pos:g} * position)")


def _values_by_position(key, got, want):
    """`_close_by_position` without the dtype requirement (charged by other cells)."""
    return _close_by_position(key, got, want, dtype=False)


def _buffer(*buffer_calls, dtype=True, skip=()):
    """`get_buffer('pe')` calls (by index) and `after=("pe",)` may return any of the three
    allowed layouts; the table's values are compared, not its dtype (the forward's output
    dtype is, if `dtype`).
    Outputs of the calls in `skip` are not compared (a forward that only has to run)."""
    def compare(key, got, want):
        parts = key.split(".")
        if len(parts) >= 3 and parts[1].isdigit() and int(parts[1]) in skip:
            return None
        table = (len(parts) == 3 and parts[2] == "out" and int(parts[1]) in buffer_calls) \
            or key.endswith(".after.pe")
        if table:
            max_len, d = want.shape
            if tuple(got.shape) not in ((max_len, d), (1, max_len, d), (max_len, 1, d)):
                return (f"`pe` has shape {tuple(got.shape)}; expected (max_len, d_model) = "
                        f"{(max_len, d)}, (1, max_len, d_model) or the sequence-first "
                        f"(max_len, 1, d_model): one row per position")
            return _close_by_position(f"{parts[0]}.after.pe", got.reshape(max_len, d), want,
                                      dtype=False)
        return _close_by_position(key, got, want, dtype=dtype)
    return compare


def _dropout(p):
    """Train mode with dropout p: the masks of two correct implementations differ, so the
    comparison asks for about p zeros, and equal values wherever both kept the output."""
    def compare(key, got, want):
        msg = _dtype(key, got, want)
        if msg or not key.endswith(".out"):
            return msg or "default"
        if got.shape != want.shape:
            return "default"
        zeros = float((got == 0).mean())
        if not (p - 0.15 <= zeros <= p + 0.15):
            return (f"in train mode {zeros:.0%} of {label(key)} is 0; with dropout={p} about "
                    f"{p:.0%} should be (dropout acts on x + pe[:L], through an nn.Dropout "
                    "that follows model.train())")
        both = (got != 0) & (want != 0)
        if not both.any():
            return None
        g, w = got[both].astype(np.float64), want[both].astype(np.float64)
        if not np.allclose(g, w, atol=1e-4, rtol=1e-4):
            i = int(np.argmax(np.abs(g - w)))
            return (f"the outputs kept by dropout are not (x + pe[:L]) / (1 - p): got "
                    f"{g[i]:.6g}, expected {w[i]:.6g} (dropout belongs on the sum, "
                    "dropout(x + pe[:L]), inverted scaling as nn.Dropout)")
        return None
    return compare


# -- inputs ---------------------------------------------------------------------------------

def _x(B, L, d, scale=1.0):
    return randn(B, L, d, scale=scale)


def _random_pe(name, shape, kwargs, with_table, what):
    """A probe of the hidden `random` cell: PositionalEncoding(d, **kwargs) in eval mode on a
    random (B, L, d) input (x3), and its table (`after=("pe",)`) when `with_table`."""
    return Probe(name, ("random",), [call(_x(*shape, scale=3.0))],
                 after=("pe",) if with_table else (), make=ctor(shape[-1], **kwargs), mode="eval",
                 compare=_buffer() if with_table else _close_by_position, what=what)


def _forward_checked(B, L, d):
    """A forward whose input gradient is compared too (it equals the upstream gradient): an
    in-place add on x, or a forward under no_grad, fails here."""
    return call(_x(B, L, d), grad=(0,), backward=randn(B, L, d))


# -- diagnoses ------------------------------------------------------------------------------

def _close(a, b, atol=1e-4, rtol=1e-3):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))


def _np64(t):
    return t.detach().double().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, float)


def mistake(message, fn, probes=()):
    """The engine's `like` (it already asks the formula to differ from the reference's output
    on at least one call, else a correct output would "match" it)."""
    return like(message, fn, probes=probes)


def _freqs(d_model, base=10000.0, rule="2i"):
    """Angular frequencies of the pairs, float64; `rule` builds the wrong ones."""
    i = torch.arange((d_model + 1) // 2, dtype=torch.float64)
    return {"2i": lambda: base ** (-2 * i / d_model), "i": lambda: base ** (-i / d_model),
            "sign": lambda: base ** (2 * i / d_model), "one": lambda: torch.ones_like(i),
            "log10": lambda: torch.exp(-math.log10(base) * 2 * i / d_model)}[rule]()


def _pe64(max_len, d_model, base=10000.0, rule="2i", concat=False, swap=False, shift=0,
          per_column=False):
    """The table (max_len, d_model) in float64 from the closed form, and its wrong relatives."""
    pos = torch.arange(max_len, dtype=torch.float64).reshape(-1, 1) + shift
    out = torch.zeros(max_len, d_model, dtype=torch.float64)
    if per_column:      # column j its own frequency base^(-j/d)
        ang = pos * base ** (-torch.arange(d_model, dtype=torch.float64) / d_model)
        out[:, 0::2], out[:, 1::2] = torch.sin(ang[:, 0::2]), torch.cos(ang[:, 1::2])
        return out
    ang = pos * _freqs(d_model, base, rule)
    s, c = (torch.cos(ang), torch.sin(ang)) if swap else (torch.sin(ang), torch.cos(ang))
    n = d_model // 2
    if concat:
        return torch.cat([s[:, :n], c[:, :n]], 1)
    out[:, 0::2], out[:, 1::2] = s, c[:, :n]
    return out


def _table_like(**kw):
    return lambda max_len, d_model, base=10000.0: _pe64(max_len, d_model, base, **kw)


def _not_a_tensor(e):
    kind = e.meta("0.out")
    return kind is not None and not hasattr(torch, kind.split("@")[0])


def _transposed(e):
    return any(g.shape != w.shape and g.shape == w.shape[::-1] for g, w in e.outs())


SPE_DIAGNOSES = [
    when("sinusoidal_positional_encoding must return a torch.Tensor (yours returned a numpy "
         "array or another type): build the table with torch operations, or wrap it with "
         "torch.from_numpy(...).float().", _not_a_tensor),
    when("the table is transposed, (d_model, max_len): one row per position, one column per "
         "dimension: (max_len, d_model).", _transposed),
    *variants(_table_like, [
        ({"swap": True},
         "sin and cos are swapped: even columns (0, 2, 4, ...) hold sin, odd columns cos, "
         "so row 0 (every angle 0) is [0, 1, 0, 1, ...]."),
        ({"concat": True},
         "the table is [all sines | all cosines] (concatenated halves); the encoding "
         "interleaves them: column 2i is sin, column 2i+1 is cos of the same frequency."),
        ({"rule": "i"},
         "the exponent uses i/d_model where it should be 2i/d_model (with i the pair index; "
         "torch.arange(0, d_model, 2) already gives the 2i values)."),
        ({"per_column": True},
         "every column got its own frequency base^(-j/d_model) (j = the column index): a "
         "sin/cos pair 2i, 2i+1 must share one frequency, base^(-2i/d_model)."),
        ({"rule": "sign"},
         "the frequencies grow instead of shrinking: multiply pos by base^(-2i/d_model) (or "
         "divide by base^(2i/d_model)), not by base^(+2i/d_model)."),
        ({"rule": "one"},
         "every frequency is 1: an integer division (2*i // d_model is 0) or a lost "
         "exponent; use float division, 2*i / d_model."),
        ({"shift": 1},
         "positions start at 1; the first position is 0 (torch.arange(max_len)), so row 0 "
         "is [0, 1, 0, 1, ...]."),
        ({"rule": "log10"},
         "you used log10 in exp(-log(base) * 2i / d_model); the exp/log form needs the "
         "natural log, math.log(base)."),
    ], make=mistake),
    mistake("the base argument is ignored: the table was built with 10000 whatever base was "
            "passed. Use base in place of the constant 10000.",
            lambda max_len, d_model, base=10000.0: None if base == 10000.0 else _pe64(max_len, d_model)),
]


def _shift64(offset, d_model, base=10000.0, rule="2i", transpose=False, no_freq=False,
             halves=False, lost_sign=False):
    """M with pe[pos + offset] = M @ pe[pos] (float64), and its wrong relatives."""
    theta = offset * _freqs(d_model, base, rule)[: d_model // 2]
    if no_freq:
        theta = torch.full_like(theta, float(offset))
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    n = d_model // 2
    for i, t in enumerate(theta.tolist()):
        c, s = math.cos(t), math.sin(t)
        a, b = (i, i + n) if halves else (2 * i, 2 * i + 1)
        M[a, a], M[a, b], M[b, a], M[b, b] = c, s, (s if lost_sign else -s), c
    return M.T.contiguous() if transpose else M


def _shift_like(**kw):
    return lambda offset, d_model, base=10000.0: _shift64(offset, d_model, base, **kw)


def _fitted(e):
    """M @ pe[pos] = pe[pos + offset] holds at some positions of 0..63 but not at all: M was
    fitted to a few positions."""
    for ci in range(len(e.pd["calls"])):
        g = e.out(ci)
        (offset, d, *rest), kw = e.args(ci)
        base = rest[0] if rest else kw.get("base", 10000.0)
        if g is None or np.shape(g) != (d, d):
            continue
        pe = _pe64(64 + offset, d, base).numpy()
        err = np.abs(pe[:64] @ np.asarray(g, float).T - pe[offset:offset + 64]).max(-1)
        if (err < 1e-4).any() and not (err < 1e-4).all():
            return True
    return False


SHIFT_DIAGNOSES = [
    mistake("M turns each pair the wrong way, giving pe[pos - offset]: with the pair ordered "
            "(sin, cos) the block is [[cos, sin], [-sin, cos]], the transpose of the textbook "
            "rotation [[cos, -sin], [sin, cos]].", _shift_like(transpose=True)),
    mistake("every pair turns by the same angle `offset`: the angle of pair i is offset * w_i, "
            "with its own frequency w_i = base^(-2i/d_model).", _shift_like(no_freq=True)),
    mistake("the blocks pair dimension i with i + d_model/2 (a concatenated [sin | cos] layout); "
            "here the pairs are the neighbours 2i, 2i+1.", _shift_like(halves=True)),
    mistake("the angles use w_i = base^(-i/d_model); the frequency of pair i is "
            "base^(-2i/d_model).", _shift_like(rule="i")),
    mistake("M is not a rotation: each block must be [[cos t, sin t], [-sin t, cos t]], the same "
            "angle t in all four entries and a minus sign on the lower-left sin.",
            _shift_like(lost_sign=True)),
    mistake("M is the identity: it must move pe[pos] to pe[pos + offset], turning each pair by "
            "offset * w_i.",
            lambda offset, d_model, base=10000.0: torch.eye(d_model) if offset else None),
    mistake("the base argument is ignored (M was built with 10000 whatever base was passed).",
            lambda offset, d_model, base=10000.0: None if base == 10000.0 else _shift64(offset, d_model)),
    when("pe[pos + offset] = M @ pe[pos] holds only at a few positions, not at every pos: M was "
         "fitted to a few positions (a least-squares fit on fewer positions than dimensions "
         "does not determine M). Build it from the 2x2 rotation blocks, one per frequency, "
         "angle offset * w_i.", _fitted),
]


# -- PositionalEncoding ---------------------------------------------------------------------

def _added(fn):
    """A forward formula fn(x (float64), table (L, d) float64) -> output."""
    return lambda m, x: fn(x.double(), _pe64(x.shape[1], x.shape[-1]))


_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def _broadcast_sizes(e):
    """({the two sizes}, x's (B, L), max_len) of a broadcasting error, or None."""
    found = _BROADCAST.search(e.error)
    if not found:
        return None
    ci = next(i for i, c in enumerate(e.pd["calls"]) if e.out(i) is None and not c["method"])
    x = e.args(ci)[0][0]
    max_len = e.pd["make"]["kwargs"].get("max_len", 5000)
    return {int(found.group(1)), int(found.group(2))}, tuple(x.shape[:2]), max_len


def _sliced_by_batch(e):
    sizes, (B, L), _ = _broadcast_sizes(e)
    return B != L and sizes == {B, L}


def _all_rows(e):
    sizes, (B, L), max_len = _broadcast_sizes(e)
    return max_len != L and sizes == {L, max_len}


def _zeros(e):
    outs = [g for g, _ in e.outs()]
    return float(np.mean([(g == 0).mean() for g in outs])) if outs else None


def _table_only(e):
    """Train mode: what was added to x is 0 or pe / (1 - p) everywhere, and 0 often."""
    for ci in range(len(e.pd["calls"])):
        g = e.out(ci)
        if g is None:
            continue
        x = e.args(ci)[0][0].double().numpy()
        pe = _pe64(x.shape[1], x.shape[2]).numpy()
        r = np.asarray(g, float) - x
        tol = 1e-4 + 1e-4 * np.abs(x + pe)
        if not ((np.abs(r) <= tol) | (np.abs(r - pe / 0.5) <= tol)).all():
            return False
        big = np.abs(pe) > 0.1
        if (np.abs(r) <= tol)[np.broadcast_to(big, r.shape)].mean() < 0.2:
            return False
    return True


def _not_buffer(e):
    return "is not a buffer" in e.error or "has no attribute `pe`" in e.error


PEM_DIAGNOSES = [
    when("PositionalEncoding.pe is an nn.Parameter: it appears in model.parameters(), so an "
         "optimizer would train it and the table would stop being sinusoidal. Register it with "
         "self.register_buffer('pe', table): saved in state_dict, moved by .to(device), never "
         "trained.",
         lambda e: _not_buffer(e) and e.got("0.raised") is not None and not bool(e.got("0.raised"))),
    when("PositionalEncoding.pe is a plain tensor attribute, not a registered buffer: it is "
         "missing from state_dict() and stays behind when the model moves with .to(device) (a "
         "device-mismatch error on the GPU). Use self.register_buffer('pe', table).",
         lambda e: "is not a buffer" in e.error),
    when("PositionalEncoding has no tensor attribute `pe`: build the table once in __init__ and "
         "register it with self.register_buffer('pe', table).", _not_buffer),
    when("the table was sliced with the batch size: x is (B, L, D), so x.size(0) is the batch "
         "size and x.size(1) the sequence length. Slice the table on the sequence axis, "
         "pe[:x.size(1)] (the study notes' pe[:x.size(0)] is written for unbatched (L, D) "
         "input).", _sliced_by_batch),
    when("all max_len rows of the table were added to L positions: a (1, max_len, d_model) "
         "table sliced pe[:n] slices its leading axis of size 1 (whether n is x.size(0), the "
         "batch size, or x.size(1)) and keeps every row. Slice the sequence axis: "
         "pe[:, :x.size(1)].", _all_rows),
    when("forward modified its input in place (x += ... or x.add_(...)): the caller's tensor "
         "changes. Return a new tensor, x + pe[:L].",
         lambda e: "leaf Variable that requires grad" in e.error or "in-place" in e.error),
    mistake("x was multiplied by sqrt(d_model) inside the module. The forward adds the table and "
            "nothing else; the sqrt(d_model) scaling belongs to the embedding, before the "
            "positional encoding (notebook 07 does it there).",
            _added(lambda x, pe: x * math.sqrt(x.shape[-1]) + pe)),
    mistake("the output is the table alone: add it to x, x + pe[:L].",
            _added(lambda x, pe: pe.expand_as(x))),
    mistake("every position got the code of position 0: the table was sliced with the batch "
            "size, x.size(0), not the sequence length x.size(1) (the study notes' size(0) trap, "
            "written for unbatched (L, D) input).", _added(lambda x, pe: x + pe[:1])),
    mistake("sequence b of the batch got the code of position b at every position: the "
            "sequence-first table (max_len, 1, d_model) of PyTorch's tutorial was sliced with "
            "x.size(0), which is the batch size for batch-first input (B, L, D). Slice "
            "pe[:x.size(1)] and move its axes to (1, L, d_model), e.g. .transpose(0, 1).",
            lambda m, x: x.double() + _pe64(x.shape[0], x.shape[-1]).unsqueeze(1)),
    mistake("x is returned unchanged: add the table.", _added(lambda x, pe: x)),
    mistake("the table was subtracted: add it.", _added(lambda x, pe: x - pe)),
    when("in eval mode many outputs are 0: dropout is still active. Use an nn.Dropout submodule "
         "(it follows model.eval()), or F.dropout(..., training=self.training).",
         lambda e: e.pd.get("mode") == "eval" and (_zeros(e) or 0) > 0.1),
    when("dropout was applied to the table only, x + dropout(pe[:L]); apply it to the sum, "
         "dropout(x + pe[:L]), as the original Transformer does.", _table_only,
         probes=("dropout train",)),
    when("in train mode (almost) no output is 0: the dropout argument is not used. Keep "
         "self.dropout = nn.Dropout(dropout) and return self.dropout(x + pe[:L]).",
         lambda e: e.pd.get("mode") == "train" and _zeros(e) is not None and _zeros(e) < 0.2,
         probes=("dropout train",)),
]


SPE = "sinusoidal_positional_encoding"
PEM = "PositionalEncoding"

_X6 = _x(6, 4, 8)   # a batch of 6, and three of its rows on their own

EXERCISES = [
    Exercise(SPE, ref="positional.sinusoidal_positional_encoding", diagnose=SPE_DIAGNOSES,
             graded=grades(shape=1, closed_form=2, base=1, random=(2, 5151)),
             probes=[
        Probe("shape", (shapes("shape"),),
              [call(7, 6), call(1, 2), call(3, 2), call(1, 8)],
              compare=_close_by_position,
              what="tables (7, 6), (1, 2), (3, 2), (1, 8): shape, float32, row 0 = [0, 1, ...]"),
        Probe("closed form", ("closed_form",),
              [call(50, 16), call(24, 10)], compare=_values_by_position,
              what="the tables (50, 16) and (24, 10) against the closed form"),
        Probe("base", ("base",),
              [call(4, 4, base=100.0), call(30, 10, base=1000.0), call(12, 6, 50.0)],
              compare=_values_by_position, what="base=100, base=1000 and base=50 (positional)"),
        Probe("random", ("random",),
              [call(128, 64), call(20, 4, base=100.0), call(37, 2), call(300, 10, base=500.0),
               call(777, 26), call(64, 96, base=2.0), call(1000, 30, base=1e5)],
              compare=_values_by_position,
              what="tables up to 1000 positions, d_model from 2 to 96, bases 2 to 1e5"),
    ]),
    Exercise("pe_shift_matrix", ref="positional.pe_shift_matrix", diagnose=SHIFT_DIAGNOSES,
             graded=grades(shape=1, shift_property=2, block_diagonal=1, random=(2, 6117)),
             probes=[
        Probe("shape", (shapes("shape"),),
              [call(3, 8), call(0, 8)], compare=_f32,
              what="M for offset 3 and for offset 0 (the identity), d_model=8: (8, 8) float32"),
        Probe("shift", ("shift_property",),
              [call(1, 8), call(5, 16), call(12, 6, base=100.0)],
              what="offsets 1, 5, 12 (d_model 8, 16, 6; base 100): M @ pe[pos] = pe[pos + offset]"),
        Probe("blocks", ("block_diagonal",),
              [call(5, 12), call(2, 12), call(7, 12), call(9, 12)],
              what="2x2 rotation blocks on the diagonal, offsets 2, 5, 7, 9 in d_model=12"),
        Probe("random", ("random",),
              [call(3, 4), call(20, 32), call(0, 6), call(1, 2), call(7, 10, base=500.0),
               call(33, 128, base=1e5), call(9, 14, base=3.0)],
              what="offsets 0 to 33, d_model 2 to 128, bases 3 to 1e5"),
        Probe("far", ("random",),
              [call(250, 64), call(120, 20, base=100.0)],
              atol=5e-5,  # float32 angles of ~250 rad: ~1e-5 off in a correct M
              what="large offsets (250 in d_model=64, 120 with base 100)"),
    ]),
    Exercise(PEM, ref="positional.PositionalEncoding", diagnose=PEM_DIAGNOSES,
             graded=grades(adds_table=2, buffer=2, batch_invariance=2, max_len=(1, 3313),
                           dropout=1, random=(2, 8080)),
             probes=[
        Probe("adds table", ("adds_table",),
              [call(_x(2, 7, 16)), _forward_checked(3, 5, 16)],
              make=ctor(16, max_len=50), mode="eval", compare=_close_by_position,
              what="PositionalEncoding(16, max_len=50) on (2, 7, 16) and (3, 5, 16), and the "
                   "gradient reaching x"),
        Probe("buffer", ("buffer",),
              [call("pe", method="get_parameter", raises=True), call("pe", method="get_buffer"),
               call(_x(3, 5, 8)), call("pe", method="get_buffer")],
              make=ctor(8, max_len=30), mode="train", params=True,
              compare=_buffer(1, 3, dtype=False, skip=(2,)),
              what="PositionalEncoding(8, max_len=30): `pe` a registered buffer holding the "
                   "table, no parameters, unchanged by a forward in train mode"),
        Probe("batch sizes", (batch("batch_invariance"),),
              [call(_x(B, 4, 8)) for B in (1, 3, 4)] + [call(_X6), call(part(_X6, slice(2, 5)))],
              make=ctor(8, max_len=20), mode="eval", compare=_close_by_position,
              what="the same L=4 at batch sizes 1, 3, 4 and 6, and rows 2-4 of the last on their own"),
        Probe("batch sizes 2", (batch("batch_invariance"),
                                "random"),
              [call(_x(B, 5, 12)) for B in (5, 1, 2, 8)],
              make=ctor(12, max_len=9), mode="eval", compare=_close_by_position,
              what="L=5 (max_len=9) at batch sizes 5, 1, 2 and 8"),
        Probe("max_len", (shapes("max_len"),),
              [call(_x(2, 10, 6)), call(_x(2, 11, 6), raises=True)],
              make=ctor(6, max_len=10), mode="eval", compare=_close_by_position,
              what="max_len=10: a sequence of length 10 works, one of length 11 must raise"),
        Probe("max_len small", (shapes("max_len"),),
              [call(_x(2, 3, 4)), call(_x(1, 4, 4), raises=True), call(_x(3, 6, 4), raises=True)],
              make=ctor(4, max_len=3), mode="eval", compare=_close_by_position,
              what="max_len=3: length 3 works, lengths 4 and 6 must raise"),
        Probe("dropout eval", ("dropout",),
              [call(_x(3, 12, 16))],
              make=ctor(16, max_len=40, dropout=0.5), mode="eval", compare=_close_by_position,
              what="dropout=0.5 in eval mode (dropout off)"),
        Probe("dropout train", ("dropout",),
              [call(_x(3, 12, 16)), call(_x(4, 9, 16))],
              make=ctor(16, max_len=40, dropout=0.5), mode="train", compare=_dropout(0.5),
              what="dropout=0.5 in train mode (on x + pe, about half the outputs 0)"),
        *[_random_pe(*row) for row in (
            # name, the input's (B, L, d), PositionalEncoding's keywords, its table read too, what
            ("random", (2, 9, 32), {"max_len": 64}, True,
             "PositionalEncoding(32, max_len=64) on (2, 9, 32), and its table"),
            ("random dropout", (1, 37, 48), {"max_len": 100, "dropout": 0.3}, False,
             "PositionalEncoding(48, max_len=100, dropout=0.3) in eval mode on (1, 37, 48)"),
            ("random small", (7, 7, 10), {"max_len": 7, "dropout": 0.1}, True,
             "PositionalEncoding(10, max_len=7, dropout=0.1) on (7, 7, 10): B = L = max_len"),
            ("random long", (4, 64, 126), {"max_len": 400}, True,
             "PositionalEncoding(126, max_len=400) on (4, 64, 126), and its table"),
            ("random default", (2, 3, 64), {"dropout": 0.5}, False,
             "PositionalEncoding(64, dropout=0.5), default max_len, (2, 3, 64), eval mode"),
        )],
    ]),
]
