#| default_exp blocks
# %% [markdown]
# # 06 · Blocks: feed-forward networks, residuals, encoder and decoder layers
#
# You now have every part: attention (01), masks (02), multi-head attention (03), LayerNorm (04)
# and positions (05). This notebook puts them together into the two layers that the whole
# Transformer is stacked from, and the stacks themselves:
#
# 1. the **position-wise feed-forward network**, the other half of every layer;
# 2. **residual connections**, and an experiment that shows why a deep stack needs them;
# 3. **where the LayerNorm goes**: post-norm (the paper) against pre-norm (today's models);
# 4. the **encoder layer** and the **encoder** (a stack in an `nn.ModuleList`, with a final
#    LayerNorm);
# 5. the **decoder layer** (masked self-attention, cross-attention over the encoder's output,
#    feed-forward) and the **decoder**;
# 6. proof that all of it equals PyTorch's `nn.TransformerEncoderLayer`,
#    `nn.TransformerDecoderLayer` and their stacks, for both norm placements.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Hidden tests with other sizes and seeds run when your work is graded.
#
# **What you may use.** The course's `MultiHeadAttention` and masks (imported below from
# `tfscratch.reference`, the same as what you built in 02 and 03), `nn.Linear`, `nn.LayerNorm`,
# `nn.Dropout`, `torch.relu`, `torch.softmax`. You may **not** use PyTorch's
# `nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer`, `nn.TransformerEncoder`,
# `nn.TransformerDecoder` or `nn.Transformer` in your code: the checks notice. We use them at
# the end, to check our layers against them.

# %% [setup] setup_imports
import math
import os

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from tfscratch import checks, plots
from tfscratch import reference as R
from tfscratch.checks.core import copy_mha_to_torch
from tfscratch.fallback import pick
from tfscratch.reference import MultiHeadAttention, make_causal_mask, make_padding_mask
from tfscratch.widgets import explore

torch.manual_seed(0)
%matplotlib inline

chk = checks.notebook("06_blocks")  # the graded checks of this notebook

# %% [markdown]
# ## 1. A layer is two or three sub-layers, each wrapped the same way
#
# Every layer of the Transformer is built from **sub-layers**: an attention and a feed-forward
# network in the encoder; a masked self-attention, a cross-attention and a feed-forward
# network in the decoder. Every sub-layer sits in the same wrapper: its input is **added back**
# to its output (a residual connection) and the result is normalised with a **LayerNorm**.
# The paper writes it as
#
# $$\text{output} = \operatorname{LayerNorm}(x + \operatorname{Sublayer}(x)).$$
#
# Attention mixes information **across positions**; the feed-forward network then transforms
# **each position on its own**. Every sub-layer maps `(B, L, d_model)` to `(B, L, d_model)`,
# so the sum $x + \operatorname{Sublayer}(x)$ is always defined and layers can be stacked as
# deep as we like. Let us build the missing sub-layer first.
#
# ## 2. The position-wise feed-forward network
#
# $$\operatorname{FFN}(x) = \max(0,\ x W_1 + b_1)\, W_2 + b_2$$
#
# Two linear layers with a ReLU between them: the first **expands** each token from `d_model`
# to `d_ff` features (the paper: 512 to 2048), the second **projects back** to `d_model`.
# *Position-wise* means the same two matrices are applied to every position separately: the
# token at position 3 never sees the token at position 4 here (that is attention's job).
# `nn.Linear` acts on the last axis only, so `(B, L, d_model)` input works as is, and so does any
# other number of leading axes.
#
# Dropout, when asked for, goes on the **hidden activations**, between the ReLU and the second
# layer, as in the Annotated Transformer and in PyTorch's `nn.TransformerEncoderLayer`.
#
# ### A bug from the study notes: a second layer that does not project back
#
# One of the study notes this course grew from defines the second layer with the same
# arguments as the first, `nn.Linear(dim, hidden_dim)` twice. Watch what happens:

# %%
class SwappedFFN(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_model, d_ff)  # BUG: should be nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


x = torch.randn(2, 5, 8)  # (B, L, d_model)
try:
    SwappedFFN(d_model=8, d_ff=32)(x)
except RuntimeError as e:
    print("d_ff=32:", e)
print("d_ff=8: runs fine, output shape", tuple(SwappedFFN(d_model=8, d_ff=8)(x).shape))

# %% [markdown]
# `mat1 and mat2 shapes cannot be multiplied (10x32 and 8x32)`: the hidden tensor has 32
# features, but the second layer expects 8. The message is clear once you know that
# `nn.Linear(in, out)` stores its weight as `(out, in)`. The bug is dangerous because a quick test
# with `d_ff == d_model` runs without complaint. The checks below always use
# `d_ff != d_model`.
#
# ### Exercise 1: `FeedForward`
#
# Keep the two layers in attributes named `linear1` and `linear2` (the tests copy weights
# through these names), with biases (`nn.Linear`'s default).

# %% [solution] FeedForward
class FeedForward(nn.Module):
    """Position-wise feed-forward network: linear1 (d_model -> d_ff), ReLU, dropout,
    linear2 (d_ff -> d_model).

    x: (..., d_model), any leading axes  ->  (..., d_model); each position is transformed on
    its own. Dropout (p=dropout) is applied to the hidden activations, between ReLU and linear2.
    """

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.linear1 = nn.Linear(d_model, d_ff)  # expand
        self.linear2 = nn.Linear(d_ff, d_model)  # project back: d_ff -> d_model
        self.dropout = nn.Dropout(dropout)  # a module, so model.eval() switches it off
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))
        ### END SOLUTION

# %% [tests] FeedForward

# %% [markdown]
# Two facts worth seeing. First, *position-wise* is literal: change one token and only that
# token's output moves. Second, the feed-forward network is where most of a layer's
# parameters live: with the paper's sizes it holds twice as many as the attention.

# %%
ff = pick("FeedForward", lambda: FeedForward(d_model=8, d_ff=32).eval(),
          lambda: R.FeedForward(d_model=8, d_ff=32).eval(),
          check=lambda m: m(torch.zeros(1, 6, 8)))
x = torch.randn(1, 6, 8)
x_changed = x.clone()
x_changed[0, 2] += 1.0  # change token 2 only
moved = (ff(x_changed) - ff(x)).abs().amax(dim=-1)[0]  # (L,) largest change per position
print("largest output change per position:", [round(v, 4) for v in moved.tolist()])

n_ffn = sum(p.numel() for p in type(ff)(512, 2048).parameters())
n_att = sum(p.numel() for p in MultiHeadAttention(512, 8).parameters())
print(f"paper sizes: feed-forward {n_ffn:,} parameters, attention {n_att:,}")

# %% [markdown]
# ## 3. Residual connections, shown by experiment
#
# A residual connection computes $x_{l+1} = x_l + F(x_l)$ instead of $x_{l+1} = F(x_l)$. The
# derivative of one step is $I + \partial F / \partial x_l$: whatever $F$ does, the identity
# $I$ gives the gradient a path straight down to the first layer. Without it, the gradient at
# layer 1 is a product of $L$ Jacobians, and a product of many matrices that each shrink a
# little shrinks exponentially.
#
# The experiment: stack `depth` copies of your `FeedForward` (freshly initialised), push a
# batch through, and measure the gradient reaching the **first** block's weights. Three
# versions: plain (`h = F(h)`), normalised but without residual (`h = LayerNorm(F(h))`), and
# residual (`h = h + F(h)`).

# %%
from contextlib import contextmanager


@contextmanager
def one_thread():
    """Run the block on one CPU thread. On matrices this small, two threads spend more time
    waiting for each other than they save (badly so on a busy machine)."""
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n_threads)


def first_layer_gradient(depth, kind, d=32, seed=0):
    """Norm of d(loss)/d(first block's linear1.weight) for a stack of `depth` blocks."""
    torch.manual_seed(seed)
    blocks = nn.ModuleList(FFN(d, 4 * d) for _ in range(depth))
    norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
    h = torch.randn(8, 8, d)  # (B, L, d)
    for block, norm in zip(blocks, norms):
        if kind == "plain":
            h = block(h)
        elif kind == "LayerNorm, no residual":
            h = norm(block(h))
        else:
            h = h + block(h)
    target = torch.randn(h.shape, generator=torch.Generator().manual_seed(1))
    (h * target).mean().backward()  # any fixed linear read-out of the output will do
    return blocks[0].linear1.weight.grad.norm().item()


FFN = pick("FeedForward", lambda: FeedForward, lambda: R.FeedForward,
           check=lambda cls: cls(8, 32)(torch.zeros(1, 2, 8)))
depths = [1, 2, 4, 8, 16, 24, 32]
kinds = ["plain", "LayerNorm, no residual", "residual"]
with one_thread():
    grads = {k: [max(first_layer_gradient(n, k), 1e-30) for n in depths] for k in kinds}
for k in kinds:
    print(f"{k:>24}: " + "  ".join(f"{g:.1e}" for g in grads[k]))
fig = plots.curves(depths, grads, xlabel="number of blocks in the stack",
                   ylabel="gradient norm at block 1", logy=True, markers=True,
                   title="gradient reaching the first block")

# %% [markdown]
# The plain stack loses a factor of about four with every block: at 32 blocks the first block
# gets a gradient around $10^{-21}$, and it would never learn. Normalising every block's output
# keeps the *forward* signal at a healthy size, but the gradient still has to pass through
# every block and it fades with depth. Only the residual stack keeps the first block's
# gradient roughly constant, even slightly growing, however deep it gets. That is why every
# sub-layer of a Transformer sits in a residual.
#
# ## 4. Where does the LayerNorm go? Post-norm and pre-norm
#
# This is the most-asked question about Transformer code, because the paper and almost every
# model since then disagree.
#
# **Post-norm** (the paper, 2017; PyTorch's default `norm_first=False`): normalise *after*
# adding the residual.
#
# $$x \leftarrow \operatorname{LN}_1\big(x + \operatorname{Attn}(x)\big), \qquad
#   x \leftarrow \operatorname{LN}_2\big(x + \operatorname{FFN}(x)\big)$$
#
# **Pre-norm** (GPT-2 and almost every model since; the study notes' choice;
# `norm_first=True`): normalise the sub-layer's *input* and leave the residual stream alone.
#
# $$x \leftarrow x + \operatorname{Attn}\big(\operatorname{LN}_1(x)\big), \qquad
#   x \leftarrow x + \operatorname{FFN}\big(\operatorname{LN}_2(x)\big)$$
#
# What changes:
#
# - In pre-norm, the path from the input to the output is a pure sum: $x_L = x_0 +
#   \sum_l F_l(\cdot)$. The gradient reaches every layer through the identity, as in the
#   experiment above. In post-norm every residual passes through a LayerNorm on its way down.
# - In pre-norm, nothing normalises the residual stream itself: its size grows with depth, so
#   a stack of pre-norm layers needs a **final LayerNorm** after the last layer.
# - Post-norm is known to be hard to train without a learning-rate **warm-up** (Xiong et al.,
#   2020, *On Layer Normalization in the Transformer Architecture*); pre-norm usually trains
#   without one. We measure both after building the layers.
#
# Each sub-layer has its **own** LayerNorm: `norm1` for attention and `norm2` for the
# feed-forward network. Each has its own learned scale and shift, so one LayerNorm object
# used twice is a different, smaller model (one of the study notes does exactly that).
#
# Dropout, when asked for, goes on each sub-layer's output just before it is added to the
# residual (and, inside the sub-layers, on the attention weights and the FFN's hidden layer).
#
# ### Exercise 2: `EncoderLayer`
#
# Self-attention means query, key and value are all the same tensor. Pass `src_mask` straight
# to the attention: `MultiHeadAttention` accepts `(B, 1, L)`, `(B, L, L)` and `(L, L)` masks
# (True = may attend). Attributes: `self_attn`, `ff`, `norm1`, `norm2`.

# %% [solution] EncoderLayer
class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual with its own LayerNorm.

    norm_first=False (post-norm):  x = norm1(x + drop(sa(x)));  x = norm2(x + drop(ff(x)))
    norm_first=True  (pre-norm):   x = x + drop(sa(norm1(x)));  x = x + drop(ff(norm2(x)))
    where sa(h) = self_attn(h, h, h, src_mask) and drop is dropout with p=dropout.

    x: (B, L, d_model); src_mask: boolean, True = may attend, (B, 1, L), (B, L, L) or (L, L).
    Returns (B, L, d_model).
    Attributes: self_attn = MultiHeadAttention(d_model, n_heads, dropout),
    ff = FeedForward(d_model, d_ff, dropout), norm1, norm2 = nn.LayerNorm(d_model).
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)  # one norm per sub-layer: never share them
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x, src_mask=None):
        ### BEGIN SOLUTION
        if self.norm_first:
            h = self.norm1(x)  # normalise a copy; the residual stream x stays as it is
            x = x + self.dropout1(self.self_attn(h, h, h, src_mask))
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, src_mask)))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x  # (B, L, d_model)
        ### END SOLUTION

# %% [tests] EncoderLayer

# %% [markdown]
# ## 5. The encoder: a stack of layers
#
# The encoder runs its input through `n_layers` identical (but separately trained) layers and
# ends with a final LayerNorm, as `nn.Transformer`'s encoder does. For pre-norm the final norm
# is essential: it is the only place where the residual stream gets normalised. For post-norm
# it is harmless (the last layer already ends with a norm) and keeps the two placements
# interchangeable.
#
# ### `nn.ModuleList`, not a Python list
#
# PyTorch finds a module's parameters by looking at its attributes. A sub-module stored in a
# plain Python list is invisible: `parameters()` skips it, so the optimizer never trains it,
# `.to(device)` never moves it and `state_dict()` never saves it, and nothing raises an error.

# %%
class ListStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 4) for _ in range(3)]  # BUG: a Python list


class ModuleListStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))


for cls in (ListStack, ModuleListStack):
    print(f"{cls.__name__:>16}: {sum(p.numel() for p in cls().parameters())} parameters seen")

# %% [markdown]
# One more trap: `nn.ModuleList([EncoderLayer(...)] * n_layers)` holds the **same** layer
# `n_layers` times, one set of weights reused at every depth. Build a new layer in every
# iteration: `nn.ModuleList(EncoderLayer(...) for _ in range(n_layers))`.
#
# ### Exercise 3: `Encoder`
#
# Keep the layers in `self.layers` (an `nn.ModuleList`) and the final LayerNorm in `self.norm`.
# Pass `dropout`, `norm_first` and, in `forward`, `src_mask` on to every layer.

# %% [solution] Encoder
class Encoder(nn.Module):
    """n_layers EncoderLayers in an nn.ModuleList, then a final LayerNorm.

    x: (B, L, d_model); src_mask as in EncoderLayer. Returns (B, L, d_model).
    Attributes: layers (nn.ModuleList of EncoderLayer), norm (nn.LayerNorm(d_model)).
    """

    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        ### END SOLUTION

    def forward(self, x, src_mask=None):
        ### BEGIN SOLUTION
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)
        ### END SOLUTION

# %% [tests] Encoder

# %% [markdown]
# ## 6. Post-norm against pre-norm, measured
#
# ### What changes inside a fresh stack
#
# Take a freshly initialised stack of your encoder layers and follow a batch through it. Two
# things are worth measuring at every layer: the size of the **residual stream** (the typical
# norm of one token's vector after the layer) and the size of the **gradient** that reaches
# the layer's parameters from a loss on the output.
#
# Toggle `norm_first` and change the depth. The grey dashed line is the other placement.

# %%
def stack_profile(norm_first, n_layers, d=32, seed=0):
    """Per layer: mean token norm after the layer, and the gradient norm of its parameters."""
    torch.manual_seed(seed)
    enc = EncoderStack(n_layers, d, 4, 4 * d, norm_first=norm_first)
    h = torch.randn(8, 10, d)  # (B, L, d)
    sizes = []
    for layer in enc.layers:
        h = layer(h)
        sizes.append(h.norm(dim=-1).mean().item())
    out = enc.norm(h)
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * target).mean().backward()
    grads = [torch.sqrt(sum(p.grad.pow(2).sum() for p in layer.parameters())).item()
             for layer in enc.layers]
    return sizes, grads


def draw_placement(norm_first=True, n_layers=24):
    with one_thread():
        profiles = {nf: stack_profile(nf, n_layers) for nf in (False, True)}
    layers = range(1, n_layers + 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for nf, style in ((not norm_first, dict(color="grey", ls="--", lw=1)),
                      (norm_first, dict(color="C0" if norm_first else "C3", lw=2))):
        sizes, grads = profiles[nf]
        label = "pre-norm" if nf else "post-norm"
        axes[0].plot(layers, sizes, label=label, **style)
        axes[1].plot(layers, grads, label=label, **style)
    axes[0].set(xlabel="layer", ylabel="mean token norm after the layer",
                title="size of the residual stream")
    axes[1].set(xlabel="layer", ylabel="gradient norm of the layer's parameters",
                title="gradient reaching each layer")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"a fresh {n_layers}-layer encoder, norm_first={norm_first}")
    fig.tight_layout()
    return fig


EncoderStack = pick("Encoder", lambda: Encoder, lambda: R.Encoder,
                    check=lambda cls: cls(2, 16, 4, 32)(torch.zeros(1, 3, 16)))
explorer = explore(draw_placement, norm_first=True, n_layers=(2, 48, 2, 24))

# %% [markdown]
# In post-norm every layer ends with a LayerNorm, so the stream is renormalised to the same
# size (about $\sqrt{d_{model}}$) after every layer. In pre-norm nothing normalises the
# stream: each layer adds to it and it keeps growing with depth, which is why the final
# LayerNorm is needed.
#
# The gradients tell the matching story. In post-norm the layers near the output get the
# largest gradients, and the gradient of each lower layer has first passed through the
# LayerNorms of all the layers above it (Xiong et al. describe the same pattern). In pre-norm
# every layer is reached straight through the identity path; the later layers, whose small
# contributions land in an ever larger stream that the final LayerNorm divides down, get a
# little less. At initialisation both placements still give every layer a usable gradient.
# The difference that matters shows once training starts.
#
# ### Early training, no warm-up
#
# A toy task: read 8 digits and output them sorted. A 12-layer encoder, a learned embedding and
# a linear read-out, trained with Adam at a fixed learning rate of 5e-3 and **no warm-up**. The
# only difference between the runs of one seed is `norm_first`. (Skipped during autograding:
# it takes a few seconds.)

# %%
def sort_task_losses(norm_first, n_layers=12, steps=60, lr=5e-3, seed=0):
    """Train an Encoder to sort 8 digits; return the loss at every step."""
    torch.manual_seed(seed)
    V, L, d = 10, 8, 32
    embed = nn.Embedding(V, d)
    pos = nn.Parameter(0.1 * torch.randn(L, d))  # learned positions keep the example short
    enc = EncoderStack(n_layers, d, 4, 2 * d, norm_first=norm_first)
    head = nn.Linear(d, V)
    params = [*embed.parameters(), pos, *enc.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=lr)  # constant learning rate: no warm-up on purpose
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, V, (16, L), generator=gen)  # (B, L)
        target = tokens.sort(dim=-1).values  # (B, L)
        logits = head(enc(embed(tokens) + pos))  # (B, L, V)
        loss = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if not os.environ.get("NBGRADER_EXECUTION"):
    runs = {}
    with one_thread():
        for seed in (0, 1):
            for norm_first, name in ((False, "post-norm"), (True, "pre-norm")):
                runs[f"{name}, seed {seed}"] = sort_task_losses(norm_first, seed=seed)
    runs["chance level, ln 10"] = [math.log(10)] * 60
    for name, losses in runs.items():
        print(f"{name:>20}: mean loss over the last 10 steps {sum(losses[-10:]) / 10:.2f}")
    fig = plots.curves(range(1, 61), runs, xlabel="training step", ylabel="cross-entropy",
                       title="12-layer encoder, Adam lr=5e-3, no warm-up")

# %% [markdown]
# Same initial weights, same batches, only the placement differs. With both seeds the
# pre-norm encoder learns steadily, while the post-norm one stays close to chance level for
# most of the run and ends far behind.
# This is the practical reason almost every model since GPT-2 is pre-norm: it tolerates larger
# learning rates without a warm-up, and deeper stacks. Post-norm is not wrong (the original
# Transformer and BERT are post-norm, trained with a warm-up schedule), and some work finds it
# slightly better when it trains at all. PyTorch gives you both through `norm_first`.
#
# ## 7. The decoder layer
#
# The decoder layer has **three** sub-layers, each with its own residual and LayerNorm:
#
# 1. **masked self-attention** over the target so far, with `tgt_mask` (causal, notebook 02),
#    so position $i$ only sees positions $\le i$;
# 2. **cross-attention**: queries from the decoder, keys and values from the encoder's output,
#    the **memory**, with `src_mask` hiding padded source positions. This is the only place
#    where the decoder reads the source sentence;
# 3. the **feed-forward network**.
#
# Post-norm: $x \leftarrow \operatorname{LN}_1(x + \operatorname{SelfAttn}(x))$,
# $x \leftarrow \operatorname{LN}_2(x + \operatorname{CrossAttn}(x, m))$,
# $x \leftarrow \operatorname{LN}_3(x + \operatorname{FFN}(x))$. Pre-norm: the same three with
# the norm moved onto the sub-layer's input, $x \leftarrow x + \operatorname{Sublayer}(\operatorname{LN}(x))$.
# Only the decoder's own stream is normalised: the memory already went through the encoder's
# final LayerNorm.
#
# Shapes: `x` is `(B, Lt, d_model)`, `memory` is `(B, Ls, d_model)` with $L_s \ne L_t$ in
# general. The cross-attention scores are `(B, H, Lt, Ls)` and its output is `(B, Lt, d_model)`:
# the decoder keeps the **target's** length because the queries come from the target. The
# argument order of the attention is (query, key, value): `cross_attn(h, memory, memory, src_mask)`.
# (One of the study notes warns about exactly this: in the paper's figure the arrows enter the
# attention box as V, K, Q from left to right.)
#
# ### Exercise 4: `DecoderLayer`
#
# Attributes: `self_attn`, `cross_attn` (two separate `MultiHeadAttention`s), `ff`, `norm1`,
# `norm2`, `norm3`. `tgt_mask` may be `(Lt, Lt)` or `(B, Lt, Lt)`; `src_mask` is `(B, 1, Ls)`.

# %% [solution] DecoderLayer
class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over memory, feed-forward; each in a residual
    with its own LayerNorm (norm1, norm2, norm3), post-norm or pre-norm as in EncoderLayer.

    x: (B, Lt, d_model) decoder input; memory: (B, Ls, d_model) encoder output.
    src_mask: (B, 1, Ls), used in cross-attention; tgt_mask: (Lt, Lt) or (B, Lt, Lt), used in
    self-attention; both boolean, True = may attend. Returns (B, Lt, d_model).
    Attributes: self_attn, cross_attn (MultiHeadAttention(d_model, n_heads, dropout)),
    ff (FeedForward(d_model, d_ff, dropout)), norm1, norm2, norm3 (nn.LayerNorm(d_model)).
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        ### BEGIN SOLUTION
        sa = lambda h: self.dropout1(self.self_attn(h, h, h, tgt_mask))  # noqa: E731
        ca = lambda h: self.dropout2(self.cross_attn(h, memory, memory, src_mask))  # noqa: E731
        ff = lambda h: self.dropout3(self.ff(h))  # noqa: E731
        if self.norm_first:
            x = x + sa(self.norm1(x))
            x = x + ca(self.norm2(x))  # queries from the decoder, keys/values from memory
            x = x + ff(self.norm3(x))
        else:
            x = self.norm1(x + sa(x))
            x = self.norm2(x + ca(x))
            x = self.norm3(x + ff(x))
        return x  # (B, Lt, d_model)
        ### END SOLUTION

# %% [tests] DecoderLayer

# %% [markdown]
# ### Seeing causality and cross-attention
#
# Causality is a statement you can test: change the target token at position $j$ and see
# which outputs move. With the causal `tgt_mask` only positions $\ge j$ can change (the
# upper triangle below); without it, every output depends on every input, including future
# tokens the model will not have when it generates.

# %%
torch.manual_seed(0)
Lt, Ls, d = 8, 6, 16
dec_layer = pick("DecoderLayer", lambda: DecoderLayer(d, 4, 32).eval(),
                 lambda: R.DecoderLayer(d, 4, 32).eval(),
                 check=lambda m: m(torch.zeros(1, Lt, d), torch.zeros(1, Ls, d)))
x, memory = torch.randn(1, Lt, d), torch.randn(1, Ls, d)


def influence(tgt_mask):
    """(Lt, Lt): row j = how much each output moves when target token j changes."""
    base = dec_layer(x, memory, tgt_mask=tgt_mask)
    rows = []
    for j in range(Lt):
        x2 = x.clone()
        x2[0, j] += 1.0
        rows.append((dec_layer(x2, memory, tgt_mask=tgt_mask) - base).norm(dim=-1)[0])
    return torch.stack(rows).detach()


fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
for ax, (title, m) in zip(axes, [("with the causal tgt_mask", make_causal_mask(Lt)),
                                 ("without tgt_mask", None)]):
    with one_thread():
        inf = influence(m)
    ax.imshow(inf / inf.max(), cmap="Blues", vmin=0, vmax=1)
    ax.set(xlabel="output position i", ylabel="changed target position j", title=title)
fig.tight_layout()

# %% [markdown]
# Cross-attention weights have one row per **target** position and one column per **memory**
# position: `(Lt, Ls)`, not square. Below, the second sentence of the batch has only 4 real
# source tokens out of 6; `src_mask` gives its two padded memory positions zero weight.

# %%
torch.manual_seed(1)
src_tokens = torch.tensor([[5, 3, 8, 2, 7, 4], [6, 2, 9, 3, 0, 0]])  # 0 = padding
src_mask = make_padding_mask(src_tokens, pad_id=0)  # (B, 1, Ls)
memory = torch.randn(2, Ls, d)
x = torch.randn(2, Lt, d)
out = dec_layer(x, memory, src_mask=src_mask, tgt_mask=make_causal_mask(Lt))
weights = dec_layer.cross_attn.attn_weights  # (B, H, Lt, Ls)
print("cross-attention weights:", tuple(weights.shape), "  output:", tuple(out.shape))
fig = plots.attention_heatmap(weights[1, 0], [f"t{i}" for i in range(Lt)],
                              [f"m{j}" + (" (pad)" if j >= 4 else "") for j in range(Ls)],
                              title="cross-attention, sentence 2, head 0")

# %% [markdown]
# ## 8. The decoder, and the study notes' bugs at this level
#
# The decoder is the same kind of stack: `n_layers` decoder layers in an `nn.ModuleList`, then a
# final LayerNorm. Every layer gets the **same** memory (the encoder's final output) and both
# masks. Three bugs from the study notes live exactly here:
#
# - **A layer called without memory.** One note's decoder loop reads `x = layer(x)`. With a
#   `forward(self, x, memory, ...)` signature this stops at once with
#   `missing 1 required positional argument: 'memory'`: the lucky case.
# - **A decoder that ignores the encoder output.** If the layer's `memory` has a default, or
#   the cross-attention is given the decoder's own `h` as keys and values, nothing crashes: the
#   model trains as a language model that never reads the source. Only a test that changes the
#   memory and expects the output to change catches it.
# - **One LayerNorm shared by all sub-layers.** Another note keeps a single `self.norm` and
#   calls it after every sub-layer. It runs, it even trains, but it is not the model in the
#   paper and its weights cannot be loaded into PyTorch's layers.
#
# All three, on small layers: the notes' `layer(x)`, a decoder layer whose cross-attention
# uses `x` instead of `memory`, and an encoder layer whose `norm2` is its `norm1`.

# %%
DecLayer = pick("DecoderLayer", lambda: DecoderLayer, lambda: R.DecoderLayer,
                check=lambda cls: cls(16, 4, 32)(torch.zeros(1, 3, 16), torch.zeros(1, 2, 16)))
EncLayer = pick("EncoderLayer", lambda: EncoderLayer, lambda: R.EncoderLayer,
                check=lambda cls: cls(16, 4, 32)(torch.zeros(1, 3, 16)))


class DeafDecoderLayer(DecLayer):
    """BUG on purpose: the cross-attention attends over the decoder's own states."""

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask))
        x = self.norm2(x + self.cross_attn(x, x, x))  # should be (x, memory, memory, src_mask)
        return self.norm3(x + self.ff(x))


torch.manual_seed(0)
x, m1, m2 = torch.randn(1, 5, d), torch.randn(1, 6, d), torch.randn(1, 6, d)
try:
    DecLayer(d, 4, 32)(x)  # the notes' decoder loop: x = layer(x)
except TypeError as e:
    print("layer(x) ->", e)

for layer in (DecLayer(d, 4, 32).eval(), DeafDecoderLayer(d, 4, 32).eval()):
    change = (layer(x, m1) - layer(x, m2)).abs().max().item()
    print(f"{type(layer).__name__:>16}: output change when the memory is replaced: {change:.4f}")

shared = EncLayer(d, 4, 32)
shared.norm2 = shared.norm1  # one LayerNorm for both sub-layers
print("parameters: separate norms", sum(p.numel() for p in EncLayer(d, 4, 32).parameters()),
      "| shared norm", sum(p.numel() for p in shared.parameters()),
      "| nn.TransformerEncoderLayer",
      sum(p.numel() for p in nn.TransformerEncoderLayer(d, 4, 32, batch_first=True).parameters()))

# %% [markdown]
# ### Exercise 5: `Decoder`
#
# `self.layers` (an `nn.ModuleList` of `DecoderLayer`) and `self.norm` (the final
# LayerNorm). In `forward`, every layer gets `memory`, `src_mask` and `tgt_mask`; pass the masks
# by name or in the order of `DecoderLayer.forward(x, memory, src_mask, tgt_mask)`: swapping
# them is easy to do and, when `Ls == Lt`, does not crash.

# %% [solution] Decoder
class Decoder(nn.Module):
    """n_layers DecoderLayers in an nn.ModuleList, then a final LayerNorm.

    x: (B, Lt, d_model); memory: (B, Ls, d_model); masks as in DecoderLayer.
    Returns (B, Lt, d_model).
    Attributes: layers (nn.ModuleList of DecoderLayer), norm (nn.LayerNorm(d_model)).
    """

    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        ### BEGIN SOLUTION
        self.layers = nn.ModuleList([DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first)
                                     for _ in range(n_layers)])  # n_layers separate layers
        self.norm = nn.LayerNorm(d_model)
        ### END SOLUTION

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        ### BEGIN SOLUTION
        for layer in self.layers:
            x = layer(x, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.norm(x)
        ### END SOLUTION

# %% [tests] Decoder

# %% [markdown]
# ## 9. The same as PyTorch's layers
#
# PyTorch ships these exact blocks: `nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer`,
# and the stacks `nn.TransformerEncoder` and `nn.TransformerDecoder`. If ours are right, copying
# our weights into theirs must give the same outputs. Three differences in bookkeeping:
#
# - PyTorch's attention keeps $W_Q, W_K, W_V$ stacked in one `in_proj_weight` of shape
#   `(3 d_model, d_model)`; `copy_mha_to_torch` (from notebook 03) does the stacking. Its
#   decoder calls the cross-attention `multihead_attn`, and keeps `linear1`, `linear2` directly
#   on the layer instead of inside an `ff` module.
# - PyTorch's boolean masks mean the **opposite** of ours: `True` = *not* allowed. Our
#   `(B, 1, Ls)` padding mask becomes `key_padding_mask = ~src_mask[:, 0, :]`, of shape
#   `(B, Ls)`, and our causal mask becomes `~make_causal_mask(L)`.
# - PyTorch's encoder stack can pack padded batches into nested tensors, which changes what the
#   padded positions contain; `enable_nested_tensor=False` turns that off. We give both stacks a
#   final `nn.LayerNorm`, like ours.

# %%
def copy_layer_to_torch(ours, theirs):
    """Copy our EncoderLayer / DecoderLayer weights into PyTorch's layer of the same sizes."""
    copy_mha_to_torch(ours.self_attn, theirs.self_attn)
    if hasattr(ours, "cross_attn"):
        copy_mha_to_torch(ours.cross_attn, theirs.multihead_attn)
    pairs = [(ours.ff.linear1, theirs.linear1), (ours.ff.linear2, theirs.linear2)]
    pairs += [(getattr(ours, n), getattr(theirs, n)) for n in ("norm1", "norm2", "norm3")
              if hasattr(ours, n)]
    with torch.no_grad():
        for mine, its in pairs:
            its.weight.copy_(mine.weight)
            its.bias.copy_(mine.bias)


def randomize_norms(module):
    """LayerNorms start at weight 1, bias 0: give them random values so a mix-up would show."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.3)
                m.bias.normal_(0.0, 0.3)


EncoderStack = pick("Encoder", lambda: Encoder, lambda: R.Encoder,
                    check=lambda cls: cls(2, 16, 4, 32)(torch.zeros(1, 3, 16)))
DecoderStack = pick("Decoder", lambda: Decoder, lambda: R.Decoder,
                    check=lambda cls: cls(2, 16, 4, 32)(torch.zeros(1, 3, 16), torch.zeros(1, 2, 16)))
torch.manual_seed(0)
B, Ls, Lt, d, H, d_ff, n = 2, 7, 5, 16, 4, 32, 3
src = torch.tensor([[4, 2, 9, 7, 3, 8, 5], [6, 1, 5, 2, 0, 0, 0]])  # 0 = padding
src_mask = make_padding_mask(src)  # (B, 1, Ls), True = real token
tgt_mask = make_causal_mask(Lt)  # (Lt, Lt), True = may attend
x_src, x_tgt = torch.randn(B, Ls, d), torch.randn(B, Lt, d)
kpm = ~src_mask[:, 0, :]  # (B, Ls), PyTorch: True = padding, ignore

for norm_first in (False, True):
    kw = dict(dropout=0.0, batch_first=True, norm_first=norm_first)
    enc = EncoderStack(n, d, H, d_ff, norm_first=norm_first).eval()
    dec = DecoderStack(n, d, H, d_ff, norm_first=norm_first).eval()
    randomize_norms(enc)
    randomize_norms(dec)
    t_enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, H, d_ff, **kw), n,
                                  norm=nn.LayerNorm(d), enable_nested_tensor=False).eval()
    t_dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, H, d_ff, **kw), n,
                                  norm=nn.LayerNorm(d)).eval()
    for ours, theirs in zip([*enc.layers, *dec.layers], [*t_enc.layers, *t_dec.layers]):
        copy_layer_to_torch(ours, theirs)
    with torch.no_grad():
        for ours, theirs in ((enc.norm, t_enc.norm), (dec.norm, t_dec.norm)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)

    mem, t_mem = enc(x_src, src_mask), t_enc(x_src, src_key_padding_mask=kpm)
    out = dec(x_tgt, mem, src_mask=src_mask, tgt_mask=tgt_mask)
    t_out = t_dec(x_tgt, t_mem, tgt_mask=~tgt_mask, memory_key_padding_mask=kpm)
    layer_out = enc.layers[0](x_src, src_mask)
    t_layer_out = t_enc.layers[0](x_src, src_key_padding_mask=kpm)
    dlayer_out = dec.layers[0](x_tgt, mem, src_mask, tgt_mask)
    t_dlayer_out = t_dec.layers[0](x_tgt, mem, tgt_mask=~tgt_mask, memory_key_padding_mask=kpm)
    print(f"norm_first={norm_first!s:>5}: max |ours - PyTorch|  "
          f"encoder layer {(layer_out - t_layer_out).abs().max():.1e}, "
          f"decoder layer {(dlayer_out - t_dlayer_out).abs().max():.1e}, "
          f"encoder {(mem - t_mem).abs().max():.1e}, decoder {(out - t_out).abs().max():.1e}")

# %% [markdown]
# Differences of order $10^{-7}$, float32 rounding, for every layer, both stacks and both norm
# placements. From now on, `tfscratch.reference` offers these same blocks, and notebook 07
# builds the full Transformer from them.

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** Why does a deep stack of layers without residual connections train badly, and
# how does $x + F(x)$ fix it?

# %% [answer] q_residual 1
# ### BEGIN SOLUTION
# Without residuals the gradient at the first layer is a product of one Jacobian per layer; if
# they shrink (or grow) the signal a little each, the product vanishes (or explodes)
# exponentially with depth, so the first layers barely learn. With $x + F(x)$ each step's
# Jacobian is $I + \partial F / \partial x$: the identity gives the gradient a direct path from
# the loss to every layer, whatever $F$ does.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** Where does the LayerNorm sit in post-norm and in pre-norm layers, and why does
# a pre-norm stack need one more LayerNorm at its end?

# %% [answer] q_prenorm_final 1
# ### BEGIN SOLUTION
# Post-norm: `x = norm(x + sublayer(x))`, the residual stream is normalised after every
# sub-layer. Pre-norm: `x = x + sublayer(norm(x))`, only the sub-layer's input is normalised and
# the residual stream itself never is: it is the sum of all sub-layers' outputs and grows with
# depth. A final LayerNorm normalises it once before the output layer (or before the decoder
# reads it as memory).
# ### END SOLUTION

# %% [markdown]
# ## 10. Mistakes worth recognising
#
# | mistake | what happens |
# | --- | --- |
# | second FFN layer `nn.Linear(d_model, d_ff)` (study notes) | shape error as soon as `d_ff != d_model`; silent when they are equal |
# | no ReLU between the FFN's layers | the two layers collapse into one linear map |
# | ReLU after the FFN's last layer | the sub-layer's output can no longer go negative: the residual stream can only grow |
# | dropout on the FFN's output *and* again on the sub-layer's output (`x + dropout(ff(x))` with an `ff` that already ends in dropout) | the same values dropped twice: with $p = 0.1$, 19% zeroed instead of 10% and the survivors scaled by $1/0.81$; training no longer matches `nn.TransformerEncoderLayer` (eval mode hides it) |
# | no residual, `x = sublayer(x)` | the gradient at the first layer vanishes exponentially with depth |
# | one LayerNorm shared by the sub-layers (study notes) | runs and trains, but a different model; PyTorch's weights do not fit |
# | `norm_first` ignored (always pre-norm, like the study notes) | not the paper's layer; `norm_first=False` disagrees with PyTorch |
# | pre-norm written as `x = norm(x); x = x + sublayer(x)` | the residual stream carries normalised values: neither placement |
# | layers in a Python list | parameters invisible: never trained, never moved to the GPU, never saved |
# | `nn.ModuleList([Layer(...)] * n)` | one layer, one set of weights, used `n` times |
# | no final LayerNorm (pre-norm) | the output's size grows with depth |
# | `layer(x)` in the decoder loop (study notes) | `missing 1 required positional argument: 'memory'` |
# | cross-attention over `h` instead of `memory` | no error: a decoder that never reads the source |
# | `cross_attn(memory, h, h)` (query and key swapped) | output of the source's length, or a mask shape error |
# | `src_mask` and `tgt_mask` swapped | a shape error, or when `Ls == Lt` a decoder that looks ahead |
# | `F.dropout(h, p)` without `training=self.training` | dropout stays on in `model.eval()`: random predictions |
#
# **Next:** `07_transformer`: embeddings, the full encoder-decoder, training on a toy task, and
# greedy decoding.
