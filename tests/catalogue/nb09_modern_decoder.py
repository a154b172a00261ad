"""Catalogue for 09_modern_decoder: realistic mistakes and correct variants."""
from . import Mistake, Variant

ASSIGNMENT = "09_modern_decoder"
EXERCISES = ["rms_norm", "RMSNorm", "apply_rope", "SwiGLU", "GroupedQueryAttention",
             "ModernDecoderLM", "top_p_filter"]

# --------------------------------------------------------------------------- shared code
_RMS_MODULE = """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
"""

_ROPE_HEAD = """
def apply_rope(x, offset=0, base=10000.0):
    *_, L, D = x.shape
"""

_ROPE_POS = """
def apply_rope(x, offset=0, base=10000.0, positions=None):
    *_, L, D = x.shape
    pos = (torch.arange(offset, offset + L, dtype=torch.float64) if positions is None
           else positions.double())
    if pos.dim() == 2 and x.dim() == 4:
        pos = pos[:, None]
"""

_SWIGLU_INIT = """
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff, bias=False):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
"""

_GQA_INIT = """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False, base=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.base = n_heads, n_kv_heads, base
        self.head_dim = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
"""


def _gqa(q_rope="apply_rope(q, offset=P, base=self.base, positions=positions)",
         k_rope="apply_rope(k, offset=P, base=self.base, positions=positions)",
         v_line="", rep="k.repeat_interleave(group, dim=1)", rep_v="v.repeat_interleave(group, dim=1)",
         mask="torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)", ret="(k, v)",
         pre_split="", attend="out, _ = scaled_dot_product_attention(q, k_all, v_all, mask)"):
    return _GQA_INIT + f"""
    def forward(self, x, cache=None, positions=None):
        B, T, C = x.shape
        P = 0 if cache is None else cache[0].size(2)
        qp, kp, vp = self.w_q(x), self.w_k(x), self.w_v(x)
{pre_split}        q = qp.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = kp.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = vp.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = {q_rope}
        k = {k_rope}
{v_line}        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        group = self.n_heads // self.n_kv_heads
        k_all = {rep}
        v_all = {rep_v}
        mask = {mask}
        {attend}
        out = out.transpose(1, 2).reshape(B, T, C)
        return self.w_o(out), {ret}
"""


_BLOCK = """
class ModernBlock(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, d_ff):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.self_attn = GroupedQueryAttention(d_model, n_heads, n_kv_heads)
        self.norm2 = RMSNorm(d_model)
        self.ff = SwiGLU(d_model, d_ff)

    def forward(self, x, cache=None):
        a, cache = self.self_attn(self.norm1(x), cache)
        x = x + a
        return x + self.ff(self.norm2(x)), cache
"""


def _lm(init_extra="self.lm_head.weight = self.tok_embed.weight", head_bias="False",
        embed="x = self.tok_embed(tokens)", layer_cache="None if cache is None else cache[i]",
        final="self.lm_head(self.norm(x))", max_check="assert P + T <= self.max_len", block=_BLOCK,
        tie_cond="if tie_weights:"):
    return block + f"""
class ModernDecoderLM(nn.Module):
    def __init__(self, vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, max_len=1024,
                 tie_weights=True):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(ModernBlock(d_model, n_heads, n_kv_heads, d_ff)
                                    for _ in range(n_layers))
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias={head_bias})
        {tie_cond}
            {init_extra}

    def forward(self, tokens, cache=None):
        B, T = tokens.shape
        P = 0 if cache is None else cache[0][0].size(2)
        {max_check}
        {embed}
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, {layer_cache})
            new_cache.append(kv)
        return {final}, new_cache
"""


def _top_p(body):
    return "\ndef top_p_filter(logits, top_p):\n" + body


MISTAKES = [
    # ================================================================ rms_norm
    Mistake("rms_norm", "subtracts the mean (LayerNorm without bias)", r"subtracted the mean", """
def rms_norm(x, weight=None, eps=1e-6):
    xc = x - x.mean(-1, keepdim=True)
    y = xc / torch.sqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "eps outside the square root", r"eps is outside the square root", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "no eps at all (a row of zeros gives NaN)", r"NaN.*eps inside", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "divides by the mean square (square root forgotten)", r"square root is missing", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / (x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "divides by the L2 norm instead of the RMS", r"L2 norm", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "uses the variance (x.var, unbiased) instead of the mean square",
            r"standard deviation", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.var(-1, keepdim=True) + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "mean square over the batch axis (dim=0)", r"wrong axis", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "forgets the weight", r"weight was not applied", """
def rms_norm(x, weight=None, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
"""),
    Mistake("rms_norm", "returns float32 for float64 input", r"dtype", """
def rms_norm(x, weight=None, eps=1e-6):
    x = x.float()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()
"""),
    Mistake("rms_norm", "half precision: the mean of squares, rsqrt and product in bfloat16/float16 "
            "(no upcast)", r"half precision.*float32", """
def rms_norm(x, weight=None, eps=1e-6):
    ms = x.pow(2).mean(dim=-1, keepdim=True)
    y = x * torch.rsqrt(ms + eps)
    return y if weight is None else y * weight
"""),
    Mistake("rms_norm", "calls F.rms_norm", r"Shortcut used", """
def rms_norm(x, weight=None, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
"""),
    # ================================================================ RMSNorm
    Mistake("RMSNorm", "weight initialised randomly", r"initialise it to ones", """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(d))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
"""),
    Mistake("RMSNorm", "default eps 1e-5 (LayerNorm's)", r"default is eps=1e-6", """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
"""),
    Mistake("RMSNorm", "ignores the eps argument", r"eps given to RMSNorm", _RMS_MODULE + """
    def forward(self, x):
        return rms_norm(x, self.weight)
"""),
    Mistake("RMSNorm", "adds a bias like LayerNorm", r"no bias", """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps) + self.bias
"""),
    Mistake("RMSNorm", "weight as a plain tensor, not a Parameter", r"no parameter `weight`", """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.ones(d)

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
"""),
    Mistake("RMSNorm", "uses weight.data: no gradient reaches the parameter", r"no gradient", _RMS_MODULE + """
    def forward(self, x):
        return rms_norm(x, self.weight.data, self.eps)
"""),
    Mistake("RMSNorm", "scales before normalising (the gain cancels out)", r"Multiply the normalised x by self.weight",
            _RMS_MODULE + """
    def forward(self, x):
        return rms_norm(x * self.weight, None, self.eps)
"""),
    Mistake("RMSNorm", "wraps nn.RMSNorm", r"Shortcut used", _RMS_MODULE + """
    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
"""),
    # ================================================================ apply_rope
    Mistake("apply_rope", "half-split (rotate-half) pairing", r"half-split", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)
"""),
    Mistake("apply_rope", "frequency base**(-i/D) (i counts pairs)", r"wrong frequency exponent", _ROPE_HEAD + """
    inv = base ** (-torch.arange(D // 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "frequency base**(-4i/D) (arange(0, D, 2) divided by D/2)",
            r"wrong frequency exponent", _ROPE_HEAD + """
    inv = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / (D // 2))
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "rotates the wrong way (sin signs swapped)", r"wrong way", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c + b * s, -a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "ignores offset (cached tokens restart at position 0)", r"offset. was ignored", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "positions start at 1", r"start at 1", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset + 1, offset + L + 1, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "rotated halves concatenated instead of re-interleaved", r"concatenated", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)
"""),
    Mistake("apply_rope", "float64 angles never cast back: returns float64", r"dtype", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos(), th.sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "takes positions but ignores it (always offset + j)", r"positions. was ignored",
            _ROPE_POS.replace("positions is None", "True") + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = pos[..., None] * inv
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "half precision: cos and sin rounded to the input's dtype, bf16 arithmetic",
            r"float32", _ROPE_POS + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = pos[..., None] * inv
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
"""),
    Mistake("apply_rope", "writes the rotation into x in place", r"in place", _ROPE_HEAD + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = torch.outer(torch.arange(offset, offset + L, dtype=torch.float64), inv)
    c, s = th.cos().to(x.dtype), th.sin().to(x.dtype)
    a, b = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = a * c - b * s
    x[..., 1::2] = a * s + b * c
    return x
"""),
    # ================================================================ SwiGLU
    Mistake("SwiGLU", "silu on the up projection instead of the gate", r"wrong projection", _SWIGLU_INIT + """
    def forward(self, x):
        return self.down(self.gate(x) * F.silu(self.up(x)))
"""),
    Mistake("SwiGLU", "sigmoid gate (GLU, not SwiGLU)", r"sigmoid", _SWIGLU_INIT + """
    def forward(self, x):
        return self.down(torch.sigmoid(self.gate(x)) * self.up(x))
"""),
    Mistake("SwiGLU", "GELU gate (GeGLU)", r"GELU", _SWIGLU_INIT + """
    def forward(self, x):
        return self.down(F.gelu(self.gate(x)) * self.up(x))
"""),
    Mistake("SwiGLU", "no gate: a plain SiLU FFN", r"gate is missing", _SWIGLU_INIT + """
    def forward(self, x):
        return self.down(F.silu(self.up(x)))
"""),
    Mistake("SwiGLU", "silu of the product", r"after the product", _SWIGLU_INIT + """
    def forward(self, x):
        return self.down(F.silu(self.gate(x) * self.up(x)))
"""),
    Mistake("SwiGLU", "biases on by default", r"has a bias although bias=False", """
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff, bias=True):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))
"""),
    Mistake("SwiGLU", "LLaMA's w1/w2/w3 names instead of gate/up/down", r"no `gate` layer", """
class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff, bias=False):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
"""),
    Mistake("SwiGLU", "adds instead of multiplying", r"MULTIPLIES", _SWIGLU_INIT + """
    def forward(self, x):
        return self.down(F.silu(self.gate(x)) + self.up(x))
"""),
    # ================================================================ GroupedQueryAttention
    Mistake("GroupedQueryAttention", "K/V heads repeated with repeat (0,1,0,1) instead of repeat_interleave",
            r"wrong K/V heads", _gqa(rep="k.repeat(1, group, 1, 1)", rep_v="v.repeat(1, group, 1, 1)")),
    Mistake("GroupedQueryAttention", "no RoPE at all", r"RoPE is missing", _gqa(q_rope="q", k_rope="k")),
    Mistake("GroupedQueryAttention", "RoPE on the queries only", r"queries only", _gqa(k_rope="k")),
    Mistake("GroupedQueryAttention", "RoPE on the values too", r"values",
            _gqa(v_line="        v = apply_rope(v, offset=P, base=self.base)\n")),
    Mistake("GroupedQueryAttention", "RoPE over d_model before splitting heads", r"before splitting",
            _gqa(q_rope="q", k_rope="k",
                 pre_split="        qp, kp = apply_rope(qp, offset=P, base=self.base), "
                           "apply_rope(kp, offset=P, base=self.base)\n")),
    Mistake("GroupedQueryAttention", "positions not offset for cached tokens", r"not offset",
            _gqa(q_rope="apply_rope(q, base=self.base)", k_rope="apply_rope(k, base=self.base)")),
    Mistake("GroupedQueryAttention", "plain tril over the (T, P + T) cached mask", r"plain tril",
            _gqa(mask="torch.ones(T, P + T, dtype=torch.bool).tril()")),
    Mistake("GroupedQueryAttention", "caches the repeated K/V (n_heads copies)", r"QUERY head",
            _gqa(ret="(k_all, v_all)").replace(
                "k = torch.cat([cache[0], k], dim=2)", "k = torch.cat([cache[0][:, ::group], k], dim=2)").replace(
                "v = torch.cat([cache[1], v], dim=2)", "v = torch.cat([cache[1][:, ::group], v], dim=2)")),
    Mistake("GroupedQueryAttention", "not causal", r"not causal",
            _gqa(mask="torch.ones(T, P + T, dtype=torch.bool)")),
    Mistake("GroupedQueryAttention", "scores scaled by 1/sqrt(d_model)", r"1/sqrt\(d_model\)",
            _gqa(attend="w = ((q @ k_all.transpose(-2, -1)) / math.sqrt(C)).masked_fill(~mask, "
                        "float('-inf')).softmax(-1)\n        out = w @ v_all")),
    Mistake("GroupedQueryAttention", "caches the keys before RoPE", r"BEFORE RoPE", _GQA_INIT + """
    def forward(self, x, cache=None):
        B, T, C = x.shape
        P = 0 if cache is None else cache[0].size(2)
        q = self.w_q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.w_k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.w_v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        q = apply_rope(q, offset=P, base=self.base)
        kr = apply_rope(k, base=self.base)  # every key rotated again, from position 0
        group = self.n_heads // self.n_kv_heads
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        out, _ = scaled_dot_product_attention(q, kr.repeat_interleave(group, 1),
                                              v.repeat_interleave(group, 1), mask)
        return self.w_o(out.transpose(1, 2).reshape(B, T, C)), (k, v)
"""),
    Mistake("GroupedQueryAttention", "positions ignored when a cache is given", r"ignored once a cache",
            _gqa(q_rope="apply_rope(q, offset=P, base=self.base, positions=None if cache is not None else positions)",
                 k_rope="apply_rope(k, offset=P, base=self.base, positions=None if cache is not None else positions)")),
    Mistake("GroupedQueryAttention", "positions accepted but never used", r"`positions` was ignored",
            _gqa(q_rope="apply_rope(q, offset=P, base=self.base)", k_rope="apply_rope(k, offset=P, base=self.base)")),
    Mistake("GroupedQueryAttention", "positions for the queries only", r"queries only",
            _gqa(k_rope="apply_rope(k, offset=P, base=self.base)")),
    Mistake("GroupedQueryAttention", "forward(x, cache=None) without positions", r"does not take `positions`",
            _gqa().replace("def forward(self, x, cache=None, positions=None):", "def forward(self, x, cache=None):")
                  .replace(", positions=positions)", ")")),
    Mistake("GroupedQueryAttention", "F.scaled_dot_product_attention(enable_gqa=True) inside", r"Shortcut used",
            _gqa(attend="out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)")),
    Mistake("GroupedQueryAttention", "base not passed on to apply_rope", r"`base` argument",
            _gqa(q_rope="apply_rope(q, offset=P)", k_rope="apply_rope(k, offset=P)")),
    # ================================================================ ModernDecoderLM
    Mistake("ModernDecoderLM", "untied: a separate output layer", r"not tok_embed.weight",
            _lm(init_extra="pass")),
    Mistake("ModernDecoderLM", "copies the embedding into lm_head once (a copy, not a tie)",
            r"copy, not a tie",
            _lm(init_extra="self.lm_head.weight.data.copy_(self.tok_embed.weight.data)")),
    Mistake("ModernDecoderLM", "ties even when tie_weights=False", r"although tie_weights=False",
            _lm(tie_cond="if True:")),
    Mistake("ModernDecoderLM", "lm_head with a bias", r"lm_head has a bias", _lm(head_bias="True")),
    Mistake("ModernDecoderLM", "no final RMSNorm", r"final RMSNorm is missing", _lm(final="self.lm_head(x)")),
    Mistake("ModernDecoderLM", "embeddings scaled by sqrt(d_model) as in 08", r"sqrt\(d_model\)",
            _lm(embed="x = self.tok_embed(tokens) * math.sqrt(self.norm.weight.numel())")),
    Mistake("ModernDecoderLM", "adds a sinusoidal positional encoding as well", r"sinusoidal",
            _lm(embed="x = self.tok_embed(tokens) + R.sinusoidal_positional_encoding(P + T, "
                      "self.norm.weight.numel())[P:]")),
    Mistake("ModernDecoderLM", "post-norm blocks", r"post-norm", _lm(block=_BLOCK.replace(
        """        a, cache = self.self_attn(self.norm1(x), cache)
        x = x + a
        return x + self.ff(self.norm2(x)), cache""",
        """        a, cache = self.self_attn(x, cache)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x)), cache"""))),
    Mistake("ModernDecoderLM", "gives every layer the first layer's cache", r"cache\[i\] to layer i",
            _lm(layer_cache="None if cache is None else cache[0]")),
    Mistake("ModernDecoderLM", "logits from the embedding matrix even when tie_weights=False",
            r"although tie_weights=False: use lm_head",
            _lm(final="F.linear(self.norm(x), self.tok_embed.weight)")),
    Mistake("ModernDecoderLM", "no max_len check", r"did not raise", _lm(max_check="pass")),
    Mistake("ModernDecoderLM", "LayerNorm instead of RMSNorm in the blocks", r"no biases",
            _lm(block=_BLOCK.replace("self.norm1 = RMSNorm(d_model)", "self.norm1 = nn.LayerNorm(d_model)")
                .replace("self.norm2 = RMSNorm(d_model)", "self.norm2 = nn.LayerNorm(d_model)"))),
    # ================================================================ top_p_filter
    Mistake("top_p_filter", "keeps cumsum <= top_p: drops the token that reaches top_p",
            r"makes the total reach top_p", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(s, dim=-1).cumsum(-1)
    s = s.masked_fill(cum > top_p, float("-inf"))
    return torch.empty_like(logits).scatter(-1, order, s)
""")),
    Mistake("top_p_filter", "shifted mask without keeping the first: drops a top token above top_p",
            r"top token must always be kept", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(s, dim=-1).cumsum(-1)
    remove = cum > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    s = s.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter(-1, order, s)
""")),
    Mistake("top_p_filter", "returns the filtered logits in sorted order", r"sorted order", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(s, dim=-1)
    return s.masked_fill(p.cumsum(-1) - p >= top_p, float("-inf"))
""")),
    Mistake("top_p_filter", "returns probabilities instead of logits", r"returned probabilities", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(s, dim=-1)
    p = p.masked_fill(p.cumsum(-1) - p >= top_p, float("-inf"))
    return torch.empty_like(logits).scatter(-1, order, p)
""")),
    Mistake("top_p_filter", "removed tokens set to 0 instead of -inf", r"set to 0", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(s, dim=-1)
    s = s.masked_fill(p.cumsum(-1) - p >= top_p, 0.0)
    return torch.empty_like(logits).scatter(-1, order, s)
""")),
    Mistake("top_p_filter", "sorts ascending", r"ascending", _top_p("""
    s, order = torch.sort(logits, dim=-1)
    p = torch.softmax(s, dim=-1)
    s = s.masked_fill(p.cumsum(-1) - p >= top_p, float("-inf"))
    return torch.empty_like(logits).scatter(-1, order, s)
""")),
    Mistake("top_p_filter", "cumulative sum of the logits, not the probabilities", r"LOGITS", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    s = s.masked_fill(s.cumsum(-1) - s >= top_p, float("-inf"))
    return torch.empty_like(logits).scatter(-1, order, s)
""")),
    Mistake("top_p_filter", "masks the caller's logits in place", r"in place", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(s, dim=-1)
    remove = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, p.cumsum(-1) - p >= top_p)
    logits[remove] = float("-inf")
    return logits
""")),
]

VARIANTS = [
    # ================================================================ rms_norm
    Variant("rms_norm", "x * x and torch.mean, then a division by sqrt", """
def rms_norm(x, weight=None, eps=1e-6):
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    rms = torch.sqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + eps)
    out = xf / rms
    if weight is not None:
        out = out * weight
    return out.to(x.dtype)
"""),
    Variant("rms_norm", "float64 inside, cast back", """
def rms_norm(x, weight=None, eps=1e-6):
    x64 = x.double()
    y = x64 / (x64.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if weight is not None:
        y = y * weight.double()
    return y.to(x.dtype)
"""),
    Variant("rms_norm", "through torch.linalg.vector_norm / sqrt(d)", """
def rms_norm(x, weight=None, eps=1e-6):
    d = x.shape[-1]
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    ms = torch.linalg.vector_norm(xf, dim=-1, keepdim=True) ** 2 / d
    y = xf / torch.sqrt(ms + eps)
    return (y if weight is None else y * weight).to(x.dtype)
"""),
    Variant("rms_norm", "einsum for the sum of squares", """
def rms_norm(x, weight=None, eps=1e-6):
    ss = torch.einsum("...d,...d->...", x, x).unsqueeze(-1) / x.shape[-1]
    y = x * (ss + eps).rsqrt()
    return y * (1 if weight is None else weight)
""".replace("def rms_norm(x, weight=None, eps=1e-6):\n",
            "def rms_norm(x, weight=None, eps=1e-6):\n"
            "    if x.dtype in (torch.float16, torch.bfloat16):  # LLaMA's way: float32 inside,\n"
            "        y = rms_norm(x.float(), None, eps).type_as(x)  # rounded, then the gain\n"
            "        return y if weight is None else y * weight\n")),
    # ================================================================ RMSNorm
    Variant("RMSNorm", "self-contained forward", _RMS_MODULE + """
    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
"""),
    Variant("RMSNorm", "register_parameter and float64 inside", """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.register_parameter("weight", nn.Parameter(torch.ones(d)))

    def forward(self, x):
        x64 = x.double()
        y = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.double()).to(x.dtype)
"""),
    Variant("RMSNorm", "keeps eps as a buffer", """
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.register_buffer("eps_t", torch.tensor(eps))
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rms_norm(x, None, float(self.eps_t)) * self.weight
"""),
    # ================================================================ apply_rope
    Variant("apply_rope", "complex numbers (view_as_complex, polar), float64 inside", _ROPE_POS + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = pos[..., None] * inv
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2).contiguous())
    out = torch.view_as_real(z * torch.polar(torch.ones_like(th), th))
    return out.reshape(x.shape).to(x.dtype)
"""),
    Variant("apply_rope", "x * cos + rotate_pairs(x) * sin with interleaved cos/sin, float32 angles",
            _ROPE_POS + """
    inv = 1.0 / (base ** (torch.arange(0, D, 2).float() / D))
    th = pos.float()[..., None] * inv
    cos = th.cos().repeat_interleave(2, dim=-1)
    sin = th.sin().repeat_interleave(2, dim=-1)
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    rot = torch.stack([-xf[..., 1::2], xf[..., 0::2]], dim=-1).reshape(x.shape)
    return (xf * cos.to(xf.dtype) + rot * sin.to(xf.dtype)).to(x.dtype)
"""),
    Variant("apply_rope", "a loop over pairs with math.pow frequencies, per-pair float32", _ROPE_POS + """
    work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    out = torch.empty(x.shape, dtype=work)
    for i in range(D // 2):
        t = pos * math.pow(base, -2 * i / D)
        c, s = t.cos().to(work)[..., None], t.sin().to(work)[..., None]
        a, b = x[..., 2 * i:2 * i + 1].to(work), x[..., 2 * i + 1:2 * i + 2].to(work)
        out[..., 2 * i:2 * i + 1] = a * c - b * s
        out[..., 2 * i + 1:2 * i + 2] = a * s + b * c
    return out.to(x.dtype)
"""),
    Variant("apply_rope", "a block-diagonal rotation matrix per position (einsum)", _ROPE_POS + """
    inv = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    th = pos[..., None] * inv
    Rm = torch.zeros(*th.shape[:-1], D, D, dtype=torch.float64)
    i = torch.arange(D // 2)
    Rm[..., 2 * i, 2 * i], Rm[..., 2 * i, 2 * i + 1] = th.cos(), -th.sin()
    Rm[..., 2 * i + 1, 2 * i], Rm[..., 2 * i + 1, 2 * i + 1] = th.sin(), th.cos()
    return torch.einsum("...lij,...lj->...li", Rm, x.double()).to(x.dtype)
"""),
    # ================================================================ SwiGLU
    Variant("SwiGLU", "x * sigmoid(x) written out", _SWIGLU_INIT + """
    def forward(self, x):
        g = self.gate(x)
        return self.down(g * torch.sigmoid(g) * self.up(x))
"""),
    Variant("SwiGLU", "F.linear with the weights and float64 inside", _SWIGLU_INIT + """
    def forward(self, x):
        lin = lambda m, t: F.linear(t, m.weight.double(), None if m.bias is None else m.bias.double())
        h = F.silu(lin(self.gate, x.double())) * lin(self.up, x.double())
        return lin(self.down, h).to(x.dtype)
"""),
    Variant("SwiGLU", "einsum", _SWIGLU_INIT + """
    def forward(self, x):
        g = torch.einsum("...d,fd->...f", x, self.gate.weight)
        u = torch.einsum("...d,fd->...f", x, self.up.weight)
        if self.gate.bias is not None:
            g, u = g + self.gate.bias, u + self.up.bias
        return self.down(F.silu(g) * u)
"""),
    # ================================================================ GroupedQueryAttention
    Variant("GroupedQueryAttention", "a loop over K/V groups, no repeat", _GQA_INIT + """
    def forward(self, x, cache=None, positions=None):
        B, T, C = x.shape
        P = 0 if cache is None else cache[0].size(2)
        q = apply_rope(self.w_q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), P, self.base,
                       positions)
        k = apply_rope(self.w_k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2), P, self.base,
                       positions)
        v = self.w_v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        g = self.n_heads // self.n_kv_heads
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        outs = []
        for j in range(self.n_kv_heads):
            qj = q[:, j * g:(j + 1) * g]  # the query heads of group j
            o, _ = scaled_dot_product_attention(qj, k[:, j:j + 1], v[:, j:j + 1], mask)
            outs.append(o)
        out = torch.cat(outs, dim=1).transpose(1, 2).reshape(B, T, C)
        return self.w_o(out), (k, v)
"""),
    Variant("GroupedQueryAttention", "einsum on (B, Hkv, group, T, hd), masked_fill, float64 softmax",
            _GQA_INIT + """
    def forward(self, x, cache=None, positions=None):
        B, T, C = x.shape
        P = 0 if cache is None else cache[0].size(2)
        g = self.n_heads // self.n_kv_heads
        pos = torch.arange(P, P + T) if positions is None else positions
        pos = pos.expand(B, T)  # (B, T) in every case
        q = apply_rope(self.w_q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), base=self.base,
                       positions=pos)
        k = apply_rope(self.w_k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2),
                       base=self.base, positions=pos)
        v = self.w_v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        qg = q.reshape(B, self.n_kv_heads, g, T, self.head_dim)  # heads h = j * g + r
        s = torch.einsum("bjrtd,bjsd->bjrts", qg.double(), k.double()) / math.sqrt(self.head_dim)
        allowed = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        w = s.masked_fill(~allowed, float("-inf")).softmax(-1)
        o = torch.einsum("bjrts,bjsd->bjrtd", w, v.double()).to(x.dtype)
        return self.w_o(o.reshape(B, self.n_heads, T, self.head_dim).transpose(1, 2).reshape(B, T, C)), (k, v)
"""),
    Variant("GroupedQueryAttention", "expand + reshape instead of repeat_interleave",
            _gqa(rep="k[:, :, None].expand(-1, -1, group, -1, -1).reshape(B, self.n_heads, -1, self.head_dim)",
                 rep_v="v[:, :, None].expand(-1, -1, group, -1, -1).reshape(B, self.n_heads, -1, self.head_dim)")),
    # ================================================================ ModernDecoderLM
    Variant("ModernDecoderLM", "ties the other way round (embedding takes lm_head's weight)",
            _lm(init_extra="self.tok_embed.weight = self.lm_head.weight")),
    Variant("ModernDecoderLM", "blocks as nn.ModuleDict, cache as a tuple, ValueError past max_len", """
class ModernDecoderLM(nn.Module):
    def __init__(self, vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, max_len=1024,
                 tie_weights=True):
        super().__init__()
        self.max_len = max_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(nn.ModuleDict({
            "norm1": RMSNorm(d_model), "self_attn": GroupedQueryAttention(d_model, n_heads, n_kv_heads),
            "norm2": RMSNorm(d_model), "ff": SwiGLU(d_model, d_ff)}) for _ in range(n_layers))
        self.norm = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.tok_embed.weight

    def forward(self, tokens, cache=None):
        P = 0 if cache is None else cache[0][0].shape[2]
        if P + tokens.shape[1] > self.max_len:
            raise ValueError("too long")
        x = self.tok_embed(tokens)
        out = []
        for i, blk in enumerate(self.layers):
            a, kv = blk["self_attn"](blk["norm1"](x), None if cache is None else cache[i])
            x = x + a
            x = x + blk["ff"](blk["norm2"](x))
            out.append(kv)
        return self.lm_head(self.norm(x)), tuple(out)
"""),
    Variant("ModernDecoderLM", "logits as F.linear with lm_head's weight, norm as a function",
            _lm(final="F.linear(rms_norm(x, self.norm.weight, self.norm.eps), self.lm_head.weight)")),
    # ================================================================ top_p_filter
    Variant("top_p_filter", "Hugging Face style: ascending sort, remove cumsum <= 1 - top_p", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=False)
    cum = s.softmax(dim=-1).cumsum(dim=-1)
    remove = cum <= (1 - top_p)
    remove[..., -1] = False
    remove = remove.scatter(-1, order, remove)
    return logits.masked_fill(remove, float("-inf"))
""")),
    Variant("top_p_filter", "a loop over rows in Python", _top_p("""
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.full_like(flat, float("-inf"))
    for r in range(flat.shape[0]):
        p = torch.softmax(flat[r].double(), dim=0)
        total = 0.0
        for j in torch.argsort(p, descending=True).tolist():
            out[r, j] = flat[r, j]
            total += p[j].item()
            if total >= top_p:
                break
    return out.reshape(logits.shape)
""")),
    Variant("top_p_filter", "float64 probabilities, inverse permutation by argsort and gather", _top_p("""
    s, order = torch.sort(logits, dim=-1, descending=True)
    p = torch.softmax(s.double(), dim=-1)
    keep = (p.cumsum(-1) - p) < top_p
    kept = torch.where(keep, s, torch.full_like(s, float("-inf")))
    return kept.gather(-1, torch.argsort(order, dim=-1))
""")),
]
