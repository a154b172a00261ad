"""Figures drawn from tensors computed in the notebook. Every function takes tensors of a
stated rank, labels its axes in words, returns its matplotlib Figure and keeps no state."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

__all__ = ["heatmap", "attention_heatmap", "heatmap_grid", "curves"]


def _as_2d(m, name="matrix"):
    m = torch.as_tensor(m).detach().float().cpu()
    if m.dim() != 2:
        raise ValueError(f"{name} must be 2-D (rows, columns), got shape {tuple(m.shape)}")
    return m


def _draw(ax, m, row_labels, col_labels, xlabel, ylabel, title, cmap, vmin, vmax, annotate):
    im = ax.imshow(m.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), [str(c) for c in col_labels], rotation=90)
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), [str(r) for r in row_labels])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                v = m[i, j].item()
                r, g, b, _ = im.cmap(im.norm(v))  # dark cell -> white text, light -> black
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black")
    return im


def heatmap(matrix, row_labels=None, col_labels=None, *, xlabel="column", ylabel="row",
            title=None, cmap="viridis", vmin=None, vmax=None, annotate=False, colorbar=True,
            figsize=None):
    """Any (rows, columns) matrix as a labelled heatmap."""
    m = _as_2d(matrix)
    figsize = figsize or (min(2 + 0.45 * m.shape[1], 12), min(1.5 + 0.4 * m.shape[0], 9))
    fig, ax = plt.subplots(figsize=figsize)
    im = _draw(ax, m, row_labels, col_labels, xlabel, ylabel, title, cmap, vmin, vmax, annotate)
    if colorbar:
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def attention_heatmap(weights, query_tokens=None, key_tokens=None, *, title="attention weights",
                      annotate=None, figsize=None):
    """One head's weights (Lq, Lk): row = the query token, column = the key it attends to."""
    w = _as_2d(weights, "weights (Lq, Lk)")
    if annotate is None:
        annotate = w.shape[0] * w.shape[1] <= 100
    return heatmap(w, query_tokens, key_tokens, xlabel="key (attended to)",
                   ylabel="query (attending)", title=title, cmap="Blues", vmin=0.0, vmax=1.0,
                   annotate=annotate, figsize=figsize)


def heatmap_grid(weights, query_tokens=None, key_tokens=None, *, row_titles=None,
                 col_titles=None, title=None, vmin=0.0, vmax=1.0, cmap="Blues", cell_size=2.2):
    """A grid of attention maps. weights: (rows, cols, Lq, Lk), e.g. (layers, heads, Lq, Lk),
    or (cols, Lq, Lk) for one row."""
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() == 3:
        w = w.unsqueeze(0)
    if w.dim() != 4:
        raise ValueError(f"weights must be (rows, cols, Lq, Lk) or (cols, Lq, Lk), got {tuple(w.shape)}")
    R, C = w.shape[:2]
    fig, axes = plt.subplots(R, C, figsize=(cell_size * C + 1, cell_size * R + 0.6), squeeze=False)
    for r in range(R):
        for c in range(C):
            ax = axes[r][c]
            _draw(ax, w[r, c], query_tokens if c == 0 else None, key_tokens if r == R - 1 else None,
                  "key" if r == R - 1 else "", "query" if c == 0 else "", None, cmap, vmin, vmax,
                  False)
            if c > 0:
                ax.set_yticks([])
            if r < R - 1:
                ax.set_xticks([])
            if r == 0 and col_titles is not None:
                ax.set_title(str(col_titles[c]), fontsize=9)
            if c == 0 and row_titles is not None:
                ax.set_ylabel(f"{row_titles[r]}\nquery", fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def curves(x, ys: dict, *, xlabel="x", ylabel="y", title=None, logy=False, figsize=(6, 3.5),
           markers=False):
    """Several named curves over the same x: ys maps a label to a 1-D sequence."""
    fig, ax = plt.subplots(figsize=figsize)
    for label, y in ys.items():
        ax.plot(list(x), [float(v) for v in y], marker="o" if markers else None, label=str(label))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    if len(ys) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig

