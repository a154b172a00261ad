"""10_efficient_attention: what the grader runs on the student's `online_softmax` and
`flash_attention`, on inputs drawn for each grading run.

Values are compared with the reference; outputs must keep the input's dtype (a float64 probe
catches a hard-coded float32). The memory cells record the shape of every tensor the student's
`flash_attention` creates (`call(..., shapes=True)`) and fail when one holds an (Lq, Lk) score or
mask matrix for one (batch, head) slice, with the rule of `full_matrix` (tests/test_memtrack
applies it to `tfscratch.memtrack`'s recorder too): the batch axes (as they are, or flattened
into one) are left out, and a tensor with (Lq, Lk) or (Lk, Lq) as its last two axes, or Lq * Lk
elements or more per slice, counts. The reference's recorded shapes are ignored. That record
is the calling thread's; the "whole process" probe holds every thread to the same rule through
the process's resident memory on one large call. The online
softmax's blocks probe also judges `.reduced` (the size of every reduction over the last axis,
which must not exceed the block size). The diagnoses recompute the usual mistakes (a running sum
that is not rescaled, the rescale factor inverted, the causal mask not offset per block, ...) on
the same inputs."""

ASSIGNMENT = "10_efficient_attention"
import math

import numpy as np
import torch

from .engine import Exercise, Probe, call, given, grades, like, memory, randn, when


# -- inputs -----------------------------------------------------------------------------------

def _ramp(*shape, scale=4.0):
    """Random rows rising along the last axis: the max tends to sit in a late block, so the
    running max grows and a missing (or inverted) rescale shows."""
    def build(g):
        x = torch.randn(*shape, generator=g) * scale
        return x + torch.linspace(0, 2 * scale, shape[-1])
    return given(build, f"rising rows {tuple(shape)}")


def _grow_late(g):
    """(3, 30): a small first block, then a much larger max in the last (short) block."""
    x = torch.randn(3, 30, generator=g)
    x[:, 27:] += 12.0       # the tail (blocks of 8: 24..29) holds the max
    x[1, 10] += 6.0         # the max grows twice in row 1
    return x


def _masked(g):
    """(5, 24) with -inf entries, in blocks of 8 (every row keeps a finite value)."""
    x = torch.randn(5, 24, generator=g) * 5
    x[0, :8] = float("-inf")        # the whole first block masked
    x[1, ::3] = float("-inf")
    x[2, 8:] = float("-inf")        # only the first block finite
    x[3] = x[3] * 100 + 500         # scores near 1000: exp overflows without the max
    x[4, :16] = float("-inf")       # two masked blocks, then the finite ones
    return x


def _overflow(g):
    """(4, 40): rows rising by hundreds from block to block (blocks of 8): exp of a score
    overflows float32 (past ~88.7) unless the running max is subtracted in every block, and a
    max taken from the first block only is too small for the later ones."""
    x = torch.randn(4, 40, generator=g) * 3 + torch.linspace(0, 600, 40)
    x[1] = x[1].flip(0)             # the max in the first block
    x[2, 17] += 400.0               # a spike in the middle
    return x


def _masked_ragged(g):
    """(2, 3, 11) with -inf entries, blocks of 4: masked leading blocks, a finite tail only."""
    x = torch.randn(2, 3, 11, generator=g) * 3
    x[0, 0, :8] = float("-inf")
    x[1, 2, :10] = float("-inf")    # one finite value, in the short last block
    x[0, 1, 4:] = float("-inf")
    x[1, 0] = x[1, 0] * 50 - 400
    return x


def _qkv(batch, Lq, Lk, d, dv, scale=1.0, dtype="float32"):
    """q, k, v for flash_attention."""
    return (randn(*batch, Lq, d, scale=scale, dtype=dtype),
            randn(*batch, Lk, d, scale=scale, dtype=dtype),
            randn(*batch, Lk, dv, dtype=dtype))


def _flash(batch, Lq, Lk, d, dv, bs, causal, scale=1.5, dtype="float32", **kw):
    return call(*_qkv(batch, Lq, Lk, d, dv, scale, dtype), block_size=bs, causal=causal, **kw)


# -- comparisons ------------------------------------------------------------------------------

def full_matrix(shapes, batch, Lq, Lk):
    """The recorded shapes (rows padded with 0 to 6 axes) holding an (Lq, Lk) matrix for one
    (batch, head) slice."""
    n_batch, bad = math.prod(batch), []
    for row in np.asarray(shapes).reshape(-1, 6):
        nz = np.flatnonzero(row)
        shape = tuple(int(s) for s in row[nz[0]:]) if nz.size else ()
        rest = shape
        if len(batch) and len(shape) > len(batch) and shape[:len(batch)] == tuple(batch):
            rest = shape[len(batch):]
        elif len(batch) and len(shape) > 1 and shape[0] == n_batch:
            rest = shape[1:]
        if shape[-2:] in ((Lq, Lk), (Lk, Lq)) or math.prod(rest) >= Lq * Lk:
            bad.append(shape)
    return bad


def _no_full_matrix(cases):
    """A compare hook for probes whose calls record shapes: `cases[i]` is call i's
    (batch, Lq, Lk, block_size); the rule applies when block_size < Lk."""
    def compare(key, got, want):
        if not key.endswith(".shapes"):
            return "default"
        batch, Lq, Lk, bs = cases[int(key.rsplit(".", 2)[-2])]
        if bs >= Lk:
            return None
        bad = full_matrix(got, batch, Lq, Lk)
        if not bad:
            return None
        return (f"with Lq={Lq}, Lk={Lk}, batch axes {tuple(batch)} and block_size={bs}, your "
                f"code created a tensor of shape {bad[0]}: it holds Lq x Lk = {Lq} x {Lk} "
                "elements for one (batch, head) slice, the full score or mask matrix. Blockwise "
                "attention keeps one (Lq, block_size) block of scores at a time and builds the "
                "causal mask for that block only, from the query positions and the block's key "
                f"positions (a full tril mask counts). ({len(bad)} such tensor(s) in all.)")
    return compare


def _one_block_at_a_time(block_sizes):
    """A compare hook for the blocks probe: `block_sizes[i]` is call i's block size. For a call
    that records shapes, the probe machine captures `.reduced`, the input's size along the
    last axis of every reduction over that axis; none may exceed the block size (a max over
    the whole row first is the two-pass softmax, not the online one)."""
    def compare(key, got, want):
        if not key.endswith(".reduced"):
            return "default"
        bs = block_sizes[int(key.rsplit(".", 2)[-2])]
        seen = np.asarray(got).reshape(-1)
        if seen.size and int(seen.max()) > bs:
            return (f"with block_size={bs}, your code reduced {int(seen.max())} entries of the last "
                    "axis at once (a max or sum over the whole row): the online softmax visits the "
                    "row in blocks, folding each block's max and sum into a running max and sum "
                    "(a max over the whole row first is the two-pass softmax, not the online one)")
        return None
    return compare


_BLOCKS = [((3, 40), 8), ((2, 23), 5), ((4, 9), 1), ((2, 6), 16), ((2, 3, 31), 4), ((3, 17), 3),
           ((2, 12), 12)]
_MEMORY = [((2, 3), 48, 48, 8, 8, 16, False), ((2, 3), 48, 48, 8, 8, 16, True),
           ((2,), 20, 36, 4, 4, 8, False), ((), 40, 40, 6, 5, 16, True),
           ((3, 2), 30, 45, 5, 7, 9, False)]
_RANDOM = [((2, 3), 37, 37, 8, 8, 10, True), ((2,), 21, 50, 6, 10, 12, False),
           ((1, 1), 24, 24, 16, 16, 24, True), ((3,), 45, 45, 4, 12, 7, True)]
_RANDOM64 = [((2, 2), 30, 30, 8, 8, 7, True), ((2,), 18, 27, 4, 4, 5, False)]


_BWD = [((2,), 13, 13, 5, 4, 4, True), ((2, 3), 7, 19, 6, 3, 5, False), ((), 24, 24, 8, 8, 7, True),
        ((1, 2), 30, 11, 4, 6, 4, False), ((3,), 10, 10, 4, 4, 16, True)]
_SAVED = [((2,), 128, 128, 4, 4, 16, True), ((1, 2), 96, 160, 4, 3, 24, False)]


def _cases(table):
    return [(b, Lq, Lk, bs) for b, Lq, Lk, _, _, bs, _ in table]


# The same rule for the whole process: the shapes above are those the calling thread creates
# (a dispatch hook is thread-local), so one large call also measures how much the process's
# resident memory grows (every thread counted, vm._measured). With Lq = Lk = 4096 one
# float32 (Lq, Lk) matrix is 64 MB, fresh pages every time (while measuring, the allocator maps
# every block of 1 MB or more anew and unmaps it when freed: vm._steady_allocator), and attention that passes the values probes holds at least one; blockwise
# attention holds (Lq, block_size) blocks of 1 MB (2 MB in float64), a few at a time: 5 MB
# measured for the solution, 16 MB for the catalogue's float64 forward + backward (the
# allocator's own slack included). The allowance is 3/4 of one float32 matrix. A first call
# with the same queries and 256 keys runs the same code paths on blocks of the same size
# (lazy imports, the allocator's first growth) and is not measured.
_BIG, _BIG_BLOCK = 4096, 64
_ALLOWANCE = _BIG * _BIG * 3


def _coarse(*shape):
    """Random multiples of 1/4 in [-1.5, 1.5]: the large calls' inputs compress well (they
    travel in every probe cell and in the stored expectations; so do the outputs, hence d_v=2)."""
    return given(lambda g: torch.randint(-6, 7, shape, generator=g).float() / 4,
                 f"coarse{tuple(shape)}")


def _whole_process(key, got, want):
    """Only the memory counts here (the values are the other probes' business: a wrong result
    does not fail this probe, and no diagnosis recomputes a mistake on 4096 x 4096)."""
    if not key.endswith(".memory"):
        return None
    grew = int(np.asarray(got).reshape(-1)[0]) if np.asarray(got).size else 0
    if grew == 0:
        return None
    mb = 2 ** 20
    return (f"with Lq = Lk = {_BIG} and block_size={_BIG_BLOCK}, the process's memory grew by "
            f"{grew / mb:.0f} MB while your code ran (every thread counted), more than the "
            f"{_ALLOWANCE // mb} MB allowed: one Lq x Lk float32 score or mask matrix is "
            f"{_BIG * _BIG * 4 // mb} MB, a (Lq, block_size) block {_BIG * _BIG_BLOCK * 4 // mb} MB. "
            "Your code holds the whole score matrix at some point, in this thread or another: "
            "keep one block of scores at a time.")


# -- diagnoses: the known mistakes, recomputed on the probe's inputs (float64) ----------------

def _online(x, block_size, bug=""):
    """The online softmax with one known mistake."""
    x = x.double()
    N, bs = x.size(-1), block_size
    starts = list(range(0, N - bs + 1, bs)) if bug == "missing tail" else list(range(0, N, bs))
    if bug == "block local":
        return torch.cat([torch.softmax(x[..., s:s + bs], -1) for s in starts], -1)
    m = torch.full(x.shape[:-1] + (1,), torch.finfo(x.dtype).min, dtype=x.dtype)
    l = torch.zeros_like(m)
    for s in starts:
        b = x[..., s:s + bs]
        m_new = torch.maximum(m, b.amax(-1, keepdim=True))
        if bug == "no rescale":
            l = l + (b - m_new).exp().sum(-1, keepdim=True)
        elif bug == "inverted":
            l = l * (m_new - m).exp() + (b - m_new).exp().sum(-1, keepdim=True)
        elif bug == "own max":
            l = l + (b - b.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)
        else:
            l = l * (m - m_new).exp() + (b - m_new).exp().sum(-1, keepdim=True)
        m = m_new
    if bug == "last block max":
        m = x[..., starts[-1]:].amax(-1, keepdim=True)
    return (x - m).exp() / l


def _online_like(message, bug):
    return like(message, lambda x, block_size: _online(x, block_size, bug))


def _nan_rows(e, with_inf):
    """Some output row has NaN or inf, and every such row does (with_inf) or does not hold -inf."""
    found = False
    for ci in range(len(e.pd["calls"])):
        g = e.out(ci)
        if g is None:
            continue
        x = e.args(ci)[0][0].numpy()
        bad, masked = ~np.isfinite(g).all(-1), np.isneginf(x).any(-1)
        if (bad & (masked != with_inf)).any():
            return False
        found = found or bad.any()
    return bool(found)


def _dtype(what):
    return when(f"{what} returned another dtype than its input's: keep the input's dtype (no "
                ".float() or float32 buffers at the end).",
                lambda e: "keep the input's dtype" in e.problem)


SOFTMAX_DIAGNOSES = [
    _dtype("online_softmax"),
    when("with block_size smaller than the row, your code reduced the whole last axis at once (a "
         "max or sum over the whole row first is the two-pass softmax, not the online one): visit "
         "the row in blocks, folding each block's max and sum into a running max and sum.",
         lambda e: "at once" in e.problem),
    _online_like("the running sum is not rescaled when the max grows. When a block raises the max "
                 "from m_old to m_new, the terms already summed were exp(x - m_old): multiply the "
                 "running sum by exp(m_old - m_new) before adding the new block.", "no rescale"),
    _online_like("the rescale factor is inverted: exp(m_new - m_old) instead of exp(m_old - m_new). "
                 "The old terms exp(x - m_old) must SHRINK to exp(x - m_new), so the factor is <= 1.",
                 "inverted"),
    _online_like("each block is normalised on its own (a softmax per block): the blocks must share "
                 "one running max and one running sum over the whole row.", "block local"),
    _online_like("the last, shorter block is never visited: when block_size does not divide the "
                 "length, range(0, N, block_size) still reaches the tail; N // block_size blocks do "
                 "not.", "missing tail"),
    _online_like("each block's sum uses that block's own max and the sums are added without "
                 "rescaling: bring every term to the common running max with exp(m_old - m_new).",
                 "own max"),
    _online_like("the output subtracts the max of the LAST block, not the running max of the whole "
                 "row: use the final running max m in exp(x - m) / l.", "last block max"),
    when("NaN in rows that hold -inf: a block in which every entry is -inf has max -inf, and "
         "exp(-inf - (-inf)) = exp(nan). Start the running max at the lowest finite value "
         "(torch.finfo(x.dtype).min) instead of -inf, or guard the rescale factor.",
         lambda e: _nan_rows(e, with_inf=True)),
    when("NaN or inf in rows without -inf: exp overflowed. Subtract the running max inside every "
         "block, and rescale the old sum by exp(m_old - m_new) (<= 1).",
         lambda e: _nan_rows(e, with_inf=False)),
    when("in half precision (bfloat16, float16) the running max and sum must be kept in float32: "
         "upcast x (x.float()), run the loop, and cast the result back to x's dtype once at the "
         "end. A running sum in bfloat16 keeps 8 bits: once it reaches a few hundred, a block's "
         "small sum is rounded away, and the rows no longer sum to 1.",
         lambda e: "dtype" not in e.problem and not e.error, probes=("half",)),
]


def _flash_var(q, k, v, block_size=64, causal=False, bug=""):
    """Blockwise attention with one known mistake."""
    q, k, v = q.double(), k.double(), v.double()
    Lq, Lk = q.size(-2), k.size(-2)
    scale = {"scale dv": 1 / math.sqrt(v.size(-1)), "no scale": 1.0,
             "scale d": 1 / q.size(-1)}.get(bug, 1 / math.sqrt(q.size(-1)))
    m = torch.full(q.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
    qp = torch.arange(Lq)[:, None]
    for s in range(0, Lk, block_size):
        kb, vb = k[..., s:s + block_size, :], v[..., s:s + block_size, :]
        sc = q @ kb.transpose(-2, -1) * scale
        if causal and bug != "ignores causal":
            kp = torch.arange(kb.size(-2))[None, :] + (0 if bug == "local causal" else s)
            blocked = {"strict causal": kp >= qp, "inverted causal": kp < qp}.get(bug, kp > qp)
            sc = sc.masked_fill(blocked, float("-inf"))
        m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
        p = (sc - m_new).exp()
        alpha = (m_new - m).exp() if bug == "inverted" else (m - m_new).exp()
        l = (l if bug == "no l rescale" else l * alpha) + p.sum(-1, keepdim=True)
        acc = (acc if bug == "no acc rescale" else acc * alpha) + p @ vb
        m = m_new
    return acc if bug == "no division" else acc / l


def _flash_like(message, bug, causal_only=False):
    def fn(q, k, v, block_size=64, causal=False):
        return None if causal_only and not causal else _flash_var(q, k, v, block_size, causal, bug)
    return like(message, fn)


def _overflowed(e):
    """Some output is NaN or inf where the reference's is finite."""
    for ci in range(len(e.pd["calls"])):
        g, w = e.out(ci), e.want_out(ci)
        if g is not None and w is not None and g.shape == w.shape \
                and (~np.isfinite(g) & np.isfinite(w)).any():
            return True
    return False


FLASH_DIAGNOSES = [
    when("the whole (Lq, Lk) score matrix is held at some point, in this thread or another: "
         "blockwise attention keeps one (Lq, block_size) block of scores at a time.",
         lambda e: "every thread counted" in e.problem, probes=("whole process",)),
    _dtype("flash_attention"),
    when("flash_attention's output does not require grad: keep the computation differentiable (no "
         ".detach(), torch.no_grad() or .item() inside).", lambda e: "does not require grad" in e.error),
    _flash_like("the scores are divided by sqrt(d_v), the size of the values; the scale is "
                "1/sqrt(d_k) with d_k = q.size(-1), the size of queries and keys.", "scale dv"),
    _flash_like("the scores are not divided by sqrt(d_k).", "no scale"),
    _flash_like("the scores are divided by d_k, not sqrt(d_k).", "scale d"),
    _flash_like("the output accumulator is not rescaled when the running max grows: acc = acc * "
                "exp(m_old - m_new) + p @ v_block (the running sum gets the same factor).",
                "no acc rescale"),
    _flash_like("the running sum is not rescaled when the max grows: l = l * exp(m_old - m_new) + "
                "p.sum(-1) (the same factor as the accumulator).", "no l rescale"),
    _flash_like("the rescale factor is inverted: exp(m_new - m_old) instead of exp(m_old - m_new).",
                "inverted"),
    _flash_like("the accumulator is never divided by the running sum l at the end.", "no division"),
    _flash_like("the causal mask compares query positions with key positions counted inside the "
                "block (0..b-1): offset the key positions by the block's start.", "local causal",
                causal_only=True),
    _flash_like("the causal mask hides the diagonal too: query i may attend to key i (mask key j "
                "only when j > i).", "strict causal", causal_only=True),
    _flash_like("the causal mask is inverted: it hides the past and keeps the future (mask key j "
                "when j > i).", "inverted causal", causal_only=True),
    _flash_like("causal=True is ignored: every query sees every key.", "ignores causal",
                causal_only=True),
    when("NaN or inf in the output where the scores are large: exp overflowed (float32 overflows "
         "past exp(88.7)). Subtract the running max in every block, p = exp(s - m_new), and "
         "rescale the old sum and accumulator by exp(m_old - m_new).", _overflowed),
]


# -- FlashAttention: the recompute backward ---------------------------------------------------
# Each call runs fixtures.drive_flash_backward: FlashAttention.apply(q, k, v, block_size, causal), then
# backward with a drawn upstream gradient; it returns (out, dq, dk, dv, saved), `saved` being
# the elements of every tensor saved for backward (saved_tensors_hooks).

def _bwd(batch, Lq, Lk, d, dv, bs, causal, dtype="float64", **kw):
    return call(*_qkv(batch, Lq, Lk, d, dv, 1.5, dtype), randn(*batch, Lq, dv, dtype=dtype), bs, causal,
                method="@flash_backward", **kw)


def _saved_allowance(batch, Lq, Lk, d, dv):
    """Elements the saved tensors may hold: twice q, k, v, O and two numbers per query row (the
    log-sum-exp, or m and l), per (batch, head) slice; far below Lq * Lk."""
    return math.prod(batch) * 2 * (Lq * d + Lk * d + Lk * dv + Lq * dv + 2 * Lq)


def _grads_only(key, got, want):
    """The gradients probes: the output and the three gradients (the saved count is the memory
    probe's business)."""
    if key.endswith(".out.4"):
        return None
    return "default"


def _recomputes(cases):
    """The memory probe's hook: no (Lq, Lk) tensor in forward or backward (`.shapes` of the whole
    call), and the saved tensors within `_saved_allowance`."""
    full = _no_full_matrix([(b, Lq, Lk, bs) for b, Lq, Lk, _, _, bs, _ in cases])

    def compare(key, got, want):
        if key.endswith(".shapes"):
            return full(key, got, want)
        if not key.endswith(".out.4"):
            return None
        b, Lq, Lk, d, dv, bs, _ = cases[int(key.rsplit(".", 3)[-3])]
        n, cap = int(np.asarray(got).reshape(-1)[0]), _saved_allowance(b, Lq, Lk, d, dv)
        if n <= cap:
            return None
        return (f"with Lq={Lq}, Lk={Lk}, d={d}, d_v={dv} and batch axes {tuple(b)}, the tensors saved "
                f"for backward hold {n} elements, more than the {cap} allowed (q, k, v, O and one "
                f"log-sum-exp per row; one (Lq, Lk) matrix per slice is {math.prod(b) * Lq * Lk}): "
                "save only ctx.save_for_backward(q, k, v, o, lse) and recompute the blocks of "
                "probabilities in backward")
    return compare


def _fa_bwd(q, k, v, do, bs, causal, bug=""):
    """FlashAttention's output and gradients (float64), with one known mistake."""
    q, k, v, do = q.double(), k.double(), v.double(), do.double()
    Lq, Lk = q.size(-2), k.size(-2)
    scale = 1 / math.sqrt(q.size(-1))
    s = q @ k.transpose(-2, -1) * scale
    allowed = torch.ones(Lq, Lk, dtype=torch.bool).tril() if causal else torch.ones(Lq, Lk, dtype=torch.bool)
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)
    lse = m + (s - m).exp().sum(-1, keepdim=True).log()
    o = (s - lse).exp() @ v
    sb = s if causal and bug != "no causal" else q @ k.transpose(-2, -1) * scale
    p = (sb - (m if bug == "no lse" else lse)).exp()
    dv = p.transpose(-2, -1) @ do
    dp = do @ v.transpose(-2, -1)
    ds = p * dp if bug == "no D" else p * (dp - (do * o).sum(-1, keepdim=True))
    dq = ds @ k * (1.0 if bug == "dq scale" else scale)
    dk = ds.transpose(-2, -1) @ q * (1.0 if bug == "dk scale" else scale)
    return o, dq, dk, dv


def _fa_like(message, bug, out, causal_only=False):
    def fn(q, k, v, do, bs, causal):
        return None if causal_only and not causal else _fa_bwd(q, k, v, do, bs, causal, bug)[int(out)]
    return like(message, fn, out=out, probes=("gradients", "float32"))


BACKWARD_DIAGNOSES = [
    when("the whole (Lq, Lk) matrix is held during forward or backward, in this thread or another: "
         "save only q, k, v, O and the row log-sum-exp, and recompute one block of probabilities "
         "at a time in backward.", lambda e: "every thread counted" in e.problem,
         probes=("whole process",)),
    when("the tensors saved for backward grow like Lq x Lk: an autograd.Function's forward runs "
         "without autograd, so save only ctx.save_for_backward(q, k, v, o, lse) and recompute the "
         "blocks in backward (plain autograd through the loop keeps every block).",
         lambda e: "saved for backward" in e.problem),
    when("a tensor holding a whole (Lq, Lk) matrix was created in forward or backward: keep one "
         "(Lq, block_size) block of scores and probabilities at a time in both passes.",
         lambda e: "Lq x Lk" in e.problem),
    _dtype("FlashAttention"),
    when("a gradient of q, k or v is missing: backward returns (dq, dk, dv, None, None), one "
         "gradient per input of forward.", lambda e: any(
             e.meta(f"{ci}.out.{i}") == "None" for ci in range(len(e.pd["calls"])) for i in (1, 2, 3))),
    _fa_like("the probabilities in backward are exp(S - m) with the running max only: save the row "
             "log-sum-exp lse = m + log(l) in forward and recompute P = exp(S - lse).", "no lse", "3"),
    _fa_like("the D term is missing: dS = P * (dP - D) with D = rowsum(dO * O), the softmax's "
             "Jacobian; dS = P * dP forgets it.", "no D", "1"),
    _fa_like("dK is not scaled: S = Q K^T / sqrt(d), so dK = dS^T Q / sqrt(d).", "dk scale", "2"),
    _fa_like("dQ is not scaled: S = Q K^T / sqrt(d), so dQ = dS K / sqrt(d).", "dq scale", "1"),
    _fa_like("the causal mask is not applied in backward: recompute each block's scores with the "
             "same mask as in forward (masked entries give P = 0).", "no causal", "3",
             causal_only=True),
]


EXERCISES = [
    Exercise("online_softmax", ref="efficient_attention.online_softmax", shortcuts=("online_softmax",),
             graded=grades(values=(2, 6066), blocks=(2, 4242), masked=1, random=(2, 8128), half=1),
             diagnose=SOFTMAX_DIAGNOSES, probes=[
        Probe("values", ("values",),
              [call(_ramp(4, 10), 3), call(_ramp(2, 3, 16), 4), call(_ramp(7, 33, scale=9.0), 6),
               call(_ramp(2, 2, 5, scale=9.0), 2), call(_ramp(50, scale=9.0), 7)],
              keep_dtype=True,
              what="rows whose max sits in a late block, several shapes and block sizes"),
        Probe("max grows late", ("values", "blocks"),
              [call(given(_grow_late, "a much larger max in the short last block"), 8)],
              keep_dtype=True,
              what="the max in the last, shorter block (blocks of 8 over 30 entries)"),
        Probe("overflow", ("values",),
              [call(given(_overflow, "rows rising by hundreds: exp overflows without the max"), 8)],
              keep_dtype=True,
              what="scores in the hundreds: exp overflows float32 unless the running max is "
                   "subtracted in every block"),
        Probe("blocks", ("blocks",),
              [call(randn(*shape, scale=3.0), bs, shapes=True) for shape, bs in _BLOCKS],
              keep_dtype=True, compare=_one_block_at_a_time([bs for _, bs in _BLOCKS]),
              what="block sizes that divide the length, that do not, 1, and >= the row"),
        Probe("masked", ("masked",),
              [call(given(_masked, "-inf entries and scores near 1000"), 8),
               call(given(_masked_ragged, "-inf blocks, a finite value in the short tail"), 4)],
              keep_dtype=True,
              what="-inf entries (whole masked blocks included) and scores near 1000"),
        Probe("random", ("random",),
              [call(randn(5, 12, scale=3.0), 5), call(randn(3, 4, 19, scale=12.0), 5),
               call(randn(1, 100, scale=12.0), 9), call(randn(2, 13, scale=12.0), 20)],
              keep_dtype=True,
              what="random float32 inputs of several shapes and block sizes"),
        Probe("float64", ("random",),
              [call(randn(5, 12, scale=3.0, dtype="float64"), 5),
               call(randn(6, 8, scale=12.0, dtype="float64"), 3)],
              keep_dtype=True, atol=1e-10, rtol=1e-8,
              what="float64 inputs (the result keeps the dtype)"),
        Probe("half", ("half",),
              [call(randn(4, 2048, scale=0.5, dtype="bfloat16"), 4),
               call(randn(3, 5, 1000, scale=2.0, dtype="bfloat16"), 7),
               call(randn(2, 4096, scale=0.5, dtype="float16"), 4)],
              keep_dtype=True, atol=1e-6, rtol=8e-3,
              what="bfloat16 and float16 rows of 1000 to 4096 entries in small blocks: running "
                   "max and sum in float32, one rounding at the end, the input's dtype returned"),
    ]),
    Exercise("flash_attention", ref="efficient_attention.flash_attention", shortcuts=("flash_attention",),
             graded=grades(values=(2, 5151), causal=(2, 7171), memory=(3, 1234), gradient=1,
                           random=(2, 3137)),
             diagnose=FLASH_DIAGNOSES, probes=[
        Probe("values", ("values",),
              [_flash((2,), 24, 24, 8, 8, 8, False), _flash((2, 3), 10, 21, 8, 5, 4, False),
               _flash((), 9, 30, 6, 3, 7, False), _flash((2, 2), 17, 17, 5, 9, 16, False),
               _flash((3,), 4, 40, 8, 2, 40, False), _flash((1,), 12, 25, 4, 4, 1, False)],
              keep_dtype=True,
              what="not causal: Lq != Lk, d_v != d_k, block sizes that do and do not divide Lk"),
        Probe("large scores", ("values", "causal"),
              [_flash((2,), 16, 24, 8, 4, 8, False, scale=12.0),
               _flash((2, 2), 20, 20, 8, 4, 6, True, scale=12.0)],
              keep_dtype=True, atol=1e-4, rtol=1e-3,
              what="scores in the hundreds (q and k scaled by 12): exp overflows float32 unless "
                   "the running max is subtracted in every block"),
        Probe("causal", ("causal",),
              [_flash((2,), 20, 20, 8, 8, 8, True), _flash((1, 2), 13, 13, 4, 6, 5, True),
               _flash((3,), 7, 7, 4, 4, 1, True), _flash((2, 2), 33, 33, 8, 5, 6, True),
               _flash((), 19, 19, 4, 4, 19, True)],
              keep_dtype=True,
              what="causal=True with block sizes 8, 5, 1, 6 and the whole length"),
        Probe("memory", (memory("memory"),),
              [_flash(b, Lq, Lk, d, dv, bs, c, scale=1.0, shapes=True)
               for b, Lq, Lk, d, dv, bs, c in _MEMORY],
              keep_dtype=True, compare=_no_full_matrix(_cases(_MEMORY)),
              what="every tensor created, causal and not, block_size < Lk"),
        Probe("whole process", (memory("memory"), "random"),
              [call(_coarse(_BIG, 8), _coarse(256, 8), _coarse(256, 2), block_size=_BIG_BLOCK,
                    causal=False),
               call(_coarse(_BIG, 8), _coarse(_BIG, 8), _coarse(_BIG, 2), block_size=_BIG_BLOCK,
                    causal=False, memory_limit=_ALLOWANCE)],
              compare=_whole_process,
              what=f"Lq = Lk = {_BIG}: the memory of the whole process (every thread) while it runs"),
        Probe("gradient", ("gradient",),
              [call(*_qkv((2,), 12, 12, 4, 4), block_size=5, causal=True, grad=(0, 1, 2),
                    backward=randn(2, 12, 4)),
               call(*_qkv((2,), 7, 15, 4, 3), block_size=4, causal=False, grad=(0, 1, 2),
                    backward=randn(2, 7, 3))],
              keep_dtype=True, atol=1e-4, rtol=1e-3,
              what="the gradients of q, k and v (causal and not)"),
        Probe("random", ("random",),
              [_flash(b, Lq, Lk, d, dv, bs, c, scale=3.0, shapes=True)
               for b, Lq, Lk, d, dv, bs, c in _RANDOM],
              keep_dtype=True, compare=_no_full_matrix(_cases(_RANDOM)),
              what="random float32 cases with large scores, causal and not"),
        Probe("float64", ("random",),
              [_flash(b, Lq, Lk, d, dv, bs, c, scale=1.0, dtype="float64", shapes=True)
               for b, Lq, Lk, d, dv, bs, c in _RANDOM64],
              keep_dtype=True, compare=_no_full_matrix(_cases(_RANDOM64)), atol=1e-10, rtol=1e-8,
              what="float64 inputs (the result keeps the dtype)"),
    ]),
    Exercise("FlashAttention", ref="efficient_attention.FlashAttention", shortcuts=("flash_attention",),
             graded=grades(gradients=(3, 2024), memory=(3, 4711)),
             diagnose=BACKWARD_DIAGNOSES, probes=[
        Probe("gradients", ("gradients",),
              [_bwd(*case) for case in _BWD],
              keep_dtype=True, compare=_grads_only, atol=1e-10, rtol=1e-8,
              what="float64: the output and the gradients of q, k and v against autograd's, causal "
                   "and not, Lq != Lk, block sizes that do not divide the length"),
        Probe("float32", ("gradients",),
              [_bwd((2, 2), 20, 20, 8, 6, 6, True, dtype="float32"),
               _bwd((3,), 9, 26, 4, 5, 8, False, dtype="float32")],
              keep_dtype=True, compare=_grads_only, atol=1e-4, rtol=1e-3,
              what="float32 inputs (the gradients keep the dtype)"),
        Probe("saved", (memory("memory"),),
              [_bwd(*case, shapes=True) for case in _SAVED],
              keep_dtype=True, compare=_recomputes(_SAVED),
              what="the tensors saved for backward and every tensor created in forward and backward"),
        Probe("whole process", (memory("memory"),),
              [call(_coarse(_BIG, 8), _coarse(256, 8), _coarse(256, 2), _coarse(_BIG, 2), _BIG_BLOCK,
                    False, method="@flash_backward"),
               call(_coarse(_BIG, 8), _coarse(_BIG, 8), _coarse(_BIG, 2), _coarse(_BIG, 2), _BIG_BLOCK,
                    True, method="@flash_backward", memory_limit=_ALLOWANCE)],
              compare=_whole_process,
              what=f"Lq = Lk = {_BIG}, forward and backward: the memory of the whole process"),
    ]),
]
