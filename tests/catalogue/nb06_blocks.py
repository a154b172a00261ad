"""Catalogue for 06_blocks: realistic mistakes (many straight from the study notes in
shared/seeds) and correct variants written differently."""
from . import Mistake, Variant

ASSIGNMENT = "06_blocks"
EXERCISES = ["FeedForward", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder"]

# ----------------------------------------------------------------------------- shared code
_FF_INIT = '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
'''


def _ff(forward: str, init: str = _FF_INIT) -> str:
    return init + forward


def _enc(forward: str, init_extra: str = "", norms: str = None) -> str:
    norms = norms if norms is not None else (
        "        self.norm1 = nn.LayerNorm(d_model)\n        self.norm2 = nn.LayerNorm(d_model)\n")
    return f'''
class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
{norms}        self.drop = nn.Dropout(dropout)
{init_extra}
{forward}
'''


def _dec(forward: str, init_extra: str = "", norms: str = None, attns: str = None) -> str:
    norms = norms if norms is not None else (
        "        self.norm1 = nn.LayerNorm(d_model)\n        self.norm2 = nn.LayerNorm(d_model)\n"
        "        self.norm3 = nn.LayerNorm(d_model)\n")
    attns = attns if attns is not None else (
        "        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)\n"
        "        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)\n")
    return f'''
class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
{attns}        self.ff = FeedForward(d_model, d_ff, dropout)
{norms}        self.drop = nn.Dropout(dropout)
{init_extra}
{forward}
'''


_ENC_STACK_INIT = '''
class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
'''
_ENC_STACK_FWD = '''
    def forward(self, x, src_mask=None):
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)
'''
_DEC_STACK_INIT = _ENC_STACK_INIT.replace("Encoder", "Decoder")
_DEC_STACK_FWD = '''
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)
'''

_POST_PRE = '''
    def forward(self, x, src_mask=None):
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.drop(self.self_attn(h, h, h, src_mask))
            x = x + self.drop(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.drop(self.self_attn(x, x, x, src_mask)))
            x = self.norm2(x + self.drop(self.ff(x)))
        return x
'''


def _dec_fwd(sa="self.self_attn(h, h, h, tgt_mask)", ca="self.cross_attn(h, memory, memory, src_mask)",
             n1="self.norm1", n2="self.norm2", n3="self.norm3", pre=None, post=None):
    pre = pre or f'''            x = x + self.drop(sa({n1}(x)))
            x = x + self.drop(ca({n2}(x)))
            x = x + self.drop(self.ff({n3}(x)))'''
    post = post or f'''            x = {n1}(x + self.drop(sa(x)))
            x = {n2}(x + self.drop(ca(x)))
            x = {n3}(x + self.drop(self.ff(x)))'''
    return f'''
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        sa = lambda h: {sa}
        ca = lambda h: {ca}
        if self.norm_first:
{pre}
        else:
{post}
        return x
'''


MISTAKES = [
    # ================================================================ FeedForward
    Mistake("FeedForward", "the seeds' bug: second layer nn.Linear(d_model, d_ff), not (d_ff, d_model)",
            r"linear2 maps d_model -> d_ff", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))
'''),
    Mistake("FeedForward", "the UvA-style nn.Sequential with aliases, but bias=False", r"no bias", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear_net = nn.Sequential(
            nn.Linear(d_model, d_ff, bias=False), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(d_ff, d_model, bias=False))
        self.linear1, self.linear2 = self.linear_net[0], self.linear_net[3]

    def forward(self, x):
        return self.linear_net(x)
'''),
    Mistake("FeedForward", "the two layers defined the other way round", r"layers are swapped", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_ff, d_model)
        self.linear2 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear1(self.dropout(torch.relu(self.linear2(x))))
'''),
    Mistake("FeedForward", "no activation between the layers", r"no activation", _ff('''
    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x)))
''')),
    Mistake("FeedForward", "ReLU after the second layer as well", r"ReLU is also applied to the output", _ff('''
    def forward(self, x):
        return torch.relu(self.linear2(self.dropout(torch.relu(self.linear1(x)))))
''')),
    Mistake("FeedForward", "GELU instead of ReLU", r"GELU", _ff('''
    def forward(self, x):
        return self.linear2(self.dropout(F.gelu(self.linear1(x))))
''')),
    Mistake("FeedForward", "bias=False on both layers, as in the seeds", r"no bias", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))
'''),
    Mistake("FeedForward", "hidden size hard-coded to 4 * d_model, d_ff ignored", r"hard-coded", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, 4 * d_model)
        self.linear2 = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))
'''),
    Mistake("FeedForward", "the dropout argument is accepted but never used", r"dropout argument is ignored", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))
'''),
    Mistake("FeedForward", "F.dropout without training=self.training: dropout stays on in eval mode",
            r"eval mode", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.p = dropout

    def forward(self, x):
        return self.linear2(F.dropout(torch.relu(self.linear1(x)), self.p))
'''),
    Mistake("FeedForward", "the seeds' typo nn.ReLu", r"spelt nn\.ReLU", _ff('''
    def forward(self, x):
        return self.linear2(self.dropout(nn.ReLu()(self.linear1(x))))
''')),
    Mistake("FeedForward", "nn.ReLU(h) used as if it were a function", r"nn\.ReLU is a module class", _ff('''
    def forward(self, x):
        return self.linear2(self.dropout(nn.ReLU(self.linear1(x))))
''')),
    # ================================================================ EncoderLayer
    Mistake("EncoderLayer", "always pre-norm, like the seeds: norm_first ignored",
            r"norm_first argument is ignored", _enc('''
    def forward(self, x, src_mask=None):
        h = self.norm1(x)
        x = x + self.drop(self.self_attn(h, h, h, src_mask))
        return x + self.drop(self.ff(self.norm2(x)))
''')),
    Mistake("EncoderLayer", "always post-norm: norm_first ignored", r"norm_first argument is ignored", _enc('''
    def forward(self, x, src_mask=None):
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, src_mask)))
        return self.norm2(x + self.drop(self.ff(x)))
''')),
    Mistake("EncoderLayer", "one LayerNorm object shared by both sub-layers (seed)", r"shared",
            _enc(_POST_PRE, norms="        self.norm1 = self.norm2 = nn.LayerNorm(d_model)\n")),
    Mistake("EncoderLayer", "forward uses norm1 for both sub-layers (copy-paste)",
            r"one LayerNorm \(norm1\) for both", _enc(_POST_PRE.replace("self.norm2", "self.norm1"))),
    Mistake("EncoderLayer", "no residual connections", r"no residual", _enc('''
    def forward(self, x, src_mask=None):
        if self.norm_first:
            h = self.norm1(x)
            x = self.drop(self.self_attn(h, h, h, src_mask))
            return self.drop(self.ff(self.norm2(x)))
        x = self.norm1(self.drop(self.self_attn(x, x, x, src_mask)))
        return self.norm2(self.drop(self.ff(x)))
''')),
    Mistake("EncoderLayer", "src_mask never passed to the self-attention",
            r"src_mask never reaches|src_mask is not applied",
            _enc(_POST_PRE.replace("h, h, h, src_mask", "h, h, h").replace("x, x, x, src_mask", "x, x, x"))),
    Mistake("EncoderLayer", "mask inverted (PyTorch's True = ignore convention)", r"inverted",
            _enc(_POST_PRE.replace("h, h, h, src_mask", "h, h, h, m").replace("x, x, x, src_mask", "x, x, x, m")
                 .replace("        if self.norm_first:", "        m = None if src_mask is None else ~src_mask\n"
                          "        if self.norm_first:", 1))),
    Mistake("EncoderLayer", "pre-norm written as x = norm1(x); x = x + sa(x)", r"overwritten by norm1", _enc('''
    def forward(self, x, src_mask=None):
        if self.norm_first:
            x = self.norm1(x)
            x = x + self.drop(self.self_attn(x, x, x, src_mask))
            x = self.norm2(x)
            return x + self.drop(self.ff(x))
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, src_mask)))
        return self.norm2(x + self.drop(self.ff(x)))
''')),
    Mistake("EncoderLayer", "pre-norm: the FFN residual adds the layer input x instead of h",
            r"adds the layer's input x instead of h", _enc('''
    def forward(self, x, src_mask=None):
        if self.norm_first:
            n = self.norm1(x)
            h = x + self.drop(self.self_attn(n, n, n, src_mask))
            return x + self.drop(self.ff(self.norm2(h)))
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, src_mask)))
        return self.norm2(x + self.drop(self.ff(x)))
''')),
    Mistake("EncoderLayer", "post-norm: residual added after the norm, x + norm(sublayer(x))",
            r"residual is added after the norm", _enc('''
    def forward(self, x, src_mask=None):
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.drop(self.self_attn(h, h, h, src_mask))
            return x + self.drop(self.ff(self.norm2(x)))
        x = x + self.norm1(self.drop(self.self_attn(x, x, x, src_mask)))
        return x + self.norm2(self.drop(self.ff(x)))
''')),
    Mistake("EncoderLayer", "typo between __init__ and forward (seed: ffn_norm / fnn_norm)",
            r"attribute 'norm_2'", _enc(_POST_PRE.replace("self.ff(self.norm2(x))", "self.ff(self.norm_2(x))"))),
    Mistake("EncoderLayer", "wraps nn.TransformerEncoderLayer (the shortcut)", r"Shortcut used", _enc('''
    def forward(self, x, src_mask=None):
        kpm = None if src_mask is None else ~src_mask[:, 0, :]
        return self.inner(x, src_key_padding_mask=kpm)
''', init_extra="        self.inner = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, "
                "batch_first=True, norm_first=norm_first)\n")),
    Mistake("EncoderLayer", "dropout argument never used", r"dropout argument is not used", '''
class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.drop = nn.Identity()
''' + _POST_PRE),
    # ================================================================ DecoderLayer
    Mistake("DecoderLayer", "cross-attention attends over the decoder's own states (memory ignored)",
            r"ignores the encoder output|does not depend on memory",
            _dec(_dec_fwd(ca="self.cross_attn(h, h, h)"))),
    Mistake("DecoderLayer", "cross-attention with query and key swapped (the V, K, Q figure)",
            r"argument order|queries from memory", _dec(_dec_fwd(ca="self.cross_attn(memory, h, h, src_mask)"))),
    Mistake("DecoderLayer", "self-attention without tgt_mask: looks ahead", r"looks ahead",
            _dec(_dec_fwd(sa="self.self_attn(h, h, h)"))),
    Mistake("DecoderLayer", "masks swapped between the two attentions", r"which mask goes where",
            _dec(_dec_fwd(sa="self.self_attn(h, h, h, src_mask)", ca="self.cross_attn(h, memory, memory, tgt_mask)"))),
    Mistake("DecoderLayer", "src_mask not passed to the cross-attention",
            r"src_mask never reaches the cross-attention|padded memory positions",
            _dec(_dec_fwd(ca="self.cross_attn(h, memory, memory)"))),
    Mistake("DecoderLayer", "one LayerNorm object for all three sub-layers (seed)", r"shared",
            _dec(_dec_fwd(), norms="        self.norm = nn.LayerNorm(d_model)\n"
                 "        self.norm1 = self.norm2 = self.norm3 = self.norm\n")),
    Mistake("DecoderLayer", "forward calls norm1 after every sub-layer", r"norm1\) is used for all three",
            _dec(_dec_fwd(n2="self.norm1", n3="self.norm1"))),
    Mistake("DecoderLayer", "one attention module used for self- and cross-attention",
            r"need their own weights", _dec(_dec_fwd(), attns=(
                "        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)\n"
                "        self.cross_attn = self.self_attn\n"))),
    Mistake("DecoderLayer", "always pre-norm (the seeds): norm_first ignored", r"norm_first argument is ignored",
            _dec(_dec_fwd(post='''            x = x + self.drop(sa(self.norm1(x)))
            x = x + self.drop(ca(self.norm2(x)))
            x = x + self.drop(self.ff(self.norm3(x)))'''))),
    Mistake("DecoderLayer", "pre-norm also normalises memory with norm2", r"memory is normalised",
            _dec(_dec_fwd(pre='''            x = x + self.drop(sa(self.norm1(x)))
            m = self.norm2(memory)
            x = x + self.drop(self.cross_attn(self.norm2(x), m, m, src_mask))
            x = x + self.drop(self.ff(self.norm3(x)))'''))),
    Mistake("DecoderLayer", "the seed's typo attentiion_norm_1 vs attention_norm_1", r"no attribute",
            _dec(_dec_fwd(n1="self.attention_norm_1"))),
    Mistake("DecoderLayer", "cross-attention sub-layer left out", r"ignores the encoder output|does not depend on memory",
            _dec(_dec_fwd(pre='''            x = x + self.drop(sa(self.norm1(x)))
            x = x + self.drop(self.ff(self.norm3(x)))''', post='''            x = self.norm1(x + self.drop(sa(x)))
            x = self.norm3(x + self.drop(self.ff(x)))'''))),
    # ================================================================ Encoder
    Mistake("Encoder", "layers kept in a Python list", r"plain Python list", '''
class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = [EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)]
        self.norm = nn.LayerNorm(d_model)
''' + _ENC_STACK_FWD),
    Mistake("Encoder", "[EncoderLayer(...)] * n_layers: one layer repeated", r"same layer object", '''
class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first)] * n_layers)
        self.norm = nn.LayerNorm(d_model)
''' + _ENC_STACK_FWD),
    Mistake("Encoder", "final LayerNorm created but never applied", r"final LayerNorm is missing",
            _ENC_STACK_INIT + _ENC_STACK_FWD.replace("return self.norm(x)", "return x")),
    Mistake("Encoder", "final norm applied after every layer", r"after every layer",
            _ENC_STACK_INIT + '''
    def forward(self, x, src_mask=None):
        for layer in self.layers:
            x = self.norm(layer(x, src_mask))
        return x
'''),
    Mistake("Encoder", "src_mask not passed on to the layers", r"src_mask is not passed on",
            _ENC_STACK_INIT + _ENC_STACK_FWD.replace("layer(x, src_mask)", "layer(x)")),
    Mistake("Encoder", "one layer too few: range(n_layers - 1)", r"has \d+ layers",
            _ENC_STACK_INIT.replace("range(n_layers)", "range(n_layers - 1)") + _ENC_STACK_FWD),
    Mistake("Encoder", "norm_first not passed on to the layers", r"norm_first",
            _ENC_STACK_INIT.replace("dropout, norm_first)", "dropout)") + _ENC_STACK_FWD),
    Mistake("Encoder", "dropout not passed on to the layers", r"dropout argument is not passed on",
            _ENC_STACK_INIT.replace("dropout, norm_first)", "norm_first=norm_first)") + _ENC_STACK_FWD),
    Mistake("Encoder", "the seed's typo super().__int__()", r"__int__",
            _ENC_STACK_INIT.replace("super().__init__()", "super().__int__()") + _ENC_STACK_FWD),
    Mistake("Encoder", "wraps nn.TransformerEncoder (the shortcut)", r"Shortcut used", _ENC_STACK_INIT + '''
        self.inner = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True,
                                       norm_first=norm_first), n_layers, enable_nested_tensor=False)

    def forward(self, x, src_mask=None):
        kpm = None if src_mask is None else ~src_mask[:, 0, :]
        return self.norm(self.inner(x, src_key_padding_mask=kpm))
'''),
    # ================================================================ Decoder
    Mistake("Decoder", "the seeds' loop calls layer(x) without memory", r"without memory",
            _DEC_STACK_INIT + _DEC_STACK_FWD.replace("layer(x, memory, src_mask, tgt_mask)", "layer(x)")),
    Mistake("Decoder", "decoder ignores the encoder output: layer(x, x, ...)", r"ignores the encoder output",
            _DEC_STACK_INIT + _DEC_STACK_FWD.replace("layer(x, memory, src_mask, tgt_mask)",
                                                     "layer(x, x, None, tgt_mask)")),
    Mistake("Decoder", "layers kept in a Python list", r"plain Python list", '''
class Decoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = []
        for _ in range(n_layers):
            self.layers.append(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first))
        self.norm = nn.LayerNorm(d_model)
''' + _DEC_STACK_FWD),
    Mistake("Decoder", "no final LayerNorm", r"final LayerNorm is missing",
            _DEC_STACK_INIT + _DEC_STACK_FWD.replace("return self.norm(x)", "return x")),
    Mistake("Decoder", "masks passed in the wrong order", r"that order",
            _DEC_STACK_INIT + _DEC_STACK_FWD.replace("layer(x, memory, src_mask, tgt_mask)",
                                                     "layer(x, memory, tgt_mask, src_mask)")),
    Mistake("Decoder", "tgt_mask not passed on: looks ahead", r"tgt_mask",
            _DEC_STACK_INIT + _DEC_STACK_FWD.replace("layer(x, memory, src_mask, tgt_mask)",
                                                     "layer(x, memory, src_mask)")),
    Mistake("Decoder", "the seed's typo DecoderLayers", r"not defined",
            _DEC_STACK_INIT.replace("DecoderLayer(d_model", "DecoderLayers(d_model") + _DEC_STACK_FWD),
    Mistake("Decoder", "the seed's loop `for _ in n_layers`", r"range\(n_layers\)",
            _DEC_STACK_INIT.replace("for _ in range(n_layers)", "for _ in n_layers") + _DEC_STACK_FWD),
    Mistake("Decoder", "norm_first not passed on to the layers", r"norm_first",
            _DEC_STACK_INIT.replace("dropout, norm_first)", "dropout)") + _DEC_STACK_FWD),
    Mistake("Decoder", "[DecoderLayer(...)] * n_layers: one layer repeated", r"same layer object", '''
class Decoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first)] * n_layers)
        self.norm = nn.LayerNorm(d_model)
''' + _DEC_STACK_FWD),
    # public patterns (issue 16)
    Mistake("FeedForward", "nanoGPT-style MLP: GELU, dropout after the second layer", r"GELU", _ff('''
    def forward(self, x):
        return self.dropout(self.linear2(F.gelu(self.linear1(x))))
''')),
    Mistake("EncoderLayer", "attention module with its own residual + LayerNorm inside, wrapped again by the layer",
            r"contains a LayerNorm", _enc('''
    def forward(self, x, src_mask=None):
        if self.norm_first:
            x = x + self.drop(self.self_attn(self.norm1(x), src_mask))
            x = x + self.drop(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.drop(self.self_attn(x, src_mask)))
            x = self.norm2(x + self.drop(self.ff(x)))
        return x
''', init_extra='''        self.self_attn = _AttnSublayer(d_model, n_heads, dropout)
''').replace("class EncoderLayer", '''class _AttnSublayer(nn.Module):
    def __init__(self, d_model, n_heads, dropout):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, n_heads, dropout)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        return self.norm(x + self.mha(x, x, x, mask))


class EncoderLayer''', 1)),
    Mistake("DecoderLayer", "cross-attention of its own that splits K and V with the query's length",
            r"their own length|memory\.size\(1\)", _dec(_dec_fwd(ca="self.cross_attn(h, memory, src_mask)"),
            init_extra='''        self.cross_attn = _CrossAttn(d_model, n_heads, dropout)
''').replace("class DecoderLayer", '''class _CrossAttn(nn.Module):
    def __init__(self, d_model, n_heads, dropout):
        super().__init__()
        self.h, self.dh = n_heads, d_model // n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, memory, mask=None):
        B, L, D = x.shape
        q = self.w_q(x).view(B, L, self.h, self.dh).transpose(1, 2)
        k = self.w_k(memory).view(B, L, self.h, self.dh).transpose(1, 2)  # L: the query's length
        v = self.w_v(memory).view(B, L, self.h, self.dh).transpose(1, 2)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        if mask is not None:
            s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
        o = self.drop(s.softmax(-1)) @ v
        return self.w_o(o.transpose(1, 2).reshape(B, L, D))


class DecoderLayer''', 1)),
]

VARIANTS = [
    # ================================================================ FeedForward
    Variant("FeedForward", "nn.Sequential over the named layers", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.net = nn.Sequential(self.linear1, nn.ReLU(), nn.Dropout(dropout), self.linear2)

    def forward(self, x):
        return self.net(x)
'''),
    Variant("FeedForward", "the UvA tutorial's nn.Sequential first, linear1/linear2 as aliases (issue 27)", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear_net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.Dropout(dropout), nn.ReLU(inplace=True),
            nn.Linear(d_ff, d_model))
        self.linear1, self.linear2 = self.linear_net[0], self.linear_net[3]

    def forward(self, x):
        return self.linear_net(x)
'''),
    Variant("FeedForward", "functional: F.relu and F.dropout(training=self.training)", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.p = dropout

    def forward(self, x):
        h = F.relu(self.linear1(x))
        h = F.dropout(h, p=self.p, training=self.training)
        return self.linear2(h)
'''),
    Variant("FeedForward", "einsum in float64 with clamp(min=0)", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        W1, b1 = self.linear1.weight.double(), self.linear1.bias.double()
        W2, b2 = self.linear2.weight.double(), self.linear2.bias.double()
        h = torch.einsum("...i,oi->...o", x.double(), W1) + b1
        h = self.drop(h.clamp(min=0))
        return (torch.einsum("...i,oi->...o", h, W2) + b2).to(x.dtype)
'''),
    Variant("FeedForward", "flatten to (N, d_model) and back", '''
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        shape = x.shape
        h = x.reshape(-1, shape[-1])  # (N, d_model)
        h = self.dropout(self.act(self.linear1(h)))  # (N, d_ff)
        return self.linear2(h).reshape(shape)  # (..., d_model)
'''),
    # ================================================================ EncoderLayer
    Variant("EncoderLayer", "a residual helper, Annotated-Transformer style", _enc('''
    def residual(self, x, norm, sublayer):
        if self.norm_first:
            return x + self.drop(sublayer(norm(x)))
        return norm(x + self.drop(sublayer(x)))

    def forward(self, x, src_mask=None):
        x = self.residual(x, self.norm1, lambda h: self.self_attn(h, h, h, src_mask))
        return self.residual(x, self.norm2, self.ff)
''')),
    Variant("EncoderLayer", "ff as an nn.Sequential with named layers, PyTorch-style blocks", '''
from collections import OrderedDict

class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.ff = nn.Sequential(OrderedDict(linear1=nn.Linear(d_model, d_ff), relu=nn.ReLU(),
                                            dropout=nn.Dropout(dropout),
                                            linear2=nn.Linear(d_ff, d_model)))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)

    def _sa_block(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x, mask))

    def _ff_block(self, x):
        return self.dropout2(self.ff(x))

    def forward(self, x, src_mask=None):
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask))
        return self.norm2(x + self._ff_block(x))
'''),
    Variant("EncoderLayer", "the course's own LayerNorm and an explicit 4-D mask", _enc('''
    def forward(self, x, src_mask=None):
        B, L, C = x.shape
        mask = None
        if src_mask is not None:
            mask = src_mask.unsqueeze(1) if src_mask.dim() == 3 else src_mask  # (B, 1, ., L)
        for norm, sub in ((self.norm1, lambda h: self.self_attn(h, h, h, mask)), (self.norm2, self.ff)):
            x = x + self.drop(sub(norm(x))) if self.norm_first else norm(x + self.drop(sub(x)))
        return x
''', norms="        from tfscratch.reference import LayerNorm\n"
           "        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)\n")),
    # ================================================================ DecoderLayer
    Variant("DecoderLayer", "loop over (norm, sub-layer) pairs", _dec('''
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        subs = [(self.norm1, lambda h: self.self_attn(h, h, h, tgt_mask)),
                (self.norm2, lambda h: self.cross_attn(h, memory, memory, src_mask)),
                (self.norm3, self.ff)]
        for norm, f in subs:
            x = x + self.drop(f(norm(x))) if self.norm_first else norm(x + self.drop(f(x)))
        return x
''')),
    Variant("DecoderLayer", "PyTorch-style _sa/_mha/_ff blocks, ff as named nn.Sequential", '''
from collections import OrderedDict

class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = nn.Sequential(OrderedDict(linear1=nn.Linear(d_model, d_ff), relu=nn.ReLU(),
                                            drop=nn.Dropout(dropout), linear2=nn.Linear(d_ff, d_model)))
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def _sa_block(self, x, mask):
        return self.dropout1(self.self_attn(x, x, x, mask))

    def _mha_block(self, x, mem, mask):
        return self.dropout2(self.cross_attn(x, mem, mem, mask))

    def _ff_block(self, x):
        return self.dropout3(self.ff(x))

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask)
            x = x + self._mha_block(self.norm2(x), memory, src_mask)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask))
        x = self.norm2(x + self._mha_block(x, memory, src_mask))
        return self.norm3(x + self._ff_block(x))
'''),
    Variant("DecoderLayer", "masks expanded to 4-D by hand, course LayerNorm", _dec('''
    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        B, Lt, C = x.shape
        if tgt_mask is not None and tgt_mask.dim() == 2:
            tgt_mask = tgt_mask.expand(B, Lt, Lt)  # (B, Lt, Lt)
        tm = None if tgt_mask is None else tgt_mask.unsqueeze(1)  # (B, 1, Lt, Lt)
        sm = None if src_mask is None else src_mask.unsqueeze(1)  # (B, 1, 1, Ls)
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.drop(self.self_attn(h, h, h, tm))
            h = self.norm2(x)
            x = x + self.drop(self.cross_attn(h, memory, memory, sm))
            return x + self.drop(self.ff(self.norm3(x)))
        x = self.norm1(x + self.drop(self.self_attn(x, x, x, tm)))
        x = self.norm2(x + self.drop(self.cross_attn(x, memory, memory, sm)))
        return self.norm3(x + self.drop(self.ff(x)))
''', norms="        from tfscratch.reference import LayerNorm\n"
           "        self.norm1, self.norm2, self.norm3 = (LayerNorm(d_model) for _ in range(3))\n")),
    # ================================================================ Encoder
    Variant("Encoder", "copy.deepcopy clones, Annotated-Transformer style", '''
import copy

class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        layer = EncoderLayer(d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first)
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d_model)
''' + _ENC_STACK_FWD),
    Variant("Encoder", "append in a loop, functools.reduce in forward", '''
import functools

class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(n_layers):
            self.layers.append(EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, src_mask=None):
        x = functools.reduce(lambda h, layer: layer(h, src_mask=src_mask), self.layers, x)
        return self.norm(x)
'''),
    Variant("Encoder", "indexing the layers, course LayerNorm as the final norm", '''
from tfscratch.reference import LayerNorm

class Encoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(d_model, n_heads, d_ff, dropout=dropout,
                                                  norm_first=norm_first)
                                     for i in range(n_layers)])
        self.norm = LayerNorm(d_model)

    def forward(self, x, src_mask=None):
        for i in range(len(self.layers)):
            x = self.layers[i](x, src_mask=src_mask)
        return self.norm(x)
'''),
    # ================================================================ Decoder
    Variant("Decoder", "copy.deepcopy clones, masks by keyword", '''
import copy

class Decoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        layer = DecoderLayer(d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first)
        self.layers = nn.ModuleList(copy.deepcopy(layer) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, src_mask=src_mask)
        return self.norm(x)
'''),
    Variant("Decoder", "append in a loop, positional masks", '''
class Decoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(n_layers):
            self.layers.append(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first))
        self.norm = nn.LayerNorm(d_model)
''' + _DEC_STACK_FWD),
    Variant("Decoder", "enumerate, course LayerNorm, 2-D tgt_mask expanded once", '''
from tfscratch.reference import LayerNorm

class Decoder(nn.Module):
    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first)
                                     for _ in range(n_layers)])
        self.norm = LayerNorm(d_model)

    def forward(self, x, memory, src_mask=None, tgt_mask=None):
        if tgt_mask is not None and tgt_mask.dim() == 2:
            tgt_mask = tgt_mask.unsqueeze(0).expand(x.size(0), -1, -1)  # (B, Lt, Lt)
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)
'''),
]
