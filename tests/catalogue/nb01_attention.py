"""Catalogue for 01_attention: realistic mistakes and correct variants."""
from . import Mistake, Variant

ASSIGNMENT = "01_attention"
EXERCISES = ["softmax", "scaled_dot_product_attention"]

MISTAKES = [
    # ---------------------------------------------------------------- softmax
    Mistake("softmax", "textbook formula with no max subtraction: overflows to NaN", r"overflow", """
def softmax(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
"""),
    Mistake("softmax", "one global max for the whole tensor instead of one per row",
            r"whole tensor|each row's own max|one max per row", """
def softmax(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim=dim, keepdim=True)
"""),
    Mistake("softmax", "max along dim without keepdim: broadcasts against the wrong axis",
            r"keepdim", """
def softmax(x, dim=-1):
    m = x.max(dim=dim).values
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)
"""),
    Mistake("softmax", "normalises over dim=0 whatever dim says", r"dim=0|dim argument|ignored", """
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=0, keepdim=True))
    return e / e.sum(dim=0, keepdim=True)
"""),
    Mistake("softmax", "hard-codes the last axis and ignores the dim argument", r"dim argument is ignored", """
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)
"""),
    Mistake("softmax", "divides by the sum over the whole tensor", r"whole tensor", """
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum()
"""),
    Mistake("softmax", "forgets the exponential (normalises the raw scores)",
            r"exponentiat|exp\(x\)", """
def softmax(x, dim=-1):
    return x / x.sum(dim=dim, keepdim=True)
"""),
    Mistake("softmax", "calls torch.softmax (the shortcut the exercise forbids)", r"shortcut", """
def softmax(x, dim=-1):
    return torch.softmax(x, dim=dim)
"""),
    Mistake("softmax", "calls the shortcut through a Tensor method", r"shortcut", """
def softmax(x, dim=-1):
    return x.softmax(dim)
"""),
    Mistake("softmax", "goes through numpy, cutting the autograd graph", r"autograd|gradient", """
def softmax(x, dim=-1):
    import numpy as np
    a = x.detach().numpy()
    e = np.exp(a - a.max(axis=dim, keepdims=True))
    return torch.from_numpy(e / e.sum(axis=dim, keepdims=True))
"""),
    # ---------------------------------------------------------------- attention
    Mistake("scaled_dot_product_attention", "forgets the 1/sqrt(d_k) scale", r"sqrt\(d_k\)", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1), dim=-1)
    return w @ v, w
"""),
    Mistake("scaled_dot_product_attention", "divides by d_k instead of sqrt(d_k)", r"divided by d_k", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / q.size(-1), dim=-1)
    return w @ v, w
"""),
    Mistake("scaled_dot_product_attention", "scales by the value size d_v", r"d_v", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(v.size(-1)), dim=-1)
    return w @ v, w
"""),
    Mistake("scaled_dot_product_attention", "softmax over the query axis (dim=-2)", r"query axis|dim=-2", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-2)
    return w @ v, w
"""),
    Mistake("scaled_dot_product_attention", "k.transpose(1, 2): right for 3-D only",
            r"transpose\(-2, -1\)|last two axes", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(1, 2) / math.sqrt(q.size(-1)), dim=-1)
    return w @ v, w
"""),
    Mistake("scaled_dot_product_attention", "returns the pre-softmax scores as the weights",
            r"raw scores|sum to 1", """
def scaled_dot_product_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return softmax(s, dim=-1) @ v, s
"""),
    Mistake("scaled_dot_product_attention", "returns only the output", r"tuple \(output, weights\)", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w @ v
"""),
    Mistake("scaled_dot_product_attention", "averages the keys instead of the values", r"keys instead of the values", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w @ k, w
"""),
    Mistake("scaled_dot_product_attention", "computes k q^T: the weights come out transposed", r"transposed", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(k @ q.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w.transpose(-2, -1) @ v, w
"""),
    Mistake("scaled_dot_product_attention", "calls F.scaled_dot_product_attention", r"shortcut", """
import torch.nn.functional as F
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return F.scaled_dot_product_attention(q, k, v), w
"""),
    Mistake("scaled_dot_product_attention", "the seed's typo: computes `socres`, then uses `scores`",
            r"NameError|scores", """
def scaled_dot_product_attention(q, k, v):
    socres = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    w = softmax(scores, dim=-1)
    return w @ v, w
"""),
    Mistake("scaled_dot_product_attention", "detaches the weights (no gradient to q and k)",
            r"gradient", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1).detach()
    return w @ v, w
"""),
    # public patterns (issue 16): batched code that only handles one rank
    Mistake("scaled_dot_product_attention", "torch.bmm: 3-D inputs only", r"torch\.bmm only takes 3-D", """
def scaled_dot_product_attention(q, k, v):
    w = softmax(torch.bmm(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1)), dim=-1)
    return torch.bmm(w, v), w
"""),
    Mistake("scaled_dot_product_attention", "assert q.dim() == 3 guarding a (B, L, d) implementation",
            r"own assert rejected", """
def scaled_dot_product_attention(q, k, v):
    assert q.dim() == 3 and k.dim() == 3, "expected (batch, length, dim)"
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w @ v, w
"""),
]

VARIANTS = [
    Variant("softmax", "log-sum-exp form", """
def softmax(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
"""),
    Variant("softmax", "float64 inside, cast back", """
def softmax(x, dim=-1):
    z = x.double()
    z = z - z.max(dim=dim, keepdim=True).values
    e = z.exp()
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)
"""),
    Variant("softmax", "moves dim to the end, works there, moves it back", """
def softmax(x, dim=-1):
    y = x.movedim(dim, -1)
    y = y - y.max(-1, keepdim=True)[0]
    y = y.exp()
    y = y / y.sum(-1, keepdim=True)
    return y.movedim(-1, dim)
"""),
    Variant("softmax", "torch.compile of a hand-written softmax, called inside the exercise", """
def softmax(x, dim=-1):
    def stable(x):
        e = torch.exp(x - x.amax(dim=dim, keepdim=True))
        return e / e.sum(dim=dim, keepdim=True)
    return torch.compile(stable)(x)
"""),
    Variant("softmax", "detached max (a constant shift; gradients unchanged)", """
def softmax(x, dim=-1):
    e = torch.exp(x - x.detach().amax(dim=dim, keepdim=True))
    return e / torch.sum(e, dim=dim, keepdim=True)
"""),
    Variant("scaled_dot_product_attention", "einsum", """
def scaled_dot_product_attention(q, k, v):
    s = torch.einsum("...qd,...kd->...qk", q, k) / q.shape[-1] ** 0.5
    w = softmax(s, dim=-1)
    return torch.einsum("...qk,...kv->...qv", w, v), w
"""),
    Variant("scaled_dot_product_attention", "scale q before the product, torch.softmax", """
def scaled_dot_product_attention(q, k, v):
    q = q * q.size(-1) ** -0.5
    w = torch.softmax(torch.matmul(q, k.mT), dim=-1)
    return torch.matmul(w, v), w
"""),
    Variant("scaled_dot_product_attention", "float64 inside", """
def scaled_dot_product_attention(q, k, v):
    qd, kd, vd = q.double(), k.double(), v.double()
    w = softmax(qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return (w @ vd).to(q.dtype), w.to(q.dtype)
"""),
    Variant("scaled_dot_product_attention", "flatten the batch axes and use bmm", """
def scaled_dot_product_attention(q, k, v):
    *batch, Lq, d = q.shape
    Lk, dv = k.shape[-2], v.shape[-1]
    q3, k3, v3 = q.reshape(-1, Lq, d), k.reshape(-1, Lk, d), v.reshape(-1, Lk, dv)
    w = softmax(torch.bmm(q3, k3.transpose(1, 2)) / math.sqrt(d), dim=-1)
    out = torch.bmm(w, v3)
    return out.reshape(*batch, Lq, dv), w.reshape(*batch, Lq, Lk)
"""),
]
