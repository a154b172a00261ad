"""Catalogue for 05_positional_encoding: realistic mistakes and correct variants."""
from . import Mistake, Variant

ASSIGNMENT = "05_positional_encoding"
EXERCISES = ["sinusoidal_positional_encoding", "PositionalEncoding", "pe_shift_matrix"]

SPE = "sinusoidal_positional_encoding"
PEM = "PositionalEncoding"
SHIFT = "pe_shift_matrix"

MISTAKES = [
    # ------------------------------------------------------------ sinusoidal table
    Mistake(SPE, "sin and cos swapped (cos in the even columns)", r"swapped", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(base) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.cos(pos * div)
    pe[:, 1::2] = torch.sin(pos * div)
    return pe
"""),
    Mistake(SPE, "exponent i/d with i the pair index (should be 2i/d)", r"i/d_model", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(1)
    i = torch.arange(d_model // 2).float()
    div = 1.0 / base ** (i / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe
"""),
    Mistake(SPE, "every column its own frequency (arange(d) instead of pairs)", r"own frequency", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(1)
    div = 1.0 / base ** (torch.arange(d_model).float() / d_model)
    angles = pos * div
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles[:, 0::2])
    pe[:, 1::2] = torch.cos(angles[:, 1::2])
    return pe
"""),
    Mistake(SPE, "multiplies pos by base^(2i/d) instead of dividing", r"grow instead of shrinking", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div = base ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe.float()
"""),
    Mistake(SPE, "the notes' numpy loop with integer division 2*i//d_model", r"integer division|every frequency is 1", """
import numpy as np
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    P = np.zeros((max_len, d_model))
    for i in np.arange(int(d_model / 2)):
        denominator = np.power(base, 2 * i // d_model)
        P[:, 2 * i] = np.sin(np.arange(max_len) / denominator)
        P[:, 2 * i + 1] = np.cos(np.arange(max_len) / denominator)
    return torch.from_numpy(P).float()
"""),
    Mistake(SPE, "positions start at 1", r"start at 0|start at 1", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(1, max_len + 1).float().unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(base) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe
"""),
    Mistake(SPE, "log10 in the exp/log form", r"log10|natural log", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log10(base) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe
"""),
    Mistake(SPE, "hard-coded 10000: the base argument is ignored", r"base argument is ignored", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe
"""),
    Mistake(SPE, "[sin | cos] halves concatenated instead of interleaved", r"concatenated|interleave", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(base) / d_model))
    return torch.cat([torch.sin(pos * div), torch.cos(pos * div)], dim=1)
"""),
    Mistake(SPE, "the notes' numpy table returned as float64", r"float32", """
import numpy as np
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    P = np.zeros((max_len, d_model))
    for i in np.arange(int(d_model / 2)):
        denominator = np.power(base, 2 * i / d_model)
        P[:, 2 * i] = np.sin(np.arange(max_len) / denominator)
        P[:, 2 * i + 1] = np.cos(np.arange(max_len) / denominator)
    return torch.from_numpy(P)
"""),
    Mistake(SPE, "returns the numpy array itself", r"torch\.Tensor", """
import numpy as np
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = np.arange(max_len)[:, None]
    div = base ** (-np.arange(0, d_model, 2) / d_model)
    P = np.zeros((max_len, d_model), dtype=np.float32)
    P[:, 0::2] = np.sin(pos * div)
    P[:, 1::2] = np.cos(pos * div)
    return P
"""),
    Mistake(SPE, "table transposed: (d_model, max_len)", r"transposed", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pos = torch.arange(max_len).float().unsqueeze(0)
    div = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(base) / d_model)).unsqueeze(1)
    pe = torch.zeros(d_model, max_len)
    pe[0::2] = torch.sin(div * pos)
    pe[1::2] = torch.cos(div * pos)
    return pe
"""),
    # ------------------------------------------------------------ shift matrix
    Mistake(SHIFT, "the textbook rotation [[cos, -sin], [sin, cos]]: shifts backwards",
            r"wrong way|pos - offset", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    M = torch.zeros(d_model, d_model)
    for i in range(d_model // 2):
        t = offset * base ** (-2 * i / d_model)
        M[2*i:2*i+2, 2*i:2*i+2] = torch.tensor([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
    return M
"""),
    Mistake(SHIFT, "every pair rotated by the same angle offset", r"same angle", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    c, s = math.cos(offset), math.sin(offset)
    M = torch.zeros(d_model, d_model)
    for a in range(0, d_model, 2):
        M[a, a], M[a, a + 1], M[a + 1, a], M[a + 1, a + 1] = c, s, -s, c
    return M
"""),
    Mistake(SHIFT, "pairs dimension i with i + d/2 (concatenated layout)", r"d_model/2|neighbours", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    n = d_model // 2
    theta = offset * torch.exp(torch.arange(0, d_model, 2).double() * -(math.log(base) / d_model))
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    idx = torch.arange(n)
    M[idx, idx], M[idx, idx + n] = torch.cos(theta), torch.sin(theta)
    M[idx + n, idx], M[idx + n, idx + n] = -torch.sin(theta), torch.cos(theta)
    return M.float()
"""),
    Mistake(SHIFT, "angle uses base^(-i/d) for pair i", r"2i/d_model", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    M = torch.zeros(d_model, d_model)
    for i in range(d_model // 2):
        t = offset * base ** (-i / d_model)
        M[2*i, 2*i], M[2*i, 2*i+1] = math.cos(t), math.sin(t)
        M[2*i+1, 2*i], M[2*i+1, 2*i+1] = -math.sin(t), math.cos(t)
    return M
"""),
    Mistake(SHIFT, "base argument ignored", r"base argument is ignored", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    M = torch.zeros(d_model, d_model)
    for i in range(d_model // 2):
        t = offset * 10000.0 ** (-2 * i / d_model)
        M[2*i, 2*i], M[2*i, 2*i+1] = math.cos(t), math.sin(t)
        M[2*i+1, 2*i], M[2*i+1, 2*i+1] = -math.sin(t), math.cos(t)
    return M
"""),
    Mistake(SHIFT, "returns float64", r"float32", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        t = offset * base ** (-2 * i / d_model)
        M[2*i, 2*i], M[2*i, 2*i+1] = math.cos(t), math.sin(t)
        M[2*i+1, 2*i], M[2*i+1, 2*i+1] = -math.sin(t), math.cos(t)
    return M
"""),
    Mistake(SHIFT, "sign lost: [[cos, sin], [sin, cos]]", r"-sin, cos|not a rotation", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    M = torch.zeros(d_model, d_model)
    for i in range(d_model // 2):
        t = offset * base ** (-2 * i / d_model)
        M[2*i, 2*i], M[2*i, 2*i+1] = math.cos(t), math.sin(t)
        M[2*i+1, 2*i], M[2*i+1, 2*i+1] = math.sin(t), math.cos(t)
    return M
"""),
    Mistake(SHIFT, "fits M by least squares on too few positions", r"pe\[pos \+ offset\]", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    n = d_model // 2  # fewer positions than dimensions: M is not determined
    pe = sinusoidal_positional_encoding(n + offset, d_model, base=base).double()
    X, Y = pe[:n], pe[offset:offset + n]  # want Y = X @ M^T
    Mt = torch.linalg.pinv(X) @ Y
    return Mt.T.float()
"""),
    Mistake(SHIFT, "identity: forgets to rotate at all", r"identity", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    return torch.eye(d_model)
"""),
    # ------------------------------------------------------------ the module
    Mistake(PEM, "the notes' size(0) slicing on batched input", r"size\(0\)|batch size", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(0), :])
"""),
    Mistake(PEM, "size(0) slicing with a (1, max_len, d) table", r"size\(0\)|batch size", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model).unsqueeze(0))
    def forward(self, x):
        if x.size(1) > self.pe.size(1):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(0)])
"""),
    Mistake(PEM, "table stored as nn.Parameter", r"nn\.Parameter", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.pe = nn.Parameter(sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Mistake(PEM, "table stored as a plain attribute", r"plain tensor attribute", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.pe = sinusoidal_positional_encoding(max_len, d_model)
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Mistake(PEM, "scales x by sqrt(d_model) inside the module", r"sqrt\(d_model\)", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.d_model = d_model
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x * math.sqrt(self.d_model) + self.pe[:x.size(1)])
"""),
    Mistake(PEM, "F.dropout without training=self.training: active in eval mode", r"eval mode", """
import torch.nn.functional as F
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return F.dropout(x + self.pe[:x.size(1)], self.p)
"""),
    Mistake(PEM, "dropout argument accepted but never used", r"dropout argument is not used", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return x + self.pe[:x.size(1)]
"""),
    Mistake(PEM, "dropout applied to the table only", r"table only", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return x + self.dropout(self.pe[:x.size(1)])
"""),
    Mistake(PEM, "adds in place, changing the caller's tensor", r"in place", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        x += self.pe[:x.size(1)]
        return self.dropout(x)
"""),
    Mistake(PEM, "PyTorch tutorial's sequence-first (max_len, 1, d) table sliced with x.size(0) on batch-first input", r"sequence-first", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        pe = sinusoidal_positional_encoding(max_len, d_model).unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(0)])
"""),
    Mistake(PEM, "forward under torch.no_grad(): no gradient reaches x", r"autograd|gradient", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    @torch.no_grad()
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Mistake(PEM, "table kept in float64: the output is upcast", r"dtype|float64", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model).double())
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("longer than max_len")
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Mistake(PEM, "rebuilds the table in every forward, no buffer", r"no tensor attribute|register_buffer", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
    def forward(self, x):
        B, L, D = x.shape
        if L > self.max_len:
            raise ValueError("longer than max_len")
        return self.dropout(x + sinusoidal_positional_encoding(L, D))
"""),
    Mistake(PEM, "sequence-first table transposed, but sliced pe[:x.size(0)] before the transpose",
            r"size\(0\)|batch size", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model).unsqueeze(1))
    def forward(self, x):
        # x (B, L, D); pe (max_len, 1, D)
        return self.dropout(x + self.pe[:x.size(0)].transpose(0, 1))
"""),
]

VARIANTS = [
    # ------------------------------------------------------------ sinusoidal table
    Variant(SPE, "the notes' direct form 1/base**(2i/d), all float32", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(start=0, end=max_len, step=1).float().unsqueeze(1)
    embedding_index = torch.arange(start=0, end=d_model, step=2).float()
    div_term = 1 / torch.tensor(base) ** (embedding_index / d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe
"""),
    Variant(SPE, "stack (sin, cos) on a new last axis and flatten: interleaves", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    w = torch.pow(torch.tensor(base, dtype=torch.float64), -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    ang = torch.outer(torch.arange(max_len, dtype=torch.float64), w)
    return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2).to(torch.float32)
"""),
    Variant(SPE, "complex exponentials: exp(i*angle) gives (cos, sin) pairs", """
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    w = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * w[None, :]
    z = torch.polar(torch.ones_like(ang), ang)  # cos + i sin
    return torch.stack([z.imag, z.real], dim=-1).reshape(max_len, d_model).float()
"""),
    Variant(SPE, "numpy, loop over the pairs only", """
import numpy as np
def sinusoidal_positional_encoding(max_len, d_model, base=10000.0):
    P = np.zeros((max_len, d_model))
    k = np.arange(max_len)
    for i in range(d_model // 2):
        denominator = np.power(base, 2 * i / d_model)
        P[:, 2 * i] = np.sin(k / denominator)
        P[:, 2 * i + 1] = np.cos(k / denominator)
    return torch.from_numpy(P).float()
"""),
    # ------------------------------------------------------------ shift matrix
    Variant(SHIFT, "torch.block_diag of 2x2 blocks built with math", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    blocks = []
    for i in range(d_model // 2):
        t = offset / base ** (2 * i / d_model)
        blocks.append(torch.tensor([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]]))
    return torch.block_diag(*blocks)
"""),
    Variant(SHIFT, "Kronecker products: diag(cos) x I + diag(sin) x J", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    theta = offset * base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    J = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    M = torch.kron(torch.diag(theta.cos()), torch.eye(2, dtype=torch.float64)) + torch.kron(torch.diag(theta.sin()), J)
    return M.float()
"""),
    Variant(SHIFT, "fill the three diagonals in float32", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    w = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(base) / d_model))
    theta = offset * w
    M = torch.zeros(d_model, d_model)
    M.diagonal()[:] = theta.cos().repeat_interleave(2)
    M.diagonal(1)[0::2] = theta.sin()
    M.diagonal(-1)[0::2] = -theta.sin()
    return M
"""),
    Variant(SHIFT, "matrix power of the one-step rotation, in float64", """
def pe_shift_matrix(offset, d_model, base=10000.0):
    w = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, t in enumerate(w.tolist()):
        R[2*i:2*i+2, 2*i:2*i+2] = torch.tensor([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]], dtype=torch.float64)
    return torch.linalg.matrix_power(R, int(offset)).float()
"""),
    # ------------------------------------------------------------ the module
    Variant(PEM, "the notes' (1, max_len, d) table sliced pe[:, :L], requires_grad_(False)", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)
        self.register_buffer("pe", pe)
    def forward(self, x):
        if x.size(1) > self.pe.size(1):
            raise ValueError(f"input length {x.size(1)} > max_len {self.pe.size(1)}")
        x = x + self.pe[:, : x.size(1)].requires_grad_(False)
        return self.dropout(x)
"""),
    Variant(PEM, "functional dropout with training flag, IndexError naming max_len", """
import torch.nn.functional as F
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        B, T, C = x.shape
        if T > self.max_len:
            raise IndexError(f"cannot encode {T} positions: maximum length is {self.max_len}")
        return F.dropout(x + self.pe[:T].unsqueeze(0), p=self.p, training=self.training)
"""),
    Variant(PEM, "non-persistent buffer, narrow() on the sequence axis, assert", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)
    def forward(self, x):
        L = x.shape[-2]
        assert L <= self.pe.shape[0], f"sequence of length {L} exceeds max_len={self.pe.shape[0]}"
        return self.drop(torch.add(x, self.pe.narrow(0, 0, L).expand_as(x)))
"""),
    Variant(PEM, "PyTorch tutorial's sequence-first (max_len, 1, d) buffer, transposed for batch-first input", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)
    def forward(self, x):
        # the buffer is (seq, 1, d); this course's input is (batch, seq, d)
        x = x + self.pe[:x.size(1)].transpose(0, 1)
        return self.dropout(x)
"""),
    Variant(PEM, "no length check of its own: past max_len the addition fails with a broadcasting error", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Variant(PEM, "raises a RuntimeError of its own wording past max_len, (1, max_len, d) buffer", """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model)[None])
    def forward(self, x):
        n = x.shape[1]
        if n > self.pe.shape[1]:
            raise RuntimeError(f"got {n} tokens, the table has {self.pe.shape[1]} rows")
        return self.dropout(x + self.pe[:, :n])
"""),
]
