"""Reference multi-head attention (notebook 03)."""
import math

import torch
from torch import nn

__all__ = ["split_heads", "combine_heads", "MultiHeadAttention", "expand_mask"]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, H, L, D // H)."""
    B, L, D = x.shape
    assert D % n_heads == 0, f"d_model={D} is not divisible by n_heads={n_heads}"
    return x.view(B, L, n_heads, D // n_heads).transpose(1, 2)  # (B, H, L, D_h)


def combine_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D_h) -> (B, L, H * D_h)."""
    B, H, L, Dh = x.shape
    return x.transpose(1, 2).contiguous().view(B, L, H * Dh)  # (B, L, D)


def expand_mask(mask):
    """Give a boolean mask a head axis: (Lq, Lk) and 4-D as is, (B, Lq, Lk) or (B, 1, Lk) -> (B, 1, ., Lk)."""
    if mask is None:
        return None
    mask = mask.to(torch.bool)
    if mask.dim() == 3:
        return mask.unsqueeze(1)
    if mask.dim() in (2, 4):
        return mask
    raise ValueError(f"mask must be 2-, 3- or 4-D, got shape {tuple(mask.shape)}")


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        assert d_model % n_heads == 0, f"d_model={d_model} not divisible by n_heads={n_heads}"
        self.d_model, self.n_heads = d_model, n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.attn_weights = None

    def forward(self, query, key, value, mask=None):
        """query (B, Lq, D), key and value (B, Lk, D), mask boolean (True = may attend) of
        shape (Lq, Lk), (B, Lq, Lk), (B, 1, Lk) or (B, H|1, Lq|1, Lk). Returns (B, Lq, D)."""
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, Lq, D_h)
        k = split_heads(self.w_k(key), self.n_heads)  # (B, H, Lk, D_h)
        v = split_heads(self.w_v(value), self.n_heads)  # (B, H, Lk, D_h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Lq, Lk), scaled by D_h
        mask = expand_mask(mask)
        if mask is not None:  # the most negative finite float: an all-masked row stays finite
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (B, H, Lq, Lk)
        self.attn_weights = weights.detach()  # kept for plotting, before dropout
        out = self.dropout(weights) @ v  # (B, H, Lq, D_h)
        return self.w_o(combine_heads(out))  # (B, Lq, D)
