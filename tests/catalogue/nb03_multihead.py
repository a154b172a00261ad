"""Catalogue for 03_multihead: realistic mistakes and correct variants.

Sources of the mistakes: the study notes in ../shared/seeds (view without transpose, the
query's seqlen reused for keys, `self.wk` assigned twice, per-head layers in plain Python lists,
`super.__init__`, `_init_`), and the usual tutorial slips (scaling by sqrt(d_model), missing
contiguous(), masks without a head axis or with the PyTorch meaning, F.dropout in eval mode).
"""
from . import Mistake, Variant

ASSIGNMENT = "03_multihead"
EXERCISES = ["split_heads", "combine_heads", "MultiHeadAttention"]

# A correct class body that mistakes below modify; {init} and {forward} are filled in.
_MHA = '''
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
{init}

    def forward(self, query, key, value, mask=None):
{forward}
'''
_INIT = '''        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)'''
_PROJ = '''        q = split_heads(self.w_q(query), self.n_heads)
        k = split_heads(self.w_k(key), self.n_heads)
        v = split_heads(self.w_v(value), self.n_heads)'''
_SCORES = '''        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)'''
_MASK = '''        if mask is not None:
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)'''
_REST = '''        w = torch.softmax(scores, dim=-1)
        self.attn_weights = w
        out = self.dropout(w) @ v
        return self.w_o(combine_heads(out))'''


def mha(init=_INIT, proj=_PROJ, scores=_SCORES, mask=_MASK, rest=_REST):
    return _MHA.format(init=init, forward="\n".join((proj, scores, mask, rest)))


MISTAKES = [
    # ---------------------------------------------------------------- split_heads
    Mistake("split_heads", "view(B, H, L, D_h) alone: right shape, heads and tokens mixed",
            r"MIXES HEADS", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.view(B, n_heads, L, D // n_heads)
"""),
    Mistake("split_heads", "interleaved split: view(B, L, D_h, H) then heads to the front",
            r"every H-th feature|interleaved", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, D // n_heads, n_heads).permute(0, 3, 1, 2)
"""),
    Mistake("split_heads", "forgets the transpose: returns (B, L, H, D_h)", r"transpose\(1, 2\)", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, n_heads, D // n_heads)
"""),
    Mistake("split_heads", "transposes to (B, D, L) first, then reshapes", r"BEFORE splitting", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.transpose(1, 2).reshape(B, n_heads, L, D // n_heads)
"""),
    Mistake("split_heads", "x.split(n_heads): pieces of SIZE n_heads, not n_heads pieces",
            r"swapped|SIZE", """
def split_heads(x, n_heads):
    return torch.stack(x.split(n_heads, dim=-1), dim=1)
"""),
    Mistake("split_heads", "swaps n_heads and D_h in the view", r"swapped", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, D // n_heads, n_heads).transpose(1, 2)
"""),
    Mistake("split_heads", "transposes the batch axis instead of the sequence axis",
            r"wrong axes|transpose\(1, 2\)", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, n_heads, D // n_heads).transpose(0, 1)
"""),
    Mistake("split_heads", "hard-codes 8 heads (the tutorial's value) instead of n_heads",
            r"hard-coded|n_heads", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.view(B, L, 8, D // 8).transpose(1, 2)
"""),
    Mistake("split_heads", "goes through numpy and back: the autograd graph is cut",
            r"autograd|gradient", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    a = x.detach().numpy().reshape(B, L, n_heads, D // n_heads).transpose(0, 2, 1, 3)
    return torch.from_numpy(a.copy())
"""),
    # ---------------------------------------------------------------- combine_heads
    Mistake("combine_heads", "no transpose: view (B, H, L, D_h) straight to (B, L, H*D_h)",
            r"without transpose\(1, 2\)", """
def combine_heads(x):
    B, H, L, Dh = x.shape
    return x.view(B, L, H * Dh)
"""),
    Mistake("combine_heads", "transpose then view without contiguous(): RuntimeError",
            r"contiguous", """
def combine_heads(x):
    B, H, L, Dh = x.shape
    return x.transpose(1, 2).view(B, L, H * Dh)
"""),
    Mistake("combine_heads", "merges (D_h, H) instead of (H, D_h): interleaved features",
            r"interleaved", """
def combine_heads(x):
    B, H, L, Dh = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, L, H * Dh)
"""),
    Mistake("combine_heads", "concatenates the heads along the sequence axis",
            r"sequence axis", """
def combine_heads(x):
    return torch.cat([x[:, h] for h in range(x.size(1))], dim=1)
"""),
    Mistake("combine_heads", "sums the heads instead of concatenating them", r"summed or averaged", """
def combine_heads(x):
    return x.sum(dim=1)
"""),
    Mistake("combine_heads", "averages the heads", r"summed or averaged", """
def combine_heads(x):
    return x.mean(dim=1)
"""),
    Mistake("combine_heads", "reads the input as (B, L, H, D_h)", r"\(B, H, L, D_h\)", """
def combine_heads(x):
    B, L, H, Dh = x.shape
    return x.transpose(1, 2).contiguous().view(B, L, H * Dh)
"""),
    Mistake("combine_heads", "swaps the last two axes (transpose(2, 3)) instead of (1, 2)",
            r"transpose\(2, 3\)|transpose\(1, 2\)", """
def combine_heads(x):
    B, H, L, Dh = x.shape
    return x.transpose(2, 3).contiguous().view(B, L, H * Dh)
"""),
    # ---------------------------------------------------------------- MultiHeadAttention
    Mistake("MultiHeadAttention", "scales the scores by sqrt(d_model) instead of sqrt(D_h)",
            r"sqrt\(d_model\)", mha(scores="        scores = q @ k.transpose(-2, -1) / "
                                    "math.sqrt(self.d_model)")),
    Mistake("MultiHeadAttention", "no scaling at all", r"not scaled",
            mha(scores="        scores = q @ k.transpose(-2, -1)")),
    Mistake("MultiHeadAttention", "inline split with view(B, H, L, D_h) (no transpose)",
            r"MIXES HEADS|not independent", mha(proj='''        B, Lq, D = query.shape
        Lk = key.size(1)
        q = self.w_q(query).view(B, self.n_heads, Lq, self.d_head)
        k = self.w_k(key).view(B, self.n_heads, Lk, self.d_head)
        v = self.w_v(value).view(B, self.n_heads, Lk, self.d_head)''')),
    Mistake("MultiHeadAttention", "the study notes' `seqlen` of the query reused for keys and values",
            r"own length|Lk != Lq", mha(proj='''        bsz, seqlen, _ = query.shape
        q = self.w_q(query).view(bsz, seqlen, self.n_heads, self.d_head).transpose(1, 2)
        k = self.w_k(key).view(bsz, seqlen, self.n_heads, self.d_head).transpose(1, 2)
        v = self.w_v(value).view(bsz, seqlen, self.n_heads, self.d_head).transpose(1, 2)''')),
    Mistake("MultiHeadAttention", "no output projection: returns the concatenated heads",
            r"w_o is missing", mha(rest='''        w = torch.softmax(scores, dim=-1)
        self.attn_weights = w
        return combine_heads(self.dropout(w) @ v)''')),
    Mistake("MultiHeadAttention", "the notes' copy-paste slip: values projected with w_k",
            r"w_k instead of w_v", mha(proj=_PROJ.replace("self.w_v(value)", "self.w_k(value)"))),
    Mistake("MultiHeadAttention", "the notes' `self.wk` assigned twice: no w_v at all",
            r"w_v|has no attribute", mha(init=_INIT.replace("self.w_v =", "self.w_k ="))),
    Mistake("MultiHeadAttention", "values computed from the key tensor", r"from `key`",
            mha(proj=_PROJ.replace("self.w_v(value)", "self.w_v(key)"))),
    Mistake("MultiHeadAttention", "softmax over the query axis", r"query axis",
            mha(rest=_REST.replace("dim=-1", "dim=-2"))),
    Mistake("MultiHeadAttention", "mask meaning flipped (PyTorch's True = blocked)", r"inverted",
            mha(mask=_MASK.replace("~mask", "mask"))),
    Mistake("MultiHeadAttention", "mask ignored", r"mask is ignored", mha(mask="")),
    Mistake("MultiHeadAttention", "3-D masks used without a head axis", r"unsqueeze\(1\)",
            mha(mask='''        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)''')),
    Mistake("MultiHeadAttention", "unsqueeze(1) on every mask, 2-D and 4-D too", r"as it is|as they are",
            mha(mask='''        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(1), torch.finfo(scores.dtype).min)''')),
    Mistake("MultiHeadAttention", "fills with -inf: NaN on a fully masked row", r"NaN",
            mha(mask=_MASK.replace("torch.finfo(scores.dtype).min", "float('-inf')"))),
    Mistake("MultiHeadAttention", "F.dropout(w, p) in forward: still random in eval mode",
            r"eval mode", mha(rest=_REST.replace("self.dropout(w)", "F.dropout(w, self.p)"),
                              init=_INIT + "\n        self.p = dropout")),
    Mistake("MultiHeadAttention", "dropout argument ignored", r"dropout argument is ignored",
            mha(init=_INIT.replace("nn.Dropout(dropout)", "nn.Dropout(0.0)"))),
    Mistake("MultiHeadAttention", "attn_weights stored after dropout", r"BEFORE dropout",
            mha(rest='''        w = self.dropout(torch.softmax(scores, dim=-1))
        self.attn_weights = w
        return self.w_o(combine_heads(w @ v))''')),
    Mistake("MultiHeadAttention", "attn_weights averaged over the heads", r"head axis is missing",
            mha(rest=_REST.replace("self.attn_weights = w", "self.attn_weights = w.mean(1)"))),
    Mistake("MultiHeadAttention", "returns (output, weights) like nn.MultiheadAttention",
            r"output only", mha(rest=_REST.replace("return self.w_o(combine_heads(out))",
                                                    "return self.w_o(combine_heads(out)), w"))),
    Mistake("MultiHeadAttention", "bias argument ignored (always bias=True)", r"bias=False|bias",
            mha(init=_INIT.replace("bias=bias", "bias=True"))),
    Mistake("MultiHeadAttention", "seed 004: per-head projections in plain Python lists",
            r"plain Python list|not\s+registered", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = [nn.Linear(d_model, self.d_head, bias=bias) for _ in range(n_heads)]
        self.w_k = [nn.Linear(d_model, self.d_head, bias=bias) for _ in range(n_heads)]
        self.w_v = [nn.Linear(d_model, self.d_head, bias=bias) for _ in range(n_heads)]
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        outs, ws = [], []
        for wq, wk, wv in zip(self.w_q, self.w_k, self.w_v):
            s = wq(query) @ wk(key).transpose(-2, -1) / math.sqrt(self.d_head)
            if mask is not None:
                s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
            w = torch.softmax(s, dim=-1)
            ws.append(w)
            outs.append(self.dropout(w) @ wv(value))
        self.attn_weights = torch.stack(ws, dim=1)
        return self.w_o(torch.cat(outs, dim=-1))
"""),
    Mistake("MultiHeadAttention", "layers created inside forward: new random weights every call",
            r"parameters|registered|inside forward", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.d_model, self.n_heads, self.d_head, self.bias = d_model, n_heads, d_model // n_heads, bias
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        self.w_q = nn.Linear(self.d_model, self.d_model, bias=self.bias)
        self.w_k = nn.Linear(self.d_model, self.d_model, bias=self.bias)
        self.w_v = nn.Linear(self.d_model, self.d_model, bias=self.bias)
        q = split_heads(self.w_q(query), self.n_heads)
        k = split_heads(self.w_k(key), self.n_heads)
        v = split_heads(self.w_v(value), self.n_heads)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_head), dim=-1)
        self.attn_weights = w
        return self.w_o(combine_heads(self.dropout(w) @ v))
"""),
    Mistake("MultiHeadAttention", "seed 000: `super.__init__()` without parentheses", r"super", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super.__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        raise RuntimeError("never reached")
"""),
    Mistake("MultiHeadAttention", "seed 003: constructor spelt `_init_`", r"__init__", """
class MultiHeadAttention(nn.Module):
    def _init_(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        raise RuntimeError("never reached")
"""),
    Mistake("MultiHeadAttention", "wraps nn.MultiheadAttention (the forbidden shortcut)", r"shortcut", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.inner = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, bias=bias,
                                           batch_first=True)

    def forward(self, query, key, value, mask=None):
        out, w = self.inner(query, key, value, average_attn_weights=False)
        self.attn_weights = w
        return out
"""),
    Mistake("MultiHeadAttention", "calls F.scaled_dot_product_attention (forbidden)", r"shortcut",
            mha(rest='''        w = torch.softmax(scores, dim=-1)
        self.attn_weights = w
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.w_o(combine_heads(out))''')),
    # public pattern (issue 16): residual + LayerNorm inside the attention module
    Mistake("MultiHeadAttention", "adds the residual and a LayerNorm inside the attention module",
            r"LayerNorm", mha(init=_INIT + """
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)""", rest=_REST.replace(
        "        return self.w_o(combine_heads(out))",
        "        return self.layer_norm(self.w_o(combine_heads(out)) + query)"))),
    Mistake("MultiHeadAttention", "keys projected by the query layer: self.w_k = self.w_q",
            r"same layer as self\.w_q", mha(init=_INIT.replace(
                "self.w_k = nn.Linear(d_model, d_model, bias=bias)", "self.w_k = self.w_q"))),
]

VARIANTS = [
    # ---------------------------------------------------------------- split_heads
    Variant("split_heads", "reshape + permute", """
def split_heads(x, n_heads):
    B, L, D = x.shape
    return x.reshape(B, L, n_heads, -1).permute(0, 2, 1, 3)
"""),
    Variant("split_heads", "chunk the features and stack the chunks on a new head axis", """
def split_heads(x, n_heads):
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)
"""),
    Variant("split_heads", "unflatten + transpose", """
def split_heads(x, n_heads):
    return x.unflatten(-1, (n_heads, x.shape[-1] // n_heads)).transpose(1, 2)
"""),
    Variant("split_heads", "explicit slices in a loop", """
def split_heads(x, n_heads):
    dh = x.size(-1) // n_heads
    return torch.stack([x[..., h * dh:(h + 1) * dh] for h in range(n_heads)], dim=1)
"""),
    # ---------------------------------------------------------------- combine_heads
    Variant("combine_heads", "transpose + reshape", """
def combine_heads(x):
    B, H, L, Dh = x.shape
    return x.transpose(1, 2).reshape(B, L, H * Dh)
"""),
    Variant("combine_heads", "concatenate the heads on the feature axis", """
def combine_heads(x):
    return torch.cat(x.unbind(dim=1), dim=-1)
"""),
    Variant("combine_heads", "permute + flatten", """
def combine_heads(x):
    return x.permute(0, 2, 1, 3).flatten(start_dim=2)
"""),
    Variant("combine_heads", "einsum with an identity (a copy in the new order)", """
def combine_heads(x):
    B, H, L, Dh = x.shape
    return torch.einsum("bhld->blhd", x).contiguous().view(B, L, H * Dh)
"""),
    # ---------------------------------------------------------------- MultiHeadAttention
    Variant("MultiHeadAttention", "einsum, -1e9 additive mask, inline head split", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.h = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        B, Lq, D = query.shape
        Lk = key.shape[1]
        q = self.w_q(query).reshape(B, Lq, self.h, -1)
        k = self.w_k(key).reshape(B, Lk, self.h, -1)
        v = self.w_v(value).reshape(B, Lk, self.h, -1)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
        if mask is not None:
            m = mask[:, None] if mask.ndim == 3 else mask
            s = s + (~m).float() * -1e9
        w = s.softmax(-1)
        self.attn_weights = w.detach()
        o = torch.einsum("bhqk,bkhd->bqhd", self.drop(w), v)
        return self.w_o(o.reshape(B, Lq, D))
"""),
    Variant("MultiHeadAttention", "loop over heads with slices of w_q, w_k, w_v (the seeds' maths)", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def _head(self, layer, x, h):
        rows = slice(h * self.d_head, (h + 1) * self.d_head)
        b = None if layer.bias is None else layer.bias[rows]
        return F.linear(x, layer.weight[rows], b)

    def forward(self, query, key, value, mask=None):
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        outs, ws = [], []
        for h in range(self.n_heads):
            q = self._head(self.w_q, query, h)
            k = self._head(self.w_k, key, h)
            v = self._head(self.w_v, value, h)
            s = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
            if mask is not None:
                m = mask if mask.dim() == 2 else mask[:, h if mask.size(1) > 1 else 0]
                s = s.masked_fill(~m, -1e9)
            w = torch.softmax(s, dim=-1)
            ws.append(w)
            outs.append(self.dropout(w) @ v)
        self.attn_weights = torch.stack(ws, dim=1)
        return self.w_o(torch.cat(outs, dim=-1))
"""),
    Variant("MultiHeadAttention", "float64 inside, zeroed weights on fully masked rows", """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        q = split_heads(self.w_q(query), self.n_heads).double()
        k = split_heads(self.w_k(key), self.n_heads).double()
        v = split_heads(self.w_v(value), self.n_heads).double()
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if mask is not None:
            mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
            s = s.masked_fill(mask == 0, float("-inf"))
            mx = s.amax(-1, keepdim=True).clamp_min(-1e30)  # all -inf rows: keep exp finite
            e = (s - mx).exp()
            w = e / e.sum(-1, keepdim=True).clamp_min(1e-300)  # all-masked rows: zeros
        else:
            w = torch.softmax(s, dim=-1)
        self.attn_weights = w.float()
        out = torch.matmul(self.dropout(w), v).float()
        return self.w_o(combine_heads(out))
"""),
    Variant("MultiHeadAttention", "fused QKV projection with one F.linear for self-attention, reference sdpa", """
from tfscratch.reference import scaled_dot_product_attention as sdpa


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0, bias=True):
        super().__init__()
        self.n_heads, self.p = n_heads, dropout
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, query, key, value, mask=None):
        if query is key and key is value:  # self-attention: one product for q, k and v
            W = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])
            b = None if self.w_q.bias is None else torch.cat([self.w_q.bias, self.w_k.bias,
                                                               self.w_v.bias])
            q, k, v = F.linear(query, W, b).chunk(3, dim=-1)
        else:
            q, k, v = self.w_q(query), self.w_k(key), self.w_v(value)
        q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        out, w = sdpa(q, k, v, mask)
        self.attn_weights = w
        if self.training and self.p > 0:
            out = F.dropout(w, self.p, training=True) @ v
        return self.w_o(combine_heads(out))
"""),
]
