"""Catalogue for 10_efficient_attention: realistic mistakes and correct variants.

Most entries are the solution with one thing changed; `_edit` applies the change and fails
loudly if the text it replaces is not there (so the catalogue cannot silently drift)."""
from . import Mistake, Variant

ASSIGNMENT = "10_efficient_attention"
EXERCISES = ["online_softmax", "flash_attention", "FlashAttention"]

SOFTMAX = '''
def online_softmax(x, block_size):
    N = x.size(-1)
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xw = x.to(work)
    lowest = torch.finfo(work).min
    m = torch.full(x.shape[:-1] + (1,), lowest, dtype=work, device=x.device)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=work, device=x.device)
    for start in range(0, N, block_size):
        block = xw[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return (torch.exp(xw - m) / l).to(x.dtype)
'''

FLASH = '''
def flash_attention(q, k, v, block_size=64, causal=False):
    Lq, Lk = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    lowest = torch.finfo(q.dtype).min
    m = torch.full(q.shape[:-1] + (1,), lowest, dtype=q.dtype, device=q.device)
    l = torch.zeros(q.shape[:-1] + (1,), dtype=q.dtype, device=q.device)
    acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype, device=q.device)
    q_pos = torch.arange(Lq, device=q.device)[:, None]
    for start in range(0, Lk, block_size):
        k_blk = k[..., start:start + block_size, :]
        v_blk = v[..., start:start + block_size, :]
        s = (q @ k_blk.transpose(-2, -1)) * scale
        if causal:
            k_pos = torch.arange(start, start + k_blk.size(-2), device=q.device)[None, :]
            s = s.masked_fill(k_pos > q_pos, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)
        alpha = torch.exp(m - m_new)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v_blk
        m = m_new
    return acc / l
'''


FA = '''
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        Lq, Lk = q.size(-2), k.size(-2)
        scale = 1.0 / math.sqrt(q.size(-1))
        m = torch.full(q.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype, device=q.device)
        q_pos = torch.arange(Lq, device=q.device)[:, None]
        for start in range(0, Lk, block_size):
            k_blk, v_blk = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
            s = (q @ k_blk.transpose(-2, -1)) * scale
            if causal:
                k_pos = torch.arange(start, start + k_blk.size(-2), device=q.device)[None, :]
                s = s.masked_fill(k_pos > q_pos, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ v_blk
            m = m_new
        o = acc / l
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block_size, ctx.causal, ctx.scale = block_size, causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        bs, scale = ctx.block_size, ctx.scale
        Lq, Lk = q.size(-2), k.size(-2)
        D = (do * o).sum(dim=-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        q_pos = torch.arange(Lq, device=q.device)[:, None]
        for start in range(0, Lk, bs):
            end = min(start + bs, Lk)
            k_blk, v_blk = k[..., start:end, :], v[..., start:end, :]
            s = (q @ k_blk.transpose(-2, -1)) * scale
            if ctx.causal:
                k_pos = torch.arange(start, end, device=q.device)[None, :]
                s = s.masked_fill(k_pos > q_pos, float("-inf"))
            p = torch.exp(s - lse)
            dv[..., start:end, :] = p.transpose(-2, -1) @ do
            dp = do @ v_blk.transpose(-2, -1)
            ds = p * (dp - D)
            dq += (ds @ k_blk) * scale
            dk[..., start:end, :] = (ds.transpose(-2, -1) @ q) * scale
        return dq, dk, dv, None, None
'''


def _edit(base, *pairs):
    out = base
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert old in out, f"catalogue edit does not apply: {old!r}"
        out = out.replace(old, new)
    return out


S, A, FB = "online_softmax", "flash_attention", "FlashAttention"
L_UPDATE = "        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)\n"

MISTAKES = [
    # ---------------------------------------------------------------- online_softmax
    Mistake(S, "the running sum is not rescaled when the max grows", r"running sum is not rescaled",
            _edit(SOFTMAX, L_UPDATE, "        l = l + torch.exp(block - m_new).sum(dim=-1, keepdim=True)\n")),
    Mistake(S, "rescales with exp(m_new - m_old) instead of exp(m_old - m_new)", r"m_new - m_old",
            _edit(SOFTMAX, "l * torch.exp(m - m_new)", "l * torch.exp(m_new - m)")),
    Mistake(S, "each block normalised on its own (a softmax per block, concatenated)",
            r"normalised on its own", '''
def online_softmax(x, block_size):
    outs = []
    for start in range(0, x.size(-1), block_size):
        block = x[..., start:start + block_size]
        e = torch.exp(block - block.amax(dim=-1, keepdim=True))
        outs.append(e / e.sum(dim=-1, keepdim=True))
    return torch.cat(outs, dim=-1)
'''),
    Mistake(S, "N // block_size blocks: the last, shorter block is never visited",
            r"last, shorter block", _edit(SOFTMAX, "range(0, N, block_size)",
                                          "range(0, N - block_size + 1, block_size)")),
    Mistake(S, "two passes: the max of the whole row first, then the sum in blocks",
            r"at once.*two-pass", '''
def online_softmax(x, block_size):
    m = x.amax(dim=-1, keepdim=True)
    l = torch.zeros_like(m)
    for start in range(0, x.size(-1), block_size):
        l = l + torch.exp(x[..., start:start + block_size] - m).sum(dim=-1, keepdim=True)
    return torch.exp(x - m) / l
'''),
    Mistake(S, "the running max starts at -inf: a fully masked block gives NaN",
            r"exp\(-inf - \(-inf\)\)", _edit(SOFTMAX, "lowest = torch.finfo(work).min",
                                            "lowest = float('-inf')")),
    Mistake(S, "no max at all: exp of the raw scores, summed in blocks", r"overflow", '''
def online_softmax(x, block_size):
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for start in range(0, x.size(-1), block_size):
        l = l + torch.exp(x[..., start:start + block_size]).sum(dim=-1, keepdim=True)
    return torch.exp(x) / l
'''),
    Mistake(S, "each block's sum uses its own max, and the sums are added unrescaled",
            r"own max", _edit(SOFTMAX, L_UPDATE,
                              "        l = l + torch.exp(block - block.amax(dim=-1, keepdim=True)).sum(dim=-1, keepdim=True)\n")),
    Mistake(S, "calls torch.softmax", r"shortcut", '''
def online_softmax(x, block_size):
    return torch.softmax(x, dim=-1)
'''),
    Mistake(S, "always returns float32", r"dtype", _edit(SOFTMAX, ".to(x.dtype)", ".float()")),
    # issue 27: half precision
    Mistake(S, "running max and sum kept in bfloat16/float16 (no upcast)", r"half precision.*float32",
            _edit(SOFTMAX, "torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype",
                  "x.dtype")),
    Mistake(S, "upcasts to float32 but returns float32 for half inputs", r"another dtype",
            _edit(SOFTMAX, "(torch.exp(xw - m) / l).to(x.dtype)", "torch.exp(xw - m) / l")),
    # ---------------------------------------------------------------- flash_attention
    Mistake(A, "scales by sqrt(d_v), the value size", r"sqrt\(d_v\)",
            _edit(FLASH, "math.sqrt(q.size(-1))", "math.sqrt(v.size(-1))")),
    Mistake(A, "divides the scores by d_k instead of sqrt(d_k)", r"by d_k, not sqrt",
            _edit(FLASH, "1.0 / math.sqrt(q.size(-1))", "1.0 / q.size(-1)")),
    Mistake(A, "forgets to rescale the accumulator", r"accumulator is not rescaled",
            _edit(FLASH, "acc = acc * alpha + p @ v_blk", "acc = acc + p @ v_blk")),
    Mistake(A, "forgets to rescale the running sum", r"running sum is not rescaled",
            _edit(FLASH, "l = l * alpha + p.sum", "l = l + p.sum")),
    Mistake(A, "rescales with exp(m_new - m_old)", r"m_new - m_old",
            _edit(FLASH, "alpha = torch.exp(m - m_new)", "alpha = torch.exp(m_new - m)")),
    Mistake(A, "never divides by the running sum", r"never divided",
            _edit(FLASH, "    return acc / l", "    return acc")),
    Mistake(A, "causal mask with key positions counted inside the block (no offset)",
            r"offset the key positions", _edit(
                FLASH, "torch.arange(start, start + k_blk.size(-2), device=q.device)",
                "torch.arange(k_blk.size(-2), device=q.device)")),
    Mistake(A, "causal mask that hides the diagonal too", r"diagonal",
            _edit(FLASH, "k_pos > q_pos", "k_pos >= q_pos")),
    Mistake(A, "causal mask inverted (hides the past)", r"hides the past",
            _edit(FLASH, "k_pos > q_pos", "k_pos < q_pos")),
    Mistake(A, "ignores causal=True", r"causal=True is ignored",
            _edit(FLASH, "        if causal:\n", "        if False:\n")),
    Mistake(A, "materialises the full score matrix (naive attention with the right signature)",
            r"Lq x Lk.*score or mask", '''
def flash_attention(q, k, v, block_size=64, causal=False):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v
'''),
    Mistake(A, "blockwise scores but one full (L, L) causal mask, sliced per block",
            r"full tril mask counts", _edit(
                FLASH, "    q_pos = torch.arange(Lq, device=q.device)[:, None]\n",
                "    full = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril()\n",
                "            k_pos = torch.arange(start, start + k_blk.size(-2), device=q.device)[None, :]\n"
                "            s = s.masked_fill(k_pos > q_pos, float(\"-inf\"))\n",
                "            s = s.masked_fill(~full[:, start:start + block_size], float(\"-inf\"))\n")),
    Mistake(A, "runs under torch.no_grad(): nothing to backpropagate", r"does not require grad",
            "@torch.no_grad()" + FLASH),
    Mistake(A, "calls F.scaled_dot_product_attention", r"shortcut", '''
def flash_attention(q, k, v, block_size=64, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
'''),
    Mistake(A, "always computes in float32", r"dtype",
            _edit(FLASH, "    return acc / l", "    return (acc / l).float()")),
    # issue 27: no running max (the scores' exp overflows only when they are large)
    Mistake(S, "no running max at all: exp(x) summed as it is", r"overflow", '''
def online_softmax(x, block_size):
    l = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)
    for start in range(0, x.size(-1), block_size):
        l = l + torch.exp(x[..., start:start + block_size]).sum(dim=-1, keepdim=True)
    return torch.exp(x) / l
'''),
    Mistake(S, "the max of the first block only, never updated", r"overflow|max", '''
def online_softmax(x, block_size):
    m = x[..., :block_size].amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    l = torch.zeros_like(m)
    for start in range(0, x.size(-1), block_size):
        l = l + torch.exp(x[..., start:start + block_size] - m).sum(dim=-1, keepdim=True)
    return torch.exp(x - m) / l
'''),
    Mistake(A, "no running max: p = exp(s), summed as it is", r"overflow", _edit(FLASH,
            "        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))\n"
            "        p = torch.exp(s - m_new)\n"
            "        alpha = torch.exp(m - m_new)\n"
            "        l = l * alpha + p.sum(dim=-1, keepdim=True)\n"
            "        acc = acc * alpha + p @ v_blk\n"
            "        m = m_new\n",
            "        p = torch.exp(s)\n"
            "        l = l + p.sum(dim=-1, keepdim=True)\n"
            "        acc = acc + p @ v_blk\n")),
]

MISTAKES += [
    # ---------------------------------------------------------------- FlashAttention
    Mistake(FB, "saves the running max m, not the log-sum-exp: P = exp(S - m) in backward",
            r"log-sum-exp", _edit(FA, "lse = m + torch.log(l)", "lse = m")),
    Mistake(FB, "the D term missing: dS = P * dP", r"D term is missing",
            _edit(FA, "ds = p * (dp - D)", "ds = p * dp")),
    Mistake(FB, "dK not scaled by 1/sqrt(d)", r"dK is not scaled",
            _edit(FA, "(ds.transpose(-2, -1) @ q) * scale", "(ds.transpose(-2, -1) @ q)")),
    Mistake(FB, "dQ not scaled by 1/sqrt(d)", r"dQ is not scaled",
            _edit(FA, "dq += (ds @ k_blk) * scale", "dq += ds @ k_blk")),
    Mistake(FB, "the causal mask not applied in backward", r"not applied in backward",
            _edit(FA, "            if ctx.causal:\n", "            if False:\n")),
    Mistake(FB, "saves the full matrix of probabilities P for backward", r"saved for backward|Lq, Lk", _edit(FA,
            "        for start in range(0, Lk, block_size):\n",
            "        ps = []\n        for start in range(0, Lk, block_size):\n",
            "            m = m_new\n",
            "            m = m_new\n            ps.append((p, m_new))\n",
            "        ctx.save_for_backward(q, k, v, o, lse)\n",
            "        P = torch.cat([p * torch.exp(mb - m) / l for p, mb in ps], dim=-1)\n"
            "        ctx.save_for_backward(q, k, v, o, lse, P)\n",
            "        q, k, v, o, lse = ctx.saved_tensors\n",
            "        q, k, v, o, lse, P = ctx.saved_tensors\n",
            "            p = torch.exp(s - lse)\n",
            "            p = P[..., start:end]\n")),
    Mistake(FB, "no Function: apply is the forward loop, and autograd saves every block", r"saved for backward", """
class FlashAttention:
    @staticmethod
    def apply(q, k, v, block_size=64, causal=False):
        scale = 1.0 / math.sqrt(q.size(-1))
        m = torch.full(q.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
        q_pos = torch.arange(q.size(-2))[:, None]
        for start in range(0, k.size(-2), block_size):
            k_blk, v_blk = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
            s = (q @ k_blk.transpose(-2, -1)) * scale
            if causal:
                s = s.masked_fill(torch.arange(start, start + k_blk.size(-2))[None, :] > q_pos, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ v_blk
            m = m_new
        return acc / l
"""),
    Mistake(FB, "backward re-runs the forward loop under autograd (every block alive at once)",
            r"every thread counted|in this thread or another", """
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def _loop(q, k, v, block_size, causal):
        scale = 1.0 / math.sqrt(q.size(-1))
        m = torch.full(q.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=q.dtype)
        q_pos = torch.arange(q.size(-2))[:, None]
        for start in range(0, k.size(-2), block_size):
            k_blk, v_blk = k[..., start:start + block_size, :], v[..., start:start + block_size, :]
            s = (q @ k_blk.transpose(-2, -1)) * scale
            if causal:
                s = s.masked_fill(torch.arange(start, start + k_blk.size(-2))[None, :] > q_pos, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ v_blk
            m = m_new
        return acc / l

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        ctx.save_for_backward(q, k, v)
        ctx.block_size, ctx.causal = block_size, causal
        return FlashAttention._loop(q, k, v, block_size, causal)

    @staticmethod
    def backward(ctx, do):
        q, k, v = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
        with torch.enable_grad():
            o = FlashAttention._loop(q, k, v, ctx.block_size, ctx.causal)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        return dq, dk, dv, None, None
"""),
    Mistake(FB, "forward calls F.scaled_dot_product_attention", r"shortcut", _edit(FA,
            "        o = acc / l\n",
            "        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n")),
    Mistake(FB, "an honest forward, and backward handed to aten's fused CPU flash-attention backward",
            r"shortcut", FA.split("    @staticmethod\n    def backward")[0] + """    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        lead = q.shape[:-2]                      # the fused kernel wants (B, H, L, d)
        q4, k4, v4, o4, do4 = (t.reshape(-1, 1, *t.shape[-2:]) for t in (q, k, v, o, do))
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do4, q4, k4, v4, o4, lse.reshape(-1, 1, lse.size(-2)), 0.0, ctx.causal, scale=ctx.scale)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None, None
"""),
]

VARIANTS = [
    # ---------------------------------------------------------------- online_softmax
    Variant(S, "a while loop, -inf start and a torch.where guard on the rescale factor", '''
def online_softmax(x, block_size):
    dtype = x.dtype
    if dtype in (torch.half, torch.bfloat16):
        x = x.float()
    m = torch.full_like(x[..., :1], float("-inf"))
    l = torch.zeros_like(m)
    i = 0
    while i < x.shape[-1]:
        block = x[..., i:i + block_size]
        m_new = torch.maximum(m, block.max(dim=-1, keepdim=True).values)
        both_inf = torch.isneginf(m_new)
        alpha = torch.where(both_inf, torch.zeros_like(m), torch.exp(m - m_new))
        safe = torch.where(both_inf, torch.zeros_like(m_new), m_new)
        l = l * alpha + torch.exp(block - safe).sum(dim=-1, keepdim=True)
        m = m_new
        i += block_size
    return (torch.exp(x - m) / l).to(dtype)
'''),
    Variant(S, "float64 accumulators, torch.split over the blocks", '''
def online_softmax(x, block_size):
    m = torch.full(x.shape[:-1] + (1,), -1e300, dtype=torch.float64)
    l = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float64)
    for block in torch.split(x.double(), block_size, dim=-1):
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        l = l * (m - m_new).exp() + (block - m_new).exp().sum(-1, keepdim=True)
        m = m_new
    return ((x.double() - m).exp() / l).to(x.dtype)
'''),
    Variant(S, "log domain: a running logsumexp of the blocks", '''
def online_softmax(x, block_size):
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16/fp16 -> float32, float64 stays
    lse = torch.full_like(xf[..., :1], float("-inf"))
    for start in range(0, x.size(-1), block_size):
        block_lse = torch.logsumexp(xf[..., start:start + block_size], dim=-1, keepdim=True)
        lse = torch.logaddexp(lse, block_lse)
    return torch.exp(xf - lse).type_as(x)
'''),
    Variant(S, "keeps each block's exponentials and rescales them all at the end", '''
def online_softmax(x, block_size):
    out_dtype = x.dtype
    x = x.float() if x.element_size() < 4 else x
    lowest = torch.finfo(x.dtype).min
    m = torch.full(x.shape[:-1] + (1,), lowest, dtype=x.dtype)
    l = torch.zeros_like(m)
    parts = []
    for start in range(0, x.size(-1), block_size):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        e = torch.exp(block - m_new)
        l = l * torch.exp(m - m_new) + e.sum(-1, keepdim=True)
        parts.append((e, m_new))
        m = m_new
    return (torch.cat([e * torch.exp(mb - m) for e, mb in parts], dim=-1) / l).to(out_dtype)
'''),
    # ---------------------------------------------------------------- flash_attention
    Variant(A, "blocks of queries too, skipping fully masked key blocks (as a real kernel does)", '''
def flash_attention(q, k, v, block_size=64, causal=False):
    Lq, Lk, scale = q.size(-2), k.size(-2), q.size(-1) ** -0.5
    rows = []
    for qs in range(0, Lq, block_size):
        qb = q[..., qs:qs + block_size, :]
        qpos = torch.arange(qs, qs + qb.size(-2))[:, None]
        m = torch.full(qb.shape[:-1] + (1,), torch.finfo(q.dtype).min, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (v.size(-1),), dtype=q.dtype)
        k_end = min(Lk, qs + qb.size(-2)) if causal else Lk
        for ks in range(0, k_end, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-2, -1) * scale
            if causal:
                kpos = torch.arange(ks, ks + s.size(-1))[None, :]
                s = s.masked_fill(kpos > qpos, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = alpha * l + p.sum(-1, keepdim=True)
            acc = alpha * acc + p @ v[..., ks:ks + block_size, :]
            m = m_new
        rows.append(acc / l)
    return torch.cat(rows, dim=-2)
'''),
    Variant(A, "float64 accumulators and einsum", '''
def flash_attention(q, k, v, block_size=64, causal=False):
    qd, kd, vd = q.double(), k.double(), v.double()
    Lq, Lk = q.shape[-2], k.shape[-2]
    m = torch.full(q.shape[:-1] + (1,), -1e300, dtype=torch.float64)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for start in range(0, Lk, block_size):
        end = min(start + block_size, Lk)
        s = torch.einsum("...qd,...kd->...qk", qd, kd[..., start:end, :]) / math.sqrt(q.shape[-1])
        if causal:
            allowed = torch.arange(start, end)[None, :] <= torch.arange(Lq)[:, None]
            s = torch.where(allowed, s, torch.tensor(float("-inf"), dtype=s.dtype))
        m_new = torch.maximum(m, s.max(-1, keepdim=True).values)
        p = (s - m_new).exp()
        alpha = (m - m_new).exp()
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = alpha * acc + torch.einsum("...qk,...kd->...qd", p, vd[..., start:end, :])
        m = m_new
    return (acc / l).to(q.dtype)
'''),
    Variant(A, "a while loop, -inf start with a torch.where guard, masked_fill with ~allowed", '''
def flash_attention(q, k, v, block_size=64, causal=False):
    Lk = k.shape[-2]
    m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    i = 0
    while i < Lk:
        kb, vb = k[..., i:i + block_size, :], v[..., i:i + block_size, :]
        s = q @ kb.transpose(-2, -1) / q.shape[-1] ** 0.5
        if causal:
            allowed = torch.arange(i, i + kb.shape[-2]) <= torch.arange(q.shape[-2])[:, None]
            s = s.masked_fill(~allowed, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)
        acc = acc * alpha + p @ vb
        l = l * alpha + p.sum(-1, keepdim=True)
        m = m_new
        i += block_size
    return acc / l
'''),
    # ---------------------------------------------------------------- FlashAttention
    Variant(FB, "einsum throughout, m and l saved instead of the log-sum-exp", _edit(FA,
            "        ctx.save_for_backward(q, k, v, o, lse)\n",
            "        ctx.save_for_backward(q, k, v, o, m, l)\n",
            "        q, k, v, o, lse = ctx.saved_tensors\n",
            "        q, k, v, o, m, l = ctx.saved_tensors\n        lse = m + torch.log(l)\n",
            "            s = (q @ k_blk.transpose(-2, -1)) * scale\n            if ctx.causal:",
            "            s = torch.einsum('...qd,...kd->...qk', q, k_blk) * scale\n            if ctx.causal:",
            "            dv[..., start:end, :] = p.transpose(-2, -1) @ do\n",
            "            dv[..., start:end, :] = torch.einsum('...qk,...qd->...kd', p, do)\n",
            "            dp = do @ v_blk.transpose(-2, -1)\n",
            "            dp = torch.einsum('...qd,...kd->...qk', do, v_blk)\n",
            "            dq += (ds @ k_blk) * scale\n",
            "            dq += torch.einsum('...qk,...kd->...qd', ds, k_blk) * scale\n",
            "            dk[..., start:end, :] = (ds.transpose(-2, -1) @ q) * scale\n",
            "            dk[..., start:end, :] = torch.einsum('...qk,...qd->...kd', ds, q) * scale\n")),
    Variant(FB, "backward with the outer loop over query blocks, dK and dV accumulated", _edit(FA,
            "        for start in range(0, Lk, bs):\n"
            "            end = min(start + bs, Lk)\n",
            "        for qs in range(0, Lq, bs):\n"
            "          qe = min(qs + bs, Lq)\n"
            "          q_b, do_b, lse_b, D_b = q[..., qs:qe, :], do[..., qs:qe, :], lse[..., qs:qe, :], D[..., qs:qe, :]\n"
            "          q_pos = torch.arange(qs, qe)[:, None]\n"
            "          for start in range(0, Lk, bs):\n"
            "            end = min(start + bs, Lk)\n",
            "            s = (q @ k_blk.transpose(-2, -1)) * scale\n            if ctx.causal:",
            "            s = (q_b @ k_blk.transpose(-2, -1)) * scale\n            if ctx.causal:",
            "            p = torch.exp(s - lse)\n"
            "            dv[..., start:end, :] = p.transpose(-2, -1) @ do\n"
            "            dp = do @ v_blk.transpose(-2, -1)\n"
            "            ds = p * (dp - D)\n"
            "            dq += (ds @ k_blk) * scale\n"
            "            dk[..., start:end, :] = (ds.transpose(-2, -1) @ q) * scale\n",
            "            p = torch.exp(s - lse_b)\n"
            "            dv[..., start:end, :] += p.transpose(-2, -1) @ do_b\n"
            "            ds = p * (do_b @ v_blk.transpose(-2, -1) - D_b)\n"
            "            dq[..., qs:qe, :] += (ds @ k_blk) * scale\n"
            "            dk[..., start:end, :] += (ds.transpose(-2, -1) @ q_b) * scale\n")),
    Variant(FB, "float64 inside, cast back, cached values kept on ctx as attributes", """
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        qd, kd, vd = q.double(), k.double(), v.double()
        scale = q.size(-1) ** -0.5
        m = torch.full(q.shape[:-1] + (1,), -1e300, dtype=torch.float64)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + (v.size(-1),), dtype=torch.float64)
        blocks = [(s, min(s + block_size, k.size(-2))) for s in range(0, k.size(-2), block_size)]
        for a, b in blocks:
            s = qd @ kd[..., a:b, :].transpose(-2, -1) * scale
            if causal:
                s = s.masked_fill(torch.arange(a, b)[None, :] > torch.arange(q.size(-2))[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = (s - m_new).exp()
            l = l * (m - m_new).exp() + p.sum(-1, keepdim=True)
            acc = acc * (m - m_new).exp() + p @ vd[..., a:b, :]
            m = m_new
        o = acc / l
        ctx.save_for_backward(q, k, v, o.to(q.dtype), m + l.log())
        ctx.blocks, ctx.causal, ctx.scale = blocks, causal, scale
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        qd, kd, vd, od, dod = q.double(), k.double(), v.double(), o.double(), do.double()
        D = (dod * od).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(qd), torch.zeros_like(kd), torch.zeros_like(vd)
        for a, b in ctx.blocks:
            s = qd @ kd[..., a:b, :].transpose(-2, -1) * ctx.scale
            if ctx.causal:
                s = s.masked_fill(torch.arange(a, b)[None, :] > torch.arange(q.size(-2))[:, None], float("-inf"))
            p = (s - lse).exp()
            dv[..., a:b, :] = p.transpose(-2, -1) @ dod
            ds = p * (dod @ vd[..., a:b, :].transpose(-2, -1) - D)
            dq = dq + ds @ kd[..., a:b, :] * ctx.scale
            dk[..., a:b, :] = ds.transpose(-2, -1) @ qd * ctx.scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None
"""),
]
