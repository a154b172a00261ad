"""Catalogue for 07_transformer: realistic mistakes and correct variants.

Most entries are the solution with one thing changed; `_edit` applies the change and fails
loudly if the text it replaces is not there (so the catalogue cannot silently drift)."""
from . import Mistake, Variant

ASSIGNMENT = "07_transformer"
EXERCISES = ["Transformer", "teacher_forcing_loss", "label_smoothing_cross_entropy", "greedy_decode"]

TRANSFORMER = '''
class Transformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
                 max_len=5000, norm_first=False, pad_id=0):
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.encoder = Encoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(n_layers, d_model, n_heads, d_ff, dropout, norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src, src_mask=None):
        x = self.src_embed(src) * math.sqrt(self.d_model)
        return self.encoder(self.pos_encoding(x), src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        y = self.tgt_embed(tgt) * math.sqrt(self.d_model)
        return self.decoder(self.pos_encoding(y), memory, src_mask, tgt_mask)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        if src_mask is None:
            src_mask = make_padding_mask(src, self.pad_id)
        if tgt_mask is None:
            tgt_mask = make_decoder_mask(tgt, self.pad_id)
        memory = self.encode(src, src_mask)
        return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))
'''

LOSS = '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    labels = tgt[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=model.pad_id)
'''

GREEDY = '''
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    B = src.size(0)
    src_mask = make_padding_mask(src, model.pad_id)
    memory = model.encode(src, src_mask)
    ys = torch.full((B, 1), bos_id, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_len - 1):
        tgt_mask = make_causal_mask(ys.size(1))
        states = model.decode(ys, memory, src_mask, tgt_mask)
        next_token = model.generator(states[:, -1]).argmax(-1)
        next_token = next_token.masked_fill(done, model.pad_id)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        done |= next_token == eos_id
        if done.all():
            break
    return ys
'''


def _edit(base, *pairs):
    out = base
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert old in out, f"catalogue edit does not apply: {old!r}"
        out = out.replace(old, new)
    return out


T, L, G = "Transformer", "teacher_forcing_loss", "greedy_decode"
S = "label_smoothing_cross_entropy"

SMOOTH = '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    V = logits.size(-1)
    logp = torch.log_softmax(logits.reshape(-1, V), dim=-1)
    target = target.reshape(-1)
    keep = target != ignore_index
    safe = target.masked_fill(~keep, 0)
    nll = -logp.gather(1, safe[:, None]).squeeze(1)
    uniform = -logp.mean(dim=-1)
    loss = (1 - smoothing) * nll + smoothing * uniform
    return loss[keep].mean()
'''
SCALE_S = "x = self.src_embed(src) * math.sqrt(self.d_model)"
SCALE_T = "y = self.tgt_embed(tgt) * math.sqrt(self.d_model)"
INIT = '''        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
'''
CE = '''    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=model.pad_id)'''

MISTAKES = [
    # ---------------------------------------------------------------- Transformer
    Mistake(T, "forgets the sqrt(d_model) factor on the embeddings", r"not multiplied by sqrt\(d_model\)",
            _edit(TRANSFORMER, SCALE_S, "x = self.src_embed(src)", SCALE_T, "y = self.tgt_embed(tgt)")),
    Mistake(T, "scales after adding the positional encoding", r"multiplies the sum", _edit(
        TRANSFORMER,
        SCALE_S + "\n        return self.encoder(self.pos_encoding(x), src_mask)",
        "x = self.src_embed(src)\n        return self.encoder(self.pos_encoding(x) * math.sqrt(self.d_model), src_mask)",
        SCALE_T + "\n        return self.decoder(self.pos_encoding(y), memory, src_mask, tgt_mask)",
        "y = self.tgt_embed(tgt)\n        return self.decoder(self.pos_encoding(y) * math.sqrt(self.d_model), memory, src_mask, tgt_mask)")),
    Mistake(T, "divides the embeddings by sqrt(d_model)", r"divided by sqrt\(d_model\)",
            _edit(TRANSFORMER, SCALE_S, "x = self.src_embed(src) / math.sqrt(self.d_model)",
                  SCALE_T, "y = self.tgt_embed(tgt) / math.sqrt(self.d_model)")),
    Mistake(T, "no positional encoding on either side", r"positional encoding is missing", _edit(
        TRANSFORMER, "self.encoder(self.pos_encoding(x), src_mask)", "self.encoder(x, src_mask)",
        "self.decoder(self.pos_encoding(y), memory", "self.decoder(y, memory")),
    Mistake(T, "the study notes' single table: the target is embedded with src_embed",
            r"embedded with src_embed", _edit(TRANSFORMER, SCALE_T,
                                              "y = self.src_embed(tgt) * math.sqrt(self.d_model)")),
    Mistake(T, "one embedding module shared by both sides", r"same module|own table", _edit(
        TRANSFORMER, "self.tgt_embed = nn.Embedding(tgt_vocab, d_model)", "self.tgt_embed = self.src_embed")),
    Mistake(T, "the study notes' wiring: the decoder is fed the source", r"fed the source", _edit(
        TRANSFORMER, "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))",
        "return self.generator(self.decode(src, memory, src_mask, make_decoder_mask(src, self.pad_id)))")),
    Mistake(T, "a softmax after the generator", r"softmax", _edit(
        TRANSFORMER, "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))",
        "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask)).softmax(-1)")),
    Mistake(T, "returns the last position only (the study notes' inference branch)", r"last position only",
            _edit(TRANSFORMER, "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))",
                  "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask)[:, [-1], :])")),
    Mistake(T, "only a padding mask for the target: no causal mask", r"causal", _edit(
        TRANSFORMER, "tgt_mask = make_decoder_mask(tgt, self.pad_id)",
        "tgt_mask = make_padding_mask(tgt, self.pad_id)")),
    Mistake(T, "an upper-triangular (inverted) causal mask", r"causal|future", _edit(
        TRANSFORMER, "tgt_mask = make_decoder_mask(tgt, self.pad_id)",
        "tgt_mask = torch.triu(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool)) & make_padding_mask(tgt, self.pad_id)")),
    Mistake(T, "the source mask reaches the encoder but not the cross-attention", r"cross-attention", _edit(
        TRANSFORMER, "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))",
        "return self.generator(self.decode(tgt, memory, None, tgt_mask))")),
    Mistake(T, "encode ignores its src_mask", r"padding mask|pass src_mask to encode", _edit(
        TRANSFORMER, "return self.encoder(self.pos_encoding(x), src_mask)",
        "return self.encoder(self.pos_encoding(x))")),
    Mistake(T, "masks built with the default pad id 0 instead of self.pad_id", r"self\.pad_id", _edit(
        TRANSFORMER, "src_mask = make_padding_mask(src, self.pad_id)", "src_mask = make_padding_mask(src)",
        "tgt_mask = make_decoder_mask(tgt, self.pad_id)", "tgt_mask = make_decoder_mask(tgt)")),
    Mistake(T, "no initialisation: nn.Embedding keeps N(0, 1)", r"Xavier", _edit(TRANSFORMER, INIT, "")),
    Mistake(T, "encode builds its own padding mask when none is given", r"only\s+forward builds masks", _edit(
        TRANSFORMER, "        x = self.src_embed(src) * math.sqrt(self.d_model)\n",
        "        if src_mask is None:\n            src_mask = make_padding_mask(src, self.pad_id)\n"
        "        x = self.src_embed(src) * math.sqrt(self.d_model)\n")),
    Mistake(T, "decode adds key padding to the mask it is given", r"only\s+forward builds masks", _edit(
        TRANSFORMER, "        y = self.tgt_embed(tgt) * math.sqrt(self.d_model)\n",
        "        pad = make_padding_mask(tgt, self.pad_id)\n"
        "        tgt_mask = pad if tgt_mask is None else tgt_mask & pad\n"
        "        y = self.tgt_embed(tgt) * math.sqrt(self.d_model)\n")),
    Mistake(T, "initialises before the parts exist (the loop sees no parameters)", r"Xavier", _edit(
        TRANSFORMER, "        self.d_model, self.pad_id = d_model, pad_id\n",
        "        self.d_model, self.pad_id = d_model, pad_id\n" + INIT, INIT + "\n    def encode", "\n    def encode")),
    # the PyTorch tutorial's way: build the model, then initialise it from outside. Correct
    # for that one object, but not part of the class (COURSE_SPEC: the model initialises itself)
    Mistake(T, "Xavier init by a loop over an instance's parameters after construction",
            r"outside the class", _edit(TRANSFORMER, INIT, "") + '''
toy = Transformer(11, 11, 32, 4, 2, 64)
for p in toy.parameters():
    if p.dim() > 1:
        nn.init.xavier_uniform_(p)
'''),
    Mistake(T, "Xavier init in a helper function applied after construction, model.apply style",
            r"outside the class", _edit(TRANSFORMER, INIT, "") + '''
def init_weights(module):
    for name, p in module.named_parameters(recurse=False):
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
'''),
    Mistake(T, "uses PyTorch's nn.TransformerEncoder/Decoder inside", r"shortcut", '''
class Transformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
                 max_len=5000, norm_first=False, pad_id=0):
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len, dropout)
        self.core = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout,
                                   batch_first=True, norm_first=norm_first)
        self.encoder, self.decoder = self.core.encoder, self.core.decoder
        self.generator = nn.Linear(d_model, tgt_vocab)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src, src_mask=None):
        x = self.pos_encoding(self.src_embed(src) * math.sqrt(self.d_model))
        return self.encoder(x)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        y = self.pos_encoding(self.tgt_embed(tgt) * math.sqrt(self.d_model))
        causal = ~make_causal_mask(tgt.size(1))
        return self.decoder(y, memory, tgt_mask=causal)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.generator(self.decode(tgt, self.encode(src)))
'''),
    # ---------------------------------------------------------------- teacher_forcing_loss
    Mistake(L, "no shift at all: the decoder reads the whole target and predicts it",
            r"not shifted", '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                           ignore_index=model.pad_id)
'''),
    Mistake(L, "shifted input but unshifted labels (position i asked for its own input)",
            r"labels are not shifted", _edit(LOSS, "labels = tgt[:, 1:]", "labels = tgt[:, :-1]")),
    Mistake(L, "the shift goes the wrong way", r"wrong way", _edit(
        LOSS, "logits = model(src, tgt[:, :-1])", "logits = model(src, tgt[:, 1:])",
        "labels = tgt[:, 1:]", "labels = tgt[:, :-1]")),
    Mistake(L, "padding counted in the loss (no ignore_index)", r"padding is counted", _edit(
        LOSS, CE, "    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))")),
    Mistake(L, "the study notes' ignore_index=-1", r"padding", _edit(LOSS, "ignore_index=model.pad_id",
                                                                     "ignore_index=-1")),
    Mistake(L, "padding assumed to be token 0", r"model\.pad_id|token 0", _edit(
        LOSS, "ignore_index=model.pad_id", "ignore_index=0")),
    Mistake(L, "a softmax before cross_entropy", r"softmax", _edit(
        LOSS, "logits.reshape(-1, logits.size(-1)), labels", "logits.softmax(-1).reshape(-1, logits.size(-1)), labels")),
    Mistake(L, "sums instead of averaging", r"sum, not a mean", _edit(
        LOSS, "ignore_index=model.pad_id)", "ignore_index=model.pad_id, reduction='sum')")),
    Mistake(L, "masks the padding but divides by every position", r"every position", '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    labels = tgt[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), reduction="none")
    keep = (labels.reshape(-1) != model.pad_id).float()
    return (nll * keep).mean()
'''),
    Mistake(L, "passes (B, L, V) logits to cross_entropy without flattening", r"classes on axis 1|flatten", '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits, tgt[:, 1:], ignore_index=model.pad_id)
'''),
    Mistake(L, "returns a Python float (.item()): nothing to backpropagate", r"scalar tensor", _edit(
        LOSS, "ignore_index=model.pad_id)", "ignore_index=model.pad_id).item()")),
    # ---------------------------------------------------------------- greedy_decode
    # ---------------------------------------------------------------- label_smoothing_cross_entropy
    Mistake(S, "spreads the smoothing over the V - 1 wrong classes only (the Annotated Transformer's way)",
            r"V - 1 wrong classes", _edit(SMOOTH, "    uniform = -logp.mean(dim=-1)\n",
                                          "    uniform = (-logp.sum(dim=-1) - nll) / (V - 1)\n")),
    Mistake(S, "forgets the (1 - smoothing) factor on the true class", r"\(1 - smoothing\)",
            _edit(SMOOTH, "loss = (1 - smoothing) * nll", "loss = nll")),
    Mistake(S, "minimises the KL divergence to the smoothed target (KLDivLoss)", r"KL divergence", '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    V = logits.size(-1)
    logp = torch.log_softmax(logits.reshape(-1, V), dim=-1)
    target = target.reshape(-1)
    keep = target != ignore_index
    q = torch.full_like(logp, smoothing / V)
    q[torch.arange(q.size(0)), target.masked_fill(~keep, 0)] += 1 - smoothing
    kl = F.kl_div(logp, q, reduction="none").sum(-1)
    return kl[keep].mean()
'''),
    Mistake(S, "zeroes the ignored positions but divides by every position", r"every position",
            _edit(SMOOTH, "    return loss[keep].mean()", "    return (loss * keep).sum() / loss.numel()")),
    Mistake(S, "never drops the ignored positions", r"ignore_index", _edit(
            SMOOTH, "    return loss[keep].mean()", "    return loss.mean()")),
    Mistake(S, "gathers with the raw targets: crashes on ignore_index=-100", r"not a class", _edit(
            SMOOTH, "logp.gather(1, safe[:, None])", "logp.gather(1, target[:, None])")),
    Mistake(S, "returns the sum instead of the mean", r"a sum, not a mean",
            _edit(SMOOTH, "    return loss[keep].mean()", "    return loss[keep].sum()")),
    Mistake(S, "smoothing term with the sum over classes instead of the mean", r"SUM of -log p",
            _edit(SMOOTH, "uniform = -logp.mean(dim=-1)", "uniform = -logp.sum(dim=-1)")),
    Mistake(S, "log(softmax(x)) instead of log_softmax(x)", r"log_softmax", _edit(
            SMOOTH, "torch.log_softmax(logits.reshape(-1, V), dim=-1)",
            "torch.log(torch.softmax(logits.reshape(-1, V), dim=-1))")),
    Mistake(S, "log_softmax over dim=1: wrong for (B, L, V) logits", r"LAST axis", '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    logp = torch.log_softmax(logits, dim=1)
    keep = target != ignore_index
    nll = -logp.gather(-1, target.masked_fill(~keep, 0).unsqueeze(-1)).squeeze(-1)
    loss = (1 - smoothing) * nll - smoothing * logp.mean(-1)
    return loss[keep].mean()
'''),
    Mistake(S, "calls F.cross_entropy with label_smoothing", r"shortcut", '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    V = logits.size(-1)
    return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), label_smoothing=smoothing,
                           ignore_index=ignore_index)
'''),
    Mistake(G, "never stops early: always runs to max_len", r"went on|stop as soon as", _edit(
        GREEDY, "        if done.all():\n            break\n", "")),
    Mistake(G, "keeps generating after EOS instead of padding", r"not padding|pad", _edit(
        GREEDY, "        next_token = next_token.masked_fill(done, model.pad_id)\n", "")),
    Mistake(G, "stops as soon as the FIRST row is finished", r"EVERY row|done\.all", _edit(
        GREEDY, "if done.all():", "if done.any():")),
    Mistake(G, "takes the logits of the first position", r"FIRST position|LAST position", _edit(
        GREEDY, "states[:, -1]", "states[:, 0]")),
    Mistake(G, "drops the BOS column from the output", r"BOS", _edit(GREEDY, "    return ys\n", "    return ys[:, 1:]\n")),
    Mistake(G, "off by one: generates max_len tokens after BOS", r"more than max_len|max_len counts", _edit(
        GREEDY, "for _ in range(max_len - 1):", "for _ in range(max_len):")),
    Mistake(G, "off by one the other way: stops one column short", r"one short", _edit(
        GREEDY, "for _ in range(max_len - 1):", "for _ in range(max_len - 2):")),
    Mistake(G, "pads finished rows with 0 instead of model.pad_id", r"pad_id", _edit(
        GREEDY, "masked_fill(done, model.pad_id)", "masked_fill(done, 0)")),
    Mistake(G, "repeats EOS in finished rows", r"repeat EOS|pad_id", _edit(
        GREEDY, "masked_fill(done, model.pad_id)", "masked_fill(done, eos_id)")),
    Mistake(G, "encodes the padded source without its mask", r"source padding is not masked", _edit(
        GREEDY, "src_mask = make_padding_mask(src, model.pad_id)", "src_mask = None")),
    Mistake(G, "decodes without the causal mask", r"causal mask", _edit(
        GREEDY, "states = model.decode(ys, memory, src_mask, tgt_mask)",
        "states = model.decode(ys, memory, src_mask, None)")),
    Mistake(G, "written for a batch of one (.item())", r"batch of one", '''
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    for _ in range(max_len - 1):
        nxt = model(src, ys)[:, -1].argmax(-1)
        ys = torch.cat([ys, nxt.view(-1, 1)], dim=1)
        if nxt.item() == eos_id:
            break
    return ys
'''),
    Mistake(G, "samples from the softmax instead of taking the argmax", r"argmax", _edit(
        GREEDY, "next_token = model.generator(states[:, -1]).argmax(-1)",
        "next_token = torch.multinomial(model.generator(states[:, -1]).softmax(-1), 1).squeeze(1)")),
    # public pattern (issue 16): the generator ends in log_softmax (for an NLLLoss)
    Mistake(T, "the generator ends in log_softmax", r"log_softmax", _edit(
        TRANSFORMER, "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))",
        "return torch.log_softmax(self.generator(self.decode(tgt, memory, src_mask, tgt_mask)), dim=-1)")),
    Mistake(G, "stops on `if eos_id and ...`: an EOS id of 0 never ends a row", r"eos_id=0|if eos_id", _edit(
        GREEDY, "        done |= next_token == eos_id\n", "        if eos_id:\n            done |= next_token == eos_id\n")),
]

VARIANTS = [
    # ---------------------------------------------------------------- Transformer
    Variant(T, "masks written out by hand (tril and a comparison)", _edit(
        TRANSFORMER, "src_mask = make_padding_mask(src, self.pad_id)",
        "src_mask = (src != self.pad_id)[:, None, :]",
        "tgt_mask = make_decoder_mask(tgt, self.pad_id)",
        "tgt_mask = torch.tril(torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool)) & (tgt != self.pad_id)[:, None, :]")),
    Variant(T, "4-D masks with a head axis", _edit(
        TRANSFORMER, "src_mask = make_padding_mask(src, self.pad_id)",
        "src_mask = (src != self.pad_id)[:, None, None, :]",
        "tgt_mask = make_decoder_mask(tgt, self.pad_id)",
        "tgt_mask = (make_causal_mask(tgt.size(1))[None] & (tgt != self.pad_id)[:, None, :]).unsqueeze(1)")),
    Variant(T, "a shared _embed helper, xavier_normal_ and a float scale", '''
class Transformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
                 max_len=5000, norm_first=False, pad_id=0):
        super().__init__()
        self.scale = float(d_model) ** 0.5
        self.pad_id = pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=pad_id if pad_id < tgt_vocab else None)
        self.pos_encoding = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        self.encoder = Encoder(n_layers, d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first)
        self.decoder = Decoder(n_layers, d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab)
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.xavier_normal_(p)

    def _embed(self, table, ids):
        return self.pos_encoding(table(ids) * self.scale)

    def encode(self, src, src_mask=None):
        return self.encoder(self._embed(self.src_embed, src), src_mask=src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        return self.decoder(self._embed(self.tgt_embed, tgt), memory, src_mask=src_mask, tgt_mask=tgt_mask)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        src_mask = make_padding_mask(src, self.pad_id) if src_mask is None else src_mask
        tgt_mask = make_decoder_mask(tgt, self.pad_id) if tgt_mask is None else tgt_mask
        return self.generator(self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask))
'''),
    Variant(T, "init over modules, generator as an explicit matmul-free Linear call", _edit(
        TRANSFORMER, INIT, '''        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.xavier_uniform_(m.weight)
''', "return self.generator(self.decode(tgt, memory, src_mask, tgt_mask))",
        "states = self.decode(tgt, memory, src_mask, tgt_mask)\n        return F.linear(states, self.generator.weight, self.generator.bias)")),
    # ---------------------------------------------------------------- teacher_forcing_loss
    Variant(L, "cross_entropy with the class axis moved to 1", '''
def teacher_forcing_loss(model, src, tgt):
    dec_in, labels = tgt[:, :-1], tgt[:, 1:]
    logits = model(src, dec_in)
    return F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=model.pad_id)
'''),
    Variant(L, "log_softmax, gather and a masked mean by hand", '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    labels = tgt[:, 1:]
    logp = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    keep = labels != model.pad_id
    return -(logp * keep).sum() / keep.sum()
'''),
    Variant(L, "nll_loss on log_softmax, in float64", '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt[:, :-1]).double()
    logp = F.log_softmax(logits, dim=-1).flatten(0, 1)
    return F.nll_loss(logp, tgt[:, 1:].flatten(), ignore_index=model.pad_id).float()
'''),
    Variant(L, "boolean indexing of the real positions", '''
def teacher_forcing_loss(model, src, tgt):
    logits = model(src, tgt[:, :-1])
    labels = tgt[:, 1:]
    real = labels != model.pad_id
    return F.cross_entropy(logits[real], labels[real])
'''),
    # ---------------------------------------------------------------- label_smoothing_cross_entropy
    Variant(S, "the smoothed target distribution built explicitly, masked mean", '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    V = logits.shape[-1]
    logp = logits.log_softmax(-1).reshape(-1, V)
    t = target.reshape(-1)
    keep = (t != ignore_index).to(logp.dtype)
    q = F.one_hot(torch.where(t == ignore_index, torch.zeros_like(t), t), V).to(logp.dtype)
    q = q * (1 - smoothing) + smoothing / V
    per_pos = -(q * logp).sum(-1)
    return (per_pos * keep).sum() / keep.sum()
'''),
    Variant(S, "nll_loss with ignore_index plus a masked uniform term", '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits.reshape(-1, V), dim=-1)
    t = target.reshape(-1)
    keep = t != ignore_index
    nll = F.nll_loss(logp, t, ignore_index=ignore_index)
    smooth = -logp[keep].mean(-1).mean()
    return (1 - smoothing) * nll + smoothing * smooth
'''),
    Variant(S, "float64 inside, logsumexp by hand, no flattening", '''
def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):
    x = logits.double()
    lse = torch.logsumexp(x, dim=-1)
    keep = target != ignore_index
    true_logit = x.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    nll = lse - true_logit
    uniform = lse - x.mean(-1)
    loss = (1 - smoothing) * nll + smoothing * uniform
    return loss[keep].mean().to(logits.dtype)
'''),
    # ---------------------------------------------------------------- greedy_decode
    Variant(G, "calls model(src, prefix) each step (re-encodes the source)", '''
def greedy_decode(model, src, max_len, bos_id, eos_id):
    with torch.no_grad():
        ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
        finished = torch.zeros(src.size(0), dtype=torch.bool)
        while ys.size(1) < max_len and not finished.all():
            nxt = model(src, ys)[:, -1].argmax(dim=-1)
            nxt = torch.where(finished, torch.full_like(nxt, model.pad_id), nxt)
            finished = finished | (nxt == eos_id)
            ys = torch.cat([ys, nxt[:, None]], 1)
        return ys
'''),
    Variant(G, "one row at a time, padded at the end", '''
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    rows = []
    for b in range(src.size(0)):
        s = src[b:b + 1]
        mask = make_padding_mask(s, model.pad_id)
        memory = model.encode(s, mask)
        ys = [bos_id]
        while len(ys) < max_len:
            t = torch.tensor([ys])
            states = model.decode(t, memory, mask, make_causal_mask(len(ys)))
            ys.append(int(model.generator(states[0, -1]).argmax()))
            if ys[-1] == eos_id:
                break
        rows.append(ys)
    out = torch.full((len(rows), max(map(len, rows))), model.pad_id, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, :len(r)] = torch.tensor(r)
    return out
'''),
    Variant(G, "preallocated output filled column by column, then sliced", '''
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    B = src.size(0)
    out = torch.full((B, max_len), model.pad_id, dtype=torch.long)
    out[:, 0] = bos_id
    mask = make_padding_mask(src, model.pad_id)
    memory = model.encode(src, mask)
    alive = torch.ones(B, dtype=torch.bool)
    t = 1
    while t < max_len and alive.any():
        logits = model.generator(model.decode(out[:, :t], memory, mask, make_causal_mask(t)))
        tok = logits[:, -1].argmax(-1)
        out[alive, t] = tok[alive]
        alive &= tok != eos_id
        t += 1
    return out[:, :t]
'''),
    Variant(G, "decoder mask with padding (finished rows hold pads), torch.where", '''
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id):
    src_mask = make_padding_mask(src, model.pad_id)
    memory = model.encode(src, src_mask)
    ys = src.new_full((src.size(0), 1), bos_id)
    done = src.new_zeros(src.size(0), dtype=torch.bool)
    for step in range(1, max_len):
        h = model.decode(ys, memory, src_mask, make_decoder_mask(ys, model.pad_id))
        tok = model.generator(h)[:, -1, :].max(dim=-1).indices
        tok = torch.where(done, torch.tensor(model.pad_id), tok)
        ys = torch.cat((ys, tok.unsqueeze(-1)), dim=-1)
        done = done | tok.eq(eos_id)
        if bool(done.all()):
            break
    return ys
'''),
]
