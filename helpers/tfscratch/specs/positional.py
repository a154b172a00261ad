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
- Dropout is compared in eval mode; in train mode (`_dropout`) only what every correct
  implementation shares is required: about p of the outputs are 0, and wherever both the
  student's and the reference's outputs are kept they are equal ((x + pe) / (1 - p)).
- An input longer than `max_len` must raise (any exception): only the probes of
  `test_PositionalEncoding_max_len` try one.
"""

ASSIGNMENT = "05_positional_encoding"
import numpy as np

from .engine import ATOL, RTOL, Exercise, Probe, call, ctor, label, randn


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


def _forward_checked(B, L, d):
    """A forward whose input gradient is compared too (it equals the upstream gradient): an
    in-place add on x, or a forward under no_grad, fails here."""
    return call(_x(B, L, d), grad=(0,), backward=randn(B, L, d))


SPE = "sinusoidal_positional_encoding"
PEM = "PositionalEncoding"

EXERCISES = [
    Exercise(SPE, ref="positional.sinusoidal_positional_encoding", probes=[
        Probe("shape", ("test_sinusoidal_positional_encoding_shape",),
              [call(7, 6), call(1, 2), call(3, 2), call(1, 8)],
              compare=_close_by_position,
              what="tables (7, 6), (1, 2), (3, 2), (1, 8): shape, float32, row 0 = [0, 1, ...]"),
        Probe("closed form", ("test_sinusoidal_positional_encoding_closed_form",),
              [call(50, 16), call(24, 10)], compare=_values_by_position,
              what="the tables (50, 16) and (24, 10) against the closed form"),
        Probe("base", ("test_sinusoidal_positional_encoding_base",),
              [call(4, 4, base=100.0), call(30, 10, base=1000.0), call(12, 6, 50.0)],
              compare=_values_by_position, what="base=100, base=1000 and base=50 (positional)"),
        Probe("random", ("test_sinusoidal_positional_encoding_random",),
              [call(128, 64), call(20, 4, base=100.0), call(37, 2), call(300, 10, base=500.0),
               call(777, 26), call(64, 96, base=2.0), call(1000, 30, base=1e5)],
              compare=_values_by_position,
              what="tables up to 1000 positions, d_model from 2 to 96, bases 2 to 1e5"),
    ]),
    Exercise("pe_shift_matrix", ref="positional.pe_shift_matrix", probes=[
        Probe("shape", ("test_pe_shift_matrix_shape",),
              [call(3, 8), call(0, 8)], compare=_f32,
              what="M for offset 3 and for offset 0 (the identity), d_model=8: (8, 8) float32"),
        Probe("shift", ("test_pe_shift_matrix_shift_property",),
              [call(1, 8), call(5, 16), call(12, 6, base=100.0)],
              what="offsets 1, 5, 12 (d_model 8, 16, 6; base 100): M @ pe[pos] = pe[pos + offset]"),
        Probe("blocks", ("test_pe_shift_matrix_block_diagonal",),
              [call(5, 12), call(2, 12), call(7, 12), call(9, 12)],
              what="2x2 rotation blocks on the diagonal, offsets 2, 5, 7, 9 in d_model=12"),
        Probe("random", ("test_pe_shift_matrix_random",),
              [call(3, 4), call(20, 32), call(0, 6), call(1, 2), call(7, 10, base=500.0),
               call(33, 128, base=1e5), call(9, 14, base=3.0)],
              what="offsets 0 to 33, d_model 2 to 128, bases 3 to 1e5"),
        Probe("far", ("test_pe_shift_matrix_random",),
              [call(250, 64), call(120, 20, base=100.0)],
              atol=5e-5,  # float32 angles of ~250 rad: ~1e-5 off in a correct M
              what="large offsets (250 in d_model=64, 120 with base 100)"),
    ]),
    Exercise(PEM, ref="positional.PositionalEncoding", probes=[
        Probe("adds table", ("test_PositionalEncoding_adds_table",),
              [call(_x(2, 7, 16)), _forward_checked(3, 5, 16)],
              make=ctor(16, max_len=50), mode="eval", compare=_close_by_position,
              what="PositionalEncoding(16, max_len=50) on (2, 7, 16) and (3, 5, 16), and the "
                   "gradient reaching x"),
        Probe("buffer", ("test_PositionalEncoding_buffer",),
              [call("pe", method="get_buffer"), call(_x(3, 5, 8)), call("pe", method="get_buffer")],
              make=ctor(8, max_len=30), mode="train", params=True,
              compare=_buffer(0, 2, dtype=False, skip=(1,)),
              what="PositionalEncoding(8, max_len=30): `pe` a registered buffer holding the "
                   "table, no parameters, unchanged by a forward in train mode"),
        Probe("batch sizes", ("test_PositionalEncoding_batch_invariance",),
              [call(_x(B, 4, 8)) for B in (1, 3, 4, 6)],
              make=ctor(8, max_len=20), mode="eval", compare=_close_by_position,
              what="the same L=4 at batch sizes 1, 3, 4 and 6"),
        Probe("batch sizes 2", ("test_PositionalEncoding_batch_invariance",
                                "test_PositionalEncoding_random"),
              [call(_x(B, 5, 12)) for B in (5, 1, 2, 8)],
              make=ctor(12, max_len=9), mode="eval", compare=_close_by_position,
              what="L=5 (max_len=9) at batch sizes 5, 1, 2 and 8"),
        Probe("max_len", ("test_PositionalEncoding_max_len",),
              [call(_x(2, 10, 6)), call(_x(2, 11, 6), raises=True)],
              make=ctor(6, max_len=10), mode="eval", compare=_close_by_position,
              what="max_len=10: a sequence of length 10 works, one of length 11 must raise"),
        Probe("max_len small", ("test_PositionalEncoding_max_len",),
              [call(_x(2, 3, 4)), call(_x(1, 4, 4), raises=True), call(_x(3, 6, 4), raises=True)],
              make=ctor(4, max_len=3), mode="eval", compare=_close_by_position,
              what="max_len=3: length 3 works, lengths 4 and 6 must raise"),
        Probe("dropout eval", ("test_PositionalEncoding_dropout",),
              [call(_x(3, 12, 16))],
              make=ctor(16, max_len=40, dropout=0.5), mode="eval", compare=_close_by_position,
              what="dropout=0.5 in eval mode (dropout off)"),
        Probe("dropout train", ("test_PositionalEncoding_dropout",),
              [call(_x(3, 12, 16)), call(_x(4, 9, 16))],
              make=ctor(16, max_len=40, dropout=0.5), mode="train", compare=_dropout(0.5),
              what="dropout=0.5 in train mode (on x + pe, about half the outputs 0)"),
        Probe("random", ("test_PositionalEncoding_random",),
              [call(_x(2, 9, 32, scale=3.0))], after=("pe",),
              make=ctor(32, max_len=64), mode="eval", compare=_buffer(),
              what="PositionalEncoding(32, max_len=64) on (2, 9, 32), and its table"),
        Probe("random dropout", ("test_PositionalEncoding_random",),
              [call(_x(1, 37, 48, scale=3.0))],
              make=ctor(48, max_len=100, dropout=0.3), mode="eval", compare=_close_by_position,
              what="PositionalEncoding(48, max_len=100, dropout=0.3) in eval mode on (1, 37, 48)"),
        Probe("random small", ("test_PositionalEncoding_random",),
              [call(_x(7, 7, 10, scale=3.0))], after=("pe",),
              make=ctor(10, max_len=7, dropout=0.1), mode="eval", compare=_buffer(),
              what="PositionalEncoding(10, max_len=7, dropout=0.1) on (7, 7, 10): B = L = max_len"),
        Probe("random long", ("test_PositionalEncoding_random",),
              [call(_x(4, 64, 126, scale=3.0))], after=("pe",),
              make=ctor(126, max_len=400), mode="eval", compare=_buffer(),
              what="PositionalEncoding(126, max_len=400) on (4, 64, 126), and its table"),
        Probe("random default", ("test_PositionalEncoding_random",),
              [call(_x(2, 3, 64, scale=3.0))],
              make=ctor(64, dropout=0.5), mode="eval", compare=_close_by_position,
              what="PositionalEncoding(64, dropout=0.5), default max_len, (2, 3, 64), eval mode"),
    ]),
]
