"""Reference sinusoidal positional encoding (notebook 05)."""
import math

import torch
from torch import nn

__all__ = ["sinusoidal_positional_encoding", "PositionalEncoding", "pe_shift_matrix"]


def _frequencies(d_model, base):
    # w_i = base^(-2i/d_model) for i = 0 .. d_model/2 - 1, in float64 for accuracy
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64)
    return torch.exp(-math.log(base) * i2 / d_model)


def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    """(max_len, d_model) float32: even columns sin(pos * w_i), odd columns cos(pos * w_i)."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    angles = pos * _frequencies(d_model, base)  # (max_len, ceil(d/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def pe_shift_matrix(offset, d_model, base=10000.0):
    """M (d_model, d_model) float32 with pe[pos + offset] = M @ pe[pos]: a 2x2 rotation per
    (sin, cos) pair, by the angle offset * w_i."""
    theta = offset * _frequencies(d_model, base)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, t in enumerate(theta.tolist()):
        c, s = math.cos(t), math.sin(t)
        a, b = 2 * i, 2 * i + 1
        # sin(x+t) = sin x cos t + cos x sin t ; cos(x+t) = cos x cos t - sin x sin t
        M[a, a], M[a, b] = c, s
        M[b, a], M[b, b] = -s, c
    return M.float()


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to (B, L, D) inputs; `pe` is a buffer, not a parameter."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))

    def forward(self, x):
        B, L, D = x.shape
        if L > self.pe.size(0):
            raise ValueError(f"sequence length {L} exceeds max_len={self.pe.size(0)}")
        return self.dropout(x + self.pe[:L])  # slice on the sequence axis, broadcast over B
