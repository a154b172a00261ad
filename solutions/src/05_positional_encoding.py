#| default_exp positional
# %% [markdown]
# # 05 · Positional encoding: telling attention where each token is
#
# Attention compares every token with every other token, but nothing in its formula says
# *where* a token sits. In this notebook you will:
#
# 1. **see** that attention without positions cannot tell "dog bites man" from "man bites dog",
# 2. build the **sinusoidal positional encoding** of *Attention Is All You Need*, one formula,
#    and look at it from every side: the heatmap, single dimensions, similarity against distance,
# 3. prove that moving $k$ positions is a **fixed rotation** of the code, the same at every
#    position, and build that matrix,
# 4. package the table as a **module** the way real models do (a buffer, sliced on the right
#    axis, with a clear error past its length), and compare it with **learned** positions.
#
# **How the exercises work.** A cell that says `# YOUR CODE HERE` is yours: replace the
# `raise NotImplementedError()` with your code. The cell after it checks your work and, when
# something is off, tells you what and why. Run every cell from the top (*Run → Run All
# Cells*). Before you hand in, run *Validate* (or `nbgrader validate 05_positional_encoding.ipynb`).
# Hidden tests with other sizes and bases run when your work is graded, so write code that works
# for any even `d_model`, not just the examples.

# %% [setup] setup_imports
import copy
import math

import matplotlib.pyplot as plt
import torch
from torch import nn

from tfscratch import checks, plots
from tfscratch import reference as R
from tfscratch.fallback import pick
from tfscratch.reference import MultiHeadAttention
from tfscratch.widgets import explore

torch.manual_seed(0)
%matplotlib inline

chk = checks.notebook("05_positional_encoding")  # the graded checks of this notebook

# %% [markdown]
# ## 1. Attention cannot see order
#
# Self-attention turns a sequence $x_1, \dots, x_L$ into outputs $y_1, \dots, y_L$ where each
# $y_i$ is a weighted average of (projected) values, with weights computed from dot products.
# Shuffle the input tokens and every dot product is still there, just in another row and
# column; every weighted average is the same, just in another place. In symbols, for any
# permutation $\pi$:
#
# $$\operatorname{Attn}(x_{\pi(1)}, \dots, x_{\pi(L)}) = (y_{\pi(1)}, \dots, y_{\pi(L)})$$
#
# Attention is **permutation-equivariant**: permute the input, and the output permutes the
# same way, nothing else changes. Let us watch it happen with the multi-head attention of
# notebook 03 (the course's reference copy) on two sentences made of the same three words.

# %%
torch.manual_seed(0)
d_model = 16
vocab = {"dog": 0, "bites": 1, "man": 2}
embed = nn.Embedding(len(vocab), d_model)
mha = MultiHeadAttention(d_model, n_heads=2).eval()

def encode(words):
    x = embed(torch.tensor([[vocab[w] for w in words]]))  # (1, L, D)
    return x

s1, s2 = ["dog", "bites", "man"], ["man", "bites", "dog"]
with torch.no_grad():
    x1, x2 = encode(s1), encode(s2)
    y1 = mha(x1, x1, x1)
    w1 = mha.attn_weights[0, 0]  # (L, L) weights of head 0, kept by the module for plotting
    y2 = mha(x2, x2, x2)
    w2 = mha.attn_weights[0, 0]

# "dog" is token 0 of s1 and token 2 of s2: its output vector is the same in both sentences
print("output for 'dog' identical in both sentences:", torch.allclose(y1[0, 0], y2[0, 2], atol=1e-6))
print("output for 'man' identical in both sentences:", torch.allclose(y1[0, 2], y2[0, 0], atol=1e-6))

# the same on random data: permute 10 tokens, the outputs come out permuted the same way
x = torch.randn(1, 10, d_model)
perm = torch.randperm(10)
with torch.no_grad():
    gap = (mha(x[:, perm], x[:, perm], x[:, perm]) - mha(x, x, x)[:, perm]).abs().max().item()
print(f"random permutation of 10 tokens: max |Attn(x[perm]) - Attn(x)[perm]| = {gap:.1e}")

# %%
fig = plots.attention_heatmap(w1, s1, s1, title="head 0, 'dog bites man'", figsize=(4.2, 3.4))
fig = plots.attention_heatmap(w2, s2, s2, title="head 0, 'man bites dog'", figsize=(4.2, 3.4))

# %% [markdown]
# The second map is the first with its rows and columns reordered: the same numbers, the same
# pairs of words. Whoever bit whom, the model computes the same thing for each word. Order has
# to be **put into the vectors** before attention sees them. The Transformer adds to every
# token vector a vector that depends only on its position, $x_{pos} + PE(pos)$.
#
# ## 2. The sinusoidal encoding
#
# *Attention Is All You Need* uses, for position $pos$ and dimension pair $i = 0, \dots,
# d_{model}/2 - 1$:
#
# $$PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{\text{base}^{2i/d_{model}}}\right), \qquad
#   PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{\text{base}^{2i/d_{model}}}\right), \qquad
#   \text{base} = 10000.$$
#
# Read it column by column: dimensions $2i$ and $2i+1$ form a **pair** that shares one angular
# frequency
#
# $$\omega_i = \text{base}^{-2i/d_{model}},$$
#
# the even one holding $\sin(pos\,\omega_i)$, the odd one $\cos(pos\,\omega_i)$. The $2i$ and
# $2i+1$ are **dimension** indices. (One set of study notes reads them as "tokens at even
# positions use sin, tokens at odd positions cos"; that is not it: every position uses both,
# in alternating columns.)
#
# ### Frequencies, two ways
#
# You will meet $\omega_i$ written two ways. Directly, as $1 / \text{base}^{2i/d}$, or, as in
# most code, through exp and log:
#
# $$\text{base}^{-2i/d} = e^{\ln\left(\text{base}^{-2i/d}\right)} = e^{-\frac{2i}{d}\ln \text{base}}
# \quad\Longrightarrow\quad \texttt{torch.exp(torch.arange(0, d, 2) * -(math.log(base) / d))}$$
#
# The same number: the exp/log form is a habit from older code, not a numerical necessity.
# `torch.arange(0, d, 2)` already yields $0, 2, 4, \dots$, the values of $2i$.

# %%
d_model, base = 16, 10000.0
two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # 0, 2, 4, ..., d-2: the values of 2i
omega_direct = 1.0 / base ** (two_i / d_model)
omega_explog = torch.exp(two_i * -(math.log(base) / d_model))
print("omega (direct):  ", [f"{w:.2e}" for w in omega_direct.tolist()])
print("omega (exp/log): ", [f"{w:.2e}" for w in omega_explog.tolist()])
print(f"largest difference: {(omega_direct - omega_explog).abs().max().item():.1e} (float64)")
o32 = torch.exp(two_i.float() * -(math.log(base) / d_model))
print(f"largest difference in float32: {(o32.double() - omega_direct).abs().max().item():.1e}")

# %% [markdown]
# ### Wavelengths form a geometric progression
#
# A sine with angular frequency $\omega_i$ repeats every $\lambda_i = 2\pi/\omega_i =
# 2\pi\,\text{base}^{2i/d}$ positions. Going from one pair to the next multiplies the
# wavelength by the same factor,
#
# $$\frac{\lambda_{i+1}}{\lambda_i} = \text{base}^{2/d},$$
#
# so the wavelengths run geometrically from $2\pi \approx 6.3$ positions (the first pair turns
# once every six tokens) to almost $2\pi \cdot \text{base}$ (the last pair barely moves over a
# whole document). Compare a binary counter: its bits flip every 1, 2, 4, 8, ... steps, a
# geometric progression with ratio 2. The sinusoids are a smooth counter with ratio
# $\text{base}^{2/d}$: fast pairs tell neighbours apart, slow pairs tell far-apart regions apart.
# On a log scale a geometric progression is a straight line:

# %%
d_model = 64
i = torch.arange(d_model // 2, dtype=torch.float64)
wavelength = 2 * math.pi * base ** (2 * i / d_model)
ratios = wavelength[1:] / wavelength[:-1]
print(f"first wavelengths: {[round(w, 1) for w in wavelength[:4].tolist()]} ... "
      f"last: {wavelength[-1].item():,.0f} positions")
print(f"ratio between neighbours: min {ratios.min().item():.6f}, max {ratios.max().item():.6f}, "
      f"base^(2/d) = {base ** (2 / d_model):.6f}")
fig = plots.curves(i.tolist(), {f"base = {b:g}": (2 * math.pi * b ** (2 * i / d_model)).tolist()
                                for b in (10000.0, 1000.0, 100.0)},
                   xlabel="pair index i (dimensions 2i and 2i+1)", ylabel="wavelength (positions)",
                   logy=True, markers=True, title=f"wavelengths for d_model = {d_model}: straight "
                   "lines on a log scale")

# %% [markdown]
# ### Exercise 1: `sinusoidal_positional_encoding`
#
# Return the whole table, shape `(max_len, d_model)`, dtype float32: row `pos` is the code of
# position `pos` (positions start at 0), column `2i` holds $\sin(pos\,\omega_i)$, column `2i+1`
# holds $\cos(pos\,\omega_i)$.
#
# - positions as a column `(max_len, 1)` times frequencies `(d_model/2,)` broadcast to all the
#   angles at once, `(max_len, d_model/2)`; no Python loops needed;
# - fill the even columns with `pe[:, 0::2] = ...` and the odd ones with `pe[:, 1::2] = ...`;
# - use the `base` argument, not a hard-coded 10000;
# - compute in float64 and return `.float()`: in float32 the angle `pos * omega` is off by
#   about $10^{-7} \cdot pos$, 4e-4 at position 5000. (The checks allow for float32 anyway.)
#
# Tests use even `d_model` only.

# %% [solution] sinusoidal_positional_encoding
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    """The sinusoidal table of 'Attention Is All You Need'.

    Returns a float32 tensor of shape (max_len, d_model) with
        pe[pos, 2i]   = sin(pos * base ** (-2i / d_model))
        pe[pos, 2i+1] = cos(pos * base ** (-2i / d_model))
    for pos = 0 .. max_len - 1 and i = 0 .. d_model/2 - 1.
    """
    ### BEGIN SOLUTION
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,): 0, 2, 4, ...
    omega = torch.exp(two_i * -(math.log(base) / d_model))  # base^(-2i/d)
    angles = pos * omega  # (max_len, d_model/2): broadcast, one angle per position and pair
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)  # even columns
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])  # odd columns (one fewer if d is odd)
    return pe.float()
    ### END SOLUTION

# %% [tests] sinusoidal_positional_encoding

# %% [markdown]
# ### A worked example from the study notes, checked
#
# One set of study notes works a small example by hand: four 4-dimensional word vectors
# (for "I like to code") plus their positional codes. The formula it writes uses base 10000;
# the code it prints underneath, `PositionEncoding(seq_len=4, d_model=4, n=100)`, uses base
# 100. With `d_model = 4` only the second pair (columns 2, 3) depends on the base: its
# frequency is $10000^{-1/2} = 0.01$ for one and $100^{-1/2} = 0.1$ for the other. Which base
# did the printed sum use? We compute both and compare every printed entry at the precision it
# was printed with (rounded or cut off).

# %%
x_notes = torch.tensor([[0.1, 0.2, 0.3, 0.4],
                        [0.2, 0.3, 0.4, 0.5],
                        [0.3, 0.4, 0.5, 0.6],
                        [0.4, 0.5, 0.6, 0.7]])
printed_sum = [["0.1", "1.2", "0.3", "1.4"],  # x + PE as printed in the notes
               ["1.041", "0.84", "0.41", "1.49"],
               ["1.209", "-0.016", "0.52", "1.59"],
               ["0.541", "-0.489", "0.895", "1.655"]]
printed_table = torch.tensor([[0.0, 1.0, 0.0, 1.0],  # the notes' printed output of their code, n=100
                              [0.84147098, 0.54030231, 0.09983342, 0.99500417],
                              [0.90929743, -0.41614684, 0.19866933, 0.98006658],
                              [0.14112001, -0.9899925, 0.29552021, 0.95533649]])

def agrees(value, text):
    """Does `value` round or truncate to the printed `text`?"""
    n = len(text.split(".")[1]) if "." in text else 0
    target = float(text)
    return abs(round(value, n) - target) < 1e-9 or abs(math.trunc(value * 10**n) / 10**n - target) < 1e-9

# your function (or the course's, while yours is still a stub)
pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
sums = {b: x_notes + pe_fn(4, 4, base=b) for b in (10000.0, 100.0)}
print("pos | printed x + PE              | which base each entry agrees with")
for pos in range(4):
    verdict = []
    for col in range(4):
        ok = [f"{b:g}" for b in (10000.0, 100.0) if agrees(sums[b][pos, col].item(), printed_sum[pos][col])]
        verdict.append("both" if len(ok) == 2 else (ok[0] if ok else "neither"))
    print(f"{pos:3d} | {' '.join(f'{t:>6}' for t in printed_sum[pos])} | {' '.join(f'{v:>7}' for v in verdict)}")
print("\nour table with base=100 reproduces the notes' printed code output:",
      torch.allclose(pe_fn(4, 4, base=100.0), printed_table, atol=1e-6))

# %% [markdown]
# Columns 0 and 1 (frequency 1) agree with both bases, as they must. Columns 2 and 3 give it
# away: positions 1 and 2 were computed with base 10000 ($0.4 + \sin 0.01 = 0.41$,
# $0.6 + \cos 0.02 = 1.5998$), position 3 with base 100 ($0.6 + \sin 0.3 = 0.895$,
# $0.7 + \cos 0.3 = 1.655$). The notes mix the two bases inside one matrix. Our
# function, given `base=100`, reproduces the table their code prints exactly. The lesson is
# general: a worked example is only as good as the code that checks it.
#
# ## 3. Looking at the encoding
#
# ### The heatmap
#
# Every row below is the code of one position, every column one dimension. Read it left to
# right: the first pairs turn fast (a few positions per cycle, the fine "ticks"); each pair to
# the right turns slower, until the last ones barely change over a hundred positions (only
# their starting values show: sin 0 = 0 in even columns, cos 0 = 1 in odd ones). Every row is
# different, and rows close together look alike.

# %%
max_len, d_model = 100, 128
pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
pe = pe_fn(max_len, d_model)

fig = plots.heatmap(pe, xlabel="embedding dimension  (even columns: sin, odd columns: cos)",
                    ylabel="position in the sequence", cmap="RdBu_r", vmin=-1, vmax=1,
                    figsize=(11, 5.6),
                    title="Sinusoidal positional encoding: each row is the code of one position")
ax, cbar_ax = fig.axes
cbar_ax.set_ylabel("encoding value")
ax.images[0].set_interpolation("nearest")
ax.set_xticks(range(0, d_model + 1, 16))
ax.set_yticks(range(0, max_len, 10))
top = ax.secondary_xaxis("top")  # the wavelength of the pair each column belongs to
ticks = list(range(0, d_model, 16))
top.set_xticks(ticks, [f"{2 * math.pi * 10000 ** (j / d_model):,.0f}" for j in ticks])
top.set_xlabel("wavelength of that column's pair, in positions  (2π · 10000^(2i/d))")
fig.tight_layout()

# %% [markdown]
# The interleaving makes the right half look striped. The same table with the sine columns
# first and the cosine columns after (a reordering for the eye only; a model does not care in
# which order its dimensions come) shows the two smooth fans the stripes are made of:

# %%
reordered = torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)  # (max_len, d): [all sin | all cos]
fig = plots.heatmap(reordered, xlabel="pair index i  (left half: sin columns 2i; right half: cos columns 2i+1)",
                    ylabel="position in the sequence", cmap="RdBu_r", vmin=-1, vmax=1, figsize=(11, 4.6),
                    title="The same table, sin columns first, then cos columns\n")
ax, cbar_ax = fig.axes
cbar_ax.set_ylabel("encoding value")
ax.set_xticks(range(0, d_model, 16), [str(j % (d_model // 2)) for j in range(0, d_model, 16)])
ax.axvline(d_model / 2 - 0.5, color="black", lw=1.5)
halves = ax.secondary_xaxis("top")
halves.set_xticks([d_model / 4, 3 * d_model / 4], ["sin(pos · ω_i)", "cos(pos · ω_i)"])
halves.tick_params(length=0)
fig.tight_layout()

# %% [markdown]
# ### Single dimensions
#
# One column of the table, plotted against position, is a plain sine or cosine. Dimensions 4
# and 5 are one pair (sin and cos of the same frequency, a quarter-cycle apart); each later pair
# is slower by the factor $10000^{2/d}$.

# %%
positions = list(range(max_len))
chosen = [10, 11, 24, 40, 64]
fig = plots.curves(positions,
                   {f"dim {j} ({'sin' if j % 2 == 0 else 'cos'}, wavelength {2 * math.pi * 10000 ** ((j - j % 2) / d_model):.0f})":
                    pe[:, j] for j in chosen},
                   xlabel="position", ylabel="encoding value", figsize=(10, 3.6),
                   title=f"columns of the table (d_model = {d_model})")

# %% [markdown]
# ### Similarity depends only on distance
#
# How alike are the codes of positions $p$ and $q$? Their dot product, pair by pair, is
# $\sin(p\omega)\sin(q\omega) + \cos(p\omega)\cos(q\omega) = \cos((p - q)\,\omega)$, so
#
# $$PE(p) \cdot PE(q) = \sum_{i=0}^{d/2-1} \cos\big((p - q)\,\omega_i\big).$$
#
# It depends on $p - q$ only, not on where the two positions are, and since cosine is even,
# only on $|p - q|$. It is largest, $d/2$, at distance 0 and falls off (not monotonically) as
# the distance grows. The matrix of all dot products is therefore constant along every
# diagonal:

# %%
sim = pe.double() @ pe.double().T  # (max_len, max_len): PE(p) . PE(q) for every pair
fig = plots.heatmap(sim, xlabel="position q", ylabel="position p", cmap="magma", figsize=(6.2, 5),
                    title="PE(p) · PE(q): constant along each diagonal")
fig.axes[1].set_ylabel("dot product")

offsets = list(range(-10, 30))
omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
curves_by_p = {f"p = {p}": [sim[p, p + k].item() for k in offsets] for p in (10, 40, 70)}
curves_by_p["Σ cos(k ω_i)"] = [torch.cos(k * omega).sum().item() for k in offsets]
fig = plots.curves(offsets, curves_by_p, xlabel="distance k = q - p", ylabel="PE(p) · PE(p + k)",
                   markers=True, figsize=(8, 3.4),
                   title="the same curve from every starting position (the curves overlap)")
spread = max(abs(sim[p, p + k] - sim[10, 10 + k]).item() for p in range(10, 70) for k in offsets)
print(f"largest difference between starting positions: {spread:.1e}")

# %% [markdown]
# ### Explore: dimension, position and base
#
# Move the sliders. `dimension` picks a column (the green box on the left, its curve in the
# middle); `position` picks a row (the black line, the dot in the middle, and on the right its
# similarity with every other position); `log10_base` sets the base, $10^{1}$ to $10^{5}$.
# A small base squeezes all wavelengths (the whole table turns fast, and distant positions
# start to look alike again once the slow pairs come round); a large base stretches them.

# %%
pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))

def draw_encoding(dimension=10, position=30, log10_base=4.0):
    L, d = 128, 64
    b = 10.0 ** log10_base
    table = pe_fn(L, d, base=b)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9), gridspec_kw={"width_ratios": [1.25, 1, 1]})
    ax = axes[0]
    ax.imshow(table.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.add_patch(plt.Rectangle((dimension - 0.5, -0.5), 1, L, fill=False, edgecolor="limegreen", lw=2))
    ax.axhline(position, color="black", lw=1.5)
    ax.set(xlabel="dimension", ylabel="position", title=f"PE table, base = {b:,.0f}")
    pair = dimension // 2
    wl = 2 * math.pi * b ** (2 * pair / d)
    ax = axes[1]
    ax.plot(range(L), table[:, dimension].numpy(), color="green")
    ax.plot([position], [table[position, dimension].item()], "o", color="black")
    ax.set(xlabel="position", ylabel="encoding value", ylim=(-1.1, 1.1),
           title=f"dim {dimension} ({'sin' if dimension % 2 == 0 else 'cos'}), wavelength {wl:,.1f}")
    ax.grid(alpha=0.3)
    ax = axes[2]
    ax.plot(range(L), (table @ table[position]).numpy(), color="black")
    ax.axvline(position, color="black", ls=":", lw=1)
    ax.set(xlabel="position q", ylabel=f"PE({position}) · PE(q)", title="similarity to the chosen position")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig

explorer = explore(draw_encoding, dimension=(0, 63, 1, 10), position=(0, 127, 1, 30),
                   log10_base=(1.0, 5.0, 0.25, 4.0))

# %% [markdown]
# ## 4. Shifting by $k$ positions is a rotation
#
# Why sines *and* cosines? Because together they make moving along the sequence a **linear**
# operation. Take one pair, write $s = \sin(pos\,\omega)$, $c = \cos(pos\,\omega)$ and
# $t = k\,\omega$. The angle-addition formulas
#
# $$\sin(pos\,\omega + t) = s\cos t + c\sin t, \qquad \cos(pos\,\omega + t) = c\cos t - s\sin t$$
#
# say, in matrix form,
#
# $$\begin{pmatrix} PE_{(pos+k,\,2i)} \\ PE_{(pos+k,\,2i+1)} \end{pmatrix} =
#   \underbrace{\begin{pmatrix} \cos k\omega_i & \sin k\omega_i \\ -\sin k\omega_i & \cos k\omega_i \end{pmatrix}}_{R_i(k)}
#   \begin{pmatrix} PE_{(pos,\,2i)} \\ PE_{(pos,\,2i+1)} \end{pmatrix}.$$
#
# $R_i(k)$ is a rotation of the $(\sin, \cos)$ plane by the angle $k\omega_i$, and it does
# **not** involve $pos$. Stacking the pairs, one matrix moves every code forward by $k$:
#
# $$PE(pos + k) = M_k\, PE(pos), \qquad M_k = \operatorname{blockdiag}\big(R_0(k), R_1(k), \dots, R_{d/2-1}(k)\big).$$
#
# So "the token $k$ places back" is the same linear map wherever you stand: exactly the kind of
# relation a linear layer (a query or key projection) can learn once and use everywhere. Note
# the order inside the block: the pair is $(\sin, \cos)$, so the block is
# $\begin{pmatrix}\cos & \sin\\ -\sin & \cos\end{pmatrix}$, the **transpose** of the textbook
# rotation $\begin{pmatrix}\cos & -\sin\\ \sin & \cos\end{pmatrix}$, which here would move
# backwards, to $pos - k$.
#
# ### Exercise 2: `pe_shift_matrix`
#
# Return $M_k$ for `offset` $= k$: a float32 `(d_model, d_model)` matrix, zero outside the
# $2 \times 2$ blocks on the diagonal, with `M @ pe[pos] == pe[pos + offset]` for every `pos`
# (for the table built with the same `base`). Tests use even `d_model` and `offset >= 0`.

# %% [solution] pe_shift_matrix
def pe_shift_matrix(offset, d_model, base=10000.0):
    """The matrix M (d_model, d_model), float32, with pe[pos + offset] = M @ pe[pos] for all pos.

    Block-diagonal: for each pair (2i, 2i+1) the 2x2 block
        [[cos(offset * w_i),  sin(offset * w_i)],
         [-sin(offset * w_i), cos(offset * w_i)]]   with w_i = base ** (-2i / d_model),
    and zeros everywhere else.
    """
    ### BEGIN SOLUTION
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,)
    theta = offset * torch.exp(two_i * -(math.log(base) / d_model))  # angle of each pair
    c, s = torch.cos(theta), torch.sin(theta)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    ev = torch.arange(0, d_model, 2)  # row/column index of each pair's sin entry
    M[ev, ev], M[ev, ev + 1] = c, s  # new sin = sin cos t + cos sin t
    M[ev + 1, ev], M[ev + 1, ev + 1] = -s, c  # new cos = cos cos t - sin sin t
    return M.float()
    ### END SOLUTION

# %% [tests] pe_shift_matrix

# %% [markdown]
# ### Derived, now checked
#
# The matrix for $k = 3$ in 16 dimensions: eight $2 \times 2$ rotations on the diagonal. The
# first blocks turn by a large angle (fast pairs), the last ones hardly at all (they are close
# to the identity).

# %%
d_model, k = 16, 3
pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
shift_fn = pick("pe_shift_matrix", lambda: pe_shift_matrix, lambda: R.pe_shift_matrix,
                check=lambda f: f(1, 4))
M = shift_fn(k, d_model)
fig = plots.heatmap(M, list(range(d_model)), list(range(d_model)), xlabel="input dimension (of PE(pos))",
                    ylabel="output dimension (of PE(pos + k))", cmap="RdBu_r", vmin=-1, vmax=1,
                    figsize=(6.6, 5.6), title=f"M_k for k = {k}: block-diagonal rotations")

table = pe_fn(500, d_model).double()
shifted = table[:-k] @ M.double().T  # row pos: M @ PE(pos)
print(f"max |M @ PE(pos) - PE(pos + {k})| over 497 positions: "
      f"{(shifted - table[k:]).abs().max().item():.1e}")
print(f"M is orthogonal (a rotation): max |M M^T - I| = "
      f"{(M @ M.T - torch.eye(d_model)).abs().max().item():.1e}")
print(f"shifting by 2 then by 5 is shifting by 7: max |M_5 M_2 - M_7| = "
      f"{(shift_fn(5, d_model) @ shift_fn(2, d_model) - shift_fn(7, d_model)).abs().max().item():.1e}")
print(f"M_k = M_1^k: max |M_1^3 - M_3| = "
      f"{(torch.linalg.matrix_power(shift_fn(1, d_model), 3) - M).abs().max().item():.1e}")

# %% [markdown]
# The same rotation is the heart of **rotary position embeddings** (RoPE, used by most current
# language models): instead of adding $PE(pos)$ to the token once, they rotate each query and
# key by $M_{pos}$ inside attention. Since rotations preserve dot products,
# $(M_p q) \cdot (M_{p'} k) = q \cdot M_{p' - p}\, k$: the score sees only the relative offset.
#
# ## 5. The module: a buffer, sliced on the sequence axis
#
# A model builds the table once, in `__init__`, and adds its first `L` rows in `forward`. Where
# to keep it? A module can hold a tensor in three ways, and only one is right for a fixed table:
#
# | | `nn.Parameter` | plain attribute `self.pe = t` | `register_buffer("pe", t)` |
# | --- | --- | --- | --- |
# | in `model.parameters()` (the optimizer trains it) | yes: wrong, the table drifts | no | no |
# | in `state_dict()` (saved and loaded with the model) | yes | **no** | yes |
# | moved by `model.to(device)` / cast by `.double()` | yes | **no**: device mismatch on the GPU | yes |
#
# A buffer is part of the model's state without being trained. Try all three: `.to("meta")`
# moves a model to PyTorch's data-less "meta" device, which shows a device move without a GPU.

# %%
class AsParameter(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.pe = nn.Parameter(table)

class AsAttribute(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.pe = table

class AsBuffer(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.register_buffer("pe", table)

pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
table = pe_fn(50, 8)
print(f"{'':12s} {'trained':>8s} {'saved':>6s} {'after .to(meta)':>16s} {'requires_grad':>14s}")
for cls in (AsParameter, AsAttribute, AsBuffer):
    m = cls(table.clone())
    trained = any(p is m.pe for p in m.parameters())
    saved = "pe" in m.state_dict()
    moved = m.to("meta").pe.device.type
    print(f"{cls.__name__:12s} {str(trained):>8s} {str(saved):>6s} {moved:>16s} {str(m.pe.requires_grad):>14s}")

# %% [markdown]
# ### Exercise 3: `PositionalEncoding`
#
# `PositionalEncoding(d_model, max_len=5000, dropout=0.0)`:
#
# - in `__init__`, build the table with your `sinusoidal_positional_encoding(max_len, d_model)`
#   and register it as the buffer `pe`, shape `(max_len, d_model)` (or `(1, max_len, d_model)`,
#   or PyTorch tutorial's sequence-first `(max_len, 1, d_model)` transposed for batch-first
#   input: the tests compare the values added, not the layout); keep an `nn.Dropout(dropout)`;
# - `forward(x)` takes `x` of shape `(B, L, d_model)` (batch first) and returns
#   `dropout(x + pe[:L])`, same shape: the first `L` rows, sliced on the **sequence** axis
#   (`L = x.size(1)`), broadcast over the batch;
# - when `L > max_len`, raise an error: there is no row for the extra positions. Any exception
#   passes the test, but a `ValueError` whose message mentions `max_len` helps the reader far
#   more than a broadcasting error about "size of tensor a";
# - do not scale `x` here (the $\sqrt{d_{model}}$ factor belongs to the embedding, section 6),
#   and do not modify `x` in place.

# %% [solution] PositionalEncoding
class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to batch-first input.

    PositionalEncoding(d_model, max_len=5000, dropout=0.0)
    buffer pe: (max_len, d_model), not a parameter.
    forward(x): x (B, L, d_model) -> dropout(x + pe[:L]), (B, L, d_model);
                ValueError mentioning max_len when L > max_len.
    """

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        ### BEGIN SOLUTION
        self.dropout = nn.Dropout(dropout)
        # a buffer: saved in state_dict, moved by .to(device), never trained
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))  # (max_len, D)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        B, L, D = x.shape
        max_len = self.pe.size(0)
        if L > max_len:
            raise ValueError(f"sequence length {L} exceeds max_len={max_len}: build "
                             f"PositionalEncoding with a larger max_len")
        return self.dropout(x + self.pe[:L])  # (L, D) broadcasts over the batch axis
        ### END SOLUTION

# %% [tests] PositionalEncoding

# %% [markdown]
# ### The `size(0)` trap
#
# A popular tutorial (and the study notes copying it) writes the forward as
# `word_embeddings + self.pe[:word_embeddings.size(0), :]`. For **unbatched** input `(L, D)`,
# `size(0)` is the length and all is well. Feed it a batch `(B, L, D)` and `size(0)` is the
# **batch size**. What happens then depends on luck:

# %%
def notes_forward(pe_table, x):
    return x + pe_table[:x.size(0), :]  # the notes' slicing: right for (L, D) input only

pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
table = pe_fn(50, 4)
L = 5
for B in (1, 5, 3):
    x = torch.zeros(B, L, 4)  # zeros, so the output is the code that was added
    try:
        out = notes_forward(table, x)
        right = torch.allclose(out, x + table[:L])
        print(f"B={B}, L={L}: no error; {'correct (B == L, by luck)' if right else 'WRONG'}; "
              f"code added at positions 0 and 4: {out[0, 0].tolist()} / {[round(v, 3) for v in out[0, 4].tolist()]}")
    except RuntimeError as e:
        print(f"B={B}, L={L}: RuntimeError: {str(e)[:80]}...")

# %% [markdown]
# With one sequence per batch every position silently gets the code of position 0: the model
# trains, and never learns anything about order. With `B == L` it is right by coincidence, and
# any other batch size crashes. (PyTorch's own tutorial keeps a `(max_len, 1, D)` table and
# slices `size(0)` because its inputs are sequence-first, `(L, B, D)`; this course is batch
# first everywhere, so the sequence axis is 1.) The batch-invariance test above feeds the same
# sequence at batch sizes 1, 3, 4 and 6 to catch exactly this.
#
# ## 6. Adding positions to token embeddings
#
# In a Transformer the input to the first layer is
#
# $$h_0 = \operatorname{Embedding}(tokens)\cdot\sqrt{d_{model}} + PE_{[:L]}.$$
#
# Why multiply by $\sqrt{d_{model}}$? In the original model the embedding matrix is shared with
# the output layer, whose weights are typically initialised with entries of size about
# $1/\sqrt{d_{model}}$, so a token vector has length about 1, while every positional code has length $\sqrt{d_{model}/2}$
# (each pair contributes $\sin^2 + \cos^2 = 1$). Unscaled, position would drown the token;
# multiplied by $\sqrt{d_{model}}$ the two are of the same size at every width:

# %%
pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
widths = [16, 32, 64, 128, 256, 512, 1024]
lengths = {"token vector, init std 1/sqrt(d)": [], "token vector × sqrt(d_model)": [],
           "positional code PE(pos)": []}
for d in widths:
    emb = nn.Embedding(1000, d)
    nn.init.normal_(emb.weight, std=d ** -0.5)  # the scale of a weight shared with the output layer
    tok = emb.weight.detach().norm(dim=-1).mean().item()
    lengths["token vector, init std 1/sqrt(d)"].append(tok)
    lengths["token vector × sqrt(d_model)"].append(tok * math.sqrt(d))
    lengths["positional code PE(pos)"].append(pe_fn(64, d).norm(dim=-1).mean().item())
fig = plots.curves(widths, lengths, xlabel="d_model", ylabel="mean vector length", logy=True,
                   markers=True, figsize=(7, 3.6), title="token and position vectors: same size only after scaling")
fig.axes[0].set_xscale("log", base=2)

# %% [markdown]
# (With `nn.Embedding`'s own default initialisation, standard deviation 1, token vectors already
# have length $\approx\sqrt{d_{model}}$; the factor is a convention tied to the initialisation.
# Notebook 07 follows the paper: embeddings times $\sqrt{d_{model}}$, then `PositionalEncoding`.)
#
# Now the sentences of section 1 again, this time with positions added. "dog" no longer gets
# the same output in both sentences, and the permutation test fails, as it should:

# %%
torch.manual_seed(0)
pos_enc = pick("PositionalEncoding", lambda: PositionalEncoding(d_model=16, max_len=64).eval(),
               lambda: R.PositionalEncoding(d_model=16, max_len=64).eval(),
               check=lambda m: m(torch.zeros(1, 3, 16)))
embed = nn.Embedding(len(vocab), 16)
mha = MultiHeadAttention(16, n_heads=2).eval()

def encode_with_positions(words):
    tokens = torch.tensor([[vocab[w] for w in words]])  # (1, L)
    return pos_enc(embed(tokens) * math.sqrt(16))  # (1, L, D)

with torch.no_grad():
    x1, x2 = encode_with_positions(s1), encode_with_positions(s2)
    y1, y2 = mha(x1, x1, x1), mha(x2, x2, x2)
    print("output for 'dog' identical in both sentences:", torch.allclose(y1[0, 0], y2[0, 2], atol=1e-6))
    x = torch.randn(1, 10, 16)
    xp = pos_enc(x[:, perm])
    gap = (mha(xp, xp, xp) - mha(pos_enc(x), pos_enc(x), pos_enc(x))[:, perm]).abs().max().item()
print(f"random permutation of 10 tokens, positions added: max difference = {gap:.2f}")

# %% [markdown]
# ## 7. The alternative: learned positions
#
# Instead of a formula, give every position its own trainable vector: an `nn.Embedding(max_len,
# d_model)` looked up with `arange(L)`. BERT and GPT-2 do this. It costs `max_len * d_model`
# parameters and can learn whatever suits the data; the original paper found both work about
# equally well. The differences:
#
# | | sinusoidal | learned |
# | --- | --- | --- |
# | parameters | none (a buffer) | `max_len × d_model`, trained |
# | beyond `max_len` | the formula is defined at any position (a table can be rebuilt longer) | no row exists: an error |
# | structure at the start | smooth: nearby positions are similar, shifts are rotations | none: random vectors |
# | what it needs | nothing | enough training data at every position |

# %%
class LearnedPositionalEmbedding(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        self.pos_embed = nn.Embedding(max_len, d_model)  # one trainable vector per position

    def forward(self, x):
        B, L, D = x.shape
        positions = torch.arange(L, device=x.device)  # (L,)
        return x + self.pos_embed(positions)  # (L, D) broadcasts over the batch

pe_fn = pick("sinusoidal_positional_encoding", lambda: sinusoidal_positional_encoding,
             lambda: R.sinusoidal_positional_encoding, check=lambda f: f(2, 4))
learned = LearnedPositionalEmbedding(d_model=64, max_len=100)
print("trainable parameters:", sum(p.numel() for p in learned.parameters()), "(= 100 x 64)")
try:
    learned(torch.zeros(1, 101, 64))
except IndexError as e:
    print("a sequence of 101 positions:", type(e).__name__, "-", str(e)[:60])

def cosine_matrix(t):
    t = t / t.norm(dim=-1, keepdim=True)
    return t @ t.T  # (L, L)

with torch.no_grad():
    sims = [cosine_matrix(learned.pos_embed.weight), cosine_matrix(pe_fn(100, 64))]
fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
for ax, s, name in zip(axes, sims, ["learned, at initialisation", "sinusoidal"]):
    im = ax.imshow(s.numpy(), cmap="magma", vmin=-0.2, vmax=1)
    ax.set(xlabel="position q", ylabel="position p", title=f"cosine similarity: {name}")
fig.colorbar(im, ax=axes, shrink=0.85)

# %% [markdown]
# A freshly initialised learned table knows nothing: every position is unlike every other.
# Whatever neighbourhood structure it ends up with must be learned from data, position by
# position; the sinusoidal table has it from the start. Newer models mostly use neither:
# rotary embeddings (section 4) or biases added to the attention scores by distance (ALiBi)
# put *relative* position straight into the score.

# %% [markdown]
# ## Questions to answer in your own words
#
# Write a few sentences in each answer cell (double-click it to edit). These answers are
# read and graded by your instructor; the model answers are not in your notebook.

# %% [markdown]
# **Question 1.** Without positional encodings, what happens to the outputs of self-attention
# when the input tokens are shuffled, and why is that a problem for language?

# %% [answer] q_permutation 1
# ### BEGIN SOLUTION
# Self-attention is permutation-equivariant: shuffling the inputs shuffles the outputs in the
# same way and leaves each token's output unchanged, because every token attends to the same set
# of keys and values whatever their order. The model sees a bag of words: "dog bites man" and
# "man bites dog" give the same representation for each word, although they mean different
# things.
# ### END SOLUTION

# %% [markdown]
# **Question 2.** Why can $PE(pos + k)$ be written as a fixed matrix times $PE(pos)$, the same
# matrix for every position, and why does that help attention?

# %% [answer] q_shift_matrix 1
# ### BEGIN SOLUTION
# Each pair of features is $(\sin \omega p, \cos \omega p)$ for one frequency $\omega$. Moving
# from $p$ to $p + k$ adds the angle $\omega k$, which is a rotation of the pair by $\omega k$:
# by the angle-addition formulas it depends on $k$ only, not on $p$. Stacking one $2 \times 2$
# rotation per pair gives a block-diagonal matrix $M_k$ with $PE(p + k) = M_k PE(p)$. Because
# the relative offset is a linear map, the linear projections and dot products of attention can
# learn to attend by relative position ("the previous token") the same way everywhere in the
# sequence.
# ### END SOLUTION

# %% [markdown]
# ## 8. Mistakes worth recognising
#
# Each of these appears in tutorials or study notes; the checks above name every one.
#
# | mistake | what happens |
# | --- | --- |
# | sin and cos swapped (even columns cos) | a valid-looking table that matches no trained model |
# | exponent `i/d` instead of `2i/d` | the slowest pair repeats after $2\pi\sqrt{\text{base}}$ positions instead of almost $2\pi \cdot \text{base}$ |
# | every column its own frequency (`arange(d)` instead of pairs) | sin and cos of a pair no longer match: the shift is no longer a rotation |
# | `base ** (2i/d)` multiplied instead of divided | frequencies explode; neighbouring positions look random |
# | `2 * i // d_model` (integer division) | every frequency is 1: the code repeats every $2\pi \approx 6.3$ positions |
# | `math.log10` in the exp/log form | a different base in disguise |
# | `[sin \| cos]` halves instead of interleaving | another layout: fine for a new model, but not the standard table |
# | hard-coded 10000, `base` ignored | the notes' example: formula with 10000, code with 100 |
# | the textbook rotation `[[cos, -sin], [sin, cos]]` | with the pair ordered (sin, cos) it shifts backwards |
# | `nn.Parameter` for the table | the optimizer trains the "fixed" encoding |
# | plain attribute `self.pe = table` | not saved in `state_dict`, left on the CPU by `.to("cuda")` |
# | `pe[:x.size(0)]` on batched input | batch size used as length: wrong (B = 1), lucky (B = L) or a crash |
# | a `(max_len, 1, D)` table from the sequence-first tutorial | broadcasts wrongly with batch-first input |
# | no length check | an obscure broadcasting error past `max_len` |
# | `F.dropout(x, p)` without `training=self.training` | dropout stays on in eval mode |
# | `x += self.pe[:L]` | changes the caller's tensor in place |
#
# **Next:** `06_blocks`: the feed-forward network, residual connections and normalisation
# placement, assembled into encoder and decoder layers.
