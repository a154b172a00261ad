#| default_exp transformer
# %% [markdown]
# # 07 · The Transformer: the whole model, trained and looked inside
#
# Every piece is ready: attention (01), masks (02), multi-head attention (03), layer norm (04),
# positional encoding (05), encoder and decoder stacks (06). Here they become one
# encoder-decoder Transformer that **learns a small translation task on your CPU in well under
# a minute**, and then we open it up and watch its attention do the job.
#
# 1. a synthetic translation task: rewriting dates (`15 mar 2024` → `2024-03-15`);
# 2. embeddings scaled by $\sqrt{d_\text{model}}$, weight initialisation, and the whole model
#    (**exercise 1: `Transformer`**), checked against `nn.Transformer`;
# 3. teacher forcing, and why the decoder must be fed the *shifted target*
#    (**exercise 2: `teacher_forcing_loss`**), and label smoothing
#    (**exercise 3: `label_smoothing_cross_entropy`**), which the training uses;
# 4. training with Adam and the paper's warm-up schedule, with a progress bar and a loss curve;
# 5. greedy decoding (**exercise 4: `greedy_decode`**) and beam search;
# 6. cross-attention and self-attention of the trained model, and an explorer;
# 7. saving and loading a checkpoint.
#
# The building blocks come from `tfscratch.reference` (the course's own versions of what you
# wrote in 02-06), so this notebook works even if an earlier one is unfinished. You may **not**
# use PyTorch's `nn.Transformer`, `nn.TransformerEncoder(Layer)` or `nn.TransformerDecoder(Layer)`
# inside your model: the checks notice. (We *do* use `nn.Transformer` once, to check yours.)
#
# Run every cell from the top. The full training takes about half a minute.

# %% [setup] setup_imports
import math
import os
import tempfile
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from tfscratch import checks, plots
from tfscratch import reference as R
from tfscratch import seq2seq as s2s
from tfscratch.checks.core import copy_mha_to_torch
from tfscratch.fallback import pick
from tfscratch.reference import (Decoder, Encoder, PositionalEncoding, make_causal_mask,
                                 make_decoder_mask, make_padding_mask,
                                 sinusoidal_positional_encoding)
from tfscratch.widgets import explore

torch.manual_seed(0)
%matplotlib inline

chk = checks.notebook("07_transformer")  # the graded checks of this notebook

# %% [markdown]
# ## 1. The task: rewriting dates
#
# A translation task needs pairs of sentences. We generate ours: a date written the way people
# write it, and the same date in ISO 8601.
#
# | source (3 formats)  | target       |
# | ---                 | ---          |
# | `15 mar 2024`       | `2024-03-15` |
# | `mar 15 , 2024`     | `2024-03-15` |
# | `15 / 03 / 2024`    | `2024-03-15` |
#
# Every digit, month word and separator is one token. The task is small but has what makes
# translation hard for a model that reads left to right: the **alignment is not the identity**.
# The year comes last in the source and first in the target; day and month swap places; a month
# *word* becomes two digits (`mar` → `0 3`); a one-digit day gains a leading zero. To write
# each output token, the model must find *where* in the source its information is, which is
# exactly what cross-attention does. (Reversing a sequence would also do, but its alignment is
# one fixed anti-diagonal; here it depends on the format, which is more interesting to look at.)
#
# Three special tokens: `<pad>` (id 0) fills short rows of a batch, `<s>` (BOS, id 1) starts
# every target, `</s>` (EOS, id 2) ends every target **and** every source (an anchor: the year
# is always just before it). The split is by *date*: no held-out date appears in training, in
# any format, so the held-out accuracy measures generalisation, not memory.

# %%
# Autograding skips the long training, and so do the course's browser tests (TFS_QUICK_TRAINING):
# a few steps draw the same figures; `make bench` checks the full run's accuracy.
QUICK = bool(os.environ.get("NBGRADER_EXECUTION") or os.environ.get("TFS_QUICK_TRAINING"))
train_set, test_set = s2s.make_task(n_train=20000, n_test=1000, seed=0)
print(f"{len(train_set)} training and {len(test_set)} held-out pairs; vocabulary of "
      f"{len(s2s.VOCAB)} tokens:\n{s2s.VOCAB}\n")
for src_text, tgt_text in train_set.text[:6]:
    print(f"  {src_text:<24} ->  {tgt_text}")

# %% [markdown]
# A batch is a pair of integer tensors, right-padded with `<pad>`: `src` is `(B, Ls)`, `tgt`
# is `(B, Lt)` and holds `<s> ... </s>`. Masks come straight from the pad id, as in
# notebook 02 (True = may attend): `make_padding_mask(src)` is `(B, 1, Ls)`, one row of
# "real key?" flags per sequence; `make_decoder_mask(tgt)` is `(B, Lt, Lt)`, causal AND not
# padding. (Every ISO date has the same length, so our targets never need padding; sources do.)

# %%
lengths = (train_set.src != s2s.PAD).sum(1)  # source lengths, </s> included
rows = [int((lengths == n).nonzero()[0]) for n in (7, 8, 9, 11)]  # one short, ..., one long
src, tgt = train_set.batch(torch.tensor(rows))
print("src", tuple(src.shape), "\n", src, "\ntgt", tuple(tgt.shape), "\n", tgt)
fig = plots.heatmap(make_padding_mask(src)[:, 0].int(),
                    [train_set.text[i][0] for i in rows], list(range(src.size(1))),
                    xlabel="source position (key)", ylabel="source", cmap="Blues", vmin=0,
                    vmax=1, colorbar=False, figsize=(6.5, 2.6),
                    title="source padding mask: dark = a real token, white = padding")
fig = plots.heatmap(make_decoder_mask(tgt)[0].int(), [s2s.VOCAB[i] for i in tgt[0]],
                    [s2s.VOCAB[i] for i in tgt[0]], xlabel="key (target prefix)",
                    ylabel="query (target position)", cmap="Greys", vmin=0, vmax=1,
                    title="decoder mask of row 0: position i sees 0..i", colorbar=False,
                    figsize=(5, 4.2))

# %% [markdown]
# ## 2. From token ids to vectors: embeddings, $\sqrt{d_\text{model}}$ and initialisation
#
# An `nn.Embedding(V, d_model)` is a table with one learned row per token; `emb(tokens)` looks
# the rows up, `(B, L)` → `(B, L, d_model)`. The Transformer then **multiplies the embeddings
# by $\sqrt{d_\text{model}}$** and adds the positional encoding (section 3.4 of the paper):
#
# $$x_i = \sqrt{d_\text{model}}\; E[\text{token}_i] + PE_i$$
#
# Why the factor? Like `nn.Transformer`, we initialise every weight matrix with Xavier (Glorot)
# uniform values, whose standard deviation is $\sqrt{2 / (\text{fan}_\text{in} + \text{fan}_\text{out})}$:
# small, and smaller the wider the table. The positional encoding, on the other hand, is a fixed
# table of sines and cosines with entries of typical size $1/\sqrt 2 \approx 0.71$ whatever
# $d_\text{model}$ is. Added unscaled, the token identity would start as a faint signal under the
# position. The $\sqrt{d_\text{model}}$ factor brings the two to the same order:

# %%
V = len(s2s.VOCAB)
d_models = [16, 32, 64, 128, 256, 512]
rms = lambda t: t.pow(2).mean().sqrt().item()
raw, scaled, pe_rms = [], [], []
for d in d_models:
    table = nn.init.xavier_uniform_(torch.empty(V, d))
    raw.append(rms(table))
    scaled.append(rms(table) * math.sqrt(d))
    pe_rms.append(rms(sinusoidal_positional_encoding(64, d)))
fig = plots.curves(d_models, {"embedding entries (Xavier)": raw,
                              "embedding x sqrt(d_model)": scaled,
                              "positional encoding entries": pe_rms},
                   xlabel="d_model", ylabel="typical size (RMS)", logy=True, markers=True,
                   title=f"token signal vs position signal (vocabulary of {V})")
default = nn.Embedding(V, 64).weight.detach()  # PyTorch's default init: N(0, 1) entries
ratio = rms(default) * math.sqrt(64) / rms(sinusoidal_positional_encoding(64, 64))
print(f"d_model=64, default N(0, 1) embeddings x sqrt(64): {ratio:.1f}x the positional encoding")

# %% [markdown]
# Two more decisions that the exercise fixes:
#
# - **Two tables**: `src_embed` for the source vocabulary and `tgt_embed` for the target
#   vocabulary. (The study notes this course grew from embed *both* sides with one table,
#   `wte`, and even feed the decoder the source; we come back to that in section 4.)
# - **An untied generator**: the last layer `generator = nn.Linear(d_model, tgt_vocab)` maps each
#   decoder state to one score (logit) per target token. The paper shares its weights with the
#   embeddings; we keep them separate, which is simpler and just as good for a task this size.
#   It ends the model: **no softmax after it**. `F.cross_entropy` takes raw logits and applies
#   log-softmax itself (fused, stable); a softmax layer in front of it squashes the gradients.

# %% [markdown]
# ## 3. The whole model
#
# With $E_s, E_t$ the two tables and $W_g, b_g$ the generator:
#
# $$\text{memory} = \text{Encoder}\big(\sqrt{d}\,E_s[\text{src}] + PE,\ \text{src\_mask}\big)
# \qquad (B, L_s, d)$$
#
# $$\text{states} = \text{Decoder}\big(\sqrt{d}\,E_t[\text{tgt}] + PE,\ \text{memory},\
# \text{src\_mask},\ \text{tgt\_mask}\big) \qquad (B, L_t, d)$$
#
# $$\text{logits} = \text{states}\, W_g^\top + b_g \qquad (B, L_t, V_t)$$
#
# The **source padding mask is used twice**: in the encoder's self-attention (no token attends
# to padding) and in the decoder's cross-attention (no target position reads padded memory).
# The target mask is causal AND padding, so position $i$ sees target tokens $0..i$ only.
#
# ### Exercise 1: `Transformer`
#
# `Transformer(src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
# max_len=5000, norm_first=False, pad_id=0)` keeps these parts, with exactly these names (the
# tests copy weights through them):
#
# - `src_embed`, `tgt_embed`: `nn.Embedding(src_vocab, d_model)`, `nn.Embedding(tgt_vocab, d_model)`;
# - `pos_encoding`: `PositionalEncoding(d_model, max_len, dropout)` (adds the table, then dropout);
# - `encoder`: `Encoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)`, and
#   `decoder`: `Decoder(...)` with the same arguments (both end with a LayerNorm);
# - `generator`: `nn.Linear(d_model, tgt_vocab)`; and `self.pad_id = pad_id`.
#
# After building every part, initialise **every parameter with more than one dimension** with
# `nn.init.xavier_uniform_` (embeddings included). Then three methods:
#
# - `encode(src, src_mask=None)` → memory `(B, Ls, d_model)`;
# - `decode(tgt, memory, src_mask=None, tgt_mask=None)` → decoder states `(B, Lt, d_model)`;
# - `forward(src, tgt, src_mask=None, tgt_mask=None)` → logits `(B, Lt, tgt_vocab)`. When a mask
#   is `None`, `forward` builds it from `self.pad_id`: `make_padding_mask(src, self.pad_id)` and
#   `make_decoder_mask(tgt, self.pad_id)`. (`encode` and `decode` use the masks they are given.)
#
# Scale the embedding **before** adding the positional encoding, and nothing after the generator.

# %% [solution] Transformer
class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    src (B, Ls) and tgt (B, Lt) token ids -> logits (B, Lt, tgt_vocab).
    Parts: src_embed, tgt_embed, pos_encoding, encoder, decoder, generator; pad_id.
    """

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
                 max_len=5000, norm_first=False, pad_id=0):
        super().__init__()
        ### BEGIN SOLUTION
        self.d_model, self.pad_id = d_model, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab)  # raw logits: no softmax
        for p in self.parameters():  # Xavier for every matrix, as nn.Transformer does
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        ### END SOLUTION

    def encode(self, src, src_mask=None):
        """src (B, Ls) -> memory (B, Ls, d_model)."""
        ### BEGIN SOLUTION
        x = self.src_embed(src) * math.sqrt(self.d_model)  # scale first, then add positions
        return self.encoder(self.pos_encoding(x), src_mask)
        ### END SOLUTION

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        """tgt (B, Lt), memory (B, Ls, d_model) -> decoder states (B, Lt, d_model)."""
        ### BEGIN SOLUTION
        y = self.tgt_embed(tgt) * math.sqrt(self.d_model)  # the target side has its own table
        return self.decoder(self.pos_encoding(y), memory, src_mask, tgt_mask)
        ### END SOLUTION

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        """src (B, Ls), tgt (B, Lt) -> logits (B, Lt, tgt_vocab); masks built from pad_id if None."""
        ### BEGIN SOLUTION
        if src_mask is None:
            src_mask = make_padding_mask(src, self.pad_id)  # (B, 1, Ls)
        if tgt_mask is None:
            tgt_mask = make_decoder_mask(tgt, self.pad_id)  # (B, Lt, Lt)
        memory = self.encode(src, src_mask)  # (B, Ls, D)
        return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))  # (B, Lt, V)
        ### END SOLUTION

# %% [markdown]
# Run the checks. Each prints a ✔ line when it passes, or tells you what is wrong.

# %% [tests] Transformer

# %% [markdown]
# ### The same model as `nn.Transformer`
#
# PyTorch's `nn.Transformer` is only the encoder and decoder stacks: no embeddings, no positional
# encoding, no generator, and masks with the **opposite meaning** (`True` = *blocked*, in
# `tgt_mask` and in the `*_key_padding_mask` arguments). Copy your model's weights into it, feed
# it the same scaled embeddings, and the logits agree to float32 precision. That is what
# `test_Transformer_matches_torch` checks; here it is done by hand:

# %%
def copy_transformer_to_torch(model, torch_tf):
    """Copy the course model's encoder and decoder weights into nn.Transformer (batch_first).
    nn.Transformer has no embeddings and no generator: those stay in the course model."""
    pairs = [(model.encoder.norm, torch_tf.encoder.norm), (model.decoder.norm, torch_tf.decoder.norm)]
    for mine, theirs in zip(model.encoder.layers, torch_tf.encoder.layers):
        copy_mha_to_torch(mine.self_attn, theirs.self_attn)
        pairs += [(mine.ff.linear1, theirs.linear1), (mine.ff.linear2, theirs.linear2),
                  (mine.norm1, theirs.norm1), (mine.norm2, theirs.norm2)]
    for mine, theirs in zip(model.decoder.layers, torch_tf.decoder.layers):
        copy_mha_to_torch(mine.self_attn, theirs.self_attn)
        copy_mha_to_torch(mine.cross_attn, theirs.multihead_attn)
        pairs += [(mine.ff.linear1, theirs.linear1), (mine.ff.linear2, theirs.linear2),
                  (mine.norm1, theirs.norm1), (mine.norm2, theirs.norm2), (mine.norm3, theirs.norm3)]
    with torch.no_grad():
        for a, b in pairs:  # nn.Linear and nn.LayerNorm: a weight and a bias each
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)


torch.manual_seed(0)
small = dict(src_vocab=V, tgt_vocab=V, d_model=32, n_heads=4, n_layers=2, d_ff=64)
mine = pick("Transformer", lambda: Transformer(**small).eval(), lambda: R.Transformer(**small).eval(),
            check=lambda m: m(*test_set.batch(torch.arange(2))))
theirs = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                        dim_feedforward=64, dropout=0.0, batch_first=True)
copy_transformer_to_torch(mine, theirs)  # attention, feed-forward and norm weights
src, tgt = test_set.batch(torch.arange(3))
with torch.no_grad():
    xs = mine.src_embed(src) * math.sqrt(32) + sinusoidal_positional_encoding(src.size(1), 32)
    xt = mine.tgt_embed(tgt) * math.sqrt(32) + sinusoidal_positional_encoding(tgt.size(1), 32)
    causal_blocked = ~make_causal_mask(tgt.size(1))  # PyTorch: True = may NOT attend
    states = theirs.train()(xs, xt, tgt_mask=causal_blocked,  # train(): dropout is 0 anyway
                            src_key_padding_mask=src == s2s.PAD, tgt_key_padding_mask=tgt == s2s.PAD,
                            memory_key_padding_mask=src == s2s.PAD)
    diff = (mine.generator(states) - mine(src, tgt)).abs()[tgt != s2s.PAD].max()
print(f"largest difference from nn.Transformer at the real target positions: {diff:.2e}")
print("parameters of this small model (d_model=32, 2 layers):")
for part in ("src_embed", "tgt_embed", "encoder", "decoder", "generator"):
    print(f"  {part:<10} {sum(p.numel() for p in getattr(mine, part).parameters()):>7,} parameters")

# %% [markdown]
# ## 4. Teacher forcing: what the decoder reads while it learns
#
# At generation time the decoder writes one token at a time and reads back what it has
# written: from `<s>` it predicts `2`, from `<s> 2` it predicts `0`, and so on until `</s>`.
# Training does all steps at once, in parallel: the decoder gets the **whole correct target
# shifted one place right** (it starts with `<s>` and drops the last token), and position $i$ is
# asked for the token at $i+1$. The causal mask makes this honest: position $i$ cannot peek at
# the token it must predict. Feeding the correct prefix instead of the model's own guesses is
# called **teacher forcing**.

# %%
row = tgt[0]
n = int((row != s2s.PAD).sum())
print(f"{'position':<14}" + "".join(f"{i:>5}" for i in range(n - 1)))
print(f"{'decoder input':<14}" + "".join(f"{s2s.VOCAB[t]:>5}" for t in row[: n - 1]))
print(f"{'label':<14}" + "".join(f"{s2s.VOCAB[t]:>5}" for t in row[1:n]))

# %% [markdown]
# ### Why the study notes' wiring cannot learn this task
#
# The notes this course grew from build their model as `enc_out = encoder(x)` and then
# `decoder(x, enc_out)`, with `x` the *source* embeddings, and never pass the target in. Then
# the decoder makes one prediction per **source** token. A translation is rarely as long as its
# source: `5 mar 2024 </s>` has 7 tokens, its answer `2 0 2 4 - 0 3 - 0 5 </s>` has 11. Such
# a model cannot even produce the answer, and the loss cannot be computed:

# %%
lengths = {}
for (src_text, tgt_text), s_row in zip(test_set.text, test_set.src):
    lengths.setdefault(s2s.format_of(src_text), set()).add(int((s_row != s2s.PAD).sum()))
for fmt, ls in lengths.items():
    print(f"  {fmt:<16} source: {sorted(ls)} tokens    labels: always 11 tokens")

first_format = [i for i, (s, _) in enumerate(test_set.text) if s2s.format_of(s) == s2s.FORMATS[0]]
src, tgt = test_set.batch(torch.tensor(first_format[:4]))
with torch.no_grad():
    memory = mine.encode(src, make_padding_mask(src))
    x = mine.pos_encoding(mine.src_embed(src) * math.sqrt(32))
    seed_logits = mine.generator(mine.decoder(x, memory))  # the decoder reads the SOURCE
print(f"\npredictions per row: {seed_logits.size(1)}, labels per row: {tgt.size(1) - 1}")
try:
    F.cross_entropy(seed_logits.reshape(-1, V), tgt[:, 1:].reshape(-1))
except (RuntimeError, ValueError) as e:
    print("cross_entropy:", type(e).__name__, "-", str(e).split("\n")[0])

# %% [markdown]
# Even where the lengths happen to match (`dd / mm / yyyy`), that decoder never sees what it has
# written, so there is nothing to feed back at generation time: it is a tagger, not a generator.
# The decoder's input must be the target prefix.
#
# The opposite mistake is as common and more treacherous: feeding the target **unshifted**,
# asking position $i$ for the token it was just given. The loss drops to almost zero, since
# copying the input is easy, and the model has learned nothing it can use: at generation time
# the next token is never in the input. Two small models, the same 150 steps, the right and the
# wrong labels:

# %%
def unshifted_loss(model, src, tgt):
    """THE BUG: the labels are the decoder's own input tokens."""
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, :-1].reshape(-1),
                           ignore_index=model.pad_id)


def right_loss(model, src, tgt):
    """Predict the NEXT token: input tgt[:, :-1], labels tgt[:, 1:]."""
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1),
                           ignore_index=model.pad_id)

# %% [markdown]
# The decoding loop comes in section 6; here we score the two models on 200 held-out dates with
# the *right* (shifted) loss: how well each predicts the next token it will have to generate.

# %%
torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and steady on a busy machine
small_config = dict(s2s.MODEL_CONFIG, n_layers=1)
few = s2s.DateTask(test_set.src[:200], test_set.tgt[:200], test_set.text[:200])
demo_steps = 5 if QUICK else 150
demo = {}
for name, loss_fn in (("shifted labels (right)", right_loss), ("unshifted labels (bug)", unshifted_loss)):
    torch.manual_seed(0)
    m = pick("Transformer", lambda: Transformer(**small_config),
             lambda: R.Transformer(**small_config), check=lambda m: m(*few.batch(torch.arange(2))))
    r = s2s.train(m, train_set, loss_fn, steps=demo_steps, batch_size=64, warmup=100,
                  factor=0.2, progress=False)
    held = s2s.held_out_loss(m, right_loss, few.src, few.tgt)
    demo[name] = (m, r)
    print(f"{name:<24} final training loss {r.losses[-1]:.4f}   held-out next-token loss {held:.4f}")
fig = plots.curves(range(1, demo_steps + 1), {k: r.losses for k, (m, r) in demo.items()},
                   xlabel="step", ylabel="training loss", logy=True,
                   title="the bug has the better loss curve")

# %% [markdown]
# ### Exercise 2: `teacher_forcing_loss`
#
# `teacher_forcing_loss(model, src, tgt)` takes a model like yours, a source batch `(B, Ls)` and
# a target batch `(B, Lt)` of `<s> ... </s>` rows padded with `model.pad_id`, and returns a
# scalar tensor: the mean cross-entropy of predicting `tgt[:, 1:]` from the decoder input
# `tgt[:, :-1]`.
#
# - Call the model as `model(src, decoder_input)`: it builds the masks.
# - `F.cross_entropy` wants the classes on axis 1: flatten the logits to `(B*(Lt-1), V)` and
#   the labels to `(B*(Lt-1),)`.
# - Padding is not a token to predict: pass `ignore_index=model.pad_id`, so the mean runs over the
#   real target tokens only. (The study notes pass `ignore_index=-1`, which ignores nothing here.)
# - Raw logits in, no softmax.

# %% [solution] teacher_forcing_loss
def teacher_forcing_loss(model, src, tgt):
    """Mean cross-entropy of the next target token, padding ignored.

    src (B, Ls), tgt (B, Lt) = <s> ... </s> <pad>...; returns a 0-D tensor.
    """
    ### BEGIN SOLUTION
    logits = model(src, tgt[:, :-1])  # (B, Lt-1, V): input is the target shifted right
    labels = tgt[:, 1:]  # (B, Lt-1): position i predicts token i+1
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=model.pad_id)
    ### END SOLUTION

# %% [tests] teacher_forcing_loss

# %% [markdown]
# ### Label smoothing: don't ask for certainty
#
# Cross-entropy against a one-hot label, $-\log p_y$, only reaches its minimum when the model
# puts probability 1 on the right token, which needs infinitely large logit gaps: the model is
# pushed to be ever more confident, right or wrong. Label smoothing (Szegedy et al. 2016,
# *Rethinking the Inception Architecture*, section 7) trains instead against a **smoothed
# target**: keep $1 - \varepsilon$ on the true token and spread $\varepsilon$ uniformly over all
# $V$ tokens. The Transformer paper (Vaswani et al. 2017, section 5.4) uses it with
# $\varepsilon_{ls} = 0.1$ and says no more about its form; the form below is Szegedy et al.'s:
#
# $$q_c = (1 - \varepsilon)\,[c = y] + \frac{\varepsilon}{V}, \qquad
# \text{loss} = -\sum_c q_c \log p_c = (1 - \varepsilon)\,(-\log p_y) + \varepsilon \cdot \frac{1}{V}\sum_c (-\log p_c).$$
#
# The second term is the cross-entropy against the uniform distribution: it grows when any token's
# probability goes to 0, so the best the model can do is $p_y = 1 - \varepsilon + \varepsilon / V$,
# not 1. This is exactly what `F.cross_entropy(..., label_smoothing=ε)` computes (PyTorch's
# uniform part includes the true class, as above). Other implementations differ: the Annotated
# Transformer (Rush 2018) puts $1 - \varepsilon$ on the true token, spreads $\varepsilon/(V-2)$
# over the others except the padding token, whose column it sets to 0, and minimises the KL
# divergence summed over positions (`nn.KLDivLoss(reduction="sum")`), which differs from this
# cross-entropy by the target's entropy (a constant) and by the normalisation.

# %%
eps = 0.1
y = s2s.STOI["7"]
target = (1 - eps) * F.one_hot(torch.tensor(y), V).float() + eps / V  # (V,)
p_true = torch.linspace(0.05, 0.999, 300)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 3.4))
ax1.bar(range(V), F.one_hot(torch.tensor(y), V).float(), color="lightgray", label="one-hot")
ax1.bar(range(V), target, width=0.5, color="tab:blue", label=f"smoothed, ε={eps}")
ax1.set_xticks(range(V), s2s.VOCAB, rotation=90, fontsize=7)
ax1.set(ylabel="target probability", title=f"the target for the token '7' (V = {V})")
ax1.legend()
for e in (0.0, 0.1, 0.2):
    rest = (1 - p_true) / (V - 1)  # the other tokens share what is left equally
    loss = -((1 - e + e / V) * p_true.log() + (e / V) * (V - 1) * rest.log())
    best = 1 - e + e / V
    ax2.plot(p_true, loss, label=f"ε={e}: best p = {best:.3f}")
    ax2.axvline(best, ls=":", color=ax2.lines[-1].get_color())
ax2.set(xlabel="probability the model gives the true token", ylabel="loss",
        title="the loss against the model's confidence", ylim=(0, 3.5))
ax2.legend()
fig.tight_layout()

# %% [markdown]
# Without smoothing the loss keeps falling all the way to $p = 1$; with it, the loss has a
# minimum below 1, and more confidence is penalised. At that minimum the true token still has
# the largest probability, so the argmax (all greedy decoding uses) of a model that reaches the
# optimum is unchanged. That is a statement about the optimum, not about training: smoothing
# changes the gradients and what a finite run learns. Vaswani et al. report that it hurt
# perplexity (the model is deliberately less sure) but improved accuracy and BLEU.
#
# ### Exercise 3: `label_smoothing_cross_entropy`
#
# `label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100)`:
#
# - `logits` is `(..., V)` with any number of leading axes (`(N, V)`, `(B, L, V)`, ...; raw
#   scores, classes on the **last** axis), `target` the class ids of the matching leading shape
#   (`(N,)`, `(B, L)`, ...);
# - the loss of a position is $(1 - \varepsilon)(-\log p_y) + \varepsilon \cdot \operatorname{mean}_c(-\log p_c)$
#   with $\log p$ = `torch.log_softmax(logits, dim=-1)` (stable; `log(softmax(...))` is not);
# - positions whose target equals `ignore_index` do not count; return the **mean over the
#   others**, a 0-D tensor. `ignore_index` need not be a class id (the default `-100` is not):
#   don't index with it.
#
# The result must equal `F.cross_entropy(logits.reshape(-1, V), target.reshape(-1),
# label_smoothing=smoothing, ignore_index=ignore_index)`; calling `F.cross_entropy` or
# `nn.CrossEntropyLoss` here is not allowed (the checks notice). `log_softmax`, `gather` and
# `F.nll_loss` are fine.

# %% [solution] label_smoothing_cross_entropy
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    """Cross-entropy against the smoothed target (1 - smoothing) * one_hot + smoothing / V,
    averaged over the positions whose target is not ignore_index.

    logits: (..., V), any leading axes; target: the matching (...) class ids. Returns a 0-D tensor, equal
    to F.cross_entropy(logits, target, label_smoothing=smoothing, ignore_index=ignore_index).
    """
    ### BEGIN SOLUTION
    V = logits.size(-1)
    logp = torch.log_softmax(logits.reshape(-1, V), dim=-1)  # (N, V), stable
    target = target.reshape(-1)  # (N,)
    keep = target != ignore_index  # (N,): the positions that count
    safe = target.masked_fill(~keep, 0)  # a valid index where ignored; those rows are dropped
    nll = -logp.gather(1, safe[:, None]).squeeze(1)  # (N,): -log p(true class)
    uniform = -logp.mean(dim=-1)  # (N,): cross-entropy against the uniform distribution 1/V
    loss = (1 - smoothing) * nll + smoothing * uniform  # (N,)
    return loss[keep].mean()
    ### END SOLUTION

# %% [tests] label_smoothing_cross_entropy

# %% [markdown]
# The training below uses it: the same teacher-forced logits and labels as your
# `teacher_forcing_loss`, with $\varepsilon = 0.1$ as in the paper.

# %%
def smoothed_loss(model, src, tgt, smoothing=s2s.LABEL_SMOOTHING):
    """teacher_forcing_loss with label smoothing: what section 5 trains with."""
    logits = model(src, tgt[:, :-1])  # (B, Lt-1, V): input is the target shifted right
    return smoothing_fn(logits, tgt[:, 1:], smoothing, model.pad_id)


smoothing_fn = pick("label_smoothing_cross_entropy", lambda: label_smoothing_cross_entropy,
                    lambda: R.label_smoothing_cross_entropy,
                    check=lambda f: f(torch.randn(3, V), torch.tensor([1, 2, 0]), 0.1, 0))

# %% [markdown]
# ## 5. Training: Adam and the warm-up schedule
#
# The paper trains with Adam ($\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$) and a
# learning rate that **rises linearly for `warmup` steps, then decays like $1/\sqrt{\text{step}}$**:
#
# $$\text{lr}(s) = \text{factor} \cdot d_\text{model}^{-0.5} \cdot \min\big(s^{-0.5},\ s \cdot \text{warmup}^{-1.5}\big)$$
#
# Early on, Adam's running estimates of the gradient's size are poor and a post-norm
# Transformer is fragile: a large step then can push it somewhere it never recovers from. The
# warm-up keeps the first steps small. The paper used $d_\text{model}=512$ and 4000 warm-up
# steps (peak $7 \cdot 10^{-4}$); our model is smaller and our run is short, so we take
# `warmup=100` and `factor=0.2`. `s2s.noam_lr` is the formula; `s2s.make_optimizer` wraps it in
# a `LambdaLR`.

# %%
steps_axis = range(1, 451)
fig = plots.curves(steps_axis, {f"warmup={w}": [s2s.noam_lr(s, 64, w, 0.2) for s in steps_axis]
                                for w in (50, 100, 200)},
                   xlabel="step", ylabel="learning rate",
                   title="warm-up schedule, d_model=64, factor=0.2 (ours: warmup=100)")

# %% [markdown]
# Now the real run: your `Transformer` and the teacher-forced loss with your label smoothing
# ($\varepsilon = 0.1$, `smoothed_loss` above), 2 layers, $d_\text{model}=64$,
# 4 heads, about 170 000 parameters, 450 steps of 128 pairs. `s2s.train` is an ordinary loop
# (sample a batch, loss, `backward`, clip the gradient norm at 1, `step` the optimizer and the
# schedule) with a `tqdm` progress bar. Every 25 steps it also measures the loss on 500
# held-out pairs (dates the model never trains on), in eval mode: the **validation loss**. Its
# gap to the training loss is what tells learning from memorising. It stops early after 55 s on
# a very slow machine. (When the notebook is autograded it only takes a few steps, shows no
# progress bar, and the figures below then show an untrained model.)

# %%
print("model:", s2s.MODEL_CONFIG, "\ntraining:", s2s.TRAIN_CONFIG)
torch.manual_seed(0)
probe = train_set.batch(torch.arange(4))  # a tiny batch to see whether your code runs yet
model = pick("Transformer", lambda: Transformer(**s2s.MODEL_CONFIG),
             lambda: R.Transformer(**s2s.MODEL_CONFIG), check=lambda m: m(*probe))
loss_fn = smoothed_loss  # teacher forcing + label smoothing 0.1
steps = 10 if QUICK else s2s.TRAIN_CONFIG["steps"]
result = s2s.train(model, train_set, loss_fn, **dict(s2s.TRAIN_CONFIG, steps=steps),
                   val_data=test_set, val_every=25, time_limit=55, seed=0)
print(f"{result.steps} steps in {result.seconds:.1f} s, "
      f"{1000 * result.seconds / result.steps:.0f} ms per step; last loss {result.losses[-1]:.4f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4))
ax1.plot(range(1, result.steps + 1), result.losses, lw=0.8, label="loss of each batch")
window = 20
smooth = [sum(result.losses[max(0, i - window + 1): i + 1]) / len(result.losses[max(0, i - window + 1): i + 1])
          for i in range(result.steps)]
ax1.plot(range(1, result.steps + 1), smooth, lw=2, label=f"mean of the last {window}")
ax1.plot(result.val_steps, result.val_losses, "o-", ms=3, lw=1.5, label="validation (held-out dates)")
q = torch.full((V,), s2s.LABEL_SMOOTHING / V)
q[0] += 1 - s2s.LABEL_SMOOTHING
floor = -(q * q.log()).sum().item()  # entropy of the smoothed target: the lowest possible loss
ax1.axhline(floor, color="k", ls="--", lw=1, label=f"lowest possible with ε={s2s.LABEL_SMOOTHING}")
ax1.set(yscale="log", xlabel="step", ylabel="smoothed cross-entropy (nats per token)",
        title="training and validation loss")
ax1.legend()
ax2.plot(range(1, result.steps + 1), result.lrs)
ax2.set(xlabel="step", ylabel="learning rate", title="the schedule this run used")
for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
fig.tight_layout()

# %% [markdown]
# With label smoothing the loss cannot go below the entropy of the smoothed target (the dashed
# line). And the trained model is **not** certain: on held-out dates, the probability it gives
# its top token piles up near $1 - \varepsilon + \varepsilon / V$, not at 1. Its argmax is what
# decoding uses, and that is as right as ever.

# %%
src, tgt = test_set.batch(torch.arange(300))
with torch.no_grad():
    probs = model.eval()(src, tgt[:, :-1]).softmax(-1)  # (300, Lt-1, V), teacher-forced
real = tgt[:, 1:] != s2s.PAD
top_p = probs.max(-1).values[real]  # the model's confidence at every real target position
right = (probs.argmax(-1) == tgt[:, 1:])[real].float().mean().item()
fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.hist(top_p.numpy(), bins=40, range=(0, 1), color="tab:blue")
ax.axvline(1 - s2s.LABEL_SMOOTHING + s2s.LABEL_SMOOTHING / V, color="k", ls="--",
           label="1 - ε + ε/V: the best the smoothed loss allows")
ax.set(xlabel="probability of the top token", ylabel="target positions", yscale="log",
       title=f"confidence on held-out dates (top token right at {right:.1%} of positions)")
ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 6. Greedy decoding
#
# To translate a new source we have no target to force. We generate: encode the source once,
# start every row with `<s>`, and repeat
#
# 1. run the decoder on the prefix so far (causal mask, source padding mask);
# 2. take the logits of the **last** position, `(B, V)`, and their argmax, `(B,)`;
# 3. append it to the prefix.
#
# In a batch, rows finish at different steps. A row that has produced `</s>` is done: from then
# on it receives `model.pad_id`, while the others go on; the loop stops **as soon as every row
# is done**, or when the output reaches `max_len` columns.
#
# ### Exercise 4: `greedy_decode`
#
# `greedy_decode(model, src, max_len, bos_id, eos_id)` returns a `(B, T)` LongTensor: column 0 is
# `bos_id`; each row holds its tokens up to and including its first `eos_id`, then
# `model.pad_id`; `T <= max_len` (the `<s>` column counts), and `T` is as short as possible: the
# loop ends at the step where the last row produced `eos_id`. A row that never produces `eos_id`
# runs to `max_len` columns.
#
# Use `model.encode(src, src_mask)`, `model.decode(ys, memory, src_mask, tgt_mask)` and
# `model.generator(...)`, with `src_mask = make_padding_mask(src, model.pad_id)` and
# `tgt_mask = make_causal_mask(T)`; or simply `model(src, ys)`, which builds the masks (and
# re-encodes the source at every step). Wrap it in `torch.no_grad()`. The tests use models that
# offer all of these and put them in eval mode.

# %% [solution] greedy_decode
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    """src (B, Ls) -> (B, T) token ids, T <= max_len: <s>, the argmax tokens, </s>, then pads.

    Stops as soon as every row has produced eos_id.
    """
    ### BEGIN SOLUTION
    B = src.size(0)
    src_mask = make_padding_mask(src, model.pad_id)  # (B, 1, Ls)
    memory = model.encode(src, src_mask)  # (B, Ls, D): encode once
    ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max_len - 1):
        tgt_mask = make_causal_mask(ys.size(1), device=src.device)  # (T, T)
        states = model.decode(ys, memory, src_mask, tgt_mask)  # (B, T, D)
        next_token = model.generator(states[:, -1]).argmax(-1)  # (B,): last position only
        next_token = next_token.masked_fill(done, model.pad_id)  # finished rows get padding
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)  # (B, T + 1)
        done |= next_token == eos_id
        if done.all():
            break
    return ys
    ### END SOLUTION

# %% [tests] greedy_decode

# %% [markdown]
# ### How well did it learn?
#
# **Exact match**: the fraction of held-out dates whose whole output, `</s>` included, is right.
# One wrong digit is a wrong date.

# %%
decode_fn = pick("greedy_decode", lambda: greedy_decode, lambda: R.greedy_decode,
                 check=lambda f: f(model.eval(), test_set.src[:2], 12, s2s.BOS, s2s.EOS))
t0 = time.perf_counter()
accuracy, outputs = s2s.exact_match(model, test_set, decode_fn)
outputs = torch.cat([F.pad(o, (0, test_set.tgt.size(1) - o.size(1)), value=s2s.PAD) for o in outputs])
print(f"held-out exact match: {accuracy:.1%} of {len(test_set)} unseen dates "
      f"(decoded in {time.perf_counter() - t0:.1f} s)\n")
for i in range(8):
    got = " ".join(s2s.decode_ids(outputs[i]))
    ok = "✔" if got == test_set.text[i][1] else "✘"
    print(f"  {ok} {test_set.text[i][0]:<26} -> {got}")

# %% [markdown]
# ## 7. Beam search
#
# Greedy decoding commits to the best token at every step, but the best *sequence* may start
# with a token that was only second best. **Beam search** keeps the `beam_size` best prefixes
# instead of one. At each step every prefix is extended by every token, scored by its total
# log-probability $\sum_t \log p(y_t \mid y_{<t}, x)$, and only the best `beam_size` survive;
# a prefix that produces `</s>` leaves the beam as a finished hypothesis. Sums of log-probabilities
# favour short outputs (each token adds a negative number), so finished hypotheses are ranked by
# their score divided by a length penalty $\big((5 + |y|)/6\big)^{\alpha}$ (Wu et al., 2016).
# With `beam_size=1` it is greedy decoding. Here is the code, one source row at a time for
# clarity (read it; it is not an exercise):

# %% [export]
@torch.no_grad()
def beam_search(model, src, max_len, bos_id, eos_id, beam_size=4, alpha=0.6):
    """Like greedy_decode, but keeps the `beam_size` best prefixes of each row."""
    rows = []
    for b in range(src.size(0)):
        s = src[b:b + 1]  # (1, Ls)
        src_mask = make_padding_mask(s, model.pad_id)  # (1, 1, Ls)
        memory = model.encode(s, src_mask)  # (1, Ls, D), encoded once
        beams = [([bos_id], 0.0)]  # (tokens, sum of log-probabilities)
        finished = []
        for _ in range(max_len - 1):
            ys = torch.tensor([tokens for tokens, _ in beams])  # (K, T)
            mem = memory.expand(len(beams), -1, -1)  # (K, Ls, D): the same source per beam
            states = model.decode(ys, mem, src_mask, make_causal_mask(ys.size(1)))  # (K, T, D)
            logp = model.generator(states[:, -1]).log_softmax(-1)  # (K, V)
            scores = torch.tensor([score for _, score in beams])[:, None] + logp  # (K, V)
            top = scores.flatten().topk(min(beam_size, scores.numel()))  # best K of K * V
            new = []
            for score, idx in zip(top.values.tolist(), top.indices.tolist()):
                k, token = divmod(idx, logp.size(-1))  # which beam, which token
                candidate = (beams[k][0] + [token], score)
                (finished if token == eos_id else new).append(candidate)
            beams = new
            if not beams or len(finished) >= beam_size:
                break
        pool = finished or beams
        best = max(pool, key=lambda c: c[1] / ((5 + len(c[0])) / 6) ** alpha)
        rows.append(best[0])
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), model.pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out

# %% [markdown]
# On the trained model both decoders are (nearly) always right, so we compare them on the
# half-trained model from section 4 (150 steps, one layer), where greedy decoding still makes
# mistakes; 150 held-out dates:

# %%
half_trained = demo["shifted labels (right)"][0].eval()
few = s2s.DateTask(test_set.src[:150], test_set.tgt[:150], test_set.text[:150])
t0 = time.perf_counter()
acc_greedy, out_greedy = s2s.exact_match(half_trained, few, decode_fn)
acc_beam1, out_beam1 = s2s.exact_match(half_trained, few, beam_search, beam_size=1)
t1 = time.perf_counter()
acc_beam4, out_beam4 = s2s.exact_match(half_trained, few, beam_search, beam_size=4)
print(f"greedy: {acc_greedy:.1%}   beam_size=1: {acc_beam1:.1%}   beam_size=4: {acc_beam4:.1%}"
      f"   (beam search took {time.perf_counter() - t1:.1f} s)")
g, b4 = out_greedy[0], out_beam4[0]
changed = [i for i in range(len(few)) if s2s.decode_ids(g[i]) != s2s.decode_ids(b4[i])]
for i in changed[:5]:
    print(f"  {few.text[i][0]:<24} greedy {' '.join(s2s.decode_ids(g[i])):<22} "
          f"beam {' '.join(s2s.decode_ids(b4[i])):<22} answer {few.text[i][1]}")

# %% [markdown]
# With `beam_size=1` the result is exactly greedy decoding. A wider beam finds outputs that the
# *model* scores higher; when the model is wrong, that is sometimes the right answer and
# sometimes a different wrong one. It cannot replace training: on the fully trained model,
# greedy decoding is already right.
#
# ## 8. Looking inside the trained model
#
# Every `MultiHeadAttention` keeps the weights of its last call in `attn_weights`,
# `(B, H, Lq, Lk)`. Run the model once on one held-out example, with its own output as the
# decoder input, and collect them: encoder self-attention, decoder self-attention and
# cross-attention, for every layer and head. Rows are labelled with the token the decoder
# **writes** at that position (the input there is the token before it).

# %%
def attention_maps(model, i, data=test_set):
    """Weights of every attention module on held-out example i, as (n_layers, H, Lq, Lk) tensors."""
    src = data.src[i][data.src[i] != s2s.PAD].unsqueeze(0)  # (1, Ls) without padding
    out = decode_fn(model, src, data.tgt.size(1), s2s.BOS, s2s.EOS)  # (1, T)
    with torch.no_grad():
        model(src, out[:, :-1])  # fills attn_weights everywhere
    stack = lambda mods: torch.stack([m.attn_weights[0] for m in mods])  # (n_layers, H, Lq, Lk)
    maps = {"cross-attention": stack([l.cross_attn for l in model.decoder.layers]),
            "decoder self-attention": stack([l.self_attn for l in model.decoder.layers]),
            "encoder self-attention": stack([l.self_attn for l in model.encoder.layers])}
    words = lambda ids: [s2s.VOCAB[t] for t in ids.tolist()]
    return maps, words(src[0]), words(out[0, :-1]), words(out[0, 1:])


by_format = {}
for i, (s, _) in enumerate(test_set.text):
    by_format.setdefault(s2s.format_of(s), i)
examples = [by_format[f] for f in s2s.FORMATS]
print("one held-out example per format:", [test_set.text[i][0] for i in examples])

# %% [markdown]
# ### Cross-attention: where each output token reads from
#
# For one example, every layer (rows) and head (columns) of the cross-attention. Each row of a
# small map is one output token; each column one source token.

# %%
maps, src_words, in_words, out_words = attention_maps(model, examples[2])
n_layers, n_heads = maps["cross-attention"].shape[:2]
fig = plots.heatmap_grid(maps["cross-attention"], out_words, src_words,
                         row_titles=[f"layer {l}" for l in range(n_layers)],
                         col_titles=[f"head {h}" for h in range(n_heads)],
                         title=f"cross-attention, every layer and head: {test_set.text[examples[2]][0]}")

# %% [markdown]
# Some heads hold a clean alignment; others spread out or look at the `</s>` anchor. We can
# measure it. For every output digit we know which source token holds its information (the
# same year digit; the month word or month digit; the same day digit). The **alignment
# score** of a head is the attention mass it puts there, averaged over the output digits of
# 300 held-out dates: 1 means it always reads exactly the right source token.

# %%
def alignment_scores(model, data, n=300):
    """(n_layers, H): mean cross-attention mass on the source token(s) holding the answer."""
    src, tgt = data.batch(torch.arange(n))
    with torch.no_grad():
        model(src, tgt[:, :-1])  # teacher-forced: query t writes label tgt[:, t + 1]
    W = torch.stack([l.cross_attn.attn_weights for l in model.decoder.layers], 1)  # (N, n, H, Lq, Ls)
    truth = torch.zeros(n, W.size(3), W.size(4))  # 1 where the answer's information is
    for b in range(n):
        for t, positions in enumerate(s2s.alignment(data.text[b][0].split())):
            truth[b, t, positions] = 1.0
    has = truth.sum(-1) > 0  # (N, Lq): output digits (not separators or </s>)
    mass = (W * truth[:, None, None]).sum(-1)  # (N, n, H, Lq)
    return mass.permute(1, 2, 0, 3)[:, :, has].mean(-1)  # (n, H)


scores = alignment_scores(model, test_set)
fig = plots.heatmap(scores, [f"layer {l}" for l in range(n_layers)],
                    [f"head {h}" for h in range(n_heads)], xlabel="head", ylabel="decoder layer",
                    title="alignment score of each cross-attention head", annotate=True,
                    cmap="Blues", vmin=0, vmax=1, figsize=(5.5, 2.6))
best_layer, best_head = divmod(int(scores.argmax()), n_heads)
print(f"best aligned: layer {best_layer}, head {best_head} (score {scores.max():.2f})")

# %% [markdown]
# That head on one held-out date of each format, with the true alignment outlined in red: the
# year digits of the output read the year at the *end* of the source, the month digits read the
# month (the word `apr`, or the two digits between the slashes), the day digits read the day,
# wherever the format put it. Most of the blue lies in the red boxes. (A leading zero that the
# source lacks has no box; other heads and the first layer share the rest of the work.)

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
for ax, i in zip(axes, examples):
    maps, src_words, _, out_words = attention_maps(model, i)
    w = maps["cross-attention"][best_layer, best_head]  # (Lq, Lk)
    ax.imshow(w.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for t, positions in enumerate(s2s.alignment(src_words[:-1])):  # src_words ends with </s>
        for j in positions:
            ax.add_patch(plt.Rectangle((j - 0.5, t - 0.5), 1, 1, fill=False, ec="red", lw=1.5))
    ax.set_xticks(range(len(src_words)), src_words)
    ax.set_yticks(range(len(out_words)), out_words)
    ax.set(xlabel="source token (key)", ylabel="output token being written (query)",
           title=test_set.text[i][0])
fig.suptitle(f"cross-attention, layer {best_layer} head {best_head}; red: where the answer is")
fig.tight_layout()

# %% [markdown]
# ### Self-attention heads
#
# The encoder's self-attention for the same example, every layer and head: some heads look at
# a fixed offset (the previous or next token), some gather the digits of one field, some look at
# the `</s>` anchor.

# %%
maps, src_words, in_words, out_words = attention_maps(model, examples[0])
fig = plots.heatmap_grid(maps["encoder self-attention"], src_words, src_words,
                         row_titles=[f"layer {l}" for l in range(n_layers)],
                         col_titles=[f"head {h}" for h in range(n_heads)],
                         title=f"encoder self-attention: {test_set.text[examples[0]][0]}")

# %% [markdown]
# ### Explore
#
# Pick a held-out example, the kind of attention, the layer and the head. `head = -1` shows the
# mean over heads.

# %%
def draw_attention(example=examples[1], kind="cross-attention", layer=best_layer, head=best_head):
    maps, src_words, in_words, out_words = attention_maps(model, example)
    w = maps[kind][layer]  # (H, Lq, Lk)
    w = w.mean(0) if head < 0 else w[head]
    rows = out_words if kind != "encoder self-attention" else src_words
    cols = {"cross-attention": src_words, "decoder self-attention": in_words,
            "encoder self-attention": src_words}[kind]
    which = "mean over heads" if head < 0 else f"head {head}"
    return plots.attention_heatmap(w, rows, cols,
                                   title=f"{kind}, layer {layer}, {which}\n{test_set.text[example][0]}")


explorer = explore(draw_attention, example=(0, len(test_set) - 1, 1, examples[1]),
                   kind=["cross-attention", "decoder self-attention", "encoder self-attention"],
                   layer=(0, n_layers - 1, 1, best_layer), head=(-1, n_heads - 1, 1, best_head))

# %% [markdown]
# ## 9. Saving and loading a checkpoint
#
# A model's `state_dict()` holds every parameter **and buffer** (here also the positional
# encoding table `pos_encoding.pe`) by name. A checkpoint stores it together with the constructor
# arguments, so the model can be rebuilt before the weights are loaded. (To resume training,
# save `optimizer.state_dict()` and the step too: Adam's moment estimates are part of the
# state.) We write to a temporary directory and read it back:

# %%
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "date_transformer.pt")
    s2s.save_model(path, model, s2s.MODEL_CONFIG, steps=result.steps)
    print(f"saved {os.path.getsize(path) / 1024:.0f} KiB: {path}")
    restored, ckpt = s2s.load_model(path, type(model))  # your Transformer class
print("checkpoint keys:", list(ckpt), "| first weights:", list(ckpt["state_dict"])[:4])
src, tgt = test_set.batch(torch.arange(64))
with torch.no_grad():
    same_logits = torch.equal(model.eval()(src, tgt), restored(src, tgt))
same_output = torch.equal(decode_fn(model, src, 12, s2s.BOS, s2s.EOS),
                          decode_fn(restored, src, 12, s2s.BOS, s2s.EOS))
print(f"identical logits: {same_logits}, identical decoded dates: {same_output}")

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** In training, the decoder reads the target shifted right (`<s> y1 ... y(n-1)`)
# and is scored on `y1 ... yn`. What would happen if it read the unshifted target `y1 ... yn`
# and were scored on the same `y1 ... yn`?

# %% [answer] q_shift_target 1
# ### BEGIN SOLUTION
# The causal mask lets position $i$ read itself, so it would see $y_i$, the very token it must
# predict: the model learns to copy its input, the loss falls to almost 0, and nothing about
# translation is learned. At generation time the token to copy does not exist yet, so greedy
# decoding produces garbage.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** Why does cross-attention need the **source** padding mask, and what would you
# observe if it were left out?

# %% [answer] q_cross_pad 1
# ### BEGIN SOLUTION
# The memory holds one vector per source position, padding included. Without the mask every
# decoder query also attends to the encodings of the pad tokens, so the decoder's states (and
# the output) depend on how much padding the sentence received, i.e. on which other sentences
# share its batch: the same source decodes differently alone and in a batch, and the model
# wastes attention on meaningless positions.
# ### END SOLUTION

# %% [markdown]
# ## 10. Mistakes worth recognising
#
# Each of these appears in published tutorials or in the study notes this course grew from;
# the checks above name each one.
#
# | mistake | what happens |
# | --- | --- |
# | the decoder is fed the source (`decoder(x, enc_out)`) | one prediction per source token; cannot produce a longer output, cannot generate |
# | the decoder input is not shifted (or the labels are not) | the loss falls to ~0 by copying; decoding produces garbage |
# | a softmax before `F.cross_entropy` | probabilities get log-softmaxed again; gradients vanish, the loss stalls |
# | `ignore_index=-1` (or none) with padding id 0 | the model is trained to predict padding; the loss is diluted |
# | one embedding table for both sides | works only when the vocabularies coincide; silently wrong otherwise |
# | no $\sqrt{d_\text{model}}$ (or scaling after adding PE) | the token signal is small next to the positions (or the positions get scaled too) |
# | default `N(0, 1)` embeddings *and* the $\sqrt{d}$ scale | embeddings 11-12x the positional encoding at $d=64$ (measured in section 2; $8 / 0.71 \approx 11$), which the positions barely perturb |
# | source padding mask only in the encoder | the cross-attention reads padding: results change with the batch |
# | masks built with `== 0` instead of `== pad_id` | correct only while the pad id happens to be 0 |
# | decoding with the logits of position 0, or without the causal mask | wrong tokens; multi-layer models change their past |
# | not padding finished rows, stopping when the *first* row ends | outputs of the wrong length or with junk after `</s>` |
# | label smoothing spread over the $V-1$ wrong classes, or the KL divergence instead of the cross-entropy | not what `label_smoothing=` computes: a different (or shifted) loss |
# | indexing the log-probabilities with `ignore_index` (-100) | an index error, or padding counted in the mean |
# | `log(softmax(x))` instead of `log_softmax(x)` | `-inf` and NaN losses for confident logits |
#
# **Next:** `08_decoder_only`: drop the encoder, and the decoder alone becomes a GPT-style
# language model.
