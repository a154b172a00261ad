"""Catalogue for 08_decoder_only: realistic mistakes and correct variants."""
from . import Mistake, Variant

ASSIGNMENT = "08_decoder_only"
EXERCISES = ["DecoderOnlyLM", "generate", "next_token_loss", "CausalSelfAttention"]

# --------------------------------------------------------------------------- shared code
_ATTN_OK_INIT = """
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
"""


def _attn(body):
    """A CausalSelfAttention whose forward is `body` (indented 4 spaces inside forward)."""
    return _ATTN_OK_INIT + "\n    def forward(self, x, past_kv=None):\n" + body


_BLOCK = """
class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x, past_kv=None):
        a, kv = self.self_attn(self.norm1(x), past_kv)
        x = x + a
        return x + self.ff(self.norm2(x)), kv
"""

_LM_INIT = """
class DecoderOnlyLM(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)
"""


def _lm(forward_body, block=_BLOCK):
    return block + _LM_INIT + "\n    def forward(self, tokens, past_kv=None, use_cache=False):\n" + forward_body


_LM_LOOP = """        cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, None if past_kv is None else past_kv[i])
            cache.append(kv)
        logits = self.lm_head(self.norm(x))
        return (logits, cache) if use_cache else logits
"""


def _gen(pick, loop_extra="", eos=True, cache_step="seq[:, -1:]", grad="with torch.no_grad():",
         last="logits[:, -1, :]", ret="seq"):
    """A generate whose token choice is `pick` (code that sets `nxt` from `z`, 12 spaces)."""
    eos_code = """            if eos_id is not None:
                nxt = nxt.masked_fill(finished, eos_id)
                finished |= nxt == eos_id
""" if eos else ""
    return f"""
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    {grad}
        seq = prompt
        finished = torch.zeros(prompt.size(0), dtype=torch.bool)
        cache = None
        for _ in range(max_new_tokens):
            if use_cache:
                step_in = seq if cache is None else {cache_step}
                logits, cache = model(step_in, past_kv=cache, use_cache=True)
            else:
                logits = model(seq)
            z = {last}
{pick}{eos_code}            seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)
{loop_extra}            if eos_id is not None and bool(finished.all()):
                break
    return {ret}
"""


_PICK_OK = """            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
"""

MISTAKES = [
    # ================================================================ next_token_loss
    Mistake("next_token_loss", "no shift: compares position t with token t (learns to copy)",
            r"no shift|copy", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Mistake("next_token_loss", "cuts both sides the same way: logits[:, :-1] vs tokens[:, :-1]",
            r"no shift|copy", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, :-1].reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Mistake("next_token_loss", "shift the wrong way: predicts the previous token",
            r"wrong way|PREVIOUS", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.cross_entropy(logits[:, 1:].reshape(-1, V), tokens[:, :-1].reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Mistake("next_token_loss", "softmax in front of F.cross_entropy (double softmax)",
            r"softmax before", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    probs = torch.softmax(logits[:, :-1], dim=-1)
    return F.cross_entropy(probs.reshape(-1, V), tokens[:, 1:].reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Mistake("next_token_loss", "F.nll_loss on raw logits", r"nll_loss expects log-probabilities", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.nll_loss(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
                      ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Mistake("next_token_loss", "ignores ignore_id: padding targets are trained on",
            r"ignore_id were counted", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
"""),
    Mistake("next_token_loss", "masks by the input token instead of the target",
            r"INPUT token", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    per = F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1), reduction="none")
    if ignore_id is None:
        return per.mean()
    keep = (tokens[:, :-1] != ignore_id).reshape(-1).float()
    return (per * keep).sum() / keep.sum()
"""),
    Mistake("next_token_loss", "sums instead of averaging", r"summed|MEAN", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id, reduction="sum")
"""),
    Mistake("next_token_loss", "no flatten: F.cross_entropy reads the time axis as the classes",
            r"classes on dim 1", """
def next_token_loss(logits, tokens, ignore_id=None):
    return F.cross_entropy(logits[:, :-1], tokens[:, 1:],
                           ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Mistake("next_token_loss", "averages each row first, then the rows", r"averaged each row", """
def next_token_loss(logits, tokens, ignore_id=None):
    B, T, V = logits.shape
    per = F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
                          reduction="none").view(B, T - 1)
    keep = torch.ones_like(per) if ignore_id is None else (tokens[:, 1:] != ignore_id).float()
    return ((per * keep).sum(1) / keep.sum(1)).mean()
"""),
    Mistake("next_token_loss", "returns loss.item(): a float, no gradient", r"0-d tensor|\.item\(\)", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1),
                           ignore_index=-100 if ignore_id is None else ignore_id).item()
"""),
    # ================================================================ CausalSelfAttention
    Mistake("CausalSelfAttention", "no causal mask at all", r"no causal mask", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        out, w = scaled_dot_product_attention(q, k, v)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Mistake("CausalSelfAttention", "triu instead of tril: looks at the future",
            r"wrong way round|FUTURE", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).triu(diagonal=P)
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Mistake("CausalSelfAttention", "mask without the diagonal: a token cannot see itself",
            r"diagonal|ITSELF", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P - 1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.w_o(combine_heads(w @ v)), (k, v)
""")),
    Mistake("CausalSelfAttention", "plain tril over the (T, P + T) mask: ignores the cache offset",
            r"ignores the \d+ cached tokens", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        mask = torch.tril(torch.ones(T, k.size(2), dtype=torch.bool))
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Mistake("CausalSelfAttention", "concatenates the cache new-first", r"wrong order", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([k, past_kv[0]], 2), torch.cat([v, past_kv[1]], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Mistake("CausalSelfAttention", "returns only the new keys/values as the cache",
            r"only the new|whole cache", _attn("""
        B, T, D = x.shape
        q, k_new, v_new = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        k, v = k_new, v_new
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k_new], 2), torch.cat([past_kv[1], v_new], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (k_new, v_new)
""")),
    Mistake("CausalSelfAttention", "scales by sqrt(d_model) instead of sqrt(D_h)", r"sqrt\(d_model\)", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(~mask, float("-inf"))
        return self.w_o(combine_heads(torch.softmax(scores, -1) @ v)), (k, v)
""")),
    Mistake("CausalSelfAttention", "splits heads with view(B, H, T, D_h), no transpose",
            r"without a transpose", _attn("""
        B, T, D = x.shape
        H = self.n_heads
        q, k, v = (f(x).view(B, H, T, D // H) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(out.reshape(B, T, D)), (k, v)
""")),
    Mistake("CausalSelfAttention", "multiplies the weights by the mask after softmax",
            r"AFTER softmax", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        mask = torch.ones(T, P + T).tril(diagonal=P)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1) * mask
        return self.w_o(combine_heads(w @ v)), (k, v)
""")),
    Mistake("CausalSelfAttention", "F.scaled_dot_product_attention(is_causal=True)", r"[Ss]hortcut", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Mistake("CausalSelfAttention", "caches the projected keys before splitting heads (B, T, D)",
            r"AFTER\s+splitting", _attn("""
        B, T, D = x.shape
        kx, vx = self.w_k(x), self.w_v(x)
        if past_kv is not None:
            kx, vx = torch.cat([past_kv[0], kx], 1), torch.cat([past_kv[1], vx], 1)
        q, k, v = split_heads(self.w_q(x), self.n_heads), split_heads(kx, self.n_heads), split_heads(vx, self.n_heads)
        P = k.size(2) - T
        mask = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=P)
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (kx, vx)
""")),
    Mistake("CausalSelfAttention", "attends to the new tokens only; the past is just passed along",
            r"past_kv is ignored", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        out, w = scaled_dot_product_attention(q, k, v, make_causal_mask(T))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Mistake("CausalSelfAttention", "masks only when there is no cache", r"dropped the causal mask", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        mask = make_causal_mask(T)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
            mask = None  # "one new token may see everything"
        out, w = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    # ================================================================ DecoderOnlyLM
    Mistake("DecoderOnlyLM", "forgets the position offset: pe[:T] in a cached step",
            r"position offset is missing", _lm("""
        B, T = tokens.shape
        x = self.tok_embed(tokens) * math.sqrt(self.d_model)
        x = x + self.pos_encoding.pe[:T]
""" + _LM_LOOP)),
    Mistake("DecoderOnlyLM", "calls self.pos_encoding(x) also for cached steps",
            r"position offset is missing", _lm("""
        x = self.pos_encoding(self.tok_embed(tokens) * math.sqrt(self.d_model))
""" + _LM_LOOP)),
    Mistake("DecoderOnlyLM", "offset read from the wrong axis of the cache (the head axis)",
            r"got positions|offset", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(1)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP)),
    Mistake("DecoderOnlyLM", "embeddings not scaled by sqrt(d_model)", r"sqrt\(d_model\)", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP)),
    Mistake("DecoderOnlyLM", "no positional encoding", r"positional encoding|word order", _lm("""
        x = self.tok_embed(tokens) * math.sqrt(self.d_model)
""" + _LM_LOOP)),
    Mistake("DecoderOnlyLM", "seed 001's pe[:x.size(0)] on a batch-first tensor",
            r"size\(0\) is the batch|wrong\s+axis", _lm("""
        x = self.tok_embed(tokens) * math.sqrt(self.d_model)
        x = x + self.pos_encoding.pe[:x.size(0)]
""" + _LM_LOOP)),
    Mistake("DecoderOnlyLM", "post-norm blocks", r"post-norm", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP, block="""
class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x, past_kv=None):
        a, kv = self.self_attn(x, past_kv)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x)), kv
""")),
    Mistake("DecoderOnlyLM", "no final LayerNorm before lm_head", r"final LayerNorm", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
        cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, None if past_kv is None else past_kv[i])
            cache.append(kv)
        logits = self.lm_head(x)
        return (logits, cache) if use_cache else logits
""")),
    Mistake("DecoderOnlyLM", "returns softmax probabilities instead of logits", r"probabilities", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
        cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, None if past_kv is None else past_kv[i])
            cache.append(kv)
        probs = torch.softmax(self.lm_head(self.norm(x)), dim=-1)
        return (probs, cache) if use_cache else probs
""")),
    Mistake("DecoderOnlyLM", "no residual connections in the blocks", r"residual", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP, block="""
class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x, past_kv=None):
        x, kv = self.self_attn(self.norm1(x), past_kv)
        return self.ff(self.norm2(x)), kv
""")),
    Mistake("DecoderOnlyLM", "passes the whole cache list to every layer's attention (layer 0's keys everywhere)",
            r"past_kv\[i\]", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
        cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, None if past_kv is None else past_kv[0])
            cache.append(kv)
        logits = self.lm_head(self.norm(x))
        return (logits, cache) if use_cache else logits
""")),
    Mistake("DecoderOnlyLM", "uses nn.MultiheadAttention with a causal mask (and no real cache)",
            r"[Ss]hortcut", """
class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)

    def forward(self, x, past_kv=None):
        T = x.size(1)
        h = self.norm1(x)
        a = self.self_attn(h, h, h, attn_mask=~make_causal_mask(T), need_weights=False)[0]
        x = x + a
        return x + self.ff(self.norm2(x)), (h, h)
""" + _LM_INIT + """
    def forward(self, tokens, past_kv=None, use_cache=False):
        B, T = tokens.shape
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[:T]
""" + _LM_LOOP),
    # ================================================================ generate
    Mistake("generate", "temperature=0 divides the logits by 0", r"temperature=0 means greedy", _gen("""
            z = z / temperature
            if top_k is not None:
                kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                z = z.masked_fill(z < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
""")),
    Mistake("generate", "multiplies the logits by the temperature", r"multiplied", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                z = z * temperature
                if top_k is not None:
                    kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
""")),
    Mistake("generate", "top-k keeps the k SMALLEST logits", r"LARGEST|not among", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    kth = torch.topk(z, top_k, dim=-1, largest=False).values[:, -1:]
                    z = z.masked_fill(z > kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
""")),
    Mistake("generate", "top_k ignored", r"top_k is ignored|not among", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                nxt = torch.multinomial(torch.softmax(z / temperature, -1), 1, generator=generator).squeeze(1)
""")),
    Mistake("generate", "draws from the global RNG, ignoring `generator`", r"generator", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1).squeeze(1)
""")),
    Mistake("generate", "always greedy: temperature and top-k never sample",
            r"always picked the most likely", _gen("""
            nxt = z.argmax(-1)
""")),
    Mistake("generate", "stops as soon as ANY row produced eos_id", r"ONE row finished", _gen(
        _PICK_OK, eos=False, loop_extra="""            if eos_id is not None:
                finished |= nxt == eos_id
                if bool(finished.any()):
                    break
""")),
    Mistake("generate", "counts eos_id inside the prompt as the end", r"before it generated anything", """
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    with torch.no_grad():
        seq = prompt
        cache = None
        for _ in range(max_new_tokens):
            finished = (seq == eos_id).any(dim=1) if eos_id is not None else seq[:, 0] < 0  # "has this row ended?"
            if eos_id is not None and bool(finished.all()):
                break
            if use_cache:
                logits, cache = model(seq if cache is None else seq[:, -1:], past_kv=cache, use_cache=True)
            else:
                logits = model(seq)
            z = logits[:, -1, :]
""" + _PICK_OK + """            if eos_id is not None:
                nxt = nxt.masked_fill(finished, eos_id)
            seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)
    return seq
"""),
    Mistake("generate", "finished rows keep generating after their eos_id", r"goes on after its eos_id", _gen(
        _PICK_OK, eos=False, loop_extra="""            if eos_id is not None:
                finished |= nxt == eos_id
""")),
    Mistake("generate", "feeds the whole sequence again together with the cache",
            r"ONLY\s+the newest token", _gen(_PICK_OK, cache_step="seq")),
    Mistake("generate", "never updates the cache (reuses the prompt's)", r"grow by one per step", """
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    with torch.no_grad():
        seq = prompt
        finished = torch.zeros(prompt.size(0), dtype=torch.bool)
        cache = None
        for _ in range(max_new_tokens):
            if use_cache:
                if cache is None:
                    logits, cache = model(seq, use_cache=True)
                else:
                    logits, _ = model(seq[:, -1:], past_kv=cache, use_cache=True)
            else:
                logits = model(seq)
            z = logits[:, -1, :]
""" + _PICK_OK + """            if eos_id is not None:
                nxt = nxt.masked_fill(finished, eos_id)
                finished |= nxt == eos_id
            seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)
            if eos_id is not None and bool(finished.all()):
                break
    return seq
"""),
    Mistake("generate", "takes the first position's logits", r"FIRST position", _gen(_PICK_OK, last="logits[:, 0, :]")),
    Mistake("generate", "no torch.no_grad(): every step keeps its graph", r"no_grad", _gen(
        _PICK_OK, grad="if True:")),
    Mistake("generate", "use_cache=True ignored: always recomputes", r"use_cache=True", """
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    with torch.no_grad():
        seq = prompt
        finished = torch.zeros(prompt.size(0), dtype=torch.bool)
        for _ in range(max_new_tokens):
            z = model(seq)[:, -1, :]
""" + _PICK_OK + """            if eos_id is not None:
                nxt = nxt.masked_fill(finished, eos_id)
                finished |= nxt == eos_id
            seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)
            if eos_id is not None and bool(finished.all()):
                break
    return seq
"""),
    Mistake("generate", "returns only the generated tokens", r"only the new tokens", _gen(
        _PICK_OK, ret="seq[:, prompt.size(1):]")),
    # ------------------------------------------------ independent implementations (issue 16):
    # shared parts that a reference read back from the student's own model would copy too
    Mistake("DecoderOnlyLM", "layers = one block repeated: nn.ModuleList([Block(...)] * n_layers)",
            r"same block object|repeats ONE block", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP).replace(
        "nn.ModuleList(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))",
        "nn.ModuleList([Block(d_model, n_heads, d_ff, dropout)] * n_layers)")),
    Mistake("DecoderOnlyLM", "one LayerNorm module serves as both norm1 and norm2 of a block",
            r"norm1 and norm2 are one LayerNorm", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP, block=_BLOCK.replace(
        "        self.norm2 = nn.LayerNorm(d_model)\n", "        self.norm2 = self.norm1\n"))),
    Mistake("DecoderOnlyLM", "lm_head tied to the embedding although the exercise asks for a separate nn.Linear with bias",
            r"shares its weight with tok_embed|weight tying", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[offset:offset + T]
""" + _LM_LOOP).replace(
        "        self.lm_head = nn.Linear(d_model, vocab_size)\n",
        "        self.lm_head = nn.Linear(d_model, vocab_size)\n"
        "        self.lm_head.weight = self.tok_embed.weight  # GPT-2 style tying\n")),
    Mistake("generate", "tests `if eos_id:`, so an EOS id of 0 never stops generation",
            r"eos_id is not None", _gen(_PICK_OK).replace("if eos_id is not None", "if eos_id")),
    # issue 27: the cases the probes did not look at
    Mistake("generate", "top-k clipped to the batch size (z.size(0)) instead of the vocabulary",
            r"vocabulary\s+axis", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    kth = torch.topk(z, min(top_k, z.size(0)), dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
""")),
    Mistake("generate", "top_k == 2 taken as greedy (top_k <= 2 treated like top_k == 1)",
            r"always picked the most likely|do not follow", _gen("""
            if temperature == 0 or (top_k is not None and top_k <= 2):
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(1)
""")),
    Mistake("generate", "the finished mask sized by the prompt length, not the batch",
            r"size|shape|eos", _gen(_PICK_OK).replace(
                "finished = torch.zeros(prompt.size(0), dtype=torch.bool)",
                "finished = torch.zeros(prompt.size(1), dtype=torch.bool)")),
    Mistake("generate", "refuses prompt + max_new_tokens == model.max_len (>= instead of >)",
            r"max_len", _gen(_PICK_OK).replace(
                "    with torch.no_grad():\n",
                "    if prompt.size(1) + max_new_tokens >= getattr(model, 'max_len', float('inf')):\n"
                "        raise ValueError('too long for the model')\n    with torch.no_grad():\n", 1)),
]

VARIANTS = [
    # ================================================================ next_token_loss
    Variant("next_token_loss", "log_softmax + gather + masked mean", """
def next_token_loss(logits, tokens, ignore_id=None):
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V)
    target = tokens[:, 1:]
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    keep = torch.ones_like(nll, dtype=torch.bool) if ignore_id is None else target != ignore_id
    return nll[keep].mean()
"""),
    Variant("next_token_loss", "classes on dim 1 by transposing to (B, V, T-1)", """
def next_token_loss(logits, tokens, ignore_id=None):
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:],
                           ignore_index=-100 if ignore_id is None else ignore_id)
"""),
    Variant("next_token_loss", "float64 nll_loss of log_softmax, cast back", """
def next_token_loss(logits, tokens, ignore_id=None):
    V = logits.size(-1)
    logp = F.log_softmax(logits[:, :-1].double(), dim=-1).reshape(-1, V)
    loss = F.nll_loss(logp, tokens[:, 1:].reshape(-1),
                      ignore_index=ignore_id if ignore_id is not None else -100)
    return loss.to(logits.dtype)
"""),
    Variant("next_token_loss", "selects the kept pairs first, then plain cross_entropy", """
def next_token_loss(logits, tokens, ignore_id=None):
    inputs, labels = logits[:, :-1], tokens[:, 1:]      # seed 001's two tables
    if ignore_id is not None:
        keep = labels != ignore_id
        return F.cross_entropy(inputs[keep], labels[keep])
    return F.cross_entropy(inputs.flatten(0, 1), labels.flatten())
"""),
    # ================================================================ CausalSelfAttention
    Variant("CausalSelfAttention", "einsum, additive -inf mask from index comparisons", _attn("""
        B, T, D = x.shape
        H = self.n_heads
        q, k, v = (f(x).reshape(B, T, H, D // H).permute(0, 2, 1, 3) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k = torch.cat((past_kv[0], k), dim=-2)
            v = torch.cat((past_kv[1], v), dim=-2)
        P = k.shape[-2] - T
        i = torch.arange(T).unsqueeze(1) + P  # absolute position of each query
        j = torch.arange(P + T).unsqueeze(0)
        bias = torch.zeros(T, P + T).masked_fill(j > i, float("-inf"))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(D // H) + bias
        w = self.dropout(torch.softmax(scores, dim=-1))
        out = torch.einsum("bhqk,bhkd->bhqd", w, v).permute(0, 2, 1, 3).reshape(B, T, D)
        return self.w_o(out), (k, v)
""")),
    Variant("CausalSelfAttention", "a loop over heads", _attn("""
        B, T, D = x.shape
        H, Dh = self.n_heads, D // self.n_heads
        q, k, v = split_heads(self.w_q(x), H), split_heads(self.w_k(x), H), split_heads(self.w_v(x), H)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        allowed = torch.ones(T, P + T, dtype=torch.bool).tril(P)
        outs = []
        for h in range(H):
            s = q[:, h] @ k[:, h].transpose(1, 2) / Dh ** 0.5
            s = s.masked_fill(~allowed, -1e9)
            outs.append(torch.softmax(s, -1) @ v[:, h])  # (B, T, Dh)
        return self.w_o(torch.cat(outs, dim=-1)), (k, v)
""")),
    Variant("CausalSelfAttention", "float64 inside, triu-based blocked mask", _attn("""
        B, T, D = x.shape
        q, k, v = (split_heads(f(x), self.n_heads) for f in (self.w_q, self.w_k, self.w_v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        P = k.size(2) - T
        blocked = torch.ones(T, P + T, dtype=torch.bool).triu(diagonal=P + 1)
        s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(D / self.n_heads)
        w = torch.softmax(s.masked_fill(blocked, float("-inf")), -1)
        out = (w @ v.double()).to(x.dtype)
        return self.w_o(combine_heads(out)), (k, v)
""")),
    Variant("CausalSelfAttention", "one fused qkv projection, split afterwards", """
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, past_kv=None):
        B, T, D = x.shape
        W = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])
        b = torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
        q, k, v = F.linear(x, W, b).split(D, dim=-1)
        q, k, v = (split_heads(t.contiguous(), self.n_heads) for t in (q, k, v))
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], 2), torch.cat([past_kv[1], v], 2)
        mask = make_causal_mask(k.size(2))[-T:]  # the last T rows of the full causal mask
        out, _ = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(combine_heads(out)), (k, v)
"""),
    # ================================================================ DecoderOnlyLM
    # (weight tying is a MISTAKE here: the exercise describes a separate nn.Linear with bias)
    Variant("DecoderOnlyLM", "ModuleDict blocks, own sinusoidal buffer, tuple cache", """
class DecoderOnlyLM(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        self.scale = d_model ** 0.5
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.register_buffer("table", sinusoidal_positional_encoding(max_len, d_model))
        self.layers = nn.ModuleList(
            nn.ModuleDict(dict(norm1=nn.LayerNorm(d_model),
                               self_attn=CausalSelfAttention(d_model, n_heads, dropout),
                               norm2=nn.LayerNorm(d_model),
                               ff=FeedForward(d_model, d_ff, dropout)))
            for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens, past_kv=None, use_cache=False):
        T = tokens.size(1)
        P = past_kv[0][0].shape[-2] if past_kv else 0
        x = self.tok_embed(tokens) * self.scale + self.table[P:P + T].unsqueeze(0)
        new = ()
        for i, blk in enumerate(self.layers):
            a, kv = blk["self_attn"](blk["norm1"](x), past_kv[i] if past_kv else None)
            x = x + a
            x = x + blk["ff"](blk["norm2"](x))
            new += (kv,)
        logits = self.lm_head(self.norm(x))
        return (logits, list(new)) if use_cache else logits
"""),
    Variant("DecoderOnlyLM", "positions by index: pe.index_select with arange(offset, offset+T)", _lm("""
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[-1][1].size(-2)
        pos = torch.arange(offset, offset + T, device=tokens.device)
        x = self.tok_embed(tokens).mul(math.sqrt(self.d_model))
        x = x + self.pos_encoding.pe.index_select(0, pos).unsqueeze(0)
        x = self.dropout(x)
""" + _LM_LOOP)),
    Variant("DecoderOnlyLM", "the block inlined in the model's forward (reference LayerNorm)", """
from tfscratch.reference import LayerNorm as CourseLayerNorm


class DecoderOnlyLM(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        self.d_model = d_model
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len)
        self.layers = nn.ModuleList()
        for _ in range(n_layers):
            blk = nn.Module()
            blk.norm1, blk.norm2 = CourseLayerNorm(d_model), CourseLayerNorm(d_model)
            blk.self_attn = CausalSelfAttention(d_model, n_heads, dropout)
            blk.ff = FeedForward(d_model, d_ff, dropout)
            self.layers.append(blk)
        self.norm = CourseLayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens, past_kv=None, use_cache=False):
        B, T = tokens.shape
        past_kv = past_kv or [None] * len(self.layers)
        off = 0 if past_kv[0] is None else past_kv[0][0].size(2)
        x = self.tok_embed(tokens) * math.sqrt(self.d_model) + self.pos_encoding.pe[off:off + T]
        cache = []
        for blk, past in zip(self.layers, past_kv):
            a, kv = blk.self_attn(blk.norm1(x), past)
            x = x + a
            x = x + blk.ff(blk.norm2(x))
            cache.append(kv)
        logits = self.lm_head(self.norm(x))
        return (logits, cache) if use_cache else logits
"""),
    # ================================================================ generate
    Variant("generate", "top-k by zeroing probabilities (multinomial renormalises)", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                probs = torch.softmax(z / temperature, dim=-1)
                if top_k is not None:
                    top = torch.topk(probs, top_k, dim=-1)
                    probs = torch.zeros_like(probs).scatter(-1, top.indices, top.values)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
""")),
    Variant("generate", "Gumbel-max sampling with the generator, inference_mode", _gen("""
            if temperature == 0 or top_k == 1:
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    vals, idx = z.topk(top_k, dim=-1)
                    z = torch.full_like(z, float("-inf")).scatter(-1, idx, vals)
                u = torch.rand(z.shape, generator=generator).clamp_min(1e-12)
                nxt = (z - torch.log(-torch.log(u))).argmax(-1)
""", grad="with torch.inference_mode():")),
    Variant("generate", "inverse-CDF sampling in float64, while loop, per-step done mask", """
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    greedy = temperature == 0 or top_k == 1
    out = prompt.clone()
    done = torch.zeros(len(prompt), dtype=torch.bool)
    past, step = None, 0
    with torch.no_grad():
        while step < max_new_tokens and not (eos_id is not None and done.all()):
            if use_cache:
                logits, past = model(out if past is None else out[:, -1:], past_kv=past, use_cache=True)
            else:
                logits = model(out)
            z = logits[:, -1].double()
            if greedy:
                nxt = z.argmax(-1)
            else:
                z = z / temperature
                if top_k is not None:
                    z[z < z.sort(-1, descending=True).values[:, top_k - 1:top_k]] = -math.inf
                cdf = torch.softmax(z, -1).cumsum(-1)
                u = torch.rand(len(z), 1, generator=generator, dtype=torch.float64)
                nxt = (cdf < u * cdf[:, -1:]).sum(-1).clamp(max=z.size(-1) - 1)
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                done = done | (nxt == eos_id)
            out = torch.cat([out, nxt[:, None]], 1)
            step += 1
    return out
"""),
]
