#| default_exp multihead
# %% [markdown]
# # 03 · Multi-head attention: several small attentions side by side
#
# The attention of notebooks 01 and 02 has no parameters: a token's query, key and value are
# the token's own vector, so it can only find tokens that *look like it*. A Transformer first
# maps every token through three learned projections, and it does so several times in
# parallel: each **head** gets its own small query, key and value spaces and its own
# attention map, and a last projection mixes what the heads found. In this notebook you build
#
# 1. the projections $W^Q, W^K, W^V, W^O$, and why one big projection *is* $h$ small ones,
# 2. `split_heads`: from `(B, L, d_model)` to `(B, H, L, D_h)` with `view` then `transpose`,
#    and why `view` alone silently mixes the heads,
# 3. `combine_heads`: back with `transpose`, `contiguous` and `view`,
# 4. `MultiHeadAttention`, scaled by the **head** dimension, with masks that gain a head axis,
#
# and then check it against `nn.MultiheadAttention`, compare it with the loop-over-heads
# version found in many tutorials (and its parameter-registration bug), look at what
# individual heads attend to, and count its parameters and cost.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cells after it check your work and, when
# something is off, tell you what and why. Run every cell from the top (*Run → Run All
# Cells*); before you hand in, run *Validate*. Hidden tests with other sizes and seeds run when
# your work is graded.
#
# You may use `torch.softmax` now (you wrote your own in 01). You may **not** use
# `nn.MultiheadAttention`, `F.multi_head_attention_forward` or `F.scaled_dot_product_attention`
# inside your `MultiHeadAttention`: the checks notice.

# %% [setup] setup_imports
import math
import os
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from tfscratch import checks, plots
from tfscratch import reference as R
from tfscratch.fallback import pick
from tfscratch.reference import make_causal_mask, make_decoder_mask, make_padding_mask
from tfscratch.widgets import explore

torch.manual_seed(0)
%matplotlib inline

chk = checks.notebook("03_multihead")  # the graded checks of this notebook

# %% [markdown]
# The masks of notebook 02 (`make_padding_mask`, `make_causal_mask`, `make_decoder_mask`) are
# imported from the course's reference module, so this notebook works even if yours are not
# finished. As always: **masks are boolean, `True` = may attend.**
#
# ## 1. Why several heads?
#
# One attention map gives every query **one** probability distribution over the keys, so each
# token gets one weighted average. But a word usually needs several things at once: in
# *"the cat sat on the mat because it was tired"*, `it` wants the noun it refers to, the verb
# it belongs to, and its neighbours. A single softmax has to compromise between them.
# Multi-head attention runs $h$ attentions side by side, each in its own learned subspace,
# and concatenates the results:
#
# $$\text{head}_i = \operatorname{Attention}(Q W_i^Q,\; K W_i^K,\; V W_i^V), \qquad
# \operatorname{MultiHead}(Q, K, V) = \operatorname{Concat}(\text{head}_1, \dots, \text{head}_h)\, W^O$$
#
# with $W_i^Q, W_i^K, W_i^V \in \mathbb{R}^{d_\text{model} \times D_h}$, $D_h = d_\text{model} / h$,
# and $W^O \in \mathbb{R}^{d_\text{model} \times d_\text{model}}$. In self-attention $Q$, $K$ and
# $V$ are all the same sequence $x$; in cross-attention (the decoder, notebook 06) the queries
# come from one sequence and the keys and values from another.
#
# ## 2. One big projection is $h$ small ones side by side
#
# Nobody stores $h$ separate $d_\text{model} \times D_h$ matrices. Put them side by side and you
# get one $d_\text{model} \times d_\text{model}$ matrix; multiplying by it computes all $h$ small
# products in one go, and head $i$'s result is simply columns $iD_h$ to $(i+1)D_h - 1$ of the
# big result. In PyTorch, `nn.Linear(d_model, d_model)` stores `weight` as `(out, in)` and
# computes $x W^\top + b$, so head $i$'s small projection is **rows** $iD_h : (i+1)D_h$ of
# `weight`.

# %%
d_model, n_heads = 8, 2
d_head = d_model // n_heads
x = torch.randn(5, d_model)  # 5 tokens
w_q = nn.Linear(d_model, d_model, bias=False)

big = w_q(x)  # (5, d_model): all heads at once
small = [x @ w_q.weight[h * d_head:(h + 1) * d_head].T for h in range(n_heads)]  # each (5, D_h)
print("head 0 = first D_h columns:", torch.allclose(big[:, :d_head], small[0]))
print("one big product == the small ones side by side:",
      torch.allclose(big, torch.cat(small, dim=-1)))
fig = plots.heatmap(w_q.weight.detach(), [f"head {i // d_head}, row {i}" for i in range(d_model)],
                    [f"in {j}" for j in range(d_model)], xlabel="input feature",
                    ylabel="output feature (row of weight)", cmap="RdBu",
                    title="w_q.weight: one block of rows per head")
for h in range(1, n_heads):
    fig.axes[0].axhline(h * d_head - 0.5, color="black", lw=3)

# %% [markdown]
# The black line separates head 0's rows from head 1's. Nothing in the matrix itself says
# where a head starts: that is purely a convention of how we **split** the result, which is
# why the split must be exactly right. Note also what this means for the parameter count:
# $h$ heads of size $D_h$ cost $h \cdot d_\text{model} D_h = d_\text{model}^2$ numbers, the same
# as one head of full size. More heads do not mean more parameters.
#
# ## 3. Splitting into heads: `view`, then `transpose`
#
# After the projection, `q` has shape `(B, L, d_model)` and each token's features are laid
# out as `[head 0's D_h | head 1's D_h | ...]`. We want `(B, H, L, D_h)`: batch and head in
# front, so that the attention of notebook 01 (which accepts any leading axes) runs for every
# head of every sequence in one batched matrix product. Two steps, neither of which copies
# any data:
#
# 1. `q.view(B, L, H, D_h)` cuts the last axis into `H` blocks of `D_h`. In memory the numbers
#    are stored token after token, feature after feature; cutting the *last* axis keeps every
#    block where it was.
# 2. `.transpose(1, 2)` swaps the token and head axes: `(B, H, L, D_h)`. Only the strides (how
#    far to jump in memory per step along each axis) change.
#
# The tempting shortcut `q.view(B, H, L, D_h)` has the right shape and is **wrong**: `view`
# never moves numbers, it re-reads them in memory order. The first `L * D_h` numbers (whole
# tokens, with every head's features) become "head 0". No error, no warning: the heads just
# see garbage. Here it is as a picture: one sequence of 4 tokens with 6 features, 2 heads of
# 3 features. Each cell shows which token (`t`) and feature (`f`) the number came from; the
# colour says which head the feature belongs to.

# %%
def label_grid(ax, codes, title, d_head):
    """Draw a (rows, cols) tensor of codes 10*token + feature, coloured by the feature's head."""
    codes = codes.long()
    head_of = (codes % 10) // d_head
    ax.imshow(head_of.numpy(), cmap="Pastel1", vmin=0, vmax=8, aspect="auto")
    for i in range(codes.shape[0]):
        for j in range(codes.shape[1]):
            c = codes[i, j].item()
            ax.text(j, i, f"t{c // 10}\nf{c % 10}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(codes.shape[1]))
    ax.set_yticks(range(codes.shape[0]))
    ax.set_title(title, fontsize=9)


L_demo, D_demo, H_demo = 4, 6, 2
Dh_demo = D_demo // H_demo
codes = (torch.arange(L_demo).view(L_demo, 1) * 10 + torch.arange(D_demo)).view(1, L_demo, D_demo)
right = codes.view(1, L_demo, H_demo, Dh_demo).transpose(1, 2)  # (B, H, L, D_h)
wrong = codes.view(1, H_demo, L_demo, Dh_demo)  # same shape, different numbers
fig, axes = plt.subplots(1, 5, figsize=(14, 3.2), gridspec_kw={"width_ratios": [2, 1, 1, 1, 1]})
label_grid(axes[0], codes[0], "projection (L, d_model)\ncolour = the head a feature belongs to", Dh_demo)
for h in range(H_demo):
    label_grid(axes[1 + h], right[0, h], f"view + transpose\nhead {h}", Dh_demo)
    label_grid(axes[3 + h], wrong[0, h], f"view(B, H, L, D_h) alone\n'head {h}'", Dh_demo)
for ax in axes:
    ax.set_xlabel("feature within the block")
axes[0].set_ylabel("token")
fig.tight_layout()

# %% [markdown]
# With `view` + `transpose`, head 0 sees features 0-2 of **every** token and head 1 features
# 3-5: one colour per head, all four tokens in order. With `view` alone, "head 0" sees tokens
# 0 and 1 chopped into rows, mixing both heads' features, and its "token 1" is really the
# second half of token 0. Attention over such rows is meaningless, yet every shape downstream
# is right, so the bug only shows up as a model that trains badly. The checks below catch it
# by tracking where every number goes.
#
# ### Exercise 1: `split_heads`
#
# Read the sizes from `x` (no hard-coded numbers) and use `n_heads`.

# %% [solution] split_heads
def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Split the feature axis into heads and move the heads in front of the tokens.

    x: (B, L, D) with D divisible by n_heads. Returns (B, n_heads, L, D // n_heads), where
    head h of token l holds x[:, l, h * D_h:(h + 1) * D_h].
    """
    ### BEGIN SOLUTION
    B, L, D = x.shape
    assert D % n_heads == 0, f"d_model={D} is not divisible by n_heads={n_heads}"
    x = x.view(B, L, n_heads, D // n_heads)  # (B, L, H, D_h): cut the feature axis
    return x.transpose(1, 2)  # (B, H, L, D_h): heads in front of the tokens
    ### END SOLUTION

# %% [tests] split_heads

# %% [markdown]
# ## 4. Combining the heads: `transpose`, `contiguous`, `view`
#
# After attention each head returns `(B, H, L, D_h)`. To concatenate the heads per token we
# undo the split: `transpose(1, 2)` back to `(B, L, H, D_h)`, then merge the last two axes into
# `H * D_h = d_model`. Here `view` runs into the strides: after the transpose the numbers of one
# token are no longer next to each other in memory, and `view` refuses to pretend they are.

# %%
heads = torch.randn(2, 3, 4, 5)  # (B, H, L, D_h), contiguous: made that way
t = heads.transpose(1, 2)  # (B, L, H, D_h): same memory, new strides
print("strides of heads:", heads.stride(), " after transpose:", t.stride(),
      " contiguous?", t.is_contiguous())
try:
    t.view(2, 4, 15)
except RuntimeError as e:
    print("view after transpose ->", str(e).split(".")[0])
merged = t.contiguous().view(2, 4, 15)  # contiguous() copies into the new order; then view works
print("contiguous().view:", tuple(merged.shape), "| reshape gives the same:",
      torch.equal(merged, t.reshape(2, 4, 15)))

# %% [markdown]
# `contiguous()` makes a copy laid out in the transposed order (it returns the tensor itself
# when it already is contiguous); `reshape` does the same thing implicitly, copying only when it
# must. Either is correct. Forgetting the transpose is not: `heads.view(B, L, H * D_h)` works
# without complaint (the input *is* contiguous) and glues together rows of one head.
#
# ### Exercise 2: `combine_heads`

# %% [solution] combine_heads
def combine_heads(x: torch.Tensor) -> torch.Tensor:
    """Concatenate the heads of every token: the inverse of split_heads.

    x: (B, H, L, D_h). Returns (B, L, H * D_h) where token l's features are
    [head 0's D_h | head 1's D_h | ...].
    """
    ### BEGIN SOLUTION
    B, H, L, Dh = x.shape
    x = x.transpose(1, 2)  # (B, L, H, D_h), not contiguous any more
    return x.contiguous().view(B, L, H * Dh)  # (B, L, d_model)
    ### END SOLUTION

# %% [tests] combine_heads

# %% [markdown]
# ## 5. Scale by the head dimension, not by $d_\text{model}$
#
# Each head compares queries and keys of size $D_h$, so its scores are sums of $D_h$ products:
# for unit-variance entries their variance is $D_h$ (notebook 01), and the right divisor is
# $\sqrt{D_h}$. Dividing by $\sqrt{d_\text{model}}$, the size of the whole projection, makes every
# score $\sqrt{h}$ times too small, and the weights come out flatter than intended: with 8 heads
# the softmax sees scores at a third of their proper size.

# %%
gen = torch.Generator().manual_seed(0)
d_model_demo = 64
print(" heads  D_h   var(q.k / sqrt(D_h))   var(q.k / sqrt(d_model))")
for h in (1, 2, 4, 8, 16):
    dh = d_model_demo // h
    q = torch.randn(4000, dh, generator=gen)
    k = torch.randn(4000, dh, generator=gen)
    dots = (q * k).sum(-1)
    print(f"{h:6d} {dh:4d}   {(dots / math.sqrt(dh)).var().item():18.2f}"
          f"   {(dots / math.sqrt(d_model_demo)).var().item():22.3f}")

# %% [markdown]
# With $\sqrt{D_h}$ the scores keep variance 1 whatever the number of heads; with
# $\sqrt{d_\text{model}}$ their variance falls to $1/h$. Code that reads the size from the tensor
# it actually multiplies, `q.size(-1)` after the split, gets this right automatically.
#
# ## 6. Masks gain a head axis
#
# The scores now have shape `(B, H, Lq, Lk)`. A mask broadcasts against them, and broadcasting
# lines shapes up **from the right**:
#
# | mask | shape | against `(B, H, Lq, Lk)` |
# | --- | --- | --- |
# | causal, `make_causal_mask(L)` | `(Lq, Lk)` | fine as it is: the same for every sequence and head |
# | padding, `make_padding_mask` | `(B, 1, Lk)` | `B` lines up with `H`! needs `unsqueeze(1)` → `(B, 1, 1, Lk)` |
# | decoder, `make_decoder_mask` | `(B, Lq, Lk)` | same problem → `(B, 1, Lq, Lk)` |
# | already 4-D | `(B, 1 or H, Lq, Lk)` | fine as it is |
#
# Without the head axis you get an error when `B != H`, and worse, nothing at all when
# `B == H`: then head $i$ of *every* sequence uses the padding of sequence $i$. Below, a batch of
# two sentences with two heads; the second sentence has two padding tokens.

# %%
tokens = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])  # 0 = padding
pad = make_padding_mask(tokens)  # (B, 1, Lk) = (2, 1, 4)
B_demo, H2, Lq_demo = 2, 2, 4
scores_shape = (B_demo, H2, Lq_demo, 4)
print("mask", tuple(pad.shape), "broadcasts against", scores_shape, "->",
      tuple(torch.broadcast_shapes(pad.shape, scores_shape)), "(no error!)")
wrong_mask = pad.expand(scores_shape)  # (B, 1, Lk) lined up as (H, Lq?, Lk): batch -> heads
right_mask = pad.unsqueeze(1).expand(scores_shape)  # (B, 1, 1, Lk): the same for every head
grid = torch.stack([wrong_mask[0], right_mask[0]]).float()  # sentence 0: (2 ways, H, Lq, Lk)
fig = plots.heatmap_grid(grid, [f"q{i}" for i in range(4)], ["cat", "sat", "on", "mat"],
                         row_titles=["no unsqueeze", "unsqueeze(1)"],
                         col_titles=[f"head {h}" for h in range(H2)],
                         title="mask seen by sentence 0 (no padding): white = blocked")

# %% [markdown]
# Sentence 0 has no padding, yet without `unsqueeze(1)` its head 1 blocks `on` and `mat`:
# it got sentence 1's mask. With the head axis every head of sentence 0 sees every key.
#
# One more convention to keep straight: PyTorch's own `nn.MultiheadAttention` uses the
# **opposite** meaning for its masks: `attn_mask` and `key_padding_mask` are `True` where a key
# must be **ignored**. Section 7 converts between the two with `~mask`.
#
# ### Exercise 3: `MultiHeadAttention`
#
# Put it together. The class takes `(d_model, n_heads, dropout=0.0, bias=True)` and has
#
# - four projections named **`w_q`, `w_k`, `w_v`, `w_o`**, each
#   `nn.Linear(d_model, d_model, bias=bias)` (the tests copy weights through these names);
# - `forward(query, key, value, mask=None)` with `query` `(B, Lq, d_model)` and `key`, `value`
#   `(B, Lk, d_model)`, returning **only the output** `(B, Lq, d_model)`:
#   1. project `query`, `key`, `value` with `w_q`, `w_k`, `w_v` and split each into heads
#      (`Lk` may differ from `Lq`: use each tensor's own sizes);
#   2. scores `q k^T / sqrt(D_h)` of shape `(B, H, Lq, Lk)`;
#   3. if a mask is given: give a 3-D mask a head axis (`unsqueeze(1)`), use 2-D and 4-D masks as
#      they are, and fill the scores where the mask is `False` with a large negative **finite**
#      number (`torch.finfo(scores.dtype).min`), so that a row whose keys are all masked stays
#      finite;
#   4. softmax over the keys; store the result in **`self.attn_weights`** `(B, H, Lq, Lk)`
#      (before dropout: it is what we plot);
#   5. dropout on the weights (an `nn.Dropout(dropout)` layer, which switches itself off in
#      `eval()` mode), multiply by `v`, combine the heads, and apply `w_o`.
#
# Use your `split_heads` and `combine_heads`.

# %% [solution] MultiHeadAttention
class MultiHeadAttention(nn.Module):
    """n_heads scaled dot-product attentions side by side, then an output projection.

    MultiHeadAttention(d_model, n_heads, dropout=0.0, bias=True)
      w_q, w_k, w_v, w_o: nn.Linear(d_model, d_model, bias=bias); head h owns rows
      h*D_h:(h+1)*D_h of w_q, w_k and w_v (D_h = d_model // n_heads).
    forward(query (B, Lq, d_model), key (B, Lk, d_model), value (B, Lk, d_model), mask=None)
      -> output (B, Lq, d_model). mask: boolean, True = may attend; (Lq, Lk) and 4-D masks as
      they are, (B, Lq, Lk) and (B, 1, Lk) with a head axis added (unsqueeze(1)).
      Keeps self.attn_weights (B, H, Lq, Lk): the softmax output, before dropout.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        ### BEGIN SOLUTION
        assert d_model % n_heads == 0, f"d_model={d_model} is not divisible by n_heads={n_heads}"
        self.d_model, self.n_heads = d_model, n_heads
        self.d_head = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)  # all heads' W_q side by side
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)  # mixes the concatenated heads
        self.dropout = nn.Dropout(dropout)
        self.attn_weights = None
        ### END SOLUTION

    def forward(self, query, key, value, mask=None):
        ### BEGIN SOLUTION
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, Lq, D_h)
        k = split_heads(self.w_k(key), self.n_heads)  # (B, H, Lk, D_h)
        v = split_heads(self.w_v(value), self.n_heads)  # (B, H, Lk, D_h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, Lq, Lk)
        if mask is not None:
            if mask.dim() == 3:  # (B, Lq, Lk) or (B, 1, Lk): one mask for every head
                mask = mask.unsqueeze(1)  # (B, 1, Lq or 1, Lk)
            # finite, not -inf: a row whose keys are all masked becomes uniform, never NaN
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (B, H, Lq, Lk)
        self.attn_weights = weights.detach()  # for plotting, before dropout
        out = self.dropout(weights) @ v  # (B, H, Lq, D_h)
        return self.w_o(combine_heads(out))  # (B, Lq, d_model)
        ### END SOLUTION

# %% [tests] MultiHeadAttention

# %% [markdown]
# ## 7. The same numbers as `nn.MultiheadAttention`
#
# PyTorch's module stores the three input projections stacked in one matrix,
# `in_proj_weight` of shape `(3 * d_model, d_model)` = $[W^Q; W^K; W^V]$ (and `in_proj_bias`
# likewise), and the output projection as `out_proj`. Copy ours in and the two modules must
# agree, for self- and cross-attention, with masks, once the mask meaning is flipped
# (`True` = blocked there). `average_attn_weights=False` makes it return one map per head.

# %%
def to_torch(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """A PyTorch module with our weights: in_proj stacks [W_q; W_k; W_v] along dim 0."""
    ref = nn.MultiheadAttention(mha.d_model, mha.n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.w_q.weight, mha.w_k.weight, mha.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([mha.w_q.bias, mha.w_k.bias, mha.w_v.bias]))
        ref.out_proj.weight.copy_(mha.w_o.weight)
        ref.out_proj.bias.copy_(mha.w_o.bias)
    return ref.eval()


# The demos from here on use your MultiHeadAttention once it works (until then, the course's)
z = torch.zeros(1, 3, 8)
MHA = pick("MultiHeadAttention", lambda: MultiHeadAttention, lambda: R.MultiHeadAttention,
           check=lambda cls: cls(8, 2)(z, z, z))
torch.manual_seed(1)
mha = MHA(32, 4).eval()
ref = to_torch(mha)
src_tokens = torch.tensor([[3, 4, 5, 6, 7, 0], [3, 4, 5, 0, 0, 0]])  # source, 0 = padding
tgt = torch.randn(2, 5, 32)
src = torch.randn(2, 6, 32)

# self-attention with a causal mask: attn_mask is True where PyTorch must NOT look
causal = make_causal_mask(5)
ours = mha(tgt, tgt, tgt, causal)
theirs, w_theirs = ref(tgt, tgt, tgt, attn_mask=~causal, average_attn_weights=False)
print("self-attention, causal mask:   max |ours - torch| =",
      f"{(ours - theirs).abs().max().item():.2e}, weights {(mha.attn_weights - w_theirs).abs().max().item():.2e}")

# cross-attention with a source padding mask: key_padding_mask is True at the pads
src_pad = make_padding_mask(src_tokens)  # (B, 1, Ls)
ours = mha(tgt, src, src, src_pad)
theirs, w_theirs = ref(tgt, src, src, key_padding_mask=~src_pad[:, 0], average_attn_weights=False)
print("cross-attention, padding mask: max |ours - torch| =",
      f"{(ours - theirs).abs().max().item():.2e}, weights {(mha.attn_weights - w_theirs).abs().max().item():.2e}")

# %% [markdown]
# Agreement to about $10^{-7}$, the rounding noise of float32. One place where the two
# *deliberately* differ: a query whose keys are **all** masked. Below the first target token is
# padding, so with the decoder mask (causal AND key padding) query 0 may look at nothing.
# PyTorch returns NaN for that row on the call below; ours stays finite (uniform weights over
# the blocked keys, harmless because such a row is padding whose output nobody uses). The checks
# compare only the rows PyTorch can compute.

# %%
tgt_tokens = torch.tensor([[0, 4, 5, 6, 2], [3, 4, 5, 6, 2]])  # sentence 0 starts with a pad
dec_mask = make_decoder_mask(tgt_tokens)  # (B, L, L)
ours = mha(tgt, tgt, tgt, dec_mask)
torch_mask = ~dec_mask.repeat_interleave(4, dim=0)  # (B * H, L, L), True = blocked
theirs, _ = ref(tgt, tgt, tgt, attn_mask=torch_mask)
print("PyTorch, sentence 0, query 0:", theirs[0, 0, :4])
print("ours,    sentence 0, query 0:", ours[0, 0, :4].detach())
rows = torch.isfinite(theirs).all(-1)  # compare the rows PyTorch can compute
print("max |ours - torch| on the other rows:", f"{(ours - theirs)[rows].abs().max().item():.2e}")

# %% [markdown]
# Whether PyTorch gives NaN depends on the path it takes (measured with PyTorch 2.13, CPU; the
# cell below checks it on your installation):
#
# | `nn.MultiheadAttention` call | fully masked row |
# | --- | --- |
# | `need_weights=True` (the default), any mode | NaN (it computes the softmax itself) |
# | `need_weights=False`, training mode or gradients on | finite: the attention part is 0 and the row is `out_proj`'s bias (it calls `F.scaled_dot_product_attention`, which returns 0 for such a row) |
# | `need_weights=False` in `eval()` under `torch.no_grad()` (the "fast path", `torch._native_multi_head_attention`) | NaN |
#
# The fast path's conditions are listed in the docstring of `nn.MultiheadAttention.forward`
# (PyTorch docs, *torch.nn.MultiheadAttention*). So a model can be finite in training and NaN
# in evaluation: one more reason to keep fully masked rows finite yourself.

# %%
def query0(need_weights, training, grad):
    """PyTorch's output for sentence 0, query 0 (every key masked) on one path."""
    was = ref.training
    ref.train(training)
    with torch.set_grad_enabled(grad):
        out, _ = ref(tgt, tgt, tgt, attn_mask=torch_mask, need_weights=need_weights)
    ref.train(was)
    row = out[0, 0].detach()
    return "NaN" if row.isnan().any() else f"finite, max |value| {row.abs().max().item():.2f}"

for need_weights, training, grad in [(True, False, False), (False, True, True),
                                     (False, False, True), (False, False, False)]:
    print(f"need_weights={need_weights!s:5} training={training!s:5} grad={grad!s:5} ->",
          query0(need_weights, training, grad))

# %% [markdown]
# ## 8. The loop over heads, and the Python-list bug
#
# Many tutorials (and the study notes this course grew from) write multi-head attention the
# way the formula reads: one small `nn.Linear(d_model, D_h)` per head for Q, K and V, a Python
# loop over the heads, and `torch.cat` at the end. It computes **the same function**: copy each
# head's rows of our big matrices into the small layers and the outputs agree.

# %%
class LoopMultiHeadAttention(nn.Module):
    """One small projection per head and a loop over heads: same maths, h small matmuls."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        d_head = d_model // n_heads
        self.q_heads = nn.ModuleList(nn.Linear(d_model, d_head) for _ in range(n_heads))
        self.k_heads = nn.ModuleList(nn.Linear(d_model, d_head) for _ in range(n_heads))
        self.v_heads = nn.ModuleList(nn.Linear(d_model, d_head) for _ in range(n_heads))
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        outs = []
        for wq, wk, wv in zip(self.q_heads, self.k_heads, self.v_heads):
            q, k, v = wq(query), wk(key), wv(value)  # each (B, L, D_h)
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, Lq, Lk)
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            outs.append(torch.softmax(scores, dim=-1) @ v)  # (B, Lq, D_h)
        return self.w_o(torch.cat(outs, dim=-1))  # (B, Lq, d_model)


def copy_into_loop(mha, loop):
    """Head h's small layers get rows h*D_h:(h+1)*D_h of the big ones."""
    dh = mha.d_model // mha.n_heads
    with torch.no_grad():
        for big, small in ((mha.w_q, loop.q_heads), (mha.w_k, loop.k_heads), (mha.w_v, loop.v_heads)):
            for h, layer in enumerate(small):
                layer.weight.copy_(big.weight[h * dh:(h + 1) * dh])
                layer.bias.copy_(big.bias[h * dh:(h + 1) * dh])
        loop.w_o.load_state_dict(mha.w_o.state_dict())


loop = LoopMultiHeadAttention(32, 4)
copy_into_loop(mha, loop)
x = torch.randn(2, 5, 32)
print("loop over heads == one batched computation:",
      torch.allclose(loop(x, x, x), mha(x, x, x), atol=1e-6))

# %% [markdown]
# Equal, but slower: $h$ small matrix products per projection instead of one big one, and a
# Python loop around them. Timing forward + backward (the best of 10 runs) at a moderate size:

# %%
def time_fwd_bwd(modules, x, repeats=10):
    """Best time of `repeats` forward + backward passes for each module. The runs are
    interleaved and use one CPU thread, which keeps timings steady on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best = [float("inf")] * len(modules)
    try:
        for _ in range(repeats):
            for i, m in enumerate(modules):
                t0 = time.perf_counter()
                m(x, x, x).sum().backward()
                best[i] = min(best[i], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best


torch.manual_seed(0)
xb = torch.randn(8, 64, 128)
print(" heads   batched (ms)   loop (ms)   loop / batched")
for h in (2, 8, 32):
    fast, slow = MHA(128, h), LoopMultiHeadAttention(128, h)
    copy_into_loop(fast, slow)
    tb, tl = time_fwd_bwd([fast, slow], xb)
    print(f"{h:6d} {tb * 1e3:13.2f} {tl * 1e3:11.2f} {tl / tb:12.1f}x")

# %% [markdown]
# With two heads the two versions are close: the work is in a few large products either way.
# As heads multiply the loop falls behind: every extra head adds three small matrix products, a
# softmax and a handful of Python calls, each too small to keep the CPU's vector units busy (on
# a GPU it is worse still: every small product is a separate kernel launch). On a quiet laptop
# the loop takes about twice as long at 8 and 32 heads; on a busy machine timings jump around,
# so rerun the cell if the numbers look odd.
#
# Now the bug. The study notes keep the per-head layers in **plain Python lists**:
#
# ```python
# self.LQ = [nn.Linear(d, t) for _ in range(h)]
# ```
#
# The forward pass works and gives sensible numbers. But `nn.Module` only registers layers that
# are assigned as attributes directly or kept in `nn.ModuleList` / `nn.ModuleDict`; a layer
# inside a list is invisible to it.

# %%
class ListMultiHeadAttention(LoopMultiHeadAttention):
    """The bug: per-head layers in plain Python lists."""

    def __init__(self, d_model, n_heads):
        nn.Module.__init__(self)
        d_head = d_model // n_heads
        self.q_heads = [nn.Linear(d_model, d_head) for _ in range(n_heads)]  # plain lists!
        self.k_heads = [nn.Linear(d_model, d_head) for _ in range(n_heads)]
        self.v_heads = [nn.Linear(d_model, d_head) for _ in range(n_heads)]
        self.w_o = nn.Linear(d_model, d_model)


good, bad = LoopMultiHeadAttention(32, 4), ListMultiHeadAttention(32, 4)
print("parameters, ModuleList:", sum(p.numel() for p in good.parameters()),
      " plain list:", sum(p.numel() for p in bad.parameters()))
print("state_dict keys, plain list:", list(bad.state_dict()))
bad.double()  # converts registered parameters only
print("after .double(): w_o is", bad.w_o.weight.dtype, "but head 0's W_q is",
      bad.q_heads[0].weight.dtype)

# %% [markdown]
# Only `w_o` is registered. So the optimizer, which receives `model.parameters()`, never
# updates the per-head projections (they stay at their random initial values while the loss
# still goes down a little through `w_o`); `state_dict()` does not save them, so a reloaded
# model gets new random ones; and `.to("cuda")` or `.double()` leaves them behind. No error
# anywhere. `nn.ModuleList` fixes all of it, and one big `nn.Linear` per projection avoids the
# question altogether.
#
# ## 9. What the heads look at
#
# A freshly initialised module has random projections, so its heads attend more or less
# uniformly: the interesting patterns appear only with training (notebook 07 shows trained
# cross-attention). To see *what heads can do*, we set the weights of one module by hand.
# Every token's vector is [one-hot of its word | one-hot of its position | a constant 1], and
# the four heads get query/key projections that make them look at
#
# - head 0: the **previous** token (query position $p$ matches key position $p - 1$),
# - head 1: tokens with the **same word** (the two `the`),
# - head 2: the **first** token, whatever the query (trained models have such "resting" heads),
# - head 3: the **next** token.
#
# `sharpness` is the score of a match after the $1/\sqrt{D_h}$ scaling; other keys score 0.

# %%
sentence = ["<s>", "the", "cat", "sat", "on", "the", "mat", "."]
vocab = list(dict.fromkeys(sentence))
L_s, d_s, h_s = len(sentence), 32, 4
dh_s = d_s // h_s  # 8 features per head
POS, ONE = 8, 16  # positions use features 8..15, the constant feature is 16


def embed(words):
    x = torch.zeros(len(words), d_s)
    for p, w in enumerate(words):
        x[p, vocab.index(w)] = 1.0  # word identity: features 0..6
        x[p, POS + p] = 1.0  # position
        x[p, ONE] = 1.0
    return x


def hand_built_heads(sharpness=4.0):
    m = MHA(d_s, h_s).eval()
    s = sharpness * math.sqrt(dh_s)  # undo the 1/sqrt(D_h) scaling
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        Wq, Wk = m.w_q.weight, m.w_k.weight  # head h owns rows h*8 .. h*8+7
        for j in range(L_s - 1):
            Wq[0 * dh_s + j, POS + j + 1] = s  # head 0: query at position j+1 ...
            Wk[0 * dh_s + j, POS + j] = 1.0  # ... matches the key at position j
            Wq[3 * dh_s + j, POS + j] = s  # head 3: query at j matches key at j+1
            Wk[3 * dh_s + j, POS + j + 1] = 1.0
        for j in range(len(vocab)):
            Wq[1 * dh_s + j, j] = s  # head 1: same word
            Wk[1 * dh_s + j, j] = 1.0
        Wq[2 * dh_s, ONE] = s  # head 2: every query ...
        Wk[2 * dh_s, POS + 0] = 1.0  # ... matches position 0
        m.w_v.weight.copy_(torch.eye(d_s))
        m.w_o.weight.copy_(torch.eye(d_s))
    return m


head_names = ["head 0: previous", "head 1: same word", "head 2: first token", "head 3: next"]
built = hand_built_heads()
xs = embed(sentence).unsqueeze(0)  # (1, L, d_model)
built(xs, xs, xs)
fig = plots.heatmap_grid(built.attn_weights[0], sentence, sentence, col_titles=head_names,
                         title="four hand-built heads on one sentence (row = query)", cell_size=2.6)

# %% [markdown]
# Each row is one query's distribution over the keys, and each head found something different
# *in the same sentence*, which one softmax could not do. Where a head has nothing to match
# (head 0 at the first token, head 3 at the last) all scores are 0 and the row is uniform.
#
# ### Explore: sharpness and masks
#
# Move `sharpness` to see the distributions go from uniform (0) to one-hot, and pick a mask:
# the causal mask removes everything above the diagonal **in every head** (head 3, "next",
# then has nothing left to look at), and the padding mask treats the last two tokens as padding.

# %%
def draw_heads(sharpness=4.0, mask="none"):
    m = hand_built_heads(sharpness)
    ids = torch.tensor([[vocab.index(w) + 1 for w in sentence]])  # 0 is kept for padding
    if mask == "causal":
        mk = make_causal_mask(L_s)  # (L, L): used as it is
    elif mask == "padding":
        ids[0, -2:] = 0
        mk = make_padding_mask(ids)  # (1, 1, L): gets a head axis inside the module
    else:
        mk = None
    m(xs, xs, xs, mk)
    return plots.heatmap_grid(m.attn_weights[0], sentence, sentence, col_titles=head_names,
                              title=f"sharpness {sharpness:.1f}, mask: {mask}", cell_size=2.6)


explorer = explore(draw_heads, sharpness=(0.0, 8.0, 0.5, 4.0), mask=["causal", "none", "padding"])

# %% [markdown]
# For contrast, the same sentence through a module with **random** initial weights (on random
# word vectors): the maps are smooth and similar across heads, with no structure to speak of.
# Training is what turns them into patterns like the ones above.

# %%
torch.manual_seed(3)
random_mha = MHA(d_s, h_s).eval()
table = torch.randn(len(vocab), d_s)
xr = table[[vocab.index(w) for w in sentence]].unsqueeze(0)  # (1, L, d_model)
random_mha(xr, xr, xr)
fig = plots.heatmap_grid(random_mha.attn_weights[0], sentence, sentence,
                         col_titles=[f"head {h} (random)" for h in range(h_s)],
                         title="an untrained module: random projections", cell_size=2.6)

# %% [markdown]
# ## 10. Parameters and cost
#
# **Parameters.** Four `d_model × d_model` matrices and four bias vectors:
# $4d_\text{model}^2 + 4d_\text{model}$, independent of the number of heads (section 2).
# `nn.MultiheadAttention` has exactly the same count, just packed differently.

# %%
print(" d_model  heads    ours    nn.MultiheadAttention   4d^2 + 4d")
for d, h in ((32, 4), (512, 1), (512, 8), (512, 64)):
    n_ours = sum(p.numel() for p in MHA(d, h).parameters())
    n_torch = sum(p.numel() for p in nn.MultiheadAttention(d, h).parameters())
    print(f"{d:8d} {h:6d} {n_ours:9,d} {n_torch:16,d} {4 * d * d + 4 * d:16,d}")

# %% [markdown]
# **Compute.** For self-attention on a sequence of length $L$ (per sequence, counting a
# multiply-add as 2 operations):
#
# - the four projections: $4 \cdot 2 L d_\text{model}^2 = 8 L d_\text{model}^2$, linear in $L$;
# - the scores $QK^\top$ and the weighted sum: $h \cdot 2 \cdot 2 L^2 D_h = 4 L^2 d_\text{model}$,
#   quadratic in $L$ and again independent of $h$.
#
# The two are equal at $L = 2 d_\text{model}$: short sequences spend their time in the
# projections, long ones in attention. Memory for the weights is another matter: every head keeps
# its own $L \times L$ map, $h L^2$ numbers per sequence (what `attn_weights` holds), so
# **more heads cost memory, not arithmetic**.

# %%
d_cost = 512
lengths = [64, 128, 256, 512, 1024, 2048, 4096]
proj = [8 * L * d_cost ** 2 / 1e9 for L in lengths]
attn = [4 * L * L * d_cost / 1e9 for L in lengths]
fig = plots.curves(lengths, {"projections (8 L d^2)": proj, "attention (4 L^2 d)": attn},
                   xlabel="sequence length L", ylabel="GFLOP per sequence", logy=True, markers=True,
                   title=f"where the work goes, d_model = {d_cost}")
fig.axes[0].set_xscale("log", base=2)
fig.axes[0].axvline(2 * d_cost, color="gray", ls="--")
for h in (8, 64):
    print(f"attention maps at L=2048 with {h:2d} heads: {h * 2048 ** 2 * 4 / 2 ** 20:6.0f} MiB "
          "per sequence (float32)")

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** In cross-attention the queries come from the target ($L_q$ tokens) and the
# keys and values from the source. Which lengths must agree, and what would break if K and V had
# different lengths?

# %% [answer] q_kv_lengths 1
# ### BEGIN SOLUTION
# $L_q$ may differ from the others, but K and V must have the same length $L_k$: the weights
# have shape `(B, H, Lq, Lk)`, one per key, and `weights @ v` averages the value *of the same
# token* as each key, so it needs `v` of shape `(B, H, Lk, D_h)`. With different lengths the
# matrix product fails with a shape error (or, if the code forced the shapes to fit, each weight
# would be applied to another token's value).
# ### END SOLUTION

# %% [markdown]
# **Question 2.** Compare one attention head of size 512 with 8 heads of size 64 (the same
# `d_model = 512`): parameters, computation, and what the 8 heads can represent that the single
# head cannot.

# %% [answer] q_heads 1
# ### BEGIN SOLUTION
# The projections $W_q, W_k, W_v, W_o$ are the same four $512 \times 512$ matrices either way,
# and the score and averaging work is the same in total ($8 \times L^2 \times 64 = L^2 \times
# 512$). The difference is that 8 heads compute 8 separate softmax distributions per query: each
# head can attend to different positions (for example the previous token in one head and a
# related word in another), while a single head can only form one weighted average per query.
# ### END SOLUTION

# %% [markdown]
# ## 11. Mistakes worth recognising
#
# Each of these appears in tutorials or study notes; the checks above name every one.
#
# | mistake | what happens |
# | --- | --- |
# | `x.view(B, H, L, D_h)` without the transpose | right shape, heads and tokens mixed; trains badly, no error |
# | `view(B, L, D_h, H)` (interleaved) | head $h$ gets every $h$-th feature instead of its block |
# | `transpose(1, 2).view(...)` when combining | `RuntimeError: view size is not compatible`: add `.contiguous()` or use `reshape` |
# | combining without the transpose | silently glues whole rows of one head together |
# | scaling by $\sqrt{d_\text{model}}$ | scores $\sqrt{h}$ times too small, weights too flat |
# | `B, L, _ = q.shape` reused for `k` and `v` | crashes in cross-attention, where `Lk != Lq` |
# | `self.wk = ...` twice, `wv` never defined | the notes' copy-paste slip: values projected with `w_k`, or an `AttributeError` |
# | a 3-D mask without `unsqueeze(1)` | error when `B != H`; when `B == H`, head $i$ uses sequence $i$'s mask |
# | mask meaning flipped | `masked_fill(mask, ...)` blocks exactly the allowed keys (PyTorch's masks *are* `True` = blocked) |
# | `-inf` in the masked scores | a fully masked row becomes NaN and spreads through `w_o` |
# | `F.dropout(w, p)` in forward | `training=True` by default: eval mode stays random; use `nn.Dropout` |
# | storing `attn_weights` after dropout | plotted rows don't sum to 1 |
# | per-head layers in a plain Python list | missing from `parameters()` and `state_dict()`: never trained, never saved |
# | `super.__init__()` or `def _init_` | `TypeError` at construction (both are in the study notes) |
#
# **Next:** `04_normalization`: LayerNorm and BatchNorm, the other half of every Transformer block.
