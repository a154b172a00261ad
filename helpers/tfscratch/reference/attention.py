"""Reference softmax and scaled dot-product attention (notebooks 01 and 02)."""
import math

import torch

__all__ = ["softmax", "scaled_dot_product_attention"]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax: subtracting the row max changes nothing mathematically
    but keeps exp() from overflowing."""
    z = x - x.amax(dim=dim, keepdim=True)
    e = z.exp()
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d_k)) v for any leading batch axes.

    q: (..., Lq, d_k), k: (..., Lk, d_k), v: (..., Lk, d_v)
    mask: boolean, True = may attend, broadcastable to (..., Lq, Lk).
    Returns (output (..., Lq, d_v), weights (..., Lq, Lk)). A query row whose keys are all
    masked gets all-zero weights and a zero output (never NaN).
    """
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)
    if mask is not None:
        mask = mask.to(torch.bool)
        # the most negative finite number, not -inf: an all-masked row stays finite
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # all-masked rows become all zeros
    return weights @ v, weights
