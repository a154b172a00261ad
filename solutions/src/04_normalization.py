#| default_exp norm
# %% [markdown]
# # 04 · Normalisation: LayerNorm versus BatchNorm
#
# Every sub-layer of a Transformer is wrapped in a **LayerNorm**. Computer-vision networks
# use **BatchNorm** instead. Both subtract a mean and divide by a standard deviation; they
# differ in *which numbers* they average over, and that one choice decides whether the
# result depends on the other examples in the batch, on padding, on the batch size and on
# whether the model is training or evaluating. In this notebook you build both from basic
# tensor operations:
#
# 1. which axes each one averages over, drawn as a picture of a `(B, L, D)` tensor,
# 2. `layer_norm` and `LayerNorm`: biased variance, `eps` inside the square root, scale and shift,
#    and why a LayerNorm found in many tutorials is *not* `nn.LayerNorm`,
# 3. `batch_norm` and `BatchNorm`: train and eval modes, running statistics, momentum and the
#    unbiased running variance,
# 4. experiments: padding pollutes BatchNorm, small batches make it noisy, train and eval
#    disagree; LayerNorm is immune to all three,
# 5. `rms_norm`, the variant today's large language models use.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Before you hand in, run *Validate* (or `nbgrader validate 04_normalization.ipynb`).
# Hidden tests with other shapes and seeds run when your work is graded.
#
# You may **not** call `F.layer_norm`, `nn.LayerNorm`, `torch.layer_norm` (or `F.rms_norm`) in
# the layer-norm exercises, nor `F.batch_norm`, `nn.BatchNorm1d`, `torch.batch_norm` in the
# batch-norm exercises: the checks notice. Means, variances, `sqrt` and arithmetic are all
# you need.

# %% [setup] setup_imports
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from tfscratch import checks, plots
from tfscratch.widgets import explore

torch.manual_seed(0)
%matplotlib inline

chk = checks.notebook("04_normalization")  # the graded checks of this notebook

# %% [markdown]
# ## 1. Why normalise?
#
# A deep network applies layer after layer. If each layer multiplies the typical size of its
# input by a little more than 1, the activations grow exponentially with depth; a little less
# than 1 and they fade away. Gradients do the same on the way back. Below, a stack of 24
# random linear layers whose weights are 20% too large or too small, and the same stack with
# every layer's output normalised (by PyTorch's `F.layer_norm` for now; you will write your
# own in a moment).

# %%
def depth_scan(gain, normalise, depth=24, d=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(32, d, generator=gen)
    stds = [h.std().item()]
    for _ in range(depth):
        w = torch.randn(d, d, generator=gen) * gain / math.sqrt(d)
        h = h @ w
        if normalise:
            h = F.layer_norm(h, (d,))
        stds.append(h.std().item())
    return stds

layers = list(range(25))
fig = plots.curves(layers, {"weights 20% too large": depth_scan(1.2, False),
                            "weights 20% too small": depth_scan(0.8, False),
                            "too large, normalised after each layer": depth_scan(1.2, True)},
                   xlabel="layer", ylabel="std of the activations", logy=True, markers=True,
                   title="activation scale through depth")

# %% [markdown]
# After 24 layers the unnormalised activations are ~80 times too large or ~200 times too
# small; normalised, every layer sees inputs of size 1. Normalisation subtracts a **mean**
# and divides by a **standard deviation**. The whole question of this notebook is: *the mean
# of which numbers?*
#
# ## 2. Which axes? A picture
#
# A Transformer's activations have shape `(B, L, D)`: `B` sequences, `L` positions each, `D`
# features per token. Picture each sequence as a table with one row per position and one
# column per feature:
#
# - **BatchNorm** computes one mean and variance **per feature** $j$, over every token of
#   every sequence in the batch: a *column* through all `B` tables. Its statistics have shape
#   `(D,)`, and they mix tokens from different sequences, padding included.
# - **LayerNorm** computes one mean and variance **per token** $(b, l)$, over its `D`
#   features: one *row* of one table. Its statistics have shape `(B, L, 1)`, and a token never
#   sees another token.
#
# The shaded cells below are the numbers that go into *one* mean; hatched cells are padding
# (sequences of lengths 5, 3 and 4 padded to 5).

# %%
def draw_axes_picture(B=3, L=5, D=6, lengths=(5, 3, 4), feature=2, token=(1, 1)):
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle
    cmap = ListedColormap(["#f4f4f4", "#e6550d", "#3182bd"])
    fig, axes = plt.subplots(2, B, figsize=(2.3 * B + 1.2, 5.6))
    rows = [("BatchNorm: one mean per FEATURE\nover batch and positions -> (D,)", 1),
            ("LayerNorm: one mean per TOKEN\nover its features -> (B, L, 1)", 2)]
    for r, (label, colour) in enumerate(rows):
        for b in range(B):
            ax = axes[r, b]
            grid = torch.zeros(L, D)
            if colour == 1:
                grid[:, feature] = 1  # the same feature at every position of every sequence
            elif b == token[0]:
                grid[token[1], :] = 2  # all features of one token
            ax.imshow(grid, cmap=cmap, vmin=0, vmax=2, aspect="equal")
            for l in range(lengths[b], L):  # padding positions
                ax.add_patch(Rectangle((-0.5, l - 0.5), D, 1, fill=False, hatch="///",
                                       edgecolor="grey", lw=0))
            ax.set_xticks(range(D), [f"d{j}" for j in range(D)], fontsize=7)
            ax.set_yticks(range(L), [f"l{i}" for i in range(L)], fontsize=7)
            ax.set_xticks([x - 0.5 for x in range(1, D)], minor=True)
            ax.set_yticks([y - 0.5 for y in range(1, L)], minor=True)
            ax.grid(which="minor", color="white", lw=1.5)
            ax.tick_params(which="minor", length=0)
            ax.set_title(f"sequence b={b} (length {lengths[b]})", fontsize=8)
            if b == 0:
                ax.set_ylabel(label, fontsize=9)
    fig.suptitle("a (B, L, D) = (3, 5, 6) batch: which cells share one mean and variance?")
    fig.tight_layout()
    return fig

fig = draw_axes_picture()

# %% [markdown]
# BatchNorm's column runs straight through the padding of sequences 1 and 2; LayerNorm's row
# never leaves its token. In code, the difference is only the `dim` argument of the
# reductions:

# %%
x = torch.randn(3, 5, 6)
bn_mean = x.mean(dim=(0, 1))              # over batch and positions: one per feature
ln_mean = x.mean(dim=-1, keepdim=True)    # over features: one per token
print("BatchNorm statistics:", tuple(bn_mean.shape), "  LayerNorm statistics:", tuple(ln_mean.shape))

# %% [markdown]
# ## 3. LayerNorm
#
# For one token $x \in \mathbb{R}^D$ (a row of the last axis):
#
# $$\mu = \frac{1}{D}\sum_{j=1}^{D} x_j, \qquad
#   \sigma^2 = \frac{1}{D}\sum_{j=1}^{D} (x_j - \mu)^2, \qquad
#   \hat{x}_j = \frac{x_j - \mu}{\sqrt{\sigma^2 + \epsilon}}, \qquad
#   y_j = \gamma_j \hat{x}_j + \beta_j$$
#
# Two details, both easy to get wrong:
#
# - **the variance is the *biased* one**, dividing by $D$. `x.var()` and `x.std()` divide by
#   $D - 1$ by default (the unbiased *estimate* of a population's variance from a sample);
#   ask for `unbiased=False` (or `correction=0`), or write the mean of squares yourself.
# - **$\epsilon$ goes inside the square root.** It keeps the division finite when a token's
#   features are all equal ($\sigma^2 = 0$); `nn.LayerNorm`'s default is $10^{-5}$.
#
# ### The LayerNorm found in many tutorials
#
# A LayerNorm that circulates in blog posts and study notes (it goes back to an early
# annotated Transformer) looks like this, rewritten here in our own names:

# %%
class TutorialLayerNorm(nn.Module):
    """The popular variant: x.std() (unbiased) and eps added to the std. Not nn.LayerNorm!"""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))   # scale, under another name
        self.b_2 = nn.Parameter(torch.zeros(features))  # shift
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)                    # divides by D - 1
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2  # eps outside the root

# %% [markdown]
# It differs from `nn.LayerNorm` in three ways: the unbiased `std` shrinks every output by
# $\sqrt{(D-1)/D}$, $\epsilon$ sits outside the root, and its default $\epsilon$ is
# $10^{-6}$. Measure how far apart the two are, first against the width $D$, then against the
# size of the input (the spread of the features):

# %%
torch.manual_seed(0)
tut_ln = TutorialLayerNorm(512)
ref_ln = nn.LayerNorm(512, elementwise_affine=False)
widths = [4, 8, 16, 64, 256, 1024]
gap_vs_D = []
for D in widths:
    x = torch.randn(256, D)
    with torch.no_grad():
        gap_vs_D.append((TutorialLayerNorm(D)(x) - nn.LayerNorm(D)(x)).abs().mean().item())
scales = [1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0]
gap_vs_scale = []
for s in scales:
    x = torch.randn(256, 512) * s
    with torch.no_grad():
        gap_vs_scale.append((tut_ln(x) - ref_ln(x)).abs().max().item())
    print(f"feature spread {s:7.0e}: max |tutorial - nn.LayerNorm| = {gap_vs_scale[-1]:.4f}")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
axes[0].plot(widths, gap_vs_D, "o-", label="measured")
axes[0].plot(widths, [math.sqrt(2 / math.pi) * (1 - math.sqrt((D - 1) / D)) for D in widths], "k--",
             label=r"mean $|\hat x|$ times $(1-\sqrt{(D-1)/D}) \approx 0.4/D$")
axes[0].set(xscale="log", yscale="log", xlabel="D (features)", ylabel="mean abs difference",
            title="unbiased std: an error shrinking like 1/D")
axes[1].plot(scales, gap_vs_scale, "o-", color="C3")
axes[1].set(xscale="log", yscale="log", xlabel="spread of the features (std of x)",
            ylabel="max abs difference", title="eps outside the root: wrong for tiny variance")
axes[0].legend(fontsize=8)
for ax in axes:
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# For ordinary inputs the tutorial version is off by a fraction of a percent (the
# $\sqrt{(D-1)/D}$ factor); a model trained with it learns around it. But when the features
# of a token barely differ (std $\lesssim 10^{-2}$, e.g. a near-constant or padded
# embedding) the two are completely different functions: `nn.LayerNorm` divides by
# $\sqrt{\sigma^2 + \epsilon} \approx \sqrt{\epsilon}$ and returns *small* values, while
# $\sigma + \epsilon \approx \sigma$ blows the token up to unit size. Weights trained with
# one do not transfer to the other, and a check against `nn.LayerNorm` fails. Write the real
# thing.
#
# ### Exercise 1: `layer_norm`
#
# Normalise over the **last axis** whatever the rank of `x` (`(D,)`, `(N, D)`, `(B, L, D)`,
# ...): reduce with `dim=-1, keepdim=True` so that the `(..., 1)` statistics broadcast back.
# `weight` and `bias` are `(D,)` tensors or `None` (then skip that step).

# %% [solution] layer_norm
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the last axis, like F.layer_norm(x, (D,), weight, bias, eps).

    x: (..., D). weight, bias: (D,) or None. Returns (..., D):
    (x - mean) / sqrt(var + eps) * weight + bias, with the mean and the BIASED variance
    (divide by D) of each vector along the last axis.
    """
    ### BEGIN SOLUTION
    mean = x.mean(dim=-1, keepdim=True)                  # (..., 1)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)   # (..., 1), biased: divide by D
    y = (x - mean) / torch.sqrt(var + eps)               # eps inside the root
    if weight is not None:
        y = y * weight                                   # (D,) broadcasts over the rows
    if bias is not None:
        y = y + bias
    return y
    ### END SOLUTION

# %% [tests] layer_norm

# %% [markdown]
# Yours against `nn.LayerNorm` and against the tutorial version, on tokens of very different
# spreads (the tutorial module has eps $10^{-6}$; give it $10^{-5}$ and it is still off):

# %%
x = torch.randn(4, 64) * torch.tensor([[1e-3], [1e-2], [1.0], [100.0]])
ref = F.layer_norm(x, (64,))
print("max |yours    - nn.LayerNorm| per row:", (layer_norm(x) - ref).abs().amax(-1))
with torch.no_grad():
    print("max |tutorial - nn.LayerNorm| per row:", (TutorialLayerNorm(64, eps=1e-5)(x) - ref).abs().amax(-1))

# %% [markdown]
# ## 4. Scale and shift
#
# Normalising forces every token to mean 0 and variance 1 across its features. That may not
# be what the next layer wants, so LayerNorm ends with a learnable per-feature **scale**
# $\gamma$ (`weight`, initialised to ones) and **shift** $\beta$ (`bias`, zeros): the network
# can give feature $j$ any spread $\gamma_j$ and offset $\beta_j$ it finds useful, and at
# initialisation the layer is the plain normalisation. Check it: after `layer_norm` with
# weight $\gamma$ and bias $\beta$, every feature column has mean $\approx \beta_j$ and std
# $\approx |\gamma_j|$.

# %%
gen = torch.Generator().manual_seed(2)
gamma = torch.linspace(0.2, 3.0, 8)
beta = torch.linspace(-2.0, 2.0, 8)
tokens = torch.randn(4000, 8, generator=gen) * 5 + 3
out = layer_norm(tokens, gamma, beta)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
axes[0].plot(beta, out.mean(0), "o", label="measured")
axes[0].plot(beta, beta, "k--", lw=1, label="y = beta")
axes[0].set(xlabel="bias beta_j", ylabel="mean of feature j", title="shift sets the mean")
axes[1].plot(gamma, out.std(0), "o", label="measured")
axes[1].plot(gamma, gamma, "k--", lw=1, label="y = gamma")
axes[1].set(xlabel="weight gamma_j", ylabel="std of feature j", title="scale sets the spread")
for ax in axes:
    ax.legend()
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# ### Exercise 2: `LayerNorm`
#
# Wrap `layer_norm` in a module, with the names PyTorch uses so that weights can be copied
# between the two: parameters `weight` (ones) and `bias` (zeros), each of shape `(d,)`, and
# `eps` kept for `forward`. Parameters must be `nn.Parameter`s, or the optimizer never sees
# them. (The tutorial's `a_2` / `b_2` names would make every `load_state_dict` from PyTorch
# fail.)

# %% [solution] LayerNorm
class LayerNorm(nn.Module):
    """LayerNorm(d, eps=1e-5) over the last axis, like nn.LayerNorm(d, eps).

    Parameters: weight (d,) = ones, bias (d,) = zeros. forward: (..., d) -> (..., d).
    """

    def __init__(self, d, eps=1e-5):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))   # scale, one per feature
        self.bias = nn.Parameter(torch.zeros(d))    # shift
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return layer_norm(x, self.weight, self.bias, self.eps)
        ### END SOLUTION

# %% [tests] LayerNorm

# %% [markdown]
# ## 5. BatchNorm
#
# BatchNorm normalises each **feature** $j$ with the mean and variance of that feature over
# the whole batch: over the `N` rows of an `(N, D)` input, over all `B * L` tokens of a
# `(B, L, D)` input. With $n$ values per feature,
#
# $$\mu_j = \frac{1}{n}\sum_{i} x_{ij}, \qquad \sigma_j^2 = \frac{1}{n}\sum_{i} (x_{ij} - \mu_j)^2,
#   \qquad y_{ij} = \gamma_j \frac{x_{ij} - \mu_j}{\sqrt{\sigma_j^2 + \epsilon}} + \beta_j .$$
#
# (PyTorch's `nn.BatchNorm1d` wants `(N, C, L)`, features on axis 1; ours keeps the features
# **last**, like everything else in this course.)
#
# **Train and eval.** At test time a model sees one example at a time, and its prediction must
# not depend on whatever else happens to share the batch. So BatchNorm keeps two buffers,
# `running_mean` and `running_var`, which it updates on every training batch:
#
# $$\text{running} \leftarrow (1 - m)\,\text{running} + m\,\text{batch statistic}$$
#
# an exponential moving average with **momentum** $m = 0.1$: the *new* batch gets weight $m$
# (the opposite convention from an optimizer's momentum). In **eval** mode BatchNorm
# normalises with the running statistics instead of the batch's, and leaves them alone.
#
# **The unbiased running variance.** The batch is normalised with its biased variance (divide
# by $n$), but the variance *stored* in `running_var` is the unbiased estimate
# $\sigma_j^2 \cdot n/(n-1)$: it is meant to estimate the variance of the whole data, and
# the biased one underestimates it by the factor $(n-1)/n$, badly so for small $n$:

# %%
gen = torch.Generator().manual_seed(3)
sizes = [2, 3, 4, 8, 16, 32, 64]
biased, unbiased = [], []
for n in sizes:
    samples = torch.randn(20000, n, generator=gen)  # 20000 batches of n values, true variance 1
    biased.append(samples.var(dim=1, unbiased=False).mean().item())
    unbiased.append(samples.var(dim=1, unbiased=True).mean().item())
fig = plots.curves(sizes, {"biased (divide by n)": biased, "unbiased (divide by n - 1)": unbiased,
                           "true variance": [1.0] * len(sizes)},
                   xlabel="values per feature in the batch (n)", ylabel="average estimate",
                   markers=True, title="which batch variance estimates the data's variance?")

# %% [markdown]
# ### Exercise 3: `batch_norm`
#
# The functional form, like `F.batch_norm` but with the feature axis **last**: statistics per
# feature over every other axis (`dim=tuple(range(x.dim() - 1))`).
#
# - `training=True`: normalise with the batch mean and **biased** variance, and update
#   `running_mean` and `running_var` **in place** (the caller's tensors must change:
#   `running_mean = ...` would only rebind a local name; use `mul_`, `add_`, `copy_` or
#   `lerp_`), `running_var` with the **unbiased** variance. The running statistics are not
#   trained: update them under `torch.no_grad()` (or from detached values), but do *not*
#   detach the batch statistics you normalise with, or the gradient is wrong.
# - `training=False` (the default): normalise with `running_mean` and `running_var`, and do
#   not change them.
#
# With a single value per feature ($n = 1$) PyTorch refuses to train; you may use $n/\max(n-1, 1)$.

# %% [solution] batch_norm
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Batch normalisation with the feature axis LAST (F.batch_norm uses axis 1).

    x: (N, D) or (B, L, D) or any (..., D). running_mean, running_var: (D,), updated in place
    when training (running_var with the unbiased batch variance). weight, bias: (D,) or None.
    training=True: normalise with the batch's mean and biased variance over every axis but
    the last; training=False: with running_mean and running_var. Returns a tensor like x.
    """
    ### BEGIN SOLUTION
    D = x.shape[-1]
    dims = tuple(range(x.dim() - 1))                     # every axis except the features
    if training:
        mean = x.mean(dim=dims)                          # (D,)
        var = ((x - mean) ** 2).mean(dim=dims)           # (D,) biased: normalises the batch
        n = x.numel() // D                               # values averaged per feature
        with torch.no_grad():                            # statistics are tracked, not trained
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(momentum * mean)
            if running_var is not None:
                running_var.mul_(1 - momentum).add_(momentum * var * n / max(n - 1, 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)               # (D,) statistics broadcast
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
    ### END SOLUTION

# %% [tests] batch_norm

# %% [markdown]
# **Running statistics in action.** Feed batches of 16 values drawn from a distribution with
# mean 3 and variance 4 and watch `running_mean` and `running_var` climb from their start
# (0 and 1) to the truth. A large momentum follows quickly but noisily; a small one smoothly
# but slowly (about $1/m$ steps).

# %%
gen = torch.Generator().manual_seed(4)
batches = [torch.randn(16, 1, generator=gen) * 2 + 3 for _ in range(120)]
trace = {}
for m in (0.01, 0.1, 0.5):
    rm, rv = torch.zeros(1), torch.ones(1)
    trace[m] = []
    for xb in batches:
        batch_norm(xb, rm, rv, training=True, momentum=m)
        trace[m].append((rm.item(), rv.item()))
steps = range(1, len(batches) + 1)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
for m, tr in trace.items():
    axes[0].plot(steps, [a for a, _ in tr], label=f"momentum {m}")
    axes[1].plot(steps, [v for _, v in tr], label=f"momentum {m}")
axes[0].axhline(3, color="k", ls="--", lw=1)
axes[1].axhline(4, color="k", ls="--", lw=1)
axes[0].set(xlabel="training step", ylabel="running_mean", title="running mean -> 3")
axes[1].set(xlabel="training step", ylabel="running_var", title="running variance -> 4")
for ax in axes:
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# ### Exercise 4: `BatchNorm`
#
# The module keeps parameters `weight` (ones) and `bias` (zeros) and **buffers**
# `running_mean` (zeros) and `running_var` (ones), all of shape `(d,)`. Buffers are registered
# with `self.register_buffer(name, tensor)`: they are saved in `state_dict()` and move with
# `.to(device)`, but they are not parameters (no gradient, the optimizer never touches them).
# `forward` calls your `batch_norm` with `training=self.training`, the flag that
# `model.train()` and `model.eval()` set. (`num_batches_tracked`, which PyTorch also keeps, is
# optional.)

# %% [solution] BatchNorm
class BatchNorm(nn.Module):
    """BatchNorm(d, eps=1e-5, momentum=0.1) with the feature axis last, like nn.BatchNorm1d.

    Parameters weight (d,) = ones and bias (d,) = zeros; buffers running_mean (d,) = zeros and
    running_var (d,) = ones. forward: (N, d) or (B, L, d) -> same shape, batch statistics and
    running-statistics update in train mode, running statistics in eval mode.
    """

    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        ### BEGIN SOLUTION
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))  # state, not trained
        self.register_buffer("running_var", torch.ones(d))
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=self.training, momentum=self.momentum, eps=self.eps)
        ### END SOLUTION

# %% [tests] BatchNorm

# %% [markdown]
# ## 6. Experiments: where BatchNorm breaks on sequences
#
# Real batches of text hold sentences of different lengths, padded to the longest one. We
# simulate token activations with a non-zero mean (as real activations have) and pad with
# zero vectors.
#
# ### 6.1 Padding pollutes BatchNorm's statistics
#
# Take one sentence of 6 tokens and put it in a batch of 8 sentences. Make the *other*
# sentences' padding grow (by making the longest sentence longer) and watch what happens to
# the outputs for our sentence's 6 real tokens, which never changed. The reference is
# BatchNorm computed over the real tokens only.

# %%
D_EXP = 16
gen = torch.Generator().manual_seed(5)
feature_mean = torch.randn(D_EXP, generator=gen) + 1.0      # activations are not centred


def make_batch(lengths, max_len, gen):
    """Sentences of the given lengths, token activations ~ N(feature_mean, 1), zero-padded."""
    x = torch.zeros(len(lengths), max_len, D_EXP)            # (B, L, D), padding = 0
    for b, n in enumerate(lengths):
        x[b, :n] = torch.randn(n, D_EXP, generator=gen) + feature_mean
    real = torch.arange(max_len) < torch.tensor(lengths)[:, None]  # (B, L), True = real token
    return x, real


gen = torch.Generator().manual_seed(6)
lengths = [6, 9, 4, 7, 5, 8, 3, 6]                      # sentence 0 is ours
base, real = make_batch(lengths, 9, gen)
clean = batch_norm(base[real], None, None, training=True)  # statistics over real tokens only
ours_clean = clean[: lengths[0]]                        # the first 6 rows belong to sentence 0
pad_fracs, bn_dev, ln_dev, bn_mean0 = [], [], [], []
ln_ref = layer_norm(base[0, :6])
for max_len in [9, 12, 16, 24, 32, 48, 64, 96]:
    x = torch.zeros(8, max_len, D_EXP)
    x[:, :9] = base                                      # same sentences, more padding
    pad_fracs.append(1 - real.sum().item() / (8 * max_len))
    y_bn = batch_norm(x, torch.zeros(D_EXP), torch.ones(D_EXP), training=True)
    y_ln = layer_norm(x)
    bn_dev.append((y_bn[0, :6] - ours_clean).abs().max().item())
    ln_dev.append((y_ln[0, :6] - ln_ref).abs().max().item())
    bn_mean0.append(x.mean(dim=(0, 1))[0].item())

fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
axes[0].plot(pad_fracs, bn_mean0, "o-", label="BatchNorm's batch mean (feature 0)")
axes[0].axhline(base[real][:, 0].mean().item(), color="k", ls="--", lw=1, label="mean over real tokens")
axes[0].set(xlabel="fraction of the batch that is padding", ylabel="feature 0 mean",
            title="padding drags the statistics to 0")
axes[1].plot(pad_fracs, bn_dev, "o-", label="BatchNorm")
axes[1].plot(pad_fracs, ln_dev, "s-", label="LayerNorm")
axes[1].set(xlabel="fraction of the batch that is padding",
            ylabel="max change of our 6 real tokens", title="same tokens, different outputs")
for ax in axes:
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
fig.tight_layout()
print("LayerNorm: largest change over all paddings =", max(ln_dev))

# %% [markdown]
# The sentence's tokens did not change, yet BatchNorm's outputs for them drift further and
# further as padding is added *elsewhere in the batch*: every pad vector is counted as a
# token of value 0 in each feature's mean and variance. LayerNorm's outputs are identical to
# the last bit: each token is normalised with its own statistics. (Masking pad tokens out of
# BatchNorm's statistics fixes this one problem, but not the next two.)
#
# ### 6.2 Statistics against batch size
#
# Even without padding, a token's BatchNorm output depends on which other sentences share its
# batch, because the batch statistics are an estimate from $n$ values with an error that
# shrinks like $1/\sqrt{n}$. Put the same sentence into 100 random batches of each size and
# measure how far its normalised output lands from the ideal one, normalised with the data's
# true mean and variance (what the running statistics converge to). LayerNorm has no
# "true statistics" to miss: we measure how much its output changes from batch to batch.

# %%
gen = torch.Generator().manual_seed(7)
ours = torch.randn(1, 6, D_EXP, generator=gen) + feature_mean   # one sentence, 6 tokens
batch_sizes = [1, 2, 4, 8, 16, 32, 64]
ideal = ours[0] - feature_mean            # (x - true mean) / true std, the std being 1
err_bn, spread_ln = [], []
for B in batch_sizes:
    outs_bn, outs_ln = [], []
    for _ in range(100):
        others = torch.randn(B - 1, 6, D_EXP, generator=gen) + feature_mean
        x = torch.cat([ours, others])                                 # (B, 6, D)
        outs_bn.append(batch_norm(x, None, None, training=True)[0])   # our sentence's outputs
        outs_ln.append(layer_norm(x)[0])
    err_bn.append((torch.stack(outs_bn) - ideal).pow(2).mean().sqrt().item())
    spread_ln.append(torch.stack(outs_ln).std(dim=0).mean().item())
fig = plots.curves(batch_sizes, {"BatchNorm (train mode): error vs ideal": err_bn,
                                 "sqrt(1.5 / (6 B)), the statistics' sampling error":
                                     [math.sqrt(1.5 / (6 * B)) for B in batch_sizes],
                                 "LayerNorm: change across batches": spread_ln},
                   xlabel="batch size B (sentences of 6 tokens)", ylabel="RMS error / change",
                   markers=True, title="BatchNorm output noise vs batch size")
print("B = 1: the batch is our sentence alone; 6 values per feature, a very noisy estimate.")
single_token = ours[0, :1]                                          # (1, D): ONE value per feature
print("a batch of ONE token in train mode ->", batch_norm(single_token, None, None, training=True)[0, :4],
      "... every output is 0: x - mean(x) = 0")

# %% [markdown]
# BatchNorm's error falls like $1/\sqrt{B}$ and is large for small batches (at B = 1 the
# sentence is normalised by its own 6 tokens); LayerNorm's output never changes. With a batch of a single token there is nothing left to normalise:
# every value *is* the batch mean, so the output is all zeros (PyTorch raises an error
# instead). That is a *training* problem: in eval mode BatchNorm normalises with its running
# statistics, so generating one token at a time (notebook 08) with a trained model is not
# itself the trouble. What does hurt a language model is that those running statistics were
# estimated over padded batches (section 6.1), that training normalises with each batch's own
# noisy statistics while evaluation uses the running ones (section 6.3 below), and that during
# training every token's output depends on which other sentences share its batch.
#
# ### 6.3 The train/eval gap
#
# In eval mode BatchNorm uses the running averages; in training, the current batch's
# statistics. For the same batch the two disagree, and the network is trained with one
# normalisation and tested with the other. Below, a `BatchNorm` sees 100 training batches;
# after each step we run the same batch in eval mode and measure the gap. It starts large
# (the running statistics begin at 0 and 1), then settles at a floor set by how noisy each
# batch's statistics are: higher for small batches, and higher again when the amount of
# padding changes from batch to batch (compare the two B=16 curves). LayerNorm computes the same thing in both modes: no
# gap, no warm-up.

# %%
def train_eval_gap(batch_size, padded, steps=100, seed=8, norm=BatchNorm):
    gen = torch.Generator().manual_seed(seed)
    bn = norm(D_EXP)
    gaps = []
    for _ in range(steps):
        if padded:
            lens = torch.randint(2, 17, (batch_size,), generator=gen).tolist()
            x, real = make_batch(lens, 16, gen)
        else:
            x, real = make_batch([16] * batch_size, 16, gen)
        bn.train()
        with torch.no_grad():
            y_train = bn(x)
            bn.eval()
            y_eval = bn(x)
        gaps.append((y_train - y_eval)[real].abs().mean().item())
    return gaps

settings = {"B=64": (64, False), "B=16": (16, False), "B=4": (4, False), "B=2": (2, False),
            "B=16, variable padding": (16, True)}
gap_curves = {name: train_eval_gap(*cfg) for name, cfg in settings.items()}
gap_curves["LayerNorm, B=2"] = train_eval_gap(2, False, norm=LayerNorm)
fig = plots.curves(range(1, 101), gap_curves, xlabel="training step",
                   ylabel="mean |train-mode - eval-mode| output", title="the train/eval gap of BatchNorm")
fig.axes[0].set_yscale("symlog", linthresh=1e-2)
fig.axes[0].set_ylim(0, 1.5)
print("LayerNorm's largest train/eval gap:", max(gap_curves["LayerNorm, B=2"]))

# %% [markdown]
# ### Explore: batch size and padding
#
# Our 6-token sentence shares a batch with `batch_size - 1` others whose padding makes up
# about `pad_fraction` of the batch (never less than the unequal lengths force). Left:
# BatchNorm's per-feature batch means (bars) against the means of the real tokens (dots). Right: feature 0 of our sentence after BatchNorm in
# train mode, after BatchNorm computed on real tokens only, and after LayerNorm. Push the
# padding up, or the batch size down to 1, and watch BatchNorm's line move while LayerNorm's
# stays put.

# %%
def draw_padding(batch_size=8, pad_fraction=0.5):
    gen = torch.Generator().manual_seed(9)
    lens = [6] + torch.randint(3, 10, (batch_size - 1,), generator=gen).tolist()
    n_real = sum(lens)
    max_len = max(max(lens), math.ceil(n_real / (batch_size * (1 - min(pad_fraction, 0.95)))))
    x, real = make_batch(lens, max_len, gen)
    y_bn = batch_norm(x, None, None, training=True)
    y_clean = batch_norm(x[real], None, None, training=True)[:6]
    y_ln = layer_norm(x)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    feats = range(8)
    axes[0].bar(feats, x.mean(dim=(0, 1))[:8], color="C0", alpha=0.7, label="BatchNorm batch mean")
    axes[0].plot(feats, x[real].mean(0)[:8], "ko", label="mean of real tokens")
    axes[0].set(xlabel="feature", ylabel="mean", ylim=(-1.5, 3.5),
                title=f"B={batch_size}, padding {1 - n_real / x.shape[0] / max_len:.0%}")
    axes[1].plot(range(6), y_bn[0, :6, 0], "o-", label="BatchNorm (padded batch)")
    axes[1].plot(range(6), y_clean[:, 0], "k--", label="BatchNorm (real tokens only)")
    axes[1].plot(range(6), y_ln[0, :6, 0], "s-", label="LayerNorm")
    axes[1].set(xlabel="position in our sentence", ylabel="normalised feature 0", ylim=(-4, 4),
                title="our sentence's outputs")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig

explorer = explore(draw_padding, batch_size=(1, 64, 1, 8), pad_fraction=(0.0, 0.9, 0.05, 0.5))

# %% [markdown]
# ## 7. Why Transformers use LayerNorm
#
# | | BatchNorm | LayerNorm |
# | --- | --- | --- |
# | statistics over | each feature, across the batch (and positions) | each token, across its features |
# | a token's output depends on | every other token in the batch, padding included | that token only |
# | padded batches | padding enters the statistics (6.1) | padding never touches a real token |
# | small batches in training | noisy statistics; a single value per feature gives all zeros (PyTorch: an error) (6.2) | fine |
# | train vs eval | different computations, running statistics, warm-up (6.3) | identical |
# | state to keep | `running_mean`, `running_var` | none |
#
# Text batches are often small, padded and variable in length: every row of the table favours
# LayerNorm. (Shen et al., 2020, "PowerNorm: Rethinking Batch Normalization in Transformers",
# measure how much more the batch statistics fluctuate on text than on images.) BatchNorm remains a good choice where
# batches are large and fixed-size, as in image CNNs, where it was invented.
#
# ## 8. RMSNorm
#
# Many recent language models (T5, LLaMA, Mistral, ...) drop LayerNorm's centring and its
# bias, and divide by the **root mean square** instead of the standard deviation:
#
# $$\operatorname{RMS}(x) = \sqrt{\frac{1}{D}\sum_{j=1}^{D} x_j^2 + \epsilon}, \qquad
#   y_j = \gamma_j \frac{x_j}{\operatorname{RMS}(x)}$$
#
# One reduction instead of two, no mean to subtract, and in practice it trains as well: the
# re-scaling, not the re-centring, is what keeps activations in range. Note that
# $\operatorname{RMS}$ is *not* $\lVert x\rVert$ (that would shrink with $\sqrt{D}$) and that
# LayerNorm is RMSNorm applied to the centred vector $x - \mu$.
#
# ### Exercise 5: `rms_norm`
#
# Over the last axis, `eps` inside the root, `weight` `(D,)` or `None`, no bias. The default
# `eps=1e-6` is the one of the first LLaMA models (`norm_eps` in their released `params.json`)
# and of Hugging Face's `LlamaConfig` (`rms_norm_eps`); Llama 2 and 3 ship with `1e-5`. Always
# take `eps` from the checkpoint you load. You may not call `F.rms_norm` or `nn.RMSNorm`.

# %% [solution] rms_norm noexport
def rms_norm(x, weight=None, eps=1e-6):
    """Root-mean-square normalisation over the last axis, like F.rms_norm(x, (D,), weight, eps).

    x: (..., D). weight: (D,) or None. Returns x / sqrt(mean(x^2, last axis) + eps) * weight.
    """
    ### BEGIN SOLUTION
    ms = (x * x).mean(dim=-1, keepdim=True)   # (..., 1) mean square, no centring
    y = x / torch.sqrt(ms + eps)
    return y * weight if weight is not None else y
    ### END SOLUTION

# %% [tests] rms_norm

# %% [markdown]
# RMSNorm and LayerNorm agree on tokens whose features already average to zero, and part
# ways as the mean grows: RMSNorm keeps the offset (scaled), LayerNorm removes it.

# %%
gen = torch.Generator().manual_seed(10)
z = torch.randn(2000, 64, generator=gen)
z = z - z.mean(dim=-1, keepdim=True)       # every token exactly centred
offsets = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0]
agree = [(rms_norm(z + o) - layer_norm(z + o)).abs().mean().item() for o in offsets]
fig = plots.curves(offsets, {"mean |rms_norm - layer_norm|": agree}, xlabel="mean of the token's features",
                   ylabel="difference", markers=True, title="RMSNorm = LayerNorm for centred tokens")
print("your rms_norm vs nn.RMSNorm:",
      (rms_norm(z[:4]) - nn.RMSNorm(64, eps=1e-6)(z[:4])).abs().max().item())

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** A batch holds our 6-token sentence and other sentences padded with zeros. When
# the amount of padding in the batch changes, whose outputs for our sentence change in training
# mode: BatchNorm's or LayerNorm's? Why?

# %% [answer] q_padding_bn 1
# ### BEGIN SOLUTION
# BatchNorm's. It normalises each feature with a mean and variance taken over every position of
# every sentence in the batch, padding included, so more padding pulls the statistics towards
# the padding's values and our unchanged sentence is normalised differently. LayerNorm takes its
# statistics over the features of one token, so our tokens' outputs do not depend on the rest of
# the batch at all.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** Why does `eps` go **inside** the square root, $\sqrt{\sigma^2 + \epsilon}$,
# and what happens to a nearly constant token (variance about $10^{-8}$) when it is added to the
# standard deviation instead?

# %% [answer] q_eps_inside 1
# ### BEGIN SOLUTION
# Inside the root, a token with $\sigma^2 \approx 0$ is divided by about $\sqrt{\epsilon}
# \approx 3 \cdot 10^{-3}$ and its centred values are tiny, so its output stays near 0: that is
# what `nn.LayerNorm` computes. With $\sigma + \epsilon$ the denominator is about $10^{-4} +
# 10^{-5}$, so the tiny deviations (noise) are blown up to unit size; the result differs from
# PyTorch's and weights trained one way do not fit the other.
# ### END SOLUTION

# %% [markdown]
# ## 9. Mistakes worth recognising
#
# The checks above name each of these; most come from real tutorials and study notes.
#
# | mistake | what happens |
# | --- | --- |
# | `x.std(-1)` / `x.var(-1)` with their default (unbiased) correction in LayerNorm | outputs shrunk by $\sqrt{(D-1)/D}$; not `nn.LayerNorm` |
# | `(x - mean) / (std + eps)` | blows near-constant tokens up to unit size instead of ~0 |
# | statistics over `dim=0` in LayerNorm, or over `dim=-1` in BatchNorm | you built the other normalisation |
# | `mean(-1)` without `keepdim=True` | a crash, or (square inputs) silently the wrong axis |
# | parameters named `a_2`, `b_2` | PyTorch weights cannot be loaded; tests cannot find `weight`/`bias` |
# | `torch.ones(d)` without `nn.Parameter` | the scale is never trained |
# | BatchNorm on `(B, L, D)` with `x.mean(0)` | one statistic per position instead of per feature |
# | `running_mean = (1 - m) * running_mean + m * mean` in a function | the caller's buffer never changes |
# | `m * running + (1 - m) * batch` | momentum reversed: with $m = 0.1$ the batch gets weight 0.9, so the "running" average jumps to each batch's statistics |
# | `running_var` updated with the biased variance | eval-mode outputs too large by $\sqrt{n/(n-1)}$ |
# | running statistics updated without `no_grad`/`detach` | the buffers join the autograd graph (`running_mean.requires_grad` becomes `True`); any later `backward` through them, e.g. from an eval-mode output, fails with "Trying to backward through the graph a second time" |
# | batch statistics in eval mode (ignoring `self.training`) | predictions depend on the rest of the batch |
# | running statistics as `nn.Parameter` | the optimizer "trains" them |
# | `E[x^2] - E[x]^2` for the variance | catastrophic cancellation in float32 when the mean is large |
#
# **Next:** `05_positional_encoding`: attention cannot tell positions apart; sinusoidal
# encodings fix that.
