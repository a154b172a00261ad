#| default_exp attention
# %% [markdown]
# # 01 · Attention: a weighted average you can compute by hand
#
# Attention is the one idea every other part of a Transformer is built around. In this
# notebook you build it from nothing but matrix products and `exp`:
#
# 1. the **dot product** as a similarity score,
# 2. a numerically **stable softmax** that turns scores into weights,
# 3. **attention as a weighted average** of value vectors,
# 4. why the scores are divided by $\sqrt{d_k}$, shown by experiment.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Before you hand in, run *Validate* (or `nbgrader validate 01_attention.ipynb`).
# Hidden tests with other shapes and seeds run when your work is graded, so write code that
# works for any shape, not just the examples.
#
# You may **not** call PyTorch's own `softmax` inside `softmax`, nor
# `F.scaled_dot_product_attention` inside your attention: the checks notice.

# %% [setup] setup_imports
import math

import matplotlib.pyplot as plt
import torch

from tfscratch import checks, plots
from tfscratch.widgets import explore

torch.manual_seed(0)
%matplotlib inline

chk = checks.notebook("01_attention")  # the graded checks of this notebook

# %% [markdown]
# ## 1. The dot product measures similarity
#
# Give every token a vector. Two vectors that point the same way have a large dot product
# $q \cdot k = \sum_i q_i k_i$; orthogonal vectors give 0; opposite ones a negative number.
# Below, six words get hand-made 4-dimensional vectors whose axes mean roughly
# *animal*, *vehicle*, *small*, *fast*.

# %%
words = ["cat", "kitten", "dog", "car", "truck", "bike"]
vecs = torch.tensor([
    [1.0, 0.0, 0.6, 0.3],   # cat
    [1.0, 0.0, 1.0, 0.2],   # kitten
    [1.0, 0.0, 0.2, 0.6],   # dog
    [0.0, 1.0, 0.3, 1.0],   # car
    [0.0, 1.0, 0.0, 0.6],   # truck
    [0.0, 0.7, 0.8, 0.5],   # bike
])
similarity = vecs @ vecs.T  # (6, 6): every pair of dot products at once
fig = plots.heatmap(similarity, words, words, xlabel="word", ylabel="word",
                    title="dot products between word vectors", annotate=True, cmap="magma")

# %% [markdown]
# Animals score high with animals and vehicles with vehicles. A matrix product computes all
# pairs at once: with queries stacked as rows of $Q$ and keys as rows of $K$, $QK^\top$ holds
# every query-key similarity. Attention uses exactly this as its raw **score**.
#
# ## 2. Softmax: scores into weights
#
# Scores can be any real numbers; to average we need non-negative weights that sum to 1.
# Softmax does that while keeping the order (a bigger score gets a bigger weight):
#
# $$\operatorname{softmax}(x)_i = \frac{e^{x_i}}{\sum_j e^{x_j}}$$
#
# Written literally it breaks on large inputs: `exp(1000)` is `inf` in float32, and
# `inf / inf` is `NaN`.

# %%
x = torch.tensor([1000.0, 1001.0, 1002.0])
naive = x.exp() / x.exp().sum()
print("naive softmax of [1000, 1001, 1002]:", naive)

# %% [markdown]
# The fix costs nothing. For any constant $c$,
# $\frac{e^{x_i - c}}{\sum_j e^{x_j - c}} = \frac{e^{-c} e^{x_i}}{e^{-c} \sum_j e^{x_j}}$, the same
# value. Choose $c = \max_j x_j$: the largest exponent becomes $e^0 = 1$, nothing overflows, and
# at least one term of the sum is 1, so we never divide by zero.
#
# Two details decide whether it works on real tensors:
# - take the max **along the same axis** as the sum, one max per row, not one for the whole
#   tensor (a row of very negative scores would underflow to all zeros);
# - keep that axis (`keepdim=True`), so a `(rows, 1)` max broadcasts back over the row. Without
#   it, a `(rows,)` tensor broadcasts against the **columns**, silently wrong for square inputs.
#
# ### Exercise 1: `softmax`

# %% [solution] softmax
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax of `x` along `dim`.

    x: a float tensor of any shape. Returns a tensor of the same shape whose entries along
    `dim` are >= 0 and sum to 1. Subtract the max along `dim` (keepdim=True) before exp.
    Do not call torch.softmax, F.softmax, Tensor.softmax or nn.Softmax.
    """
    ### BEGIN SOLUTION
    z = x - x.amax(dim=dim, keepdim=True)  # largest entry per slice becomes 0
    e = z.exp()
    return e / e.sum(dim=dim, keepdim=True)
    ### END SOLUTION

# %% [markdown]
# Run the checks. Each prints a ✔ line when it passes, or tells you what is wrong.

# %% [tests] softmax

# %% [markdown]
# ## 3. Attention is a weighted average of values
#
# A query $q$ asks "who is relevant to me?". Each key $k_j$ answers with a score $q \cdot k_j$;
# softmax turns the scores into weights $w_j$; the answer is the weighted average of the values,
# $\sum_j w_j v_j$. Stacking queries, keys and values as rows of matrices:
#
# $$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V$$
#
# with shapes $Q: (L_q, d_k)$, $K: (L_k, d_k)$, $V: (L_k, d_v)$, weights $(L_q, L_k)$ and
# output $(L_q, d_v)$. Queries and keys must share $d_k$ (they are dot-multiplied); values may
# have another size, and there may be more keys than queries (cross-attention in notebook 06).
#
# Leading axes are batch axes: the same formula applies to `(B, L, d)` and, after
# notebook 03, to `(B, H, L, d)`. That is why the key transpose must swap the **last two** axes,
# `k.transpose(-2, -1)`; `k.T` reverses *all* axes of a 3-D tensor, and `k.transpose(1, 2)`
# is only right for one particular rank.
#
# ### Exercise 2: `scaled_dot_product_attention`
#
# Use your `softmax` (or `torch.softmax`, now allowed); do not call
# `F.scaled_dot_product_attention`. Return **both** the output and the weights: the weights are
# what we plot.

# %% [solution] scaled_dot_product_attention noexport
def scaled_dot_product_attention(q, k, v):
    """softmax(q k^T / sqrt(d_k)) v, for any leading batch axes.

    q: (..., Lq, d_k)   k: (..., Lk, d_k)   v: (..., Lk, d_v)
    Returns (output, weights): output (..., Lq, d_v), weights (..., Lq, Lk), whose rows sum to 1.
    """
    ### BEGIN SOLUTION
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)
    weights = softmax(scores, dim=-1)  # normalise over the keys
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)
    ### END SOLUTION

# %% [tests] scaled_dot_product_attention

# %% [markdown]
# ## 4. Attention on a sentence
#
# Let each token of a short sentence be its own query, key and value (self-attention) using
# random but fixed embeddings. Each row of the heatmap is one query's weights over the keys: a
# probability distribution, so each row sums to 1. With random vectors each token mostly
# attends to itself, since a vector's dot product with itself, $\lVert x \rVert^2$, is
# usually the largest. Learned projections (notebook 03) are what let tokens look elsewhere.

# %%
sentence = ["the", "cat", "sat", "on", "the", "mat"]
vocab = {w: i for i, w in enumerate(dict.fromkeys(sentence))}
gen = torch.Generator().manual_seed(1)
table = torch.randn(len(vocab), 8, generator=gen)
emb = table[[vocab[w] for w in sentence]]  # (6, 8): the two "the" share one vector
out, weights = scaled_dot_product_attention(emb, emb, emb)
fig = plots.attention_heatmap(weights, sentence, sentence, title="self-attention weights")

# %% [markdown]
# The two `the` tokens have identical vectors, so they give identical rows and attend to
# each other as strongly as to themselves: attention sees *content*, not *position*
# (notebook 05 fixes that).
#
# ## 5. Why divide by $\sqrt{d_k}$?
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, then
# $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ is a sum of $d_k$ terms of variance 1: its variance is
# $d_k$, its typical size $\sqrt{d_k}$ (the argument of Vaswani et al., 2017, "Attention Is All
# You Need", section 3.2.1, footnote 4). Measure it:

# %%
dims = [4, 16, 64, 256, 1024]
gen = torch.Generator().manual_seed(0)
raw_var, scaled_var = [], []
for d in dims:
    q = torch.randn(2000, d, generator=gen)
    k = torch.randn(2000, d, generator=gen)
    dots = (q * k).sum(-1)
    raw_var.append(dots.var().item())
    scaled_var.append((dots / math.sqrt(d)).var().item())
    print(f"d_k={d:5d}  var(q.k)={raw_var[-1]:8.1f}  var(q.k/sqrt(d_k))={scaled_var[-1]:.2f}")
fig = plots.curves(dims, {"q·k": raw_var, "q·k / sqrt(d_k)": scaled_var}, xlabel="d_k",
                   ylabel="variance of the score", logy=True, markers=True,
                   title="score variance grows with d_k unless scaled")

# %% [markdown]
# Large scores **saturate** softmax: one weight goes to ~1, the rest to ~0. Then softmax is
# flat around its output, and its gradient (the Jacobian $\operatorname{diag}(w) - ww^\top$)
# goes to 0: the layer stops learning. Below: the largest weight and the gradient norm reaching
# the scores, for one query over 16 keys, with and without scaling.

# %%
def saturation(d, scale, n_keys=16, trials=200, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(trials, 1, d, generator=gen)
    k = torch.randn(trials, n_keys, d, generator=gen)
    scores = (q @ k.transpose(-2, -1)) / (math.sqrt(d) if scale else 1.0)
    scores.requires_grad_(True)
    w = torch.softmax(scores, dim=-1)
    target = torch.randn(w.shape, generator=gen)
    (w * target).sum().backward()
    return w.max(-1).values.mean().item(), scores.grad.norm(dim=-1).mean().item()

stats = {s: [saturation(d, s) for d in dims] for s in (False, True)}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for s, label in ((False, "unscaled"), (True, "scaled by sqrt(d_k)")):
    axes[0].plot(dims, [m for m, _ in stats[s]], "o-", label=label)
    axes[1].plot(dims, [g for _, g in stats[s]], "o-", label=label)
axes[0].set(xscale="log", xlabel="d_k", ylabel="largest weight (mean)", title="softmax saturates")
axes[1].set(xscale="log", yscale="log", xlabel="d_k", ylabel="gradient norm at the scores",
            title="...and its gradient vanishes")
for ax in axes:
    ax.legend()
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# Without scaling, at $d_k = 1024$ the largest weight is nearly 1 and the gradient is orders of
# magnitude smaller; with scaling, both stay put whatever $d_k$ is.
#
# ### Explore: watch the weights sharpen
#
# Move `d_k` and toggle `scale`. Queries and keys are random with unit-variance entries; only
# their size changes. Unscaled, the rows turn into near one-hot vectors as `d_k` grows.
# `temperature` divides the scores once more: small values sharpen, large values flatten.

# %%
def draw_weights(d_k=64, scale=False, temperature=1.0):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, d_k, generator=gen)
    k = torch.randn(6, d_k, generator=gen)
    scores = q @ k.T / (math.sqrt(d_k) if scale else 1.0) / temperature
    w = torch.softmax(scores, dim=-1)
    title = f"d_k={d_k}, {'scaled' if scale else 'unscaled'}, T={temperature:.2f}"
    return plots.attention_heatmap(w, [f"q{i}" for i in range(6)], [f"k{j}" for j in range(6)],
                                   title=title)

explorer = explore(draw_weights, d_k=(1, 512, 1, 64), scale=False, temperature=(0.1, 5.0, 0.1, 1.0))

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** Softmax is computed as `exp(x - max(x))` divided by its sum. Why does
# subtracting the row maximum not change the result, and what does it prevent?

# %% [answer] q_softmax_shift 1
# ### BEGIN SOLUTION
# For any constant $c$, $e^{x_i - c} / \sum_j e^{x_j - c} = e^{-c} e^{x_i} / (e^{-c} \sum_j
# e^{x_j})$: the factor $e^{-c}$ cancels, so the weights are the same. With $c = \max(x)$ the
# largest exponent is $e^0 = 1$: nothing overflows to `inf` (float32 `exp` overflows past about
# 88), and the denominator is at least 1, so there is no `inf / inf` or `0 / 0` = NaN.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** Queries and keys have $d_k = 256$ independent entries of mean 0 and variance
# 1. What is the typical size (standard deviation) of $q \cdot k$, and why does it hurt training
# if the scores are not divided by $\sqrt{d_k}$?

# %% [answer] q_scale_dk 1
# ### BEGIN SOLUTION
# $q \cdot k$ is a sum of 256 products of variance 1: variance 256, standard deviation 16.
# Scores that differ by tens saturate softmax: one weight near 1, the rest near 0. Softmax's
# Jacobian $\operatorname{diag}(w) - w w^\top$ is then almost 0, so almost no gradient reaches
# the queries and keys and learning stalls. Dividing by $\sqrt{256} = 16$ brings the scores back
# to variance 1.
# ### END SOLUTION

# %% [markdown]
# ## 6. Mistakes worth recognising
#
# These appear in published tutorials and study notes; the checks above name each one.
#
# | mistake | what happens |
# | --- | --- |
# | no max subtraction in softmax | `NaN` as soon as a score passes ~88 (float32 `exp` overflows) |
# | one global max instead of one per row | a row whose scores sit ~100 or more below the global max underflows to 0/0 = `NaN` |
# | `max` without `keepdim=True` | broadcasts against the wrong axis; silently wrong on square inputs |
# | softmax over `dim=-2` | columns sum to 1 instead of rows: each *key* distributes its attention |
# | no $1/\sqrt{d_k}$, or $1/d_k$ | saturated or over-flattened weights; training stalls or learns slowly |
# | `k.T` or `k.transpose(1, 2)` | only correct for one tensor rank; wrong or crashing with heads (`.T` on more than 2 dims reverses *every* axis, and PyTorch warns that this is deprecated) |
# | returning the scores as "weights" | they don't sum to 1 and are not what you plot |
# | a misspelt variable (`socres` for `scores`) | a `NameError`, or worse a stale global used silently |
#
# The last one is real: a set of study notes computes `socres = ...` and then uses `scores`.
# In a notebook, a `scores` left over from an earlier cell makes that run *without an error*.
# Restarting the kernel and running all cells is the cure.
#
# **Next:** `02_masks`: padding and causal masks, and what $-\infty$ does inside softmax.
