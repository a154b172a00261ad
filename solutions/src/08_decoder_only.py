#| default_exp decoder_only
# %% [markdown]
# # 08 · Decoder-only: a GPT-style model, sampling and a KV cache
#
# Notebook 07 built the full encoder-decoder. The GPT models (Radford et al., 2018 and 2019;
# Brown et al., 2020) keep **half** of it: one stack of masked self-attention layers that reads
# a sequence and predicts its next token. The
# question and the answer live in the same sequence. In this notebook you:
#
# 1. see what changes from encoder-decoder to **decoder-only** (no encoder, no cross-attention,
#    one causal stack);
# 2. write the **next-token loss**: inputs and labels shifted by one (teacher forcing), on the
#    tiny example of seed 001 ("what is statquest" → "awesome"), and watch what happens
#    without the shift;
# 3. build **causal self-attention with a key/value cache**, then the whole **`DecoderOnlyLM`**,
#    and train it until both of seed 001's prompts are answered "awesome <EOS>";
# 4. write **`generate`**: greedy decoding, temperature, top-k, end-of-sequence handling, and
#    the KV cache;
# 5. sample from a model trained on a small synthetic corpus, with plots of the next-token
#    distribution and an explorer for temperature and top-k;
# 6. meet the KV cache's classic bug (a forgotten **position offset**), check that cached and
#    uncached generation agree, and measure the speed-up.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Hidden tests with other sizes and seeds run when your work is graded.
#
# **What you may use.** The course's blocks from `tfscratch.reference` (imported below:
# `scaled_dot_product_attention` with a mask, `split_heads`, `combine_heads`,
# `PositionalEncoding`, `FeedForward`, the same as what you built in 01-06), `nn.Linear`,
# `nn.Embedding`, `nn.LayerNorm`, `nn.Dropout`, `torch.softmax`, `F.cross_entropy`. You may
# **not** use `F.scaled_dot_product_attention`, `nn.MultiheadAttention` or PyTorch's
# `nn.Transformer*` classes in your attention or your model: the checks notice (and none of
# them can continue from a cache anyway).

# %% [setup] setup_imports
import math
import os
import random
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from tfscratch import checks, plots
from tfscratch import reference as R
from tfscratch.fallback import pick
from tfscratch.reference import (FeedForward, PositionalEncoding, combine_heads, make_causal_mask,
                                 scaled_dot_product_attention, sinusoidal_positional_encoding,
                                 split_heads)
from tfscratch.widgets import explore
from tqdm.auto import tqdm

torch.manual_seed(0)
torch.set_num_threads(1)  # models this small run fastest on one thread: more threads only wait
# autograding and quick runs (TFS_QUICK_TRAINING=1, as the course's browser tests do): skip the long training runs
QUICK = bool(os.environ.get("NBGRADER_EXECUTION") or os.environ.get("TFS_QUICK_TRAINING"))
%matplotlib inline

chk = checks.notebook("08_decoder_only")  # the graded checks of this notebook

# %% [markdown]
# ## 1. Decoder-only versus encoder-decoder
#
# | | encoder-decoder (07) | decoder-only (this notebook) |
# | --- | --- | --- |
# | stacks | an encoder reads the source; a decoder writes the target | **one** stack |
# | attention per layer | encoder: self-attention; decoder: masked self-attention **and** cross-attention | masked self-attention only |
# | input | source and target are two sequences | prompt and answer are **one** sequence |
# | training target | the target, shifted by one | the whole sequence, shifted by one |
# | masks | padding (source), causal + padding (target) | causal (+ padding) |
#
# Without an encoder there is nothing to cross-attend to, so each layer keeps two sub-layers:
# masked self-attention and the feed-forward network. That is exactly an *encoder* layer from
# notebook 06 run with a causal mask (PyTorch's `nn.TransformerEncoderLayer` given a causal
# mask computes the same blocks). The name "decoder" comes from the masking:
# it can only look back, like the decoder of 07, so it can generate.
#
# Seed 001 trains such a model to answer two questions with the same word. The question, a
# separator `<EOS>` and the answer form one sequence; one causal mask covers all of it:

# %%
vocab = ["what", "is", "statquest", "awesome", "<EOS>"]  # seed 001's whole vocabulary
token_to_id = {w: i for i, w in enumerate(vocab)}
EOS = token_to_id["<EOS>"]
sentences = ["what is statquest <EOS> awesome <EOS>", "statquest is what <EOS> awesome <EOS>"]
seed_tokens = torch.tensor([[token_to_id[w] for w in s.split()] for s in sentences])  # (2, 6)
words0 = sentences[0].split()
fig = plots.heatmap(make_causal_mask(6).float(), words0, words0, xlabel="key (may be read)",
                    ylabel="query (reading)", cmap="Blues", colorbar=False,
                    title="decoder-only: one causal mask over question + answer")

# %% [markdown]
# Row `awesome` may read the whole question and the `<EOS>` that ends it: that is how the
# answer "sees" the question without any cross-attention.
#
# ## 2. Next-token training: labels are the inputs shifted by one
#
# A language model predicts, at every position $t$, the **next** token $x_{t+1}$ from
# $x_0 \dots x_t$. One pass over a sequence of length $T$ therefore gives $T - 1$ training
# examples at once (teacher forcing: the model always reads the true previous tokens, never
# its own guesses). Seed 001 writes the inputs and labels as two tables; they are the same
# sequence, shifted:

# %%
print(f"{'position':>9}" + "".join(f"{t:>11}" for t in range(5)))
print(f"{'input':>9}" + "".join(f"{vocab[i]:>11}" for i in seed_tokens[0, :-1].tolist()))
print(f"{'label':>9}" + "".join(f"{vocab[i]:>11}" for i in seed_tokens[0, 1:].tolist()))

# %% [markdown]
# The loss is the mean cross-entropy over all those predictions:
#
# $$\mathcal{L} = -\frac{1}{B(T-1)} \sum_{b} \sum_{t=0}^{T-2} \log p_\theta(x_{b,t+1} \mid x_{b,0..t}).$$
#
# We follow the Hugging Face convention: the model runs on the whole sequence, `logits =
# model(tokens)` of shape `(B, T, V)`, and the loss drops the last prediction (nothing follows
# it) and the first token (nothing predicts it). Thanks to the causal mask, `logits[:, :-1]`
# equals the output of `model(tokens[:, :-1])`, which is seed 001's "input" table.
#
# `F.cross_entropy` wants the classes on axis 1, so flatten: `(B, T-1, V) -> (B*(T-1), V)`
# and `(B, T-1) -> (B*(T-1),)`. With padded batches, targets equal to the padding id must not
# count: `F.cross_entropy(..., ignore_index=...)` leaves them out of the mean.
#
# ### Exercise 1: `next_token_loss`

# %% [solution] next_token_loss
def next_token_loss(logits, tokens, ignore_id=None):
    """Mean cross-entropy of predicting tokens[:, t + 1] from logits[:, t].

    logits: (B, T, V), the model's output for `tokens`; tokens: (B, T) LongTensor.
    Returns a 0-d tensor: the mean over the B * (T - 1) predictions whose target is not
    `ignore_id` (None: keep them all). Pass raw logits to F.cross_entropy (no softmax).
    """
    ### BEGIN SOLUTION
    B, T, V = logits.shape
    pred = logits[:, :-1].reshape(-1, V)  # (B*(T-1), V): positions 0..T-2 predict ...
    target = tokens[:, 1:].reshape(-1)  # (B*(T-1),): ... tokens 1..T-1
    return F.cross_entropy(pred, target, ignore_index=-100 if ignore_id is None else ignore_id)
    ### END SOLUTION

# %% [tests] next_token_loss

# %% [markdown]
# ## 3. Causal self-attention that can continue: the key/value cache
#
# The model's only attention is masked self-attention: multi-head attention (notebook 03) in
# which query $i$ may read keys $j \le i$. Before you write it, look ahead to generation,
# because it changes how we want this layer to work.
#
# Generating means: run the model, take the last position's prediction, append it, run the
# model again on the longer sequence, and so on. Run naively, step $n$ recomputes the keys and
# values of all $n$ earlier tokens, although **none of them changed**: with a causal mask, a
# token's keys and values depend only on the tokens before it. So keep them. Each layer
# returns its keys and values, `(B, H, T, D_h)` after splitting into heads; on the next call it
# receives them back as `past_kv`, computes queries, keys and values for the **new** tokens
# only, and attends from the new queries to the old keys followed by the new ones:
#
# $$K = \operatorname{concat}(K_\text{past}, K_\text{new}), \qquad V = \operatorname{concat}(V_\text{past}, V_\text{new}) \quad \text{along the time axis.}$$
#
# The mask then has shape `(T_new, P + T_new)`, where $P$ is the number of cached tokens: new
# query $i$ sits at position $P + i$ and may read keys $0 \dots P + i$. That is `tril` shifted
# right by $P$, `torch.ones(T, P + T).tril(diagonal=P)`. A plain `tril` over that rectangle lets
# the first new token see only key 0: a wrong answer, not an error.

# %%
P, T_new = 4, 3
offset_mask = torch.ones(T_new, P + T_new, dtype=torch.bool).tril(diagonal=P)
plain_tril = torch.ones(T_new, P + T_new, dtype=torch.bool).tril()
keys = [f"cached {j}" for j in range(P)] + [f"new {j}" for j in range(P, P + T_new)]
queries = [f"new {i}" for i in range(P, P + T_new)]
fig, axes = plt.subplots(1, 2, figsize=(10, 2.8))
for ax, m, title in ((axes[0], offset_mask, "tril(diagonal=P): right"),
                     (axes[1], plain_tril, "plain tril: new tokens blind to the cache")):
    ax.imshow(m.float(), cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(P + T_new), keys, rotation=60)
    ax.set_yticks(range(T_new), queries)
    ax.set_title(title)
fig.tight_layout()

# %% [markdown]
# ### Exercise 2: `CausalSelfAttention`
#
# `CausalSelfAttention(d_model, n_heads, dropout=0.0)` keeps four projections
# `w_q, w_k, w_v, w_o` (each `nn.Linear(d_model, d_model)`, with bias) and a dropout on the
# attention weights. `forward(x, past_kv=None)`:
#
# - `x`: `(B, T, d_model)`, the new tokens; `past_kv`: `None` or a pair `(k_past, v_past)`,
#   each `(B, H, P, D_h)`, from an earlier call;
# - returns `(out, (k, v))`: `out` `(B, T, d_model)`, and the keys and values of **all** tokens
#   so far, `(B, H, P + T, D_h)`, old ones first;
# - query $i$ may attend to keys $j \le P + i$.
#
# Keep the weights in `self.attn_weights` `(B, H, T, P + T)` for plotting (not tested). The
# course's `scaled_dot_product_attention(q, k, v, mask)` takes a boolean mask (True = may
# attend) that broadcasts over `(B, H, T, P + T)`.

# %% [solution] CausalSelfAttention
class CausalSelfAttention(nn.Module):
    """Masked multi-head self-attention that can continue from cached keys and values.

    forward(x (B, T, d_model), past_kv=None or (k, v) each (B, H, P, D_h))
      -> (out (B, T, d_model), (k, v) each (B, H, P + T, D_h))
    """

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        assert d_model % n_heads == 0, f"d_model={d_model} not divisible by n_heads={n_heads}"
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.attn_weights = None
        ### END SOLUTION

    def forward(self, x, past_kv=None):
        ### BEGIN SOLUTION
        B, T, D = x.shape
        q = split_heads(self.w_q(x), self.n_heads)  # (B, H, T, D_h)
        k = split_heads(self.w_k(x), self.n_heads)  # (B, H, T, D_h)
        v = split_heads(self.w_v(x), self.n_heads)  # (B, H, T, D_h)
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)  # (B, H, P + T, D_h): old keys first
            v = torch.cat([past_kv[1], v], dim=2)
        P = k.size(2) - T  # number of cached tokens
        mask = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(diagonal=P)
        _, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, P + T)
        self.attn_weights = weights.detach()
        out = self.dropout(weights) @ v  # (B, H, T, D_h)
        return self.w_o(combine_heads(out)), (k, v)
        ### END SOLUTION

# %% [tests] CausalSelfAttention

# %% [markdown]
# ## 4. The model: embeddings, positions, a causal stack, logits
#
# `DecoderOnlyLM` keeps GPT-2's block layout, pre-norm sub-layers and a final LayerNorm
# (Radford et al., 2019, "Language Models are Unsupervised Multitask Learners", section 2.3:
# "Layer normalization was moved to the input of each sub-block ... and an additional layer
# normalization was added after the final self-attention block"), but otherwise stays with the
# parts of notebooks 05-07. Where GPT-2 differs: it *learns* its position embeddings (`wpe`)
# instead of using sinusoids, does not multiply the token embeddings by $\sqrt{d_\text{model}}$,
# uses GELU in the feed-forward network, and its output layer has no bias and shares its weight
# with the token embedding. Ours:
#
# $$h_0 = \sqrt{d_\text{model}}\; E[x_t] + PE_{\text{offset} + t}, \qquad
# h \leftarrow h + \operatorname{Attn}(\operatorname{LN}_1(h)), \quad
# h \leftarrow h + \operatorname{FF}(\operatorname{LN}_2(h)) \;\; (\times n_\text{layers}), \qquad
# \text{logits} = W \operatorname{LN}(h) + b.$$
#
# The blocks are **pre-norm** (notebook 06): the normalisation comes before each sub-layer and
# the residual path stays clean, with one final LayerNorm before the output layer, `lm_head`.
#
# **The position offset.** With a cache, a call may receive only the newest token. It is not
# at position 0: it is at position $P$, the number of cached tokens. Its positional encoding is
# therefore `pe[P : P + T]`. `PositionalEncoding.forward` always adds `pe[:T]`, so calling it
# in a cached step gives every new token the encoding of position 0. Nothing crashes: the
# model just sees a different sentence. That is *the* classic KV-cache bug; section 8 shows
# what it does to generation.
#
# ### Exercise 3: `DecoderOnlyLM`
#
# `DecoderOnlyLM(vocab_size, d_model, n_heads, n_layers, d_ff, max_len=512, dropout=0.0)` keeps:
#
# - `tok_embed`: `nn.Embedding(vocab_size, d_model)`, multiplied by $\sqrt{d_\text{model}}$;
# - positions: the sinusoidal table of notebook 05, e.g. `self.pos_encoding =
#   PositionalEncoding(d_model, max_len)` and its buffer `pe`, added after the scaling, then a
#   dropout;
# - `layers`: an `nn.ModuleList` of `n_layers` blocks, each with `norm1` (LayerNorm),
#   `self_attn` (your `CausalSelfAttention`), `norm2` (LayerNorm) and `ff` (`FeedForward`, with
#   `linear1`, `linear2`, ReLU), computing `x = x + attn(norm1(x)); x = x + ff(norm2(x))`, with
#   dropout on each sub-layer's output;
# - `norm`: the final LayerNorm; `lm_head`: `nn.Linear(d_model, vocab_size)`.
#
# `forward(tokens, past_kv=None, use_cache=False)`: `tokens` `(B, T)`; `past_kv` is `None` or
# the cache returned by an earlier call, a list with one `(k, v)` pair per layer, so that
# `past_kv[0][0].size(2)` is the number of cached tokens (the offset). It returns the logits
# `(B, T, vocab_size)` (raw scores, no softmax), or `(logits, cache)` when `use_cache=True`,
# where `cache` is the list of the `(k, v)` pairs the layers returned. The tests read the
# weights through these names; they never require a sub-module to be of a particular class.
# The cell below has two skeletons: write the `Block` first (its forward returns the new `x`
# and its attention's `(k, v)`), then the model that stacks it.

# %% [solution] DecoderOnlyLM
class Block(nn.Module):
    """Pre-norm decoder-only block: x + attn(norm1(x)), then x + ff(norm2(x))."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        ### END SOLUTION

    def forward(self, x, past_kv=None):
        """x (B, T, D), past_kv None or (k, v) -> (x (B, T, D), (k, v) for the cache)."""
        ### BEGIN SOLUTION
        a, present = self.self_attn(self.norm1(x), past_kv)
        x = x + self.dropout1(a)
        x = x + self.dropout2(self.ff(self.norm2(x)))
        return x, present
        ### END SOLUTION


class DecoderOnlyLM(nn.Module):
    """GPT-style language model: tokens (B, T) -> logits (B, T, vocab_size).

    forward(tokens, past_kv=None, use_cache=False) returns the logits, or (logits, cache) with
    use_cache=True; cache = [(k, v) per layer], each (B, H, P + T, D_h).
    """

    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.vocab_size, self.d_model, self.max_len = vocab_size, d_model, max_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok_embed.weight, std=d_model ** -0.5)  # unit size after scaling
        self.pos_encoding = PositionalEncoding(d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)
        ### END SOLUTION

    def forward(self, tokens, past_kv=None, use_cache=False):
        ### BEGIN SOLUTION
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)  # tokens already cached
        assert offset + T <= self.max_len, f"{offset + T} positions > max_len={self.max_len}"
        x = self.tok_embed(tokens) * math.sqrt(self.d_model)  # (B, T, D)
        x = self.dropout(x + self.pos_encoding.pe[offset:offset + T])  # positions offset.., not 0..
        cache = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, None if past_kv is None else past_kv[i])
            cache.append(present)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        return (logits, cache) if use_cache else logits
        ### END SOLUTION

# %% [tests] DecoderOnlyLM

# %% [markdown]
# **Causality, seen.** Change one token and look at how much every position's logits move.
# Positions before the change cannot move at all; the change and everything after it may.

# %%
LM = pick("DecoderOnlyLM", lambda: DecoderOnlyLM, lambda: R.DecoderOnlyLM,  # the class the demos use
          check=lambda cls: cls(5, 8, 2, 1, 16)(torch.zeros(1, 3, dtype=torch.long), use_cache=True))
torch.manual_seed(0)
demo = LM(11, 32, 4, 2, 64).eval()
x_demo = torch.randint(0, 11, (1, 10))
x_changed = x_demo.clone()
x_changed[0, 6] = (x_changed[0, 6] + 1) % 11
with torch.no_grad():
    moved = (demo(x_demo) - demo(x_changed)).abs().amax(-1)[0]  # (T,): largest change per position
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.bar(range(10), moved.tolist(), color=["tab:blue"] * 6 + ["tab:red"] * 4)
ax.set(xlabel="position", ylabel="max |change in logits|", xticks=range(10),
       title="token 6 changed: positions 0-5 do not move")
ax.grid(alpha=0.3)
fig.tight_layout()
print("largest change before position 6:", moved[:6].max().item())

# %% [markdown]
# ## 5. Seed 001 in plain PyTorch
#
# Seed 001 uses Lightning and a model with `d_model = 2`. Here is the same experiment as a plain
# training loop: zero the gradients, run the model, compute the loss, backpropagate, step.
# Both training sequences go in as one batch of shape `(2, 6)`. We stop as soon as **both**
# prompts, `what is statquest <EOS>` and `statquest is what <EOS>`, are answered
# `awesome <EOS>` by greedy decoding (checked every 5 steps), then train on to 60 steps so the
# answer is confident. Greedy decoding is the simplest generation loop: append the argmax of
# the last position and repeat (exercise 4 makes it general).

# %%
def greedy_answer(model, prompt_ids, n=2):
    """Append the most likely next token n times; return the new tokens as words."""
    seq = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(n):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return [vocab[i] for i in seq[0, len(prompt_ids):].tolist()]


def train(model, loss_fn, batch, steps, lr, check=None):
    """Plain PyTorch training on one batch. Returns the loss curve and the first step after
    which `check(model)` held (None if it never did)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, first_ok = [], None
    for step in range(steps):
        model.train()
        loss = loss_fn(model(batch), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if check is not None and first_ok is None and step % 5 == 4 and check(model.eval()):
            first_ok = step + 1
    model.eval()
    return losses, first_ok


prompts = [seed_tokens[0, :4].tolist(), seed_tokens[1, :4].tolist()]
answers_ok = lambda m: all(greedy_answer(m, p) == ["awesome", "<EOS>"] for p in prompts)
lm_loss = pick("next_token_loss", lambda: next_token_loss, lambda: R.next_token_loss,
               check=lambda f: f(torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long)))
torch.manual_seed(1)
seed_model = LM(len(vocab), 16, 2, 1, 32, max_len=16)
shift_losses, first_ok = train(seed_model, lm_loss, seed_tokens, steps=60, lr=0.01,
                               check=answers_ok)
for p in prompts:
    print(" ".join(vocab[i] for i in p), "->", " ".join(greedy_answer(seed_model, p)))
print(f"both prompts first answered 'awesome <EOS>' after {first_ok} steps; "
      f"loss after 60 steps: {shift_losses[-1]:.4f}")

# %% [markdown]
# **What the model attends to.** The trained model's attention, for the first sentence: each
# row is a query position, each column a key it may read (the upper triangle is masked).

# %%
with torch.no_grad():
    seed_model(seed_tokens[:1])
w = torch.stack([blk.self_attn.attn_weights[0] for blk in seed_model.layers])  # (layers, H, T, T)
fig = plots.heatmap_grid(w, words0, words0, row_titles=[f"layer {i}" for i in range(len(w))],
                         col_titles=[f"head {h}" for h in range(w.shape[1])],
                         title="seed 001 model: causal self-attention")

# %% [markdown]
# ## 6. Without the shift, the model learns to copy
#
# Forget the shift and compare `logits` with `tokens` at the same positions. The causal mask
# lets position $t$ read token $t$ itself, so the task becomes "repeat the current token": the
# loss falls just as fast, and the model has learnt nothing about what comes **next**. A falling
# training loss alone proves nothing; look at what the model generates.

# %%
def unshifted_loss(logits, tokens):  # the mistake: label t = token t
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens.reshape(-1))


torch.manual_seed(1)
copy_model = LM(len(vocab), 16, 2, 1, 32, max_len=16)
copy_losses, _ = train(copy_model, unshifted_loss, seed_tokens, steps=60, lr=0.01)
fig = plots.curves(range(1, 61), {"shifted labels (next token)": shift_losses,
                                 "no shift (same token)": copy_losses},
                   xlabel="step", ylabel="training loss", logy=True,
                   title="both losses fall; only one model learns to answer")
for p in prompts:
    print(" ".join(vocab[i] for i in p), "-> copy model says:", " ".join(greedy_answer(copy_model, p, 3)))

# %% [markdown]
# The predicted next-token distributions make it plain: the shifted model predicts the next
# word of the table; the copy model predicts the word it is reading.

# %%
with torch.no_grad():
    p_shift = seed_model(seed_tokens[:1])[0, :-1].softmax(-1)  # (5, V)
    p_copy = copy_model(seed_tokens[:1])[0, :-1].softmax(-1)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for ax, p, title in ((axes[0], p_shift, "shifted: predicts the next word"),
                     (axes[1], p_copy, "no shift: repeats the current word")):
    ax.imshow(p, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(vocab)), vocab, rotation=45)
    ax.set_yticks(range(5), [f"after '{w}'" for w in words0[:-1]])
    ax.set_xlabel("predicted next token")
    ax.set_title(title)
fig.tight_layout()

# %% [markdown]
# ## 7. Generation: greedy, temperature, top-k, and the end of the sequence
#
# `generate` runs the model again and again, each time appending one token chosen from the
# **last** position's logits $z$ (a `(B, V)` slice):
#
# - **greedy**: $\arg\max_v z_v$;
# - **temperature** $\tau$: sample from $\operatorname{softmax}(z / \tau)$; $\tau < 1$ sharpens
#   the distribution, $\tau > 1$ flattens it, and $\tau \to 0$ is greedy (so `temperature=0`
#   means greedy; never divide by 0);
# - **top-k**: keep the $k$ largest logits, set the others to $-\infty$, then sample; `top_k=1`
#   is greedy whatever the temperature;
# - **end of sequence**: a row is finished once it has *generated* `eos_id`. Its later positions
#   are filled with `eos_id`; the loop stops when every row is finished (or after
#   `max_new_tokens`). Seed 001's prompts end with `<EOS>` themselves: tokens of the prompt
#   never count;
# - **the cache**: with `use_cache=True`, the first call runs the whole prompt with
#   `use_cache=True` and keeps the returned cache; each later call feeds only the newest token,
#   shape `(B, 1)`, with `past_kv=cache`. With `use_cache=False` every step runs
#   `model(seq)` on the whole sequence so far.
#
# Generation never trains: run the model under `torch.no_grad()`, or every step keeps its
# autograd graph in memory.
#
# ### Exercise 4: `generate`
#
# `generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
# use_cache=True, generator=None)`: `prompt` is a `(B, T0)` LongTensor; returns a new
# `(B, T0 + n)` LongTensor, the prompt followed by the `n <= max_new_tokens` generated tokens.
# Draw samples with `torch.multinomial(probs, 1, generator=generator)`, so that a seeded
# `torch.Generator` makes runs reproducible. Do not modify `prompt` in place; leave the model's
# train/eval mode alone (the tests put it in eval mode).

# %% [solution] generate
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    """Autoregressive generation: prompt (B, T0) -> (B, T0 + n), n <= max_new_tokens.

    temperature=0 or top_k=1: greedy. Otherwise sample from softmax(logits / temperature),
    restricted to the top_k largest logits when top_k is given. A row that has generated eos_id
    is filled with eos_id; stop when every row has. use_cache: feed the prompt once, then one
    token per step with past_kv.
    """
    ### BEGIN SOLUTION
    with torch.no_grad():
        seq = prompt
        finished = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
        cache = None
        for _ in range(max_new_tokens):
            if use_cache:
                step_in = seq if cache is None else seq[:, -1:]  # the prompt once, then 1 token
                logits, cache = model(step_in, past_kv=cache, use_cache=True)
            else:
                logits = model(seq)  # everything recomputed from scratch
            z = logits[:, -1, :]  # (B, V): the prediction for the next position
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(dim=-1)
            else:
                z = z / temperature
                if top_k is not None:
                    kth = torch.topk(z, min(top_k, z.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
                    z = z.masked_fill(z < kth, float("-inf"))
                probs = torch.softmax(z, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
            if eos_id is not None:
                nxt = nxt.masked_fill(finished, eos_id)  # finished rows only repeat eos_id
                finished |= nxt == eos_id
            seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)  # (B, T + 1)
            if eos_id is not None and bool(finished.all()):
                break
    return seq
    ### END SOLUTION

# %% [tests] generate

# %% [markdown]
# Seed 001's prompts, answered by `generate` with the cache, stopping at `<EOS>`. The rows are
# batched: the two prompts have the same length, and each row stops on its own.

# %%
generate_fn = pick("generate", lambda: generate, lambda: R.generate,
                   check=lambda g: g(seed_model, seed_tokens[:1, :4], 1, temperature=0))
out = generate_fn(seed_model, seed_tokens[:, :4], max_new_tokens=5, temperature=0, eos_id=EOS)
for row in out.tolist():
    print(" ".join(vocab[i] for i in row[:4]), "->", " ".join(vocab[i] for i in row[4:]))

# %% [markdown]
# ## 8. A slightly larger corpus: sampling with temperature and top-k
#
# Two questions with one answer leave nothing to sample. We generate a corpus in code with real
# uncertainty: animal names, each drawn with a fixed frequency, written character by character
# and separated by `.`, as in `cat.dog.horse.cow.`. Because we wrote the generator, we know the
# **true** next-character distribution after any prefix (after `.d`: `o` for dog, `u` for duck,
# `e` for deer, in proportion to their counts) and can compare the model with it.

# %%
LEXICON = {"cat": 8, "cow": 6, "dog": 8, "duck": 4, "deer": 3, "horse": 5, "hen": 4, "goat": 4,
           "goose": 3, "pig": 6, "owl": 3, "ox": 2, "bee": 4, "bear": 3, "fox": 4, "frog": 3}
rng = random.Random(0)
corpus = "." + ".".join(rng.choices(list(LEXICON), weights=list(LEXICON.values()), k=3000)) + "."
chars = sorted(set(corpus))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in corpus])
encode = lambda s: [stoi[c] for c in s]
decode = lambda ids: "".join(chars[i] for i in ids)
print(f"{len(corpus)} characters, vocabulary of {len(chars)}: {''.join(chars)}")
print(corpus[:70], "...")


def true_next(prefix):
    """The generator's own next-character distribution after '.' + prefix."""
    p = torch.zeros(len(chars))
    for word, n in LEXICON.items():
        if word.startswith(prefix):
            p[stoi[word[len(prefix)]] if len(word) > len(prefix) else stoi["."]] += n
    return p / p.sum()

# %% [markdown]
# Training samples random windows of 48 characters (the model never sees positions beyond
# 47, so we also generate within that length) and uses your `next_token_loss`. The last 10% of
# the corpus is held out: every 10 steps the loss on 64 fixed windows from it, in eval mode, is
# the **validation loss**. We also plot the **perplexity** $e^{\text{loss}}$: the number of
# equally likely characters the model is, on average, choosing between. A few hundred steps of a
# two-layer model are enough (a few seconds, with a progress bar; fewer steps and no bar while
# autograding).

# %%
def window_batch(gen, B=32, T=48, source=None):
    source = data if source is None else source
    starts = torch.randint(0, len(source) - T, (B,), generator=gen)
    return torch.stack([source[s:s + T] for s in starts.tolist()])  # (B, T)


split = int(0.9 * len(data))
train_data, val_data = data[:split], data[split:]  # the last 10% is held out
val_batch = window_batch(torch.Generator().manual_seed(1), B=64, source=val_data)
torch.manual_seed(0)
char_model = LM(len(chars), 48, 4, 2, 96, max_len=64)
opt = torch.optim.AdamW(char_model.parameters(), lr=1e-2)
gen = torch.Generator().manual_seed(0)
n_steps = 30 if QUICK else 150
char_losses, val_steps, val_losses = [], [], []
bar = tqdm(range(n_steps), desc="training", unit="step", disable=QUICK, mininterval=0.5)
for step in bar:
    batch = window_batch(gen, source=train_data)
    loss = lm_loss(char_model(batch), batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
    char_losses.append(loss.item())
    if (step + 1) % 10 == 0 or step + 1 == n_steps:
        char_model.eval()  # validation: no dropout, no gradients
        with torch.no_grad():
            val_losses.append(lm_loss(char_model(val_batch), val_batch).item())
        char_model.train()
        val_steps.append(step + 1)
        bar.set_postfix(train=f"{char_losses[-1]:.3f}", val=f"{val_losses[-1]:.3f}")
bar.close()
char_model.eval()
word_entropy = -sum(n / sum(LEXICON.values()) * math.log(n / sum(LEXICON.values()))
                    for n in LEXICON.values())
chars_per_word = sum(n * (len(w) + 1) for w, n in LEXICON.items()) / sum(LEXICON.values())
floor = word_entropy / chars_per_word  # nats per character
train_steps = range(1, n_steps + 1)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for ax, f, unit in ((axes[0], lambda l: l, "nats per character"),
                    (axes[1], math.exp, "perplexity (e^loss)")):
    ax.plot(train_steps, [f(l) for l in char_losses], lw=0.8, label="training (each batch)")
    ax.plot(val_steps, [f(l) for l in val_losses], "o-", ms=3, label="validation (held-out 10%)")
    ax.axhline(f(floor), color="gray", ls="--", label="entropy of the corpus")
    ax.set(xlabel="step", ylabel=unit, yscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
axes[0].set_title("the character model: loss")
axes[1].set_title("the character model: perplexity")
fig.tight_layout()
print(f"after {n_steps} steps: training loss {char_losses[-1]:.3f}, validation loss "
      f"{val_losses[-1]:.3f} (perplexity {math.exp(val_losses[-1]):.2f}); the corpus' floor "
      f"{floor:.3f} (perplexity {math.exp(floor):.2f})")

# %% [markdown]
# The dashed line is the corpus' own entropy per character: no model can do better on
# average, because which animal comes next is pure chance (a perplexity of about 1.8: on
# average the next character is as uncertain as a choice between 1.8 equally likely ones). The
# validation curve stays within a few hundredths of the training curve: the held-out tenth
# holds the same words in the same proportions, so there is nothing to overfit. On real text the
# two part ways when the model starts memorising its training set, and the validation loss is
# the one to watch. Now the next-character
# distribution after three prefixes, the model's against the truth, at three temperatures.

# %%
def next_probs(model, context, temperature=1.0, top_k=None):
    """The model's sampling distribution for the character after `context`."""
    with torch.no_grad():
        z = model(torch.tensor([encode(context)]))[0, -1]
    if temperature == 0:
        return F.one_hot(z.argmax(), z.numel()).float()
    z = z / temperature
    if top_k:
        z = z.masked_fill(z < z.topk(top_k).values[-1], float("-inf"))
    return z.softmax(-1)


contexts = ["pig.", "pig.d", "pig.go"]
fig, axes = plt.subplots(len(contexts), 1, figsize=(10, 7), sharex=True)
width = 0.2
for ax, ctx in zip(axes, contexts):
    ax.bar(torch.arange(len(chars)) - 1.5 * width, true_next(ctx.split(".")[-1]), width, color="black",
           label="true")
    for j, temp in enumerate((0.5, 1.0, 2.0)):
        ax.bar(torch.arange(len(chars)) + (j - 0.5) * width, next_probs(char_model, ctx, temp),
               width, label=f"model, T={temp}")
    ax.set_ylabel(f"after '{ctx}'")
    ax.grid(alpha=0.3)
axes[0].legend(ncol=4, fontsize=8)
axes[-1].set_xticks(range(len(chars)), chars)
axes[-1].set_xlabel("next character")
fig.suptitle("next-character distributions: T < 1 sharpens, T > 1 flattens")
fig.tight_layout()

# %% [markdown]
# ### Explore: temperature and top-k
#
# Pick a context and move `temperature` and `top_k` (0 = no top-k). Black bars are the true
# distribution; blue bars are what `generate` would sample from. Low temperatures pile
# everything onto the favourite; high temperatures give the impossible characters real
# probability; top-k cuts them off whatever the temperature.

# %%
def draw_next(context="pig.d", temperature=1.0, top_k=0):
    p = next_probs(char_model, context, temperature, top_k or None)
    fig, ax = plt.subplots(figsize=(8, 3))
    x = torch.arange(len(chars))
    ax.bar(x - 0.2, true_next(context.split(".")[-1]), 0.4, color="black", label="true")
    ax.bar(x + 0.2, p, 0.4, color="tab:blue", label="model, as sampled")
    ax.set_xticks(range(len(chars)), chars)
    ax.set(ylim=(0, 1), xlabel="next character", ylabel="probability",
           title=f"after '{context}', T={temperature:.2f}, top_k={top_k or 'none'}")
    ax.legend()
    fig.tight_layout()
    return fig


explorer = explore(draw_next, context=["pig.d", "pig.", "pig.go", "pig.h", "pig.b", "cat.f"],
                   temperature=(0.0, 3.0, 0.05, 1.0), top_k=(0, len(chars), 1, 0))

# %% [markdown]
# **Samples, and what temperature does to them.** Sixteen rows of 40 characters each, from the
# prompt `.`, at several temperatures, with and without top-k. We count how many generated
# words are real animals (validity) and how many different words appear (diversity).

# %%
def sample_words(temperature, top_k=None, rows=16, n=40):
    prompt = torch.tensor([encode(".")] * rows)
    out = generate_fn(char_model, prompt, n, temperature=temperature, top_k=top_k,
                   generator=torch.Generator().manual_seed(1))
    return [w for row in out.tolist() for w in decode(row).split(".")[1:-1]]


temps = [0.3, 0.7, 1.0, 1.5, 2.0, 3.0]
samples = {(t, k): sample_words(t, k) for k in (None, 3) for t in temps}
stats = {k: ([100 * sum(w in LEXICON for w in samples[t, k]) / max(1, len(samples[t, k]))
              for t in temps], [len(set(samples[t, k])) for t in temps]) for k in (None, 3)}
for t in (0.3, 1.0, 3.0):
    print(f"T={t}: " + " ".join(samples[t, None][:12]))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for k, (valid, distinct) in stats.items():
    axes[0].plot(temps, valid, "o-", label=f"top_k={k}")
    axes[1].plot(temps, distinct, "o-", label=f"top_k={k}")
axes[0].set(xlabel="temperature", ylabel="% real animal names", title="quality falls with T")
axes[1].axhline(len(LEXICON), color="black", ls="--", lw=1, label="animals in the corpus")
axes[1].set(xlabel="temperature", ylabel="different words", title="diversity rises with T")
for ax in axes:
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# Low temperature: a handful of favourite animals, over and over. Around $T = 1$: the
# corpus' own variety, still all real words. High temperature: many invented "animals". Top-k
# keeps the invented ones rare at high temperature because it never lets an implausible
# character be drawn: the quality/diversity dial of every chatbot.
#
# ## 9. The KV cache: the position offset, agreement, speed
#
# **The classic bug.** Here is the model's forward pass written out once more, for a cached
# step, but with the positions restarting at 0 in every call, as `PositionalEncoding.forward`
# would do (`pe[:T]` instead of `pe[P : P + T]`). It uses the same weights and the same
# cache.

# %%
@torch.no_grad()
def forward_forgetting_offset(model, tokens, past_kv):
    """A cached step with the classic bug: the new tokens get positions 0.. instead of P.."""
    B, T = tokens.shape
    D = model.tok_embed.embedding_dim
    x = model.tok_embed(tokens) * math.sqrt(D) + sinusoidal_positional_encoding(T, D)  # BUG
    cache = []
    for layer, past in zip(model.layers, past_kv):
        a, kv = layer.self_attn(layer.norm1(x), past)
        x = x + a
        x = x + layer.ff(layer.norm2(x))
        cache.append(kv)
    return model.lm_head(model.norm(x)), cache


@torch.no_grad()
def cached_greedy(model, prompt, n, step_fn):
    """Greedy decoding with a cache; also returns, per step, how far the cached logits are
    from a full uncached pass over the same sequence."""
    logits, cache = model(prompt, use_cache=True)
    seq, errors = prompt, []
    for _ in range(n):
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        logits, cache = step_fn(seq[:, -1:], cache)
        errors.append((logits[:, -1] - model(seq)[:, -1]).abs().max().item())
    return seq, errors


words_of = lambda ids: " ".join(vocab[i] for i in ids)
start = torch.tensor([[token_to_id["what"]]])  # seed 001's model, prompt "what" only
right, _ = cached_greedy(seed_model, start, 5, lambda t, c: seed_model(t, past_kv=c, use_cache=True))
wrong, _ = cached_greedy(seed_model, start, 5, lambda t, c: forward_forgetting_offset(seed_model, t, c))
print("seed 001 model, with the offset:  ", words_of(right[0].tolist()))
print("seed 001 model, offset forgotten: ", words_of(wrong[0].tolist()))
start = torch.tensor([encode(".goat.co")])  # the character model
_, err_right = cached_greedy(char_model, start, 30,
                             lambda t, c: char_model(t, past_kv=c, use_cache=True))
_, err_wrong = cached_greedy(char_model, start, 30,
                             lambda t, c: forward_forgetting_offset(char_model, t, c))
fig = plots.curves(range(1, 31), {"positions offset by the cache": [max(e, 1e-8) for e in err_right],
                                  "offset forgotten (pe[:T])": err_wrong},
                   xlabel="generated character", ylabel="max |cached - full| logit", logy=True,
                   title="character model: a cached step must equal a full pass")

# %% [markdown]
# Seed 001's model, asked to continue from `what` alone, relies on positions to tell its two
# sentences apart: with the offset forgotten, the cached `is` is encoded as if it were the first
# word again, and the model loses its place (here it says `is` twice; another initialisation may
# stumble elsewhere, or by luck not at all on so short a text). On the character model the
# damage is measured directly: with the offset, a cached step equals a full pass to float
# precision (about $10^{-6}$); without it, the logits are off by whole units from the first
# cached step on. Nothing ever raised an error: the test of exercise 3 compares cached and full
# passes for exactly this reason.
#
# **Cached equals uncached.** Your `generate` must give the same greedy tokens both ways:

# %%
prompt = torch.tensor([encode(".cat.")] * 4)
a = generate_fn(char_model, prompt, 40, temperature=0, use_cache=True)
b = generate_fn(char_model, prompt, 40, temperature=0, use_cache=False)
print("cached == uncached:", torch.equal(a, b), "|", decode(a[0].tolist()))

# %% [markdown]
# **What the cache saves.** Without a cache, step $n$ runs the model on all $T_0 + n$ tokens,
# so generating $N$ tokens costs about $N^2/2$ token-passes; with the cache, each step runs one
# token through the model (its attention still reads the $n$ cached keys, which is cheap). The
# speed-up therefore grows with the number of generated tokens. Measured on a larger random
# model (2 layers, `d_model` 128), batch of 2, prompt of 16 tokens; `tools/bench_kvcache.py`
# measures a 4-layer one:

# %%
torch.manual_seed(0)
bench_model = LM(64, 128, 4, 2, 512, max_len=256).eval()
bench_prompt = torch.randint(0, 64, (2, 16))
lengths = [8, 16, 32] if QUICK else [8, 16, 32, 64, 128]
timings = {True: [], False: []}
for n in lengths:
    for cached in (True, False):
        t0 = time.process_time()  # CPU time of this process: steady even on a busy machine
        out = generate_fn(bench_model, bench_prompt, n, temperature=0, use_cache=cached)
        timings[cached].append(time.process_time() - t0)
speedup = [u / c for u, c in zip(timings[False], timings[True])]
for n, c, u, s in zip(lengths, timings[True], timings[False], speedup):
    print(f"{n:4d} new tokens: cached {c:6.3f} s, uncached {u:6.3f} s, speed-up {s:5.1f}x")
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
axes[0].plot(lengths, timings[True], "o-", label="with KV cache")
axes[0].plot(lengths, timings[False], "o-", label="without (recompute everything)")
axes[0].set(xscale="log", yscale="log", xlabel="generated tokens", ylabel="CPU seconds",
            title="generation time")
axes[1].plot(lengths, speedup, "o-", color="tab:green")
axes[1].set(xscale="log", xlabel="generated tokens", ylabel="uncached / cached",
            title="KV-cache speed-up grows with length")
for ax in axes:
    ax.grid(alpha=0.3)
axes[0].legend()
fig.tight_layout()

# %% [markdown]
# The cache is not free: every layer keeps a key and a value vector of size $d_\text{model}$ for
# every token of every sequence, so it holds
#
# $$\text{KV-cache bytes} = B \times T \times n_\text{layers} \times 2 \times d_\text{model} \times \text{bytes per number},$$
#
# growing linearly with the batch and the context. For a 32-layer model with
# $d_\text{model} = 4096$ in 16-bit floats that is 0.5 MiB per token: 2 GiB for one sequence of
# 4096 tokens, on top of the weights. (Models with grouped-query attention store fewer key/value
# heads and divide this by the group size; notebook 09 measures it.)

# %%
def kv_cache_bytes(batch, context, n_layers, d_model, bytes_per_number):
    return batch * context * n_layers * 2 * d_model * bytes_per_number

print(f"this notebook's char model, one sequence of 64 characters (float32): "
      f"{kv_cache_bytes(1, 64, len(char_model.layers), char_model.tok_embed.embedding_dim, 4) / 2**10:.0f} KiB")
print(f"32 layers, d_model 4096, fp16, 1 x 4096 tokens: {kv_cache_bytes(1, 4096, 32, 4096, 2) / 2**30:.1f} GiB")
print(f"the same, batch of 16:                          {kv_cache_bytes(16, 4096, 32, 4096, 2) / 2**30:.1f} GiB")
_, cache = char_model(torch.tensor([encode(".cat.dog.")]), use_cache=True)
measured = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in cache)
print(f"measured on the char model's cache after 9 tokens: {measured} bytes, formula: "
      f"{kv_cache_bytes(1, 9, len(char_model.layers), char_model.tok_embed.embedding_dim, 4)} bytes")

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** Why does one forward pass over a sequence of length $T$ give $T - 1$
# next-token training examples at once?

# %% [answer] q_next_token 1
# ### BEGIN SOLUTION
# With the causal mask the output at position $t$ depends only on tokens $0..t$. So position
# $t$'s logits are a genuine prediction of token $t + 1$ from its true prefix (teacher forcing),
# and the $T - 1$ positions that have a next token are $T - 1$ independent examples, computed in
# parallel in one pass; the labels are the inputs shifted by one.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** With a KV cache, a generation step feeds only the newest token. What goes
# wrong if it is given the positional encoding of position 0 instead of position $P$ (the number
# of cached tokens), and why does nothing raise an error?

# %% [answer] q_cache_offset 1
# ### BEGIN SOLUTION
# The model then sees the new token as if it were the first token of the sequence: its query and
# the key and value it adds to the cache carry the wrong position, so attention compares
# positions wrongly and the predictions (and all later steps) differ from an uncached pass:
# wrong text. Every shape is still valid (`pe[:1]` has the same shape as `pe[P:P+1]`), so
# nothing crashes; only comparing cached and uncached outputs reveals it.
# ### END SOLUTION

# %% [markdown]
# **Question 3.** Estimate the KV cache of a 24-layer model with $d_\text{model} = 2048$ in
# 16-bit floats, for a batch of 8 sequences of 2048 tokens.

# %% [answer] q_cache_size 1
# ### BEGIN SOLUTION
# batch x context x layers x 2 (K and V) x d_model x bytes $= 8 \times 2048 \times 24 \times 2
# \times 2048 \times 2 = 3\,221\,225\,472$ bytes, i.e. 3 GiB, on top of the weights; it grows
# linearly with the batch size and the context length.
# ### END SOLUTION

# %% [markdown]
# ## 10. Mistakes worth recognising
#
# | mistake | what happens |
# | --- | --- |
# | no shift between logits and labels | the model learns to copy the current token; the loss still falls |
# | shift the wrong way (`logits[:, 1:]` vs `tokens[:, :-1]`) | it learns to predict the previous token |
# | softmax before `F.cross_entropy` | a double softmax: the loss barely moves |
# | padding targets not ignored | the model is trained to predict padding |
# | `pe[:x.size(0)]` on a batch-first tensor (seed 001 is unbatched) | slices by the batch size: a crash, or wrong positions when B = 1 |
# | positions restart at 0 in a cached step | no error, wrong text: the classic KV-cache bug |
# | plain `tril` over the `(T, P + T)` cached mask | new tokens see only the first keys |
# | `F.scaled_dot_product_attention(..., is_causal=True)` with a cache | PyTorch aligns that mask to the top-left: the same bug |
# | cache concatenated new-first, or only the new keys returned | wrong attention, or a cache that never grows |
# | feeding the whole sequence again with `past_kv` | duplicated tokens in the cache (or no speed-up) |
# | `temperature=0` implemented as `logits / 0` | NaN probabilities; `torch.multinomial` raises |
# | stop when *any* row produced `<EOS>` / count `<EOS>` in the prompt | answers cut short, or nothing generated at all |
# | generating with gradients on | every cached key and value keeps its step's autograd graph alive: memory grows with every step |
#
# **Where next.** Everything here scales: a byte-pair tokenizer instead of characters, learned
# positions or rotary embeddings (RoPE, whose rotation is the `pe_shift_matrix` of notebook 05
# applied to queries and keys), more layers, and a much larger corpus. The loop you wrote, one
# token at a time with a cache, is how every chatbot answers.
