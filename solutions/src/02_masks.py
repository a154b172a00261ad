#| default_exp masks
# %% [markdown]
# # 02 · Masks: padding, causality, and what $-\infty$ does to softmax
#
# The attention of notebook 01 lets every query look at every key. Real models must forbid
# some of those pairs, for two reasons:
#
# 1. **Padding.** Sentences have different lengths; to stack them into one tensor the short
#    ones are filled up with a `<pad>` token. A padded position is not a word, and no real word
#    should attend to it.
# 2. **Causality.** A decoder learns to predict token $t+1$ from tokens $0..t$. In training all
#    positions are computed at once, so position $t$ must be kept from peeking at $t+1, t+2,
#    \dots$: otherwise it simply copies the answer.
#
# A **mask** says which (query, key) pairs are allowed. In this notebook you build:
#
# | exercise | returns |
# | --- | --- |
# | `make_padding_mask(tokens, pad_id=0)` | `(B, 1, Lk)`: which keys are real tokens |
# | `make_causal_mask(size, device=None)` | `(L, L)`: which keys are not in the future |
# | `make_decoder_mask(tokens, pad_id=0)` | `(B, L, L)`: both at once |
# | `scaled_dot_product_attention(q, k, v, mask=None)` | notebook 01's attention, now obeying a mask |
#
# **The convention of this course, everywhere: a mask is a boolean tensor, `True` = may
# attend.** PyTorch itself is not consistent about this (section 3.3 shows where it flips).
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Before you hand in, run *Validate* (or `nbgrader validate 02_masks.ipynb`). Hidden
# tests with other shapes and seeds run when your work is graded. `torch.softmax` is allowed
# now; `F.scaled_dot_product_attention` is not (the checks notice).

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

chk = checks.notebook("02_masks")  # the graded checks of this notebook

# %% [markdown]
# ## 1. Why masks
#
# ### 1.1 Padding
#
# Here is a toy vocabulary and a batch of three sentences of lengths 6, 3 and 2. To become one
# `(B, L)` tensor of token ids, the short ones are padded with `<pad>`, id 0.

# %%
sentences = [["the", "cat", "sat", "on", "the", "mat"],
             ["a", "dog", "ran"],
             ["birds", "sing"]]
PAD = 0
vocab = {"<pad>": PAD}
for s in sentences:
    for w in s:
        vocab.setdefault(w, len(vocab))
L = max(len(s) for s in sentences)
labels = [s + ["<pad>"] * (L - len(s)) for s in sentences]  # token labels for the plots
tokens = torch.tensor([[vocab[w] for w in s] for s in labels])  # (B, L)
print(tokens)
print("shape:", tuple(tokens.shape), " pad id:", PAD)

# %% [markdown]
# Give every token a random but fixed 8-dimensional embedding and run the plain self-attention
# of notebook 01 (queries = keys = values = the embeddings). Does the output for *"a dog ran"*
# depend on being in a batch with longer sentences? It should not: the meaning of a sentence
# does not change because its neighbour in the batch is long.

# %%
gen = torch.Generator().manual_seed(0)
table = torch.randn(len(vocab), 8, generator=gen)  # one vector per vocabulary entry
x = table[tokens]  # (B, L, 8)


def plain_attention(x):
    """Notebook 01's self-attention with q = k = v = x and no mask."""
    w = torch.softmax(x @ x.transpose(-2, -1) / math.sqrt(x.size(-1)), dim=-1)  # (B, L, L)
    return w @ x, w


alone, _ = plain_attention(x[1:2, :3])  # "a dog ran" on its own: (1, 3, 8)
in_batch, _ = plain_attention(x[1:2])   # the same sentence padded to length 6
print("largest change in the outputs of 'a dog ran':",
      (alone - in_batch[:, :3]).abs().max().item())

# %% [markdown]
# It does: in the batch, *dog* spends part of its attention on the three `<pad>` positions.
# A **padding mask** removes those keys.
#
# ### 1.2 Causality
#
# A language model is trained on *"the cat sat on the mat"* to predict, at every position, the
# next token. All six predictions are computed in one pass (teacher forcing, notebook 07). If
# position 2 (*sat*) could attend to position 3 (*on*), predicting *on* would be trivial, and
# the model would learn nothing it can use at generation time, when the future does not exist
# yet. A **causal mask** lets query $i$ see keys $0..i$ only.
#
# ## 2. The convention and the shapes
#
# Attention scores are `(B, Lq, Lk)` for one head and `(B, H, Lq, Lk)` for several heads
# (notebook 03): **row = query, column = key**. A mask is a boolean tensor, `True` where the
# query may attend to the key, and it is applied in one line: blocked scores become $-\infty$,
# and softmax turns $e^{-\infty} = 0$ into a weight of exactly zero.

# %%
def apply_mask(scores, mask):
    """The whole trick (section 6 looks closer): blocked scores -> -inf -> weight 0."""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


scores = torch.tensor([[2.0, 1.0, 0.5, 3.0]])
print(apply_mask(scores, torch.tensor([[True, True, False, False]])))
print(torch.softmax(torch.tensor([[2.0, 1.0]]), dim=-1))  # the same numbers: the rest renormalise

# %% [markdown]
# The mask does not need the scores' full shape: it only has to **broadcast** against them.
# Broadcasting lines the shapes up *from the right*; each pair of sizes must be equal, or one
# of them 1 (which is then repeated). That is what lets one `(L, L)` causal mask serve every
# sequence and every head. It is also what makes mask bugs silent: a wrong shape often still
# broadcasts, just along the wrong axis. The table below is computed, not typed: each mask
# against one-head scores `(B, Lq, Lk) = (3, 4, 5)` (cross-attention, `Lq != Lk`), against
# self-attention scores `(3, 5, 5)`, and against two-head scores `(B, H, Lq, Lk) = (3, 2, 4, 5)`.
# `WRONG` marks a result that is not the scores' own shape.

# %%
B, H = 3, 2
settings = {"cross-attn (3, 4, 5)": (4, 5), "self-attn (3, 5, 5)": (5, 5),
            "heads (3, 2, 4, 5)": (4, 5)}
mask_shapes = {  # each mask's shape for given Lq, Lk
    "(B, 1, Lk)     padding mask": lambda Lq, Lk: (B, 1, Lk),
    "(Lq, Lk)       causal mask": lambda Lq, Lk: (Lq, Lk),
    "(B, Lq, Lk)    decoder mask": lambda Lq, Lk: (B, Lq, Lk),
    "(B, 1, 1, Lk)  padding + head axis": lambda Lq, Lk: (B, 1, 1, Lk),
    "(B, 1, Lq, Lk) decoder + head axis": lambda Lq, Lk: (B, 1, Lq, Lk),
    "(B, Lk)        trap: no query axis": lambda Lq, Lk: (B, Lk),
    "(B, Lk, 1)     trap: wrong side": lambda Lq, Lk: (B, Lk, 1),
}


def broadcast(mask_shape, scores_shape):
    try:
        out = tuple(torch.broadcast_shapes(mask_shape, scores_shape))
    except RuntimeError:
        return "error"
    return f"{out}" + ("" if out == scores_shape else " WRONG")


print(f"{'mask':36s}" + "".join(f"{s:24s}" for s in settings))
for name, shape_of in mask_shapes.items():
    cells = []
    for setting, (Lq, Lk) in settings.items():
        scores_shape = (B, H, Lq, Lk) if setting.startswith("heads") else (B, Lq, Lk)
        cells.append(broadcast(shape_of(Lq, Lk), scores_shape))
    print(f"{name:36s}" + "".join(f"{c:24s}" for c in cells))

# %% [markdown]
# Read it as a rule book:
#
# | mask | against `(B, Lq, Lk)` | against `(B, H, Lq, Lk)` | notes |
# | --- | --- | --- | --- |
# | `(B, 1, Lk)` | ✓ one row per sequence, shared by all queries | ✗ `B` lands on the head axis | add a head axis first: `mask.unsqueeze(1)` |
# | `(Lq, Lk)` | ✓ shared by the batch | ✓ shared by batch and heads | the causal mask |
# | `(B, Lq, Lk)` | ✓ | ✗ `B` lands on the head axis | `unsqueeze(1)` for heads |
# | `(B, 1, 1, Lk)` | ✗ **silently** `(B, B, Lq, Lk)` | ✓ | only for multi-head scores |
# | `(B, Lk)` | ✗ `B` lands on the query axis | ✗ | an error when `B != Lq`, **silently wrong** when `B == Lq` |
# | `(B, Lk, 1)` | masks **queries**, not keys | ✗ | an error when `Lq != Lk`, **silently wrong** in self-attention |
#
# Note the `(B, Lk, 1)` row: an error in cross-attention, but self-attention accepts it without
# a word, and it is still wrong. "Error" is the lucky case. The two silent traps deserve a
# demonstration; section 3.2 runs them once you have a padding mask.
#
# ## 3. The padding mask
#
# A key may be attended to when it is a real token: `tokens != pad_id`. That is `(B, L)`; the
# query axis in the middle turns it into `(B, 1, Lk)`, which broadcasts over every query. Pads
# can sit anywhere (some tokenizers pad on the left), so compare every token, do not count
# lengths.
#
# ### Exercise 1: `make_padding_mask`

# %% [solution] make_padding_mask
def make_padding_mask(tokens: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Boolean key-padding mask: True where the key is a real token.

    tokens: (B, L) integer token ids. pad_id: the id used for padding.
    Returns a torch.bool tensor of shape (B, 1, L): the middle axis (size 1) is the query axis,
    so the mask broadcasts against scores (B, Lq, Lk) for any number of queries Lq.
    """
    ### BEGIN SOLUTION
    return (tokens != pad_id).unsqueeze(1)  # (B, L) -> (B, 1, L)
    ### END SOLUTION

# %% [tests] make_padding_mask

# %% [markdown]
# ### 3.1 What it looks like
#
# Left: the padding mask of each sentence, one row per sequence (`(B, 1, L)` without its middle
# axis). Right: what it becomes against the `(L, L)` scores of the second sentence once
# broadcast: every query row is the same, and the `<pad>` columns are blocked.

# %%
pad_mask = make_padding_mask(tokens, PAD)  # (B, 1, L)
print("mask shape:", tuple(pad_mask.shape))
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), gridspec_kw={"width_ratios": [1.3, 1]})
axes[0].imshow(pad_mask.squeeze(1).float().numpy(), cmap="Greens", vmin=0, vmax=1)
axes[0].set_yticks(range(len(sentences)), [" ".join(s) for s in sentences], fontsize=8)
axes[0].set_xticks(range(L), [f"key {j}" for j in range(L)], rotation=90, fontsize=8)
axes[0].set_title("padding mask (B, 1, L): green = may attend")
for b in range(len(sentences)):
    for j in range(L):
        axes[0].text(j, b, labels[b][j], ha="center", va="center", fontsize=7)
axes[1].imshow(pad_mask[1].expand(L, L).float().numpy(), cmap="Greens", vmin=0, vmax=1)
axes[1].set_xticks(range(L), labels[1], rotation=90)
axes[1].set_yticks(range(L), labels[1])
axes[1].set(xlabel="key", ylabel="query", title="sentence 2, broadcast to (L, L)")
fig.tight_layout()

# %% [markdown]
# The `<pad>` *rows* of the right plot are not blocked: a pad query still attends to the real
# keys. That is on purpose. Its output is garbage nobody reads (the loss ignores pad
# positions), and blocking its row as well would only create a row with nothing to attend to;
# section 6 shows why such rows are dangerous.
#
# A helper for the rest of the notebook draws one matrix per sentence with its own token
# labels; entries that are `NaN` are painted **red**.

# %%
def show_grid(mats, token_lists, row_titles, title=None, cmap="Blues"):
    """mats[r][c]: an (L, L) matrix (row = query, column = key) for sentence c.
    NaN entries are drawn red."""
    R, C = len(mats), len(mats[0])
    fig, axes = plt.subplots(R, C, figsize=(2.7 * C + 1.0, 2.6 * R + 0.4), squeeze=False)
    cm = plt.get_cmap(cmap).copy()
    cm.set_bad("red")
    for r in range(R):
        for c in range(C):
            ax, m = axes[r][c], torch.as_tensor(mats[r][c]).detach().float()
            ax.imshow(m.numpy(), cmap=cm, vmin=0.0, vmax=1.0)
            ax.set_xticks(range(len(token_lists[c])), token_lists[c], rotation=90, fontsize=7)
            ax.set_yticks(range(len(token_lists[c])), token_lists[c], fontsize=7)
            if c == 0:
                ax.set_ylabel(f"{row_titles[r]}\nquery", fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

# %% [markdown]
# ### 3.2 Two traps, running
#
# **Trap 1: a `(B, Lk)` mask.** Forget the middle axis and the batch axis of the mask is lined
# up with the *query* axis of the scores. With our batch (`B = 3`, `L = 6`) that is an error:

# %%
flat = tokens != PAD  # (B, L): the query axis is missing
scores = x @ x.transpose(-2, -1) / math.sqrt(8)  # (B, L, L)
try:
    apply_mask(scores, flat)
except RuntimeError as e:
    print("RuntimeError:", e)

# %% [markdown]
# The dangerous case is when `B` happens to equal `Lq`. Cut the batch to three positions, so
# `B = Lq = 3`: now it runs, and query $i$ of **every** sentence gets the padding of sentence
# $i$. Compare the rows with the correct result:

# %%
short_tokens = tokens[:, :3]  # (3, 3): B == L
short_labels = [row[:3] for row in labels]
s3 = scores[:, :3, :3]
right = apply_mask(s3, make_padding_mask(short_tokens, PAD))  # (B, 1, Lk) mask
wrong = apply_mask(s3, short_tokens != PAD)                   # (B, Lk) mask: (1, B, Lk) in effect
fig = show_grid([list(right), list(wrong)], short_labels, ["(B, 1, Lk) mask", "(B, Lk) mask"],
                title="a (B, Lk) mask silently mixes up sequences (red = NaN)")

# %% [markdown]
# In the bottom row the last query of *every* sentence is blocked from the last key, even in
# the two sentences without padding, while the first two queries of *birds sing* still see its
# `<pad>`: query $i$ of each sentence took the mask of sentence $i$.
#
# **Trap 2: masking queries instead of keys.** A `(B, L, 1)` mask varies along the *query*
# axis. In self-attention `Lq == Lk`, so it broadcasts without complaint, but it blanks whole
# rows instead of columns: real words still attend to `<pad>`, and every `<pad>` row has no key
# left, which turns into NaN.

# %%
keys_masked = apply_mask(scores, make_padding_mask(tokens, PAD))          # (B, 1, L)
queries_masked = apply_mask(scores, (tokens != PAD).unsqueeze(-1))         # (B, L, 1)
fig = show_grid([list(keys_masked), list(queries_masked)], labels,
                ["keys masked (B, 1, L)", "queries masked (B, L, 1)"],
                title="mask the keys (columns), not the queries (rows); red = NaN")

# %% [markdown]
# ### 3.3 PyTorch's own conventions
#
# PyTorch's modules use the **opposite** meaning. `nn.MultiheadAttention(key_padding_mask=...)`
# and every boolean mask of `nn.Transformer*` mean `True` = *ignore this key*.
# `F.scaled_dot_product_attention(attn_mask=...)` uses our meaning, `True` = *takes part*.
# Float masks are added to the scores (0 = keep, $-\infty$ = block) everywhere.
#
# | API | argument | `True` means |
# | --- | --- | --- |
# | this course | `mask` | may attend |
# | `F.scaled_dot_product_attention` | `attn_mask` (bool) | may attend |
# | `nn.MultiheadAttention`, `nn.Transformer*` | `key_padding_mask`, `attn_mask`, `src_mask`, `tgt_mask`, `*_key_padding_mask` (bool) | **must not** attend |
#
# Hand our mask to `nn.MultiheadAttention` as it is and watch what happens:

# %%
torch.manual_seed(0)
mha = nn.MultiheadAttention(8, num_heads=1, batch_first=True)
ours = make_padding_mask(tokens, PAD).squeeze(1)  # (B, L), True = real token
_, w_as_is = mha(x, x, x, key_padding_mask=ours)   # PyTorch reads True as "ignore"
_, w_flip = mha(x, x, x, key_padding_mask=~ours)   # flip it: True = padding
fig = show_grid([list(w_as_is), list(w_flip)], labels,
                ["key_padding_mask=ours", "key_padding_mask=~ours"],
                title="nn.MultiheadAttention: True means IGNORE (red = NaN)")

# %% [markdown]
# Passed as it is, our mask makes PyTorch attend *only* to the padding, and the sentence with
# no padding has no key left at all: NaN (on this call, which returns the weights; notebook 03
# shows the paths of `nn.MultiheadAttention` that return zeros there instead). Whenever a mask crosses into PyTorch's modules (as in
# notebooks 03 and 06, where we compare with them), flip it with `~`.
#
# ## 4. The causal mask
#
# Query $i$ may attend to keys $j \le i$: the **lower triangle, diagonal included**, of an
# `(L, L)` matrix. `torch.tril` keeps the lower triangle of a matrix and zeroes the rest;
# applied to a boolean matrix of ones it gives exactly that. The diagonal matters: position 0
# has nothing before it, so without the diagonal its row would be empty.
#
# The mask is built fresh for the actual length, on the device the scores live on. A mask
# created on the CPU next to scores on a GPU makes `masked_fill` fail, hence `device=`.
#
# ### Exercise 2: `make_causal_mask`

# %% [solution] make_causal_mask
def make_causal_mask(size: int, device=None) -> torch.Tensor:
    """Boolean look-ahead mask: query i may attend to keys 0..i.

    size: the sequence length L. device: where to create the mask (None = the default device).
    Returns a torch.bool tensor of shape (L, L), True on and below the diagonal.
    """
    ### BEGIN SOLUTION
    return torch.tril(torch.ones(size, size, dtype=torch.bool, device=device))  # (L, L)
    ### END SOLUTION

# %% [tests] make_causal_mask

# %% [markdown]
# The causal mask of the first sentence, and the self-attention weights it allows:

# %%
causal = make_causal_mask(L)  # (L, L)
w_causal = apply_mask(scores[0], causal)  # (L, L)
fig = plots.heatmap_grid(torch.stack([causal.float(), w_causal]), labels[0], labels[0],
                         col_titles=["causal mask (L, L): dark = may attend",
                                     "weights with the causal mask"])

# %% [markdown]
# Every row of the weights still sums to 1; row $i$ simply spreads its weight over the first
# $i + 1$ keys. Row 0 puts everything on itself.
#
# ### 4.1 The seed notes' causal-mask bugs, running
#
# This course grew out of study notes that build the causal mask the way many tutorials do: an
# **additive** float mask, 0 where allowed and $-\infty$ where blocked, added to the scores.
# Three bugs from them, each run and explained.
#
# **Bug 1: `torch.full` with the size spread over three arguments.** `torch.full(size,
# fill_value)` takes the size as *one* tuple:

# %%
max_seq_len = 6
try:
    seed_mask = torch.full(1, max_seq_len, max_seq_len).float("-inf")  # as in the notes
except TypeError as e:
    print("TypeError:", e)
seed_mask = torch.full((1, max_seq_len, max_seq_len), float("-inf"))  # size tuple, then value
print(seed_mask.shape)

# %% [markdown]
# The same notes also write `torch.triu(mask, diagnoal=1)`: a misspelt keyword is a
# `TypeError` too. Cheap bugs: Python stops you.
#
# **Bug 2: `triu` with `diagonal=-1`.** `torch.triu(m, diagonal=d)` keeps the entries on and
# above the $d$-th diagonal and zeroes the rest. On a matrix of $-\infty$ the kept part is the
# *blocked* part. `diagonal=1` blocks the strict future, correct. One version of the notes uses
# `diagonal=-1`, which blocks the future **and** the token itself **and** its predecessor:

# %%
Lc = 5
good = torch.triu(torch.full((Lc, Lc), float("-inf")), diagonal=1)
bad = torch.triu(torch.full((Lc, Lc), float("-inf")), diagonal=-1)
print("diagonal=-1 gives:\n", bad)
flat_scores = torch.zeros(Lc, Lc)  # equal scores: the weights show the mask's pattern
w_good = torch.softmax(flat_scores + good, dim=-1)
w_bad = torch.softmax(flat_scores + bad, dim=-1)
print("weights with diagonal=-1:\n", w_bad)
toks = labels[0][:Lc]
fig = show_grid([[w_good], [w_bad]], [toks], ["triu(diagonal=1)", "triu(diagonal=-1)"],
                title="causal weights (red = NaN)")

# %% [markdown]
# Rows 0 and 1 have every key blocked: softmax of all $-\infty$ is NaN (section 6 explains
# why), and every other row is shifted by two: token $i$ sees $0..i-2$. A model trained like
# this never sees the most useful token, itself.
#
# **Bug 3: a 3-D slice of a 4-D mask.** For multi-head scores `(B, H, L, L)` the notes keep a
# `(1, 1, max_seq_len, max_seq_len)` buffer and cut it to the current length with
# `mask[:, :seqlen, :seqlen]`. Three indices on a 4-D tensor slice axes 0, 1 and 2: the head
# axis (size 1, unharmed) and the **query** axis; the key axis keeps its full length.

# %%
buffer = torch.triu(torch.full((1, 1, max_seq_len, max_seq_len), float("-inf")), diagonal=1)
seqlen = 4
print("mask[:, :seqlen, :seqlen]    ->", tuple(buffer[:, :seqlen, :seqlen].shape))
print("mask[:, :, :seqlen, :seqlen] ->", tuple(buffer[:, :, :seqlen, :seqlen].shape))
head_scores = torch.randn(2, 3, seqlen, seqlen)  # (B, H, L, L)
try:
    head_scores + buffer[:, :seqlen, :seqlen]
except RuntimeError as e:
    print("RuntimeError:", e)
full_len = torch.randn(2, 3, max_seq_len, max_seq_len)  # a batch exactly max_seq_len long
print("at seqlen == max_seq_len it runs:", tuple((full_len + buffer[:, :max_seq_len, :max_seq_len]).shape))

# %% [markdown]
# It only fails for sequences shorter than `max_seq_len`; a test on full-length inputs passes.
# (The same notes also test `self.is_casual` after setting `self.is_causal`, and another version
# adds `mask` where it means `self.mask`: in a notebook, a global `mask` left over from an
# earlier cell makes that run silently.) The course's design avoids the whole family: a boolean `(L, L)`
# mask made on demand for the actual length needs no buffer, no slicing, and broadcasts against
# 3-D and 4-D scores alike.
#
# Another set of notes builds the decoder mask with a loop, `mask = torch.ones(B, L, L)` then
# `mask[:, i, i+1:] = 0` for every `i`. The values are right; but the mask is float, a Python
# loop per position, and created on the CPU. `torch.tril` does it in one call, on any device.
#
# ## 5. The decoder mask: both at once
#
# The decoder's self-attention needs both rules: a key is allowed when it is a **real token
# AND not in the future**. Broadcasting does the combining: `(B, 1, L) & (L, L)` gives
# `(B, L, L)`. As with the padding mask, the query rows at pad positions are left alone (they
# keep their causal keys).
#
# ### Exercise 3: `make_decoder_mask`
#
# You may call your `make_padding_mask` and `make_causal_mask`. Build the causal part on
# `tokens.device`.

# %% [solution] make_decoder_mask
def make_decoder_mask(tokens: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """Mask for decoder self-attention: causal AND key padding.

    tokens: (B, L) integer token ids. Returns a torch.bool tensor of shape (B, L, L) on the
    tokens' device: entry [b, i, j] is True when key j is a real token of sequence b and j <= i.
    Query rows at pad positions are not masked beyond that.
    """
    ### BEGIN SOLUTION
    L = tokens.size(1)
    pad = make_padding_mask(tokens, pad_id)                # (B, 1, L)
    causal = make_causal_mask(L, device=tokens.device)     # (L, L)
    return pad & causal                                    # (B, L, L)
    ### END SOLUTION

# %% [tests] make_decoder_mask

# %% [markdown]
# The three masks side by side, for each sentence:

# %%
dec_mask = make_decoder_mask(tokens, PAD)  # (B, L, L)
pad_full = make_padding_mask(tokens, PAD).expand(-1, L, -1)  # (B, L, L), only for the plot
causal_full = make_causal_mask(L).expand(len(sentences), -1, -1)
fig = show_grid([list(pad_full), list(causal_full), list(dec_mask)], labels,
                ["padding", "causal", "decoder = both"], cmap="Greens",
                title="masks (green = may attend)")

# %% [markdown]
# ## 6. What $-\infty$ does inside softmax
#
# With the stable softmax of notebook 01, a row is `exp(x - max(x)) / sum(...)`. A blocked
# entry is $-\infty$, its exponential exactly 0; the allowed entries renormalise among
# themselves, as if the blocked ones had never existed. Now block **every** entry of a row:

# %%
dead = torch.full((4,), float("-inf"))
print("softmax of a row of -inf:", torch.softmax(dead, dim=-1))
print("its max:", dead.max().item(), "  x - max:", (dead - dead.max()).tolist())

# %% [markdown]
# $-\infty - (-\infty)$ is undefined: NaN. (Without the max subtraction it is
# $0/0$, NaN too.) One NaN does not stay put. The next attention layer mixes every position
# into every other, so a single NaN row poisons the whole sequence, then the loss, then,
# through the gradients, every parameter:

# %%
gen = torch.Generator().manual_seed(1)
h0 = torch.randn(1, 4, 8, generator=gen)
m = torch.ones(4, 4, dtype=torch.bool)
m[0] = False  # query 0 has no key left
h1 = apply_mask(h0 @ h0.mT / math.sqrt(8), m) @ h0   # layer 1, masked
h2, _ = plain_attention(h1)                           # layer 2, no mask at all
print("rows with NaN after layer 1:", torch.isnan(h1).any(-1).tolist())
print("rows with NaN after layer 2:", torch.isnan(h2).any(-1).tolist())

# %% [markdown]
# Fully masked rows are not exotic. They appear with **left padding plus a causal mask** (the
# first position is a pad, and the only key it may see is itself), with a batch entry that is
# all padding, in cross-attention over an empty source, and with a causal mask that forgot its
# diagonal (bug 2 above). Three ways to keep them finite:

# %%
scores = torch.tensor([[0.5, 2.0, -1.0, 0.3], [1.0, -0.2, 0.7, 2.2], [0.1, 0.4, 1.5, -0.8]])
mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)  # row 1: nothing
torch.set_printoptions(precision=3)
inf_fill = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
print("fill -inf:\n", inf_fill)
finite = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
print("fill torch.finfo(dtype).min (a finite number): the dead row is uniform\n", finite)
zeroed = torch.where(mask.any(dim=-1, keepdim=True), inf_fill, 0.0)
print("fill -inf, then zero the rows that have no key:\n", zeroed)
torch.set_printoptions(profile="default")

# %% [markdown]
# - A **finite fill value** keeps softmax finite: a dead row becomes uniform (an average over
#   keys it should not see, harmless because nothing reads it). Use `torch.finfo(dtype).min`
#   rather than a literal like `-1e9`: in float16, whose largest magnitude is 65504, `-1e9` is
#   $-\infty$ again, and `masked_fill` refuses it outright:

# %%
half = scores.half()
print("-1e9 as float16:", torch.tensor(-1e9).half().item(), "  finfo(float16).min:",
      torch.finfo(torch.float16).min)
try:
    half.masked_fill(~mask, -1e9)
except RuntimeError as e:
    print("RuntimeError:", e)

# %% [markdown]
# - **Zeroing dead rows** after softmax gives them all-zero weights and a zero output. Both
#   answers are accepted by the tests; PyTorch's `F.scaled_dot_product_attention` returns zeros
#   there.
#
# ### 6.1 `masked_fill` versus an additive mask
#
# The notes (and `nn.Transformer.generate_square_subsequent_mask`) use an **additive** float
# mask: 0 where allowed, $-\infty$ where blocked, *added* to the scores. In the forward pass it
# is the same as `masked_fill`. Converting between the two is one comparison:

# %%
additive = nn.Transformer.generate_square_subsequent_mask(4)  # float: 0 / -inf
print(additive)
print("as our boolean mask:\n", additive == 0)
print("same as make_causal_mask:", torch.equal(additive == 0, make_causal_mask(4)))

# %% [markdown]
# The differences show up elsewhere:
#
# 1. **A boolean mask is not additive.** `scores + mask` adds 1 where `True` (the allowed
#    keys get a small boost) and blocks nothing.
# 2. **Gradients.** Suppose you fill with $-\infty$ and clean the NaN of a dead row with
#    `nan_to_num`. Forward is fine either way. Backward, `masked_fill` sends *no* gradient to a
#    filled entry, so the NaN of the dead row is stopped; an addition passes it straight
#    through to the scores, and from there to $q$ and $k$:

# %%
gen = torch.Generator().manual_seed(2)
q0, k0 = torch.randn(1, 3, 4, generator=gen), torch.randn(1, 5, 4, generator=gen)
m = torch.tensor([[[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 1]]], dtype=torch.bool)
for name in ("masked_fill", "additive"):
    q = q0.clone().requires_grad_(True)
    s = q @ k0.mT / 2.0
    if name == "masked_fill":
        s = s.masked_fill(~m, float("-inf"))
    else:
        s = s + torch.zeros(m.shape).masked_fill(~m, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # forward: the dead row becomes zeros
    w.sum().backward()
    print(f"{name:11s} forward finite: {bool(torch.isfinite(w).all())}   "
          f"gradient finite: {bool(torch.isfinite(q.grad).all())}")

# %% [markdown]
# 3. In favour of additive masks: they can carry *soft* biases (ALiBi, T5's relative
#    positions add learned or fixed numbers to the scores), which a boolean cannot.
#
# In this course masks stay boolean; attention turns them into numbers in one place.
#
# ## 7. Attention with a mask
#
# $$\operatorname{Attention}(Q, K, V, M) = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}
# + \begin{cases}0 & M = \text{True}\\ -\infty & M = \text{False}\end{cases}\right) V$$
#
# ### Exercise 4: `scaled_dot_product_attention` with `mask`
#
# Extend notebook 01's attention with a `mask` argument:
#
# - `mask=None` means nothing is masked (plain attention).
# - The mask is boolean, `True` = may attend, and broadcastable to the scores `(..., Lq, Lk)`:
#   `(B, 1, Lk)`, `(Lq, Lk)`, `(B, Lq, Lk)`, and with heads `(B, 1, 1, Lk)`, `(B, H, Lq, Lk)`
#   and so on. Use it as it is (no `unsqueeze`, no reshape, no `scores[~mask] = ...` indexing, which
#   needs the exact shape).
# - Masked keys get weight **exactly** 0; every row with at least one allowed key sums to 1.
# - A row whose keys are all masked must come out finite, in the forward pass *and* the
#   gradients: all-zero weights or uniform weights are both fine.
#
# Return `(output, weights)`. `torch.softmax` is allowed; `F.scaled_dot_product_attention` is
# not.

# %% [solution] scaled_dot_product_attention
def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d_k), blocked where mask is False) v, for any leading batch axes.

    q: (..., Lq, d_k)   k: (..., Lk, d_k)   v: (..., Lk, d_v)
    mask: None, or a boolean tensor broadcastable to (..., Lq, Lk), True = may attend.
    Returns (output, weights): output (..., Lq, d_v), weights (..., Lq, Lk). Masked keys get
    weight 0; a query row with no allowed key gets finite weights (all zeros or uniform).
    """
    ### BEGIN SOLUTION
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)
    if mask is not None:
        # -inf makes blocked keys weigh exactly 0 ...
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        # ... and a row with no key left is softmax(all -inf) = NaN: make it all zeros.
        # masked_fill (not +) also stops that NaN from flowing back into the gradients.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights  # (..., Lq, d_v), (..., Lq, Lk)
    ### END SOLUTION

# %% [tests] scaled_dot_product_attention

# %% [markdown]
# ## 8. Masked attention on the sentences
#
# Self-attention over the batch with your attention and your masks. Top: the padding mask
# (an encoder); bottom: the decoder mask. No weight reaches a `<pad>` column, and in the
# bottom row nothing reaches the upper triangle.

# %%
_, w_pad = scaled_dot_product_attention(x, x, x, make_padding_mask(tokens, PAD))
_, w_dec = scaled_dot_product_attention(x, x, x, make_decoder_mask(tokens, PAD))
fig = show_grid([list(w_pad), list(w_dec)], labels, ["padding mask", "decoder mask"],
                title="masked self-attention weights")

# %% [markdown]
# And the question of section 1.1, answered: with the padding mask, the outputs of *"a dog
# ran"* are the same alone and inside the padded batch.

# %%
alone, _ = scaled_dot_product_attention(x[1:2, :3], x[1:2, :3], x[1:2, :3])
batch_out, _ = scaled_dot_product_attention(x, x, x, make_padding_mask(tokens, PAD))
print("largest change, masked:", (alone - batch_out[1:2, :3]).abs().max().item())

# %% [markdown]
# ### Explore: lengths, padding and fully masked rows
#
# Two sentences of adjustable length, padded to the longer one plus `extra_pad` positions, on
# the right or (with `left_padding`) on the left. Pick the mask and how attention treats it:
# `your attention` is your exercise 4; `plain softmax with -inf` shows what a naive version
# does. Things to try: the decoder mask with `left_padding` under the naive version (a red NaN
# row appears where a pad comes first), then the same with your attention; `extra_pad` leaves
# the weights of real tokens unchanged.

# %%
words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs"]


def draw_masks(len_a=5, len_b=2, extra_pad=1, mask="decoder", left_padding=False,
               attention="your attention"):
    lengths = [len_a, len_b]
    Lmax = max(lengths) + extra_pad
    rows, labs = [], []
    for n in lengths:
        ids = list(range(1, n + 1))  # token ids 1..n; 0 is <pad>
        pad = [PAD] * (Lmax - n)
        rows.append(pad + ids if left_padding else ids + pad)
        labs.append(["<pad>"] * len(pad) + words[:n] if left_padding else words[:n] + ["<pad>"] * len(pad))
    toks = torch.tensor(rows)  # (2, Lmax)
    emb = torch.randn(len(words) + 1, 8, generator=torch.Generator().manual_seed(0))[toks]  # (2, Lmax, 8)
    if mask == "padding":
        mk = make_padding_mask(toks, PAD).expand(-1, Lmax, -1)
    elif mask == "causal":
        mk = make_causal_mask(Lmax).expand(2, -1, -1)
    elif mask == "decoder":
        mk = make_decoder_mask(toks, PAD)
    else:
        mk = torch.ones(2, Lmax, Lmax, dtype=torch.bool)
    if attention == "your attention":
        _, w = scaled_dot_product_attention(emb, emb, emb, mk)
    else:
        w = apply_mask(emb @ emb.mT / math.sqrt(8), mk)
    return show_grid([list(mk), list(w)], labs, [f"{mask} mask", "weights"],
                     title=f"{attention}; red = NaN")


explorer = explore(draw_masks, len_a=(1, 8, 1, 5), len_b=(1, 8, 1, 2), extra_pad=(0, 4, 1, 1),
                   mask=["decoder", "padding", "causal", "none"], left_padding=True,
                   attention=["your attention", "plain softmax with -inf"])

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** Why does a query row whose keys are **all** masked give NaN when the masked
# scores are set to $-\infty$, and why is that NaN a problem even when the row belongs to a
# padding token nobody reads?

# %% [answer] q_masked_row 1
# ### BEGIN SOLUTION
# Every score of the row is $-\infty$, so the row maximum is $-\infty$ and $x - \max = -\infty -
# (-\infty)$ = NaN (or, without the max, every `exp` is 0 and softmax is $0/0$). That row's
# output is NaN. It does not stay there: in the next layer other tokens attend to that position,
# and a weight of 0 times NaN is still NaN, so the NaN spreads to every token; the loss and the
# gradients become NaN and one optimiser step turns every weight into NaN.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** The decoder mask is the padding mask AND the causal mask. What would a model
# trained with OR (`|`) instead be able to see, and what would it learn?

# %% [answer] q_and_not_or 1
# ### BEGIN SOLUTION
# With OR a key is allowed if it is a real token *or* not in the future, so every real token,
# future ones included, is visible. During training each position could read the very token it
# must predict: the loss drops by copying it, and the model learns nothing that works at
# generation time, when the future tokens do not exist yet.
# ### END SOLUTION

# %% [markdown]
# ## 9. Mistakes worth recognising
#
# Each of these runs without an error on some input; the checks above name every one.
#
# | mistake | what happens |
# | --- | --- |
# | `(tokens != pad_id)` without `unsqueeze(1)` | `(B, Lk)` lines up as `(1, B, Lk)`: error, or silently wrong when `B == Lq` |
# | `unsqueeze(-1)`: `(B, Lk, 1)` | masks query rows instead of key columns; pad rows go NaN |
# | `tokens == pad_id` as the mask | PyTorch's `key_padding_mask` meaning: attends only to padding |
# | `(B, 1, 1, Lk)` with single-head scores | broadcasts to `(B, B, Lq, Lk)` |
# | `triu(..., diagonal=1)` as a boolean "may attend" mask | the future is visible and the past hidden |
# | `tril(..., diagonal=-1)` or the notes' `triu(-inf, diagonal=-1)` | a token cannot see itself; row 0 has no key left: NaN |
# | `torch.full(1, L, L)` | `TypeError`: the size is one tuple |
# | `mask[:, :L, :L]` on a 4-D buffer | slices the query axis, not the key axis; fails only for short inputs |
# | mask created without `device=` | works on the CPU, fails next to GPU scores |
# | padding OR causal | must be AND (`&`): allowed only when real **and** not in the future |
# | `masked_fill(mask, -inf)` | blocks the allowed keys (convention flipped) |
# | `masked_fill(~mask, 0)` or `scores * mask` | $e^0 = 1$: masked keys keep weight |
# | `softmax(scores) * mask` | rows stop summing to 1 |
# | `scores + mask` with a boolean mask | adds 1 to allowed scores, blocks nothing |
# | $-\infty$ with no guard | NaN on fully masked rows, then everywhere |
# | additive $-\infty$ + `nan_to_num` | finite forward, NaN gradients |
# | `-1e9` in float16 | overflows to $-\infty$ (or `masked_fill` raises) |
#
# **Next:** `03_multihead`: several heads at once, where every mask gets a head axis.
