"""Reference decoder-only language model (notebook 08): the next-token loss, causal
self-attention with a key/value cache, a GPT-style model and `generate`.

Layout (fixed by the notebook's exercise text, so tests can copy weights across):
    DecoderOnlyLM.tok_embed        nn.Embedding(vocab_size, d_model), scaled by sqrt(d_model)
    DecoderOnlyLM.pos_encoding     PositionalEncoding (sinusoidal table in the buffer `pe`)
    DecoderOnlyLM.layers[i]        DecoderBlock, pre-norm:
        .norm1, .self_attn (CausalSelfAttention: w_q, w_k, w_v, w_o), .norm2, .ff (linear1, linear2)
    DecoderOnlyLM.norm             final LayerNorm
    DecoderOnlyLM.lm_head          nn.Linear(d_model, vocab_size)
A block equals nn.TransformerEncoderLayer(norm_first=True, batch_first=True) with a causal
mask: a decoder-only model is one causal stack with no cross-attention.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import scaled_dot_product_attention
from .blocks import FeedForward
from .multihead import combine_heads, split_heads
from .positional import PositionalEncoding

__all__ = ["next_token_loss", "CausalSelfAttention", "DecoderBlock", "DecoderOnlyLM", "generate"]


def next_token_loss(logits, tokens, ignore_id=None):
    """Mean cross-entropy of predicting tokens[:, t + 1] from logits[:, t].

    logits: (B, T, V), the model's output for `tokens` (B, T). Targets equal to `ignore_id`
    (e.g. padding) are left out of the mean."""
    B, T, V = logits.shape
    pred = logits[:, :-1].reshape(-1, V)  # (B*(T-1), V): positions 0 .. T-2 predict ...
    target = tokens[:, 1:].reshape(-1)  # (B*(T-1),): ... tokens 1 .. T-1
    return F.cross_entropy(pred, target, ignore_index=-100 if ignore_id is None else ignore_id)


def causal_mask_with_offset(T, past_len, device=None):
    """(T, past_len + T) boolean: new query i sits at position past_len + i and may attend to
    keys 0 .. past_len + i."""
    return torch.ones(T, past_len + T, dtype=torch.bool, device=device).tril(diagonal=past_len)


class CausalSelfAttention(nn.Module):
    """Multi-head masked self-attention that can continue from cached keys and values."""

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        assert d_model % n_heads == 0, f"d_model={d_model} not divisible by n_heads={n_heads}"
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.attn_weights = None

    def forward(self, x, past_kv=None):
        B, T, D = x.shape
        q = split_heads(self.w_q(x), self.n_heads)  # (B, H, T, D_h)
        k = split_heads(self.w_k(x), self.n_heads)  # (B, H, T, D_h)
        v = split_heads(self.w_v(x), self.n_heads)  # (B, H, T, D_h)
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)  # (B, H, P + T, D_h): old keys first
            v = torch.cat([past_kv[1], v], dim=2)
        past_len = k.size(2) - T
        mask = causal_mask_with_offset(T, past_len, x.device)  # (T, P + T)
        _, weights = scaled_dot_product_attention(q, k, v, mask)
        self.attn_weights = weights.detach()  # (B, H, T, P + T)
        out = self.dropout(weights) @ v  # (B, H, T, D_h)
        return self.w_o(combine_heads(out)), (k, v)


class DecoderBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then x + ff(norm2(x))."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x, past_kv=None):
        a, present = self.self_attn(self.norm1(x), past_kv)
        x = x + self.dropout1(a)
        x = x + self.dropout2(self.ff(self.norm2(x)))
        return x, present


class DecoderOnlyLM(nn.Module):
    """GPT-style language model: embeddings + positions, a causal stack, logits."""

    def __init__(self, vocab_size, d_model, n_heads, n_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        self.vocab_size, self.d_model, self.max_len = vocab_size, d_model, max_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.tok_embed.weight, std=d_model ** -0.5)  # unit size after scaling
        self.pos_encoding = PositionalEncoding(d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            DecoderBlock(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens, past_kv=None, use_cache=False):
        B, T = tokens.shape
        offset = 0 if past_kv is None else past_kv[0][0].size(2)  # tokens already cached
        assert offset + T <= self.max_len, f"{offset + T} positions > max_len={self.max_len}"
        x = self.tok_embed(tokens) * math.sqrt(self.d_model)  # (B, T, D)
        x = self.dropout(x + self.pos_encoding.pe[offset:offset + T])  # positions offset.. not 0..
        cache = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, None if past_kv is None else past_kv[i])
            cache.append(present)
        logits = self.lm_head(self.norm(x))  # (B, T, V)
        return (logits, cache) if use_cache else logits


def _pick_next(logits, temperature, top_k, generator):
    """(B, V) scores -> (B,) token ids: greedy for temperature 0 or top_k 1, else sampled."""
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, eos_id=None,
             use_cache=True, generator=None):
    """prompt (B, T0) -> (B, T0 + n), n <= max_new_tokens: the prompt and the new tokens.
    After a row's first generated eos_id the row is filled with eos_id; generation stops as
    soon as every row has produced one (eos_id in the prompt does not count)."""
    seq = prompt
    finished = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
    cache = None
    for _ in range(max_new_tokens):
        if use_cache:
            step_in = seq if cache is None else seq[:, -1:]  # the whole prompt once, then 1 token
            logits, cache = model(step_in, past_kv=cache, use_cache=True)
        else:
            logits = model(seq)  # recompute everything from scratch
        nxt = _pick_next(logits[:, -1, :], temperature, top_k, generator)  # (B,)
        if eos_id is not None:
            nxt = nxt.masked_fill(finished, eos_id)
            finished |= nxt == eos_id
        seq = torch.cat([seq, nxt.unsqueeze(1)], dim=1)  # (B, T + 1)
        if eos_id is not None and bool(finished.all()):
            break
    return seq
