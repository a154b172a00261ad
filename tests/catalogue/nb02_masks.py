"""Catalogue for 02_masks: realistic mistakes and correct variants.

Sources of the mistakes: the study notes in ../shared/seeds (an additive -inf mask built with
torch.full called wrongly, triu with diagonal=-1, a 3-D slice of a 4-D buffer, a float mask
built in a loop, masked_fill(mask == 0, -1e9)), PyTorch's own opposite key_padding_mask
convention, and the broadcasting slips that tutorials make.
"""
from . import Mistake, Variant

ASSIGNMENT = "02_masks"
EXERCISES = ["make_padding_mask", "make_causal_mask", "make_decoder_mask",
             "scaled_dot_product_attention"]

PAD = "make_padding_mask"
CAU = "make_causal_mask"
DEC = "make_decoder_mask"
ATT = "scaled_dot_product_attention"

MISTAKES = [
    # ---------------------------------------------------------------- make_padding_mask
    Mistake(PAD, "no query axis: returns (B, Lk)", r"query axis is missing", """
def make_padding_mask(tokens, pad_id=0):
    return tokens != pad_id
"""),
    Mistake(PAD, "unsqueeze(-1): (B, Lk, 1) masks queries instead of keys", r"QUERY axis", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens != pad_id).unsqueeze(-1)
"""),
    Mistake(PAD, "PyTorch's key_padding_mask convention: True at the padding",
            r"opposite convention", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens == pad_id).unsqueeze(1)
"""),
    Mistake(PAD, "compares with 0 whatever pad_id is", r"compared with 0", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens != 0).unsqueeze(1)
"""),
    Mistake(PAD, "tokens > pad_id: ids below pad_id counted as padding", r"below pad_id", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens > pad_id).unsqueeze(1)
"""),
    Mistake(PAD, "counts lengths and assumes right padding", r"padding sits at the end", """
def make_padding_mask(tokens, pad_id=0):
    B, L = tokens.shape
    lengths = (tokens != pad_id).sum(dim=1)
    return (torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1)
"""),
    Mistake(PAD, "returns the multi-head form (B, 1, 1, Lk)", r"multi-head form", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens != pad_id)[:, None, None, :]
"""),
    Mistake(PAD, "additive float mask 0 / -inf as in the seed notes", r"additive float mask", """
def make_padding_mask(tokens, pad_id=0):
    m = torch.zeros(tokens.shape).masked_fill(tokens == pad_id, float("-inf"))
    return m.unsqueeze(1)
"""),
    Mistake(PAD, "float 0/1 mask instead of boolean", r"dtype torch\.float32", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens != pad_id).float().unsqueeze(1)
"""),
    Mistake(PAD, "expands to (B, Lk, Lk): breaks cross-attention", r"cross-attention", """
def make_padding_mask(tokens, pad_id=0):
    B, L = tokens.shape
    return (tokens != pad_id).unsqueeze(1).expand(B, L, L)
"""),
    # ---------------------------------------------------------------- make_causal_mask
    Mistake(CAU, "triu(diagonal=1): True on the future (the blocked set)", r"positions to HIDE", """
def make_causal_mask(size, device=None):
    return torch.triu(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=1)
"""),
    Mistake(CAU, "tril(diagonal=-1): the diagonal is missing", r"diagonal is missing", """
def make_causal_mask(size, device=None):
    return torch.tril(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=-1)
"""),
    Mistake(CAU, "the seed's triu(diagonal=-1) mask translated to booleans",
            r"triu\(\.\.\., diagonal=-1\) bug", """
def make_causal_mask(size, device=None):
    blocked = torch.triu(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=-1)
    return ~blocked
"""),
    Mistake(CAU, "the seed's additive mask: triu of -inf", r"additive float mask", """
def make_causal_mask(size, device=None):
    return torch.triu(torch.full((size, size), float("-inf"), device=device), diagonal=1)
"""),
    Mistake(CAU, "the seed's torch.full(1, L, L).float('-inf')", r"torch\.full takes the size as ONE tuple", """
def make_causal_mask(size, device=None):
    mask = torch.full(1, size, size).float("-inf")
    return torch.triu(mask, diagonal=1) == 0
"""),
    Mistake(CAU, "the seed's misspelt keyword diagnoal", r"misspelt", """
def make_causal_mask(size, device=None):
    mask = torch.ones(size, size, dtype=torch.bool, device=device)
    return ~torch.triu(mask, diagnoal=1)
"""),
    Mistake(CAU, "tril(diagonal=1): one future token leaks", r"one token of the future", """
def make_causal_mask(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(diagonal=1)
"""),
    Mistake(CAU, "upper triangle with the diagonal (triu)", r"upper triangle", """
def make_causal_mask(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).triu()
"""),
    Mistake(CAU, "ignores the device argument", r"device argument is ignored", """
def make_causal_mask(size, device=None):
    return torch.tril(torch.ones(size, size, dtype=torch.bool))
"""),
    Mistake(CAU, "keeps the seed's (1, L, L) buffer shape", r"return the plain \(size, size\)", """
def make_causal_mask(size, device=None):
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool, device=device))
"""),
    Mistake(CAU, "float tril of ones (no .bool())", r"dtype torch\.float32", """
def make_causal_mask(size, device=None):
    return torch.tril(torch.ones(size, size, device=device))
"""),
    # ---------------------------------------------------------------- make_decoder_mask
    Mistake(DEC, "combines padding and causal with OR", r"with OR", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    return make_padding_mask(tokens, pad_id) | make_causal_mask(L, device=tokens.device)
"""),
    Mistake(DEC, "also blanks the query rows of pads (pad & pad^T & causal)",
            r"query rows at padding positions", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    real = tokens != pad_id
    return real.unsqueeze(1) & real.unsqueeze(2) & make_causal_mask(L, device=tokens.device)
"""),
    Mistake(DEC, "pads the queries instead of the keys", r"QUERIES instead of the keys", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    return (tokens != pad_id).unsqueeze(2) & make_causal_mask(L, device=tokens.device)
"""),
    Mistake(DEC, "only the causal mask, expanded over the batch", r"padding part is missing", """
def make_decoder_mask(tokens, pad_id=0):
    B, L = tokens.shape
    return make_causal_mask(L, device=tokens.device).expand(B, L, L)
"""),
    Mistake(DEC, "returns the multi-head form (B, 1, L, L)", r"multi-head form", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    pad = (tokens != pad_id)[:, None, None, :]
    return pad & make_causal_mask(L, device=tokens.device)
"""),
    Mistake(DEC, "ignores pad_id (calls make_padding_mask with the default)",
            r"compared with 0 instead of pad_id", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    return make_padding_mask(tokens) & make_causal_mask(L, device=tokens.device)
"""),
    Mistake(DEC, "causal part made on the CPU whatever the tokens' device",
            r"device", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    return make_padding_mask(tokens, pad_id) & make_causal_mask(L)
"""),
    Mistake(DEC, "the seed's float loop mask, without padding", r"dtype torch\.float32", """
def make_decoder_mask(tokens, pad_id=0):
    B, L = tokens.shape
    mask = torch.ones((B, L, L))
    for i in range(L):
        mask[:, i, i + 1:] = 0
    return mask
"""),
    Mistake(DEC, "flips the convention of the result", r"opposite convention", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    return ~(make_padding_mask(tokens, pad_id) & make_causal_mask(L, device=tokens.device))
"""),
    Mistake(DEC, "returns only the padding mask", r"only the padding mask", """
def make_decoder_mask(tokens, pad_id=0):
    return make_padding_mask(tokens, pad_id)
"""),
    # ---------------------------------------------------------------- attention with a mask
    Mistake(ATT, "ignores the mask", r"mask was ignored", """
def scaled_dot_product_attention(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "fills where the mask is True (key_padding_mask convention)",
            r"blocked the keys where the mask is True", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(mask, -1e9)
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "sets masked scores to 0 instead of -inf", r"exp\(0\) = 1", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s * mask
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "zeroes weights after softmax without renormalising", r"without renormalising", """
def scaled_dot_product_attention(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if mask is not None:
        w = w * mask
    return w @ v, w
"""),
    Mistake(ATT, "-inf and a plain softmax: NaN on fully masked rows", r"NaN", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "adds the boolean mask to the scores", r"added the boolean mask", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s + mask
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "unsqueezes the mask for heads inside single-head attention",
            r"unsqueeze|broadcast", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(mask.unsqueeze(1) == 0, -1e9)
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "boolean indexing scores[~mask] = ...: needs the exact shape",
            r"Boolean indexing|broadcast", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s[~mask] = -1e9
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "additive -inf, then nan_to_num: NaN gradients", r"gradient", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s + torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w
"""),
    Mistake(ATT, "`if mask:` on a tensor", r"if mask is not None", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask:
        s = s.masked_fill(~mask, -1e9)
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "(1 - mask) * -1e9 on a boolean mask", r"~mask", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s + (1 - mask) * -1e9
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Mistake(ATT, "calls F.scaled_dot_product_attention", r"shortcut", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, -1e9)
    w = torch.softmax(s, dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), w
"""),
    Mistake(ATT, "no default for mask", r"mask=None", """
def scaled_dot_product_attention(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, -1e9)
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
]

VARIANTS = [
    # ---------------------------------------------------------------- make_padding_mask
    Variant(PAD, "ne and None indexing", """
def make_padding_mask(tokens, pad_id=0):
    return tokens.ne(pad_id)[:, None, :]
"""),
    Variant(PAD, "negated equality, unsqueeze(-2)", """
def make_padding_mask(tokens, pad_id=0):
    return ~(tokens == pad_id).unsqueeze(-2)
"""),
    Variant(PAD, "view with explicit sizes", """
def make_padding_mask(tokens, pad_id=0):
    B, L = tokens.shape
    return (tokens != pad_id).view(B, 1, L)
"""),
    Variant(PAD, "torch.where and reshape", """
def make_padding_mask(tokens, pad_id=0):
    m = torch.where(tokens == pad_id, False, True)
    return m.reshape(tokens.size(0), 1, -1)
"""),
    Variant(PAD, "difference cast to bool", """
def make_padding_mask(tokens, pad_id=0):
    return (tokens - pad_id).bool().unsqueeze(1)
"""),
    # ---------------------------------------------------------------- make_causal_mask
    Variant(CAU, "Tensor.tril on ones", """
def make_causal_mask(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()
"""),
    Variant(CAU, "compare position indices", """
def make_causal_mask(size, device=None):
    i = torch.arange(size, device=device)
    return i[:, None] >= i[None, :]  # query index >= key index
"""),
    Variant(CAU, "negated strict upper triangle", """
def make_causal_mask(size, device=None):
    return ~torch.triu(torch.ones(size, size, dtype=torch.bool, device=device), diagonal=1)
"""),
    Variant(CAU, "the seed's additive mask, converted: == 0", """
def make_causal_mask(size, device=None):
    additive = torch.triu(torch.full((size, size), float("-inf"), device=device), diagonal=1)
    return additive == 0
"""),
    Variant(CAU, "a loop, then .to(device)", """
def make_causal_mask(size, device=None):
    m = torch.zeros(size, size, dtype=torch.bool)
    for i in range(size):
        m[i, :i + 1] = True
    return m.to(device) if device is not None else m
"""),
    # ---------------------------------------------------------------- make_decoder_mask
    Variant(DEC, "logical_and of the two helpers", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.shape[-1]
    return torch.logical_and(make_padding_mask(tokens, pad_id),
                             make_causal_mask(L, device=tokens.device))
"""),
    Variant(DEC, "from scratch with index comparisons and expand", """
def make_decoder_mask(tokens, pad_id=0):
    B, L = tokens.shape
    pos = torch.arange(L, device=tokens.device)
    causal = (pos[:, None] >= pos[None, :]).expand(B, L, L)
    return causal & (tokens != pad_id)[:, None, :]
"""),
    Variant(DEC, "bool multiplication", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    return make_padding_mask(tokens, pad_id) * make_causal_mask(L, tokens.device)
"""),
    Variant(DEC, "stack one sequence at a time", """
def make_decoder_mask(tokens, pad_id=0):
    L = tokens.size(1)
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=tokens.device))
    return torch.stack([causal & (row != pad_id) for row in tokens])
"""),
    # ---------------------------------------------------------------- attention with a mask
    Variant(ATT, "masked_fill(mask == 0, -1e9): uniform fully masked rows", """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p = torch.softmax(scores, dim=-1)
    return torch.matmul(p, v), p
"""),
    Variant(ATT, "-inf, then nan_to_num after softmax", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.mT / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ v, w
"""),
    Variant(ATT, "additive mask with finfo.min via torch.where", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    if mask is not None:
        s = s + torch.where(mask, 0.0, torch.finfo(s.dtype).min)
    w = torch.softmax(s, dim=-1)
    return w @ v, w
"""),
    Variant(ATT, "einsum, float64 inside, zero the dead rows with where", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = torch.einsum("...qd,...kd->...qk", q.double(), k.double()) / math.sqrt(q.size(-1))
    if mask is not None:
        s = torch.where(mask, s, float("-inf"))
    w = torch.softmax(s, dim=-1)
    if mask is not None:
        w = torch.where(mask.any(-1, keepdim=True), w, 0.0)
    out = torch.einsum("...qk,...kd->...qd", w, v.double())
    return out.to(q.dtype), w.to(q.dtype)
"""),
    Variant(ATT, "in-place fill through an expanded mask", """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.clone()
        scores[~mask.expand_as(scores)] = -1e9
    w = torch.softmax(scores, dim=-1)
    return w @ v, w
"""),
    Variant(ATT, "hand-made softmax that multiplies by the mask", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is None:
        mask = torch.ones_like(s, dtype=torch.bool)
    s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    e = torch.exp(s - s.amax(dim=-1, keepdim=True)) * mask
    w = e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    return w @ v, w
"""),
    Variant(ATT, "-inf, softmax, then zero the masked weights again", """
def scaled_dot_product_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    return w @ v, w
"""),
]
