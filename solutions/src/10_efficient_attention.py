#| default_exp efficient_attention
# %% [markdown]
# # 10 · Efficient attention: the online softmax and FlashAttention's idea
#
# Attention as written in notebook 01, $\operatorname{softmax}(QK^\top/\sqrt{d_k})\,V$, first
# builds the whole $L_q \times L_k$ matrix of scores, then its softmax, then multiplies by $V$.
# That matrix is the problem with long inputs: its size grows with the **square** of the length.
# In this notebook you:
#
# 1. **measure** how much memory naive attention holds as the sequence grows, and see the $L^2$;
# 2. write the **online softmax** (exercise 1): softmax over a row visited once, block by block,
#    with a running max and a running sum, exact thanks to one rescaling factor;
# 3. write **blockwise attention** (exercise 2, `flash_attention`): the same online softmax over
#    blocks of keys and values, causal or not, equal to `F.scaled_dot_product_attention` and
#    **never creating the score matrix**; a check watches every tensor your function creates;
# 4. plot peak memory and time against $L$ for both, on this CPU, with and without autograd,
#    and read honestly what a fused GPU kernel (FlashAttention) adds on top of the algorithm.
#
# Where the ideas come from: the online softmax is Milakov and Gimelshein (2018, *Online
# normalizer calculation for softmax*, arXiv:1805.02867); attention over blocks of keys with a
# running max and sum, for all queries at once, is Rabe and Staats (2021, *Self-attention does
# not need O(n^2) memory*, arXiv:2112.05682); FlashAttention (Dao et al. 2022, arXiv:2205.14135)
# tiles queries too, fuses the loop into one GPU kernel and recomputes the blocks in the
# backward pass; FlashAttention-2 (Dao 2023, arXiv:2307.08691) among other changes divides by
# the running sum once at the end instead of after every block, as we do here.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Hidden tests with other shapes, block sizes and seeds run when your work is graded.
#
# You may **not** call a softmax (`torch.softmax`, `F.softmax`, `Tensor.softmax`, `nn.Softmax`)
# inside `online_softmax`, nor `F.scaled_dot_product_attention` inside `flash_attention`: the
# checks notice. Everything else (`torch.exp`, `amax`,
# `torch.maximum`, matrix products, `masked_fill`) is yours to use.

# %% [setup] setup_imports
import functools
import math
import os
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from tfscratch import checks, plots
from tfscratch import reference as R
from tfscratch.fallback import pick
from tfscratch.memtrack import TensorRecorder, peak_memory
from tfscratch.widgets import explore

torch.manual_seed(0)
torch.set_num_threads(1)  # steady timings on a shared machine
# autograding and quick runs (TFS_QUICK_TRAINING=1, as the course's browser tests do): smaller measurements
QUICK = bool(os.environ.get("NBGRADER_EXECUTION") or os.environ.get("TFS_QUICK_TRAINING"))
%matplotlib inline

chk = checks.notebook("10_efficient_attention")  # the graded checks of this notebook

# %% [markdown]
# ## 1. Naive attention holds an $L \times L$ matrix
#
# Here is attention exactly as the formula reads, with the optional causal mask of notebook 02
# (True = may attend). For `B` sequences, `H` heads and length `L`, the scores are a
# `(B, H, L, L)` tensor: in float32, $4 B H L^2$ bytes, and the softmax makes a second one of the
# same size.

# %% [export]
def naive_attention(q, k, v, causal=False):
    """softmax(q k^T / sqrt(d)) v with the whole (..., Lq, Lk) score matrix in memory."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    if causal:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v  # (..., Lq, d_v)

# %% [markdown]
# How much memory does it use? CPU PyTorch keeps no allocator statistics
# (`torch.cuda.max_memory_allocated` exists for GPUs only), and Python's `tracemalloc` does not
# see tensor memory. But PyTorch sends every operation through its *dispatcher*, and
# `tfscratch.memtrack.peak_memory` hooks into it (a `TorchDispatchMode`): it sees every tensor
# the function creates, counts its bytes while it is alive, and returns the peak.

# %%
B, H, d = 1, 4, 64
lengths = [128, 256, 512, 1024] if QUICK else [128, 256, 512, 1024, 2048]
naive_peak = []
for L in lengths:
    q, k, v = torch.randn(3, B, H, L, d).unbind(0)  # three (B, H, L, d) tensors
    _, peak = peak_memory(naive_attention, q, k, v, causal=True)
    naive_peak.append(peak / 2**20)
    print(f"L={L:5d}  peak {peak / 2**20:8.1f} MiB   one (B, H, L, L) float32 matrix: "
          f"{4 * B * H * L * L / 2**20:8.1f} MiB")
fig = plots.curves(lengths, {"naive attention, measured peak": naive_peak,
                             "one (B, H, L, L) float32 matrix": [4 * B * H * L * L / 2**20 for L in lengths],
                             "q, k, v and the output": [4 * 4 * B * H * L * d / 2**20 for L in lengths]},
                   xlabel="sequence length L", ylabel="MiB", logy=True, markers=True,
                   title=f"memory of naive attention (B={B}, H={H}, d={d}, causal)")
plt.gca().set_xscale("log", base=2)

# %% [markdown]
# On log-log axes, doubling $L$ multiplies the peak by 4: the slope of an $L^2$ curve. The inputs
# and the output grow only like $L$. The peak is a few score-sized matrices at once (scores,
# the masked scores, their softmax, and the boolean mask). At $L = 32\,768$ one float32 score
# matrix is 4 GiB **per head and per sequence**, and training also keeps it for the backward
# pass. The numbers you need, though, are only $L \times d$: the output. The rest of this
# notebook computes that output exactly while holding one block of scores at a time.
#
# ## 2. The online softmax
#
# Notebook 01's stable softmax makes **two passes** over a row: one to find the max $m$, one to
# sum $\ell = \sum_j e^{x_j - m}$ (and then a last step to write $e^{x_i - m} / \ell$). Can we find
# $m$ and $\ell$ in **one** pass, reading the row in blocks, without knowing the max in advance?
#
# Keep a running max $m$ and a running sum $\ell$ of $e^{x_j - m}$ over the entries seen so far.
# A new block $x_{\text{blk}}$ arrives:
#
# $$m_\text{new} = \max\big(m_\text{old},\ \max_j x_{\text{blk}, j}\big), \qquad
# \ell_\text{new} = \ell_\text{old}\, e^{m_\text{old} - m_\text{new}} + \sum_j e^{x_{\text{blk}, j} - m_\text{new}}$$
#
# **Why the rescale is exact.** Every term already in $\ell_\text{old}$ is $e^{x_j - m_\text{old}}$.
# We want it as $e^{x_j - m_\text{new}}$, and
# $e^{x_j - m_\text{new}} = e^{x_j - m_\text{old}} \cdot e^{m_\text{old} - m_\text{new}}$, for every $j$
# at once: one multiplication fixes the whole old sum. No approximation is made; only the
# order of the floating-point additions differs from the two-pass softmax. Since
# $m_\text{new} \ge m_\text{old}$, the factor is at most 1: nothing overflows. (The inverted
# factor, $e^{m_\text{new} - m_\text{old}}$, grows the old terms instead of shrinking them.)
# After the last block, $m$ is the row's max and $\ell$ its sum, and the softmax is
# $e^{x_i - m}/\ell$.
#
# One detail: masked entries are $-\infty$. Starting the running max at $-\infty$ is what
# FlashAttention's Algorithm 1 does (Dao et al., 2022), and it is right as long as every block
# holds a finite score. When a whole block is $-\infty$ while the max is still $-\infty$ (a row
# whose first keys are all masked), $m_\text{old} - m_\text{new} = -\infty - (-\infty)$ is NaN.
# Either guard that subtraction, or, as we do, start the running max at the lowest **finite**
# number, `torch.finfo(x.dtype).min`; then that case gives $e^{-\infty} = 0$ as it should.
#
# ### Exercise 1: `online_softmax`
#
# `online_softmax(x, block_size)`: softmax of `x` over its **last** axis, for any leading axes.
# Visit the last axis once, in blocks `x[..., s:s + block_size]` (the last block may be
# shorter), updating a running max and a running sum of shape `(..., 1)`; then return
# `exp(x - m) / l` with the final `m` and `l`. Every max and sum you take must cover **one block
# at most** (the checks watch the reductions you make). Return `x`'s dtype.
#
# **Half precision.** For float16 and bfloat16 inputs, keep the running max and sum in float32
# (upcast each block, or `x` once) and cast the result back to `x`'s dtype at the end, as real
# kernels keep their softmax statistics in float32. The running sum is a long chain of additions:
# bfloat16 keeps 8 bits of mantissa, so once $\ell$ reaches a few hundred, a block adding 4 to it
# is rounded to a multiple of 2 or lost altogether. float32 and float64 inputs are computed as
# they are.

# %% [solution] online_softmax
def online_softmax(x, block_size):
    """Softmax of `x` over its last axis, visiting that axis once, in blocks of `block_size`.

    x: (..., N) float tensor. Returns the same shape. A running max m and a running sum
    l = sum exp(x_j - m) over the blocks seen so far are updated block by block; when the max
    grows, the old sum is rescaled by exp(m_old - m_new).
    """
    ### BEGIN SOLUTION
    N = x.size(-1)
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xw = x.to(work)  # half precision: the running statistics live in float32
    lowest = torch.finfo(work).min  # a finite "minus infinity": keeps exp(m_old - m_new) free of NaN
    m = torch.full(x.shape[:-1] + (1,), lowest, dtype=work, device=x.device)  # running max
    l = torch.zeros(x.shape[:-1] + (1,), dtype=work, device=x.device)  # running sum
    for start in range(0, N, block_size):
        block = xw[..., start:start + block_size]  # (..., b)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return (torch.exp(xw - m) / l).to(x.dtype)  # one elementwise step, one rounding
    ### END SOLUTION

# %% [markdown]
# Run the checks. Each prints a ✔ line when it passes, or tells you what is wrong.

# %% [tests] online_softmax

# %% [markdown]
# **The bfloat16 probe.** Rows of 2048 scores in bfloat16, in blocks of 4, two ways: your
# `online_softmax` (statistics in float32, one rounding at the end), and the same loop with the
# running max and sum kept in bfloat16. Both are compared with the float64 softmax of the same
# bfloat16 numbers; a row of probabilities should sum to 1.

# %%
xh = (torch.randn(8, 2048, generator=torch.Generator().manual_seed(6)) * 0.5).bfloat16()
exact = torch.softmax(xh.double(), -1)
half_fn = pick("online_softmax", lambda: online_softmax, lambda: R.online_softmax,
               check=lambda f: f(xh[:1, :8], 4))


def online_in_bf16(x, block_size):
    """The loop with every running statistic in x's own dtype (here bfloat16)."""
    m = torch.full(x.shape[:-1] + (1,), torch.finfo(x.dtype).min, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for s in range(0, x.size(-1), block_size):
        m_new = torch.maximum(m, x[..., s:s + block_size].amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(x[..., s:s + block_size] - m_new).sum(-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


for name, y in (("float32 statistics (yours)", half_fn(xh, 4)), ("bfloat16 statistics", online_in_bf16(xh, 4))):
    rel = ((y.double() - exact).abs() / exact).max().item()
    sums = y.double().sum(-1)
    print(f"{name:27s}: dtype {y.dtype}, largest relative error {rel:.3f}, "
          f"row sums {sums.min():.3f} to {sums.max():.3f}")

# %% [markdown]
# In one run here, float32 statistics stayed within one bfloat16 rounding of the exact softmax
# (largest relative error 0.004, rows summing to 1.000), while bfloat16 statistics were off by up
# to 24% and rows summed to as much as 1.22: blocks whose sum was rounded away never reached
# $\ell$, so $\ell$ came out too small.

# %% [markdown]
# ### Watch the running max and sum
#
# One row of 48 scores, visited in blocks. The left panel shows the row and each block's
# extent; the right one the running max and the running sum after each block. When a block
# brings a new maximum, the sum **drops**: its old terms were rescaled by
# $e^{m_\text{old} - m_\text{new}} < 1$. The final values are the row's max and
# $\sum_j e^{x_j - \max}$, whatever the block size. Move `block_size` in the explorer.

# %%
row = torch.randn(48, generator=torch.Generator().manual_seed(4)) * 2 + torch.linspace(0, 4, 48)
softmax_fn = pick("online_softmax", lambda: online_softmax, lambda: R.online_softmax,
                  check=lambda f: f(row[None], 8))


def draw_online(block_size=8):
    ms, ls, ends = [], [], []
    m, l = torch.tensor(torch.finfo(row.dtype).min), torch.tensor(0.0)
    for s in range(0, row.numel(), block_size):
        blk = row[s:s + block_size]
        m_new = torch.maximum(m, blk.max())
        l = l * torch.exp(m - m_new) + torch.exp(blk - m_new).sum()
        m = m_new
        ms.append(m.item())
        ls.append(l.item())
        ends.append(min(s + block_size, row.numel()))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2))
    ax1.bar(range(row.numel()), row.tolist(), color="tab:gray")
    for e in ends[:-1]:
        ax1.axvline(e - 0.5, color="tab:red", lw=0.8)
    ax1.set(xlabel="position in the row", ylabel="score", title=f"the row, in blocks of {block_size}")
    ax2.plot(ends, ms, "o-", label="running max m")
    ax2.plot(ends, ls, "s-", label="running sum l")
    ax2.axhline(row.max().item(), color="tab:blue", ls=":", lw=1)
    ax2.axhline(torch.exp(row - row.max()).sum().item(), color="tab:orange", ls=":", lw=1)
    ax2.set(xlabel="entries seen", title="running statistics (dotted: the two-pass values)")
    ax2.legend()
    fig.tight_layout()
    return fig


fig = draw_online(8)
diff = (softmax_fn(row[None], 8) - torch.softmax(row[None], -1)).abs().max().item()
print(f"largest difference from torch.softmax: {diff:.1e}")
explorer = explore(draw_online, block_size=(1, 48, 1, 8))

# %% [markdown]
# ## 3. Blockwise attention
#
# Attention is a softmax over the keys followed by a weighted sum of the values. The online
# softmax extends to it directly. For every query row keep, besides $m$ and $\ell$, an
# **accumulator** $a$ of size $d_v$: the running sum $\sum_j e^{s_j - m} v_j$ of the values
# weighted by the *unnormalised* probabilities. For each block of keys $K_\text{blk}$ and
# values $V_\text{blk}$ (say 64 of them):
#
# $$S = Q K_\text{blk}^\top / \sqrt{d_k} \quad (L_q \times b), \qquad
# m_\text{new} = \max(m, \operatorname{rowmax} S), \qquad P = e^{S - m_\text{new}}$$
#
# $$\alpha = e^{m - m_\text{new}}, \qquad \ell \leftarrow \alpha\,\ell + \operatorname{rowsum} P,
# \qquad a \leftarrow \alpha\, a + P\, V_\text{blk}, \qquad m \leftarrow m_\text{new}$$
#
# and at the end the output is $a / \ell$. The accumulator gets **the same factor** $\alpha$ as
# the sum, for the same reason: its old terms were weighted by $e^{s_j - m_\text{old}}$. The
# largest tensor is one block of scores, $L_q \times b$, so **without autograd** (inference,
# `torch.no_grad()`) memory grows like $L$, not $L^2$. With autograd on, PyTorch saves every
# block's probabilities for the backward pass, and those blocks add up to the whole
# $L_q \times L_k$ matrix again (section 4 measures it). FlashAttention avoids that with its own
# backward pass: it saves only the output and one log-sum-exp per row, and recomputes each
# block of scores when the gradients need it. This loop over key
# blocks for all queries at once is Rabe and Staats' (2021) algorithm; FlashAttention (Dao et al.
# 2022) also splits the *queries* into blocks so that everything fits in a GPU's on-chip
# memory, and divides by $\ell$ after every block, which FlashAttention-2 (Dao 2023) defers to
# the end, as here.
#
# **The causal mask, one block at a time.** Query $i$ may attend to key $j$ when $j \le i$.
# Don't build the $L \times L$ mask: for the block starting at `start`, the key positions are
# `start, ..., start + b - 1`, and the `(Lq, b)` comparison of query positions with them is that
# block's mask. Forgetting the offset `start` (comparing with `0..b-1`) is the classic bug.
# With $L_q = L_k$ every row sees key 0 in the first block, so its running max is finite from
# then on, and later fully masked blocks add $e^{-\infty} = 0$.
#
# ### Exercise 2: `flash_attention`
#
# `flash_attention(q, k, v, block_size=64, causal=False)` with `q (..., Lq, d)`,
# `k (..., Lk, d)`, `v (..., Lk, d_v)` and any leading axes (batch, heads) returns the output
# `(..., Lq, d_v)` of $\operatorname{softmax}(QK^\top/\sqrt{d})V$, equal to
# `F.scaled_dot_product_attention(q, k, v, is_causal=causal)`. With `causal=True`, `Lq == Lk`
# and query $i$ sees keys $0..i$.
#
# Loop over blocks of `block_size` keys and values (the last may be shorter) with a running
# max, sum and accumulator per query. **No tensor you create may hold an $L_q \times L_k$
# matrix for one (batch, head) slice** when `block_size < Lk`, the causal mask included: the
# check records every tensor your function makes. Keep the computation differentiable and the
# input's dtype.

# %% [solution] flash_attention
def flash_attention(q, k, v, block_size=64, causal=False):
    """softmax(q k^T / sqrt(d)) v, computed over blocks of keys and values with an online softmax.

    q: (..., Lq, d)   k: (..., Lk, d)   v: (..., Lk, d_v)   -> (..., Lq, d_v).
    causal=True (with Lq == Lk): query i attends to keys 0..i only. No tensor ever holds an
    (Lq, Lk) matrix for one (batch, head) slice: scores exist one (Lq, block) block at a time.
    """
    ### BEGIN SOLUTION
    Lq, Lk = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    lowest = torch.finfo(q.dtype).min
    m = torch.full(q.shape[:-1] + (1,), lowest, dtype=q.dtype, device=q.device)  # (..., Lq, 1)
    l = torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype, device=q.device)  # (..., Lq, 1)
    acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype, device=q.device)  # (..., Lq, d_v)
    q_pos = torch.arange(Lq, device=q.device)[:, None]  # (Lq, 1)
    for start in range(0, Lk, block_size):
        k_blk = k[..., start:start + block_size, :]  # (..., b, d)
        v_blk = v[..., start:start + block_size, :]  # (..., b, d_v)
        s = (q @ k_blk.transpose(-2, -1)) * scale  # (..., Lq, b): one block of scores
        if causal:
            k_pos = torch.arange(start, start + k_blk.size(-2), device=q.device)[None, :]  # (1, b)
            s = s.masked_fill(k_pos > q_pos, float("-inf"))  # (Lq, b) mask: this block only
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)  # (..., Lq, b), masked entries give exp(-inf) = 0
        alpha = torch.exp(m - m_new)  # rescales what was summed under the old max
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v_blk
        m = m_new
    return acc / l
    ### END SOLUTION

# %% [tests] flash_attention

# %% [markdown]
# ### What the recorder saw
#
# The memory check records the shape of every tensor your function produces, with the same
# kind of dispatcher hook as `TensorRecorder`, which lists every operation and the shapes of
# its outputs. Here are the largest tensors each version creates for
# one head of length 256 with blocks of 64: the naive version's `(256, 256)` scores, mask and
# probabilities, and only `(256, 64)` blocks in yours.

# %%
flash_fn = pick("flash_attention", lambda: flash_attention, lambda: R.flash_attention,
                check=lambda f: f(*torch.randn(3, 1, 8, 4).unbind(0), block_size=4))
q, k, v = torch.randn(3, 1, 1, 256, 32).unbind(0)  # (B=1, H=1, L=256, d=32) each
for name, fn in (("naive", lambda: naive_attention(q, k, v, causal=True)),
                 ("blockwise", lambda: flash_fn(q, k, v, block_size=64, causal=True))):
    with TensorRecorder() as rec:
        fn()
    sizes = sorted({(math.prod(s), s, r.op) for r in rec.records for s in r.out_shapes}, reverse=True)
    print(f"{name:>9}: largest tensors created: " + ", ".join(f"{s} by {op}" for _, s, op in sizes[:3]))
same = torch.allclose(flash_fn(q, k, v, block_size=64, causal=True),
                      F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
print(f"blockwise output equal to F.scaled_dot_product_attention: {same}")

# %% [markdown]
# ### Query tiles, and the causal tiles never computed
#
# FlashAttention (Dao et al. 2022) also cuts the **queries** into blocks of $B_r$ rows and keys
# into blocks of $B_c$: each $(B_r, B_c)$ tile of scores is small enough for on-chip memory, and
# each query block keeps its own running $m$, $\ell$ and accumulator. With a causal mask this
# buys arithmetic too: a tile whose first key comes after its last query is entirely masked,
# so the loop over key blocks stops at the diagonal and those tiles are **never computed**;
# only the tiles that cross the diagonal need a mask. Out of $n^2$ tiles ($n = L / B$),
# $n(n+1)/2$ remain: about half.

# %%
def best_time(fn, repeats=3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def tiled_attention(q, k, v, block_q=64, block_k=64, causal=False):
    """Attention over (block_q, block_k) tiles; returns (output, tiles computed, tiles in all)."""
    Lq, Lk, scale = q.size(-2), k.size(-2), q.size(-1) ** -0.5
    out = torch.empty(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
    computed = 0
    for qs in range(0, Lq, block_q):
        qb = q[..., qs:qs + block_q, :]  # (..., B_r, d): one block of queries
        q_pos = torch.arange(qs, qs + qb.size(-2))[:, None]
        m = torch.full(qb.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.size(-1),), dtype=q.dtype)
        k_end = min(Lk, qs + qb.size(-2)) if causal else Lk  # causal: no key block past the diagonal
        for ks in range(0, k_end, block_k):
            s = qb @ k[..., ks:ks + block_k, :].transpose(-2, -1) * scale  # (..., B_r, B_c)
            if causal and ks + s.size(-1) - 1 > qs:  # only a tile crossing the diagonal needs a mask
                s = s.masked_fill(torch.arange(ks, ks + s.size(-1))[None, :] > q_pos, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
            l = alpha * l + p.sum(-1, keepdim=True)
            acc = alpha * acc + p @ v[..., ks:ks + block_k, :]
            m = m_new
            computed += 1
        out[..., qs:qs + qb.size(-2), :] = acc / l
    total = math.ceil(Lq / block_q) * math.ceil(Lk / block_k)
    return out, computed, total


tile_lengths = [256, 512] if QUICK else [256, 512, 1024, 2048]
print(f"{'L':>5} {'tiles computed':>15} {'time tiled':>11} {'time key loop':>14} {'peak tiled':>11} "
      f"{'peak key loop':>14}")
tile_ms, loop_ms = [], []
with torch.no_grad():
    for L in tile_lengths:
        q, k, v = torch.randn(3, 1, 4, L, 64).unbind(0)
        out, done, total = tiled_attention(q, k, v, 128, 128, causal=True)
        assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
        t_tiled = best_time(lambda: tiled_attention(q, k, v, 128, 128, causal=True))
        t_loop = best_time(lambda: flash_fn(q, k, v, block_size=128, causal=True))
        _, p_tiled = peak_memory(tiled_attention, q, k, v, 128, 128, causal=True)
        _, p_loop = peak_memory(flash_fn, q, k, v, block_size=128, causal=True)
        tile_ms.append(t_tiled * 1000)
        loop_ms.append(t_loop * 1000)
        print(f"{L:5d} {done:7d} of {total:<5d} {t_tiled * 1000:8.1f} ms {t_loop * 1000:11.1f} ms "
              f"{p_tiled / 2**20:7.2f} MiB {p_loop / 2**20:10.2f} MiB")
fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.plot(tile_lengths, loop_ms, "o-", label="keys in blocks, all queries (exercise 2)")
ax.plot(tile_lengths, tile_ms, "s-", label="128 x 128 tiles, causal tiles skipped")
ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="ms (best of 3)",
       title="causal attention, 4 heads, d = 64")
ax.set_xscale("log", base=2)
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# The tiled version computes $n(n+1)/2$ of the $n^2$ tiles and, from a few hundred positions on,
# takes less than half the time of the key loop, which computes every block and masks half of
# them away (on one run here: 56 ms against 175 ms at $L = 2048$; the small tiles also stay in
# the CPU's caches). Its working memory is a few $(B_r, B_c)$ tiles per head instead of a few
# $(L_q, B_c)$ blocks: its peak is the inputs and the output plus about 1 MiB (9 MiB against
# 24 MiB at $L = 2048$ on that run). A GPU kernel runs the query blocks in parallel, one per
# group of threads; here they run one after the other.

# %% [markdown]
# ## 4. Memory and time against $L$, on this CPU
#
# Both versions on one sequence of 4 heads, $d = 64$, causal, blocks of 128 keys. Peak memory
# is measured as in section 1; time is the best of a few runs.

# %%
lengths = [256, 512, 1024] if QUICK else [256, 512, 1024, 2048, 4096]
stats = {"naive": ([], []), "blockwise (128 keys per block)": ([], [])}
with torch.no_grad():
    for L in lengths:
        q, k, v = torch.randn(3, 1, 4, L, 64).unbind(0)
        runs = {"naive": lambda: naive_attention(q, k, v, causal=True),
                "blockwise (128 keys per block)": lambda: flash_fn(q, k, v, block_size=128, causal=True)}
        for name, fn in runs.items():
            _, peak = peak_memory(fn)
            stats[name][0].append(peak / 2**20)
            stats[name][1].append(best_time(fn) * 1000)
        print(f"L={L:5d}  " + "   ".join(f"{n.split()[0]}: {stats[n][0][-1]:7.1f} MiB {stats[n][1][-1]:7.1f} ms"
                                         for n in stats))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
for name, (mem, ms) in stats.items():
    ax1.plot(lengths, mem, "o-", label=name)
    ax2.plot(lengths, ms, "o-", label=name)
ax1.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="peak MiB",
        title="peak memory: L^2 against L")
ax2.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel="ms (best of 3)",
        title="time on this CPU (one thread)")
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
fig.tight_layout()

# %% [markdown]
# **Memory** is the win, in inference: the naive peak grows fourfold per doubling, the blockwise
# one twofold (the inputs, the output, one block of scores). **Time** is not: both do the same
# $O(L^2 d)$ arithmetic, and neither is reliably faster on a CPU. The blockwise loop pays Python
# and per-operation overhead, most visibly at short lengths; at long ones the two are close, and
# which comes out ahead depends on the machine (small blocks stay in the CPU's caches, while the
# naive version streams several $L \times L$ matrices through main memory). This loop also
# computes the blocks that the causal mask hides entirely; a real kernel skips them, which
# halves the work. Expect these
# timings to move by tens of percent from run to run on a shared machine; the memory figures do
# not.
#
# ### With autograd on
#
# Training needs gradients. The same comparison with autograd recording, forward and backward
# (`peak_memory(..., grad=True)`): PyTorch saves what each operation needs for the backward pass,
# and for the loop that is every block of probabilities, $L_q \times L_k$ numbers in all.

# %%
def forward_backward(fn):
    def run():
        fn().sum().backward()
    return run


grad_lengths = [256, 512] if QUICK else [256, 512, 1024]
for L in grad_lengths:
    q, k, v = (torch.randn(1, 4, L, 64).requires_grad_() for _ in range(3))
    _, naive_fb = peak_memory(forward_backward(lambda: naive_attention(q, k, v, causal=True)), grad=True)
    _, block_fb = peak_memory(forward_backward(lambda: flash_fn(q, k, v, block_size=128, causal=True)),
                              grad=True)
    print(f"L={L:5d}  forward + backward peak: naive {naive_fb / 2**20:6.1f} MiB, "
          f"blockwise loop {block_fb / 2**20:6.1f} MiB")

# %% [markdown]
# Both grow like $L^2$: with autograd, our loop saves as much as the naive version (on one run
# here: 53 MiB naive against 51 MiB for the loop at $L = 1024$). The memory saving of this
# notebook's loop is an inference saving; FlashAttention's training saving comes from its
# hand-written backward pass, which saves only $O$ and one log-sum-exp per row and recomputes
# the blocks.
#
# ### Exercise 3: `FlashAttention`, the backward pass that recomputes
#
# Write blockwise attention as a `torch.autograd.Function`: PyTorch runs its `forward` **without**
# recording anything, keeps only what you pass to `ctx.save_for_backward`, and calls your
# `backward` with $dO$, the gradient of the loss with respect to the output. Save $Q$, $K$, $V$,
# $O$ and, per query row, the **log-sum-exp** $\text{lse} = m + \log \ell$ of its scores (from
# the running max and sum at the end of the forward loop): $O(L d)$ numbers. In backward, loop
# over the same key blocks and recompute each block's probabilities from it, exactly, with no
# new max or sum: $P = e^{S - \text{lse}}$ (with the causal mask applied again). The gradients
# (FlashAttention-2, Dao 2023, Algorithm 2), with $D = \operatorname{rowsum}(dO \odot O)$ computed
# once:
#
# $$dV_\text{blk} = P^\top dO, \qquad dP = dO\, V_\text{blk}^\top, \qquad
# dS = P \odot (dP - D), \qquad dQ \mathrel{+}= dS\, K_\text{blk} / \sqrt{d}, \qquad
# dK_\text{blk} = dS^\top Q / \sqrt{d}.$$
#
# ($dS = P \odot (dP - D)$ is the softmax's Jacobian applied row by row: $D_i = \sum_j P_{ij}
# dP_{ij} = dO_i \cdot O_i$.) `FlashAttention.apply(q, k, v, block_size, causal)` takes the same
# arguments as `flash_attention` (passed by position, as `apply` requires) and returns $O$;
# `backward` returns `(dq, dk, dv, None, None)`, one entry per argument of `forward`. The checks
# compare the output and the three gradients with autograd's in float64, count the elements of
# every tensor saved for backward (they must be $O(L d)$, not $O(L^2)$), and record every tensor
# created in forward **and** backward: none may hold an $L_q \times L_k$ matrix for one
# (batch, head) slice.

# %% [solution] FlashAttention
class FlashAttention(torch.autograd.Function):
    """Blockwise attention with FlashAttention's backward pass: forward saves q, k, v, the output
    O and each row's log-sum-exp only; backward recomputes the probabilities block by block.

    FlashAttention.apply(q, k, v, block_size, causal) -> O, shapes as flash_attention's.
    """

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        ### BEGIN SOLUTION
        Lq, Lk = q.size(-2), k.size(-2)
        scale = 1.0 / math.sqrt(q.size(-1))
        m = torch.full(q.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype, device=q.device)
        q_pos = torch.arange(Lq, device=q.device)[:, None]
        for start in range(0, Lk, block_size):
            k_blk, v_blk = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
            s = (q @ k_blk.transpose(-2, -1)) * scale
            if causal:
                k_pos = torch.arange(start, start + k_blk.size(-2), device=q.device)[None, :]
                s = s.masked_fill(k_pos > q_pos, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ v_blk
            m = m_new
        o = acc / l
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block_size, ctx.causal, ctx.scale = block_size, causal, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do):
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        bs, scale = ctx.block_size, ctx.scale
        Lq, Lk = q.size(-2), k.size(-2)
        D = (do * o).sum(dim=-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        q_pos = torch.arange(Lq, device=q.device)[:, None]
        for start in range(0, Lk, bs):
            end = min(start + bs, Lk)
            k_blk, v_blk = k[..., start:end, :], v[..., start:end, :]
            s = (q @ k_blk.transpose(-2, -1)) * scale
            if ctx.causal:
                k_pos = torch.arange(start, end, device=q.device)[None, :]
                s = s.masked_fill(k_pos > q_pos, float("-inf"))
            p = torch.exp(s - lse)
            dv[..., start:end, :] = p.transpose(-2, -1) @ do
            dp = do @ v_blk.transpose(-2, -1)
            ds = p * (dp - D)
            dq += (ds @ k_blk) * scale
            dk[..., start:end, :] = (ds.transpose(-2, -1) @ q) * scale
        return dq, dk, dv, None, None
        ### END SOLUTION

# %% [tests] FlashAttention

# %% [markdown]
# **Peak memory of forward and backward, measured.** The same runs as above, now with your
# `FlashAttention` too (blocks of 128 keys):

# %%
fa_fn = pick("FlashAttention", lambda: FlashAttention.apply, lambda: R.FlashAttention.apply,
             check=lambda f: f(*torch.randn(3, 1, 8, 4).unbind(0), 4, False))
fb_lengths = [256, 512] if QUICK else [256, 512, 1024, 2048]
fb = {"naive": [], "blockwise loop, autograd": [], "FlashAttention (recompute)": []}
for L in fb_lengths:
    q, k, v = (torch.randn(1, 4, L, 64).requires_grad_() for _ in range(3))
    runs = {"naive": lambda: naive_attention(q, k, v, causal=True),
            "blockwise loop, autograd": lambda: flash_fn(q, k, v, block_size=128, causal=True),
            "FlashAttention (recompute)": lambda: fa_fn(q, k, v, 128, True)}
    for name, fn in runs.items():
        _, peak = peak_memory(forward_backward(fn), grad=True)
        fb[name].append(peak / 2**20)
    print(f"L={L:5d}  forward + backward peak: " + ", ".join(f"{n} {fb[n][-1]:6.1f} MiB" for n in fb))
fig = plots.curves(fb_lengths, fb, xlabel="sequence length L", ylabel="peak MiB, forward + backward",
                   logy=True, markers=True, title="training memory (B=1, H=4, d=64, causal)")
plt.gca().set_xscale("log", base=2)

# %% [markdown]
# The naive version and the loop under autograd grow like $L^2$; the recompute grows like $L$:
# its peak is the inputs, the output, their gradients and a few $(L, 128)$ blocks at a time
# (on one run here: 202 MiB naive, 182 MiB for the loop and 36 MiB for the recompute at
# $L = 2048$; 52, 50 and 18 MiB at $L = 1024$).
# It pays for that with arithmetic: the backward pass computes every block of scores again.
#
# **One function for both.** From here on, `flash_attention` trains with your backward pass:
# when autograd is recording and an input needs a gradient, it hands the work to
# `FlashAttention.apply`; otherwise (inference, `torch.no_grad()`) it runs your forward loop as
# before. The course's exported `flash_attention` is this one. (The progress table at the end
# still checks your own loop, kept as `flash_attention.learners_loop`.)

# %% [export]
# your Exercise 2 loop, kept for inference (running this cell again keeps your loop, not this one)
flash_attention_forward = getattr(flash_attention, "learners_loop", flash_attention)


@functools.wraps(flash_attention_forward)  # your loop's name and docstring
def flash_attention(q, k, v, block_size=64, causal=False):
    # with gradients: FlashAttention (saves O and the row log-sum-exp, recomputes the blocks)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return FlashAttention.apply(q, k, v, block_size, causal)
    return flash_attention_forward(q, k, v, block_size, causal)


flash_attention.learners_loop = flash_attention_forward  # what the progress table checks

# %%
q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))
trained = pick("FlashAttention", lambda: flash_attention, lambda: R.flash_attention,
               check=lambda f: f(q, k, v, 16, True))
print("training: output made by", type(trained(q, k, v, 16, True).grad_fn).__name__)
with torch.no_grad():
    print("inference: no graph, grad_fn =", trained(q, k, v, 16, True).grad_fn)

# %% [markdown]
# ### What a fused GPU kernel adds
#
# The code above shows the *algorithm*, not the speed. On a GPU, FlashAttention is fast because
# the whole loop is **one kernel**: a block of queries, its running $m$, $\ell$ and accumulator
# stay in the streaming multiprocessor's on-chip SRAM (registers and shared memory, tens of
# MiB in total, roughly ten times the bandwidth of the GPU's main memory), key and value
# blocks are streamed through it, and the $L \times L$ scores never travel to main memory at all.
# Naive attention is limited by that traffic, not by arithmetic: it writes the scores, reads them
# back for the softmax, writes the probabilities and reads them again for $PV$. The fused kernel
# never writes an $L \times L$ matrix to main memory. It does not read $Q, K, V$ only once: each
# block of queries streams all of $K$ and $V$ past it, so $K$ and $V$ are read once per query
# block, $\Theta(L^2 d^2 / M)$ memory accesses for on-chip memory of size $M$ against
# $\Theta(L d + L^2)$ for the naive version (Dao et al. 2022, Theorem 2); FlashAttention-2 (Dao
# 2023) writes each output block once. It also skips fully masked causal blocks, and for training
# it stores only one log-sum-exp per row and *recomputes* the score blocks in the backward pass
# which costs arithmetic but saves the $L^2$ memory and its traffic. Each PyTorch
# operation in our loop, by contrast, is a separate kernel that round-trips through main memory.
# `F.scaled_dot_product_attention` picks such a fused kernel when one is available.

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** In the online softmax, when a new block raises the running maximum from
# $m_\text{old}$ to $m_\text{new}$, the running sum is multiplied by
# $e^{m_\text{old} - m_\text{new}}$. Why does this keep the final result exact?

# %% [answer] q_online_rescale 1
# ### BEGIN SOLUTION
# The running sum holds $\sum_j e^{x_j - m_\text{old}}$ over the blocks seen so far. Multiplying
# by $e^{m_\text{old} - m_\text{new}}$ turns every term into $e^{x_j - m_\text{new}}$: the same
# sum, now measured against the new maximum. After the last block every term uses the global
# maximum, exactly as the two-pass softmax has it. Nothing is approximated; only the reference
# point of the exponentials moves (and since $m_\text{new} \ge m_\text{old}$ the factor is at
# most 1, so nothing overflows).
# ### END SOLUTION

# %% [markdown]
# **Question 2.** The blockwise attention here is not reliably faster than the naive one on this
# CPU, yet FlashAttention is much faster on a GPU. What does a fused GPU kernel save that our
# Python loop does not?

# %% [answer] q_fused_kernel 1
# ### BEGIN SOLUTION
# Memory traffic. A fused kernel keeps each block of scores, its running max and sum, and the
# output accumulator in fast on-chip memory (registers and shared memory) and writes only the
# final output to the GPU's main memory (HBM). Our loop runs one PyTorch operation per step,
# and each operation reads its inputs from and writes its result to main memory, so the
# (Lq, block) tiles make round trips the fused kernel avoids. Attention is limited by memory
# bandwidth, not arithmetic, so saving that traffic is where the speed comes from.
# ### END SOLUTION

# %% [markdown]
# ## 5. Mistakes worth recognising
#
# The checks above name each of these.
#
# | mistake | what happens |
# | --- | --- |
# | the running sum is not rescaled when the max grows | old terms stay relative to a stale (smaller) max, so they are too large and the sum $\ell$ too big: a row whose max grew sums to less than 1 (0.16 to 0.51 measured on the checks' rising rows) |
# | the factor inverted, $e^{m_\text{new} - m_\text{old}}$ | old terms grow instead of shrinking; wrong, and may overflow |
# | the accumulator not rescaled (only the sum) | the output is dominated by early blocks |
# | running max started at $-\infty$ with no guard, on rows whose first block is all masked | $-\infty - (-\infty)$ = NaN (starting at $-\infty$ is FlashAttention's own choice and fine with a guard, or when every block holds a finite score) |
# | causal mask compared with positions inside the block | every block is masked as if it were the first: the model sees the future |
# | the causal mask built for all $L \times L$ positions and sliced | correct values, and the $L^2$ memory is back |
# | scaling by $\sqrt{d_v}$ or $d_k$ | wrong as soon as the value size differs or $d_k > 1$ |
# | a max over the whole row first, then blocks | a two-pass softmax: right values, but not online |
#
# **Next:** with notebook 09's modern decoder (RMSNorm, rotary positions, SwiGLU,
# grouped-query attention) and this one, FlashAttention's papers (Dao et al. 2022; Dao 2023)
# are a short read. Notebook 11 turns text into the tokens all these models read.
