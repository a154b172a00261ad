"""Reference encoder-decoder Transformer, teacher-forcing loss, greedy decoding and beam search
(notebook 07). With weights copied across, `Transformer` matches `nn.Transformer` (batch_first,
ReLU) plus embeddings scaled by sqrt(d_model), the sinusoidal encoding and a linear generator.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import Decoder, Encoder
from .masks import make_causal_mask, make_decoder_mask, make_padding_mask
from .positional import PositionalEncoding

__all__ = ["Transformer", "teacher_forcing_loss", "greedy_decode", "beam_search"]


class Transformer(nn.Module):
    """Embeddings -> encoder; embeddings -> decoder (cross-attending to the memory) -> logits."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
                 max_len=5000, norm_first=False, pad_id=0):
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)  # adds PE, then dropout
        self.encoder = Encoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab)  # logits; cross-entropy does the softmax
        for p in self.parameters():  # Xavier for every matrix, as nn.Transformer does
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def _embed(self, tokens, table):
        return self.pos_encoding(table(tokens) * math.sqrt(self.d_model))  # (B, L, D)

    def encode(self, src, src_mask=None):
        return self.encoder(self._embed(src, self.src_embed), src_mask)  # (B, Ls, D)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        return self.decoder(self._embed(tgt, self.tgt_embed), memory, src_mask, tgt_mask)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        if src_mask is None:
            src_mask = make_padding_mask(src, self.pad_id)  # (B, 1, Ls)
        if tgt_mask is None:
            tgt_mask = make_decoder_mask(tgt, self.pad_id)  # (B, Lt, Lt)
        memory = self.encode(src, src_mask)
        return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))  # (B, Lt, V)


def teacher_forcing_loss(model, src, tgt):
    """Mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1], ignoring padding."""
    logits = model(src, tgt[:, :-1])  # (B, Lt-1, V)
    labels = tgt[:, 1:]  # (B, Lt-1): each position predicts the NEXT token
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=model.pad_id)


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    """(B, Ls) -> (B, T<=max_len): BOS, then the argmax token each step; pads after EOS."""
    B = src.size(0)
    src_mask = make_padding_mask(src, model.pad_id)
    memory = model.encode(src, src_mask)  # encode once, reuse every step
    ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max_len - 1):
        tgt_mask = make_causal_mask(ys.size(1), device=src.device)
        states = model.decode(ys, memory, src_mask, tgt_mask)  # (B, T, D)
        nxt = model.generator(states[:, -1]).argmax(-1)  # (B,) from the last position only
        nxt = nxt.masked_fill(done, model.pad_id)  # finished rows only get padding
        ys = torch.cat([ys, nxt.unsqueeze(1)], dim=1)
        done |= nxt == eos_id
        if done.all():
            break
    return ys


@torch.no_grad()
def beam_search(model, src, max_len, bos_id, eos_id, beam_size=4, alpha=0.6):
    """Beam search, one source row at a time; returns the same format as greedy_decode.

    Keeps the `beam_size` best prefixes by total log-probability. A finished hypothesis is
    ranked by its score divided by the length penalty ((5 + len) / 6) ** alpha (Wu et al.,
    2016), so that short outputs are not favoured just for having fewer negative terms.
    """
    rows = []
    for b in range(src.size(0)):
        s = src[b:b + 1]  # (1, Ls)
        src_mask = make_padding_mask(s, model.pad_id)  # (1, 1, Ls)
        memory = model.encode(s, src_mask)  # (1, Ls, D), encoded once
        beams = [([bos_id], 0.0)]  # (tokens, sum of log-probabilities)
        finished = []
        for _ in range(max_len - 1):
            ys = torch.tensor([t for t, _ in beams], device=src.device)  # (K, T)
            mem = memory.expand(len(beams), -1, -1)  # (K, Ls, D)
            tgt_mask = make_causal_mask(ys.size(1), device=src.device)
            states = model.decode(ys, mem, src_mask, tgt_mask)  # (K, T, D)
            logp = model.generator(states[:, -1]).log_softmax(-1)  # (K, V)
            scores = torch.tensor([sc for _, sc in beams], device=src.device)[:, None] + logp
            top = scores.flatten().topk(min(beam_size, scores.numel()))
            V = logp.size(-1)
            new = []
            for sc, idx in zip(top.values.tolist(), top.indices.tolist()):
                k, tok = divmod(idx, V)
                cand = (beams[k][0] + [tok], sc)
                (finished if tok == eos_id else new).append(cand)
            beams = new
            if not beams or len(finished) >= beam_size:
                break
        pool = finished or beams
        best = max(pool, key=lambda c: c[1] / (((5 + len(c[0])) / 6) ** alpha))
        rows.append(best[0])
    T = max(len(r) for r in rows)
    out = torch.full((len(rows), T), model.pad_id, dtype=torch.long, device=src.device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, device=src.device)
    return out
