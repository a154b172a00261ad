"""The probe machine's stand-ins and procedures: the stand-in models a probe passes to a
decoding function (`FIXTURES`, plan values {"$fixture": name}) and the drivers that run a
student's object inside a small procedure (`DRIVERS`, calls whose method is "@name").

Its text runs in the student's kernel with the probe machine's: the grader's probe cell holds
this file's text and then `vm.py`'s, in one fresh module (tfsgrade.verdict.VM_SOURCE), so
nothing the student patched in `tfscratch` is used. Like `vm.py`, it imports torch, numpy and
the standard library only; imported as a module, `vm.py` imports it.
"""
import os

import torch


# -- fixtures: stand-in objects a probe passes to the exercise -----------------------------

class ToySeq2Seq(torch.nn.Module):
    """A tiny deterministic encoder-decoder offering encode/decode/generator and forward,
    for decoding functions (greedy_decode): the next token depends on the source and on the
    prefix through embeddings and a causal mean, so a decoder that feeds the wrong prefix or
    the wrong source gives other tokens."""

    def __init__(self, vocab: int, d: int, pad_id: int = 0):
        super().__init__()
        self.pad_id = pad_id
        self.src_embed = torch.nn.Embedding(vocab, d)
        self.tgt_embed = torch.nn.Embedding(vocab, d)
        self.mix = torch.nn.Linear(2 * d, d)
        self.generator = torch.nn.Linear(d, vocab)

    def encode(self, src, src_mask=None):
        return self.src_embed(src)                                   # (B, Ls, d)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        B, T = tgt.shape
        h = self.tgt_embed(tgt).cumsum(1) / torch.arange(1, T + 1).view(1, T, 1)  # causal mean
        ctx = memory.mean(1, keepdim=True).expand(B, T, -1)
        return torch.tanh(self.mix(torch.cat([h, ctx], -1)))         # (B, T, d)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.generator(self.decode(tgt, self.encode(src)))


class ToyLM(torch.nn.Module):
    """A tiny causal language model `forward(tokens) -> logits (B, T, V)` for sampling and
    generation functions; a causal mean of embeddings, so every prefix token matters."""

    def __init__(self, vocab: int, d: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        T = tokens.shape[1]
        h = self.embed(tokens).cumsum(1) / torch.arange(1, T + 1).view(1, T, 1)
        return self.head(torch.tanh(h))


GAIN = 3.0


class ToySeq2SeqMasked(torch.nn.Module):
    """toy_seq2seq that honours its masks like a two-layer Transformer, for greedy_decode:
    `decode` mixes the target positions twice through the positions `tgt_mask` allows (so the
    last position's state depends on the causal mask), and reads the memory through `src_mask`
    (so padded source positions matter); `forward` builds both masks from `pad_id` when none
    are given. Masks: (Lq, Lk), (B, Lq, Lk), (B, 1, Lk) or 4-D with a head axis (head 0 is
    read); None = everything allowed. Its generator never proposes `pad_id`."""

    class _NoPad(torch.nn.Linear):
        def __init__(self, d, vocab, pad_id):
            super().__init__(d, vocab)
            self.pad_id = pad_id

        def forward(self, x):
            y = super().forward(x)
            if 0 <= self.pad_id < y.size(-1):
                y = y.index_fill(-1, torch.tensor([self.pad_id]), -1e4)
            return y

    def __init__(self, vocab: int, d: int, pad_id: int = 0):
        super().__init__()
        self.pad_id = pad_id
        self.src_embed = torch.nn.Embedding(vocab, d)
        self.tgt_embed = torch.nn.Embedding(vocab, d)
        self.mid = torch.nn.Linear(d, d)
        self.mix = torch.nn.Linear(2 * d, d)
        self.generator = self._NoPad(d, vocab, pad_id)
        for lin in (self.mid, self.mix, self.generator):     # sharp: small changes move the argmax
            torch.nn.init.normal_(lin.weight, std=GAIN / lin.in_features ** 0.5)
            torch.nn.init.zeros_(lin.bias)

    K = 4

    @staticmethod
    def _allowed(mask, B, Lq, Lk):
        if mask is None:
            return torch.ones(B, Lq, Lk)
        m = mask.to(torch.float32)
        if m.dim() == 4:
            m = m[:, 0]
        return m.expand(B, Lq, Lk)

    @staticmethod
    def _mean(a, x):
        return (a @ x) / a.sum(-1, keepdim=True).clamp_min(1.0)

    def encode(self, src, src_mask=None):
        return self.src_embed(src)                                   # (B, Ls, d)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        B, T = tgt.shape
        a = self._allowed(tgt_mask, B, T, T)
        h1 = torch.tanh(self.mid(self._mean(a, self.tgt_embed(tgt))))  # layer 1
        h2 = self._mean(a, h1)                                          # layer 2
        ctx = self._mean(self._allowed(src_mask, B, T, memory.size(1)), memory)
        # what layer 2 adds is amplified: without a causal mask h2 == h1 at the last position
        return torch.tanh(self.mix(torch.cat([h1 + self.K * (h2 - h1), ctx], -1)))  # (B, T, d)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        if src_mask is None:
            src_mask = (src != self.pad_id).unsqueeze(1)
        if tgt_mask is None:
            T = tgt.size(1)
            tgt_mask = torch.ones(T, T, dtype=torch.bool).tril() & (tgt != self.pad_id).unsqueeze(1)
        return self.generator(self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask))


class ToyCacheLM(torch.nn.Module):
    """A tiny causal language model with DecoderOnlyLM's interface, for `generate`:
    forward(tokens, past_kv=None, use_cache=False) returns the logits (B, T, V), or
    (logits, cache) with use_cache=True, where cache = [(k, v)] holds the ids of every token so
    far as (B, 1, P + T, 1) floats (one layer, one head, shaped like real keys; P =
    past_kv[0][0].size(2)). Position t's logits depend on every token up to t and on t itself,
    so a cached call that repeats cached tokens, or a stale cache, gives other tokens.
    It is also a spy, through two fixed biases: a call that does not ask for the cache gets
    `plain_bias` added (generate(use_cache=True) that never uses the cache picks other
    tokens than one that does; with use_cache=False both sides call it that way), and a call
    made with gradients enabled gets `grad_bias` added (generate without torch.no_grad())."""

    def __init__(self, vocab: int, d: int, max_len: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(max_len, d)
        self.head = torch.nn.Linear(d, vocab)
        self.plain_bias = torch.nn.Parameter(3.0 * torch.randn(vocab))
        self.grad_bias = torch.nn.Parameter(3.0 * torch.randn(vocab))

    def forward(self, tokens, past_kv=None, use_cache=False):
        B, T = tokens.shape
        past = (tokens.new_zeros(B, 0) if past_kv is None
                else past_kv[0][0][:, 0, :, 0].round().long())
        full = torch.cat([past, tokens], 1)                          # (B, P + T)
        L = full.size(1)
        h = self.embed(full).cumsum(1) / torch.arange(1, L + 1).view(1, L, 1) + self.pos(torch.arange(L))
        logits = self.head(torch.tanh(h))[:, past.size(1):]           # (B, T, V)
        if not use_cache:
            logits = logits + self.plain_bias
        if torch.is_grad_enabled():
            logits = logits + self.grad_bias
        if use_cache:
            kv = full.to(torch.float32)[:, None, :, None]
            return logits, [(kv, kv.clone())]
        return logits


class ToyUnigramLM(torch.nn.Module):
    """A language model `forward(tokens) -> logits (B, T, V)` whose logits are the same fixed
    vector at every position, whatever the tokens: every step of a sampled generation draws
    from one distribution, so the frequencies of all generated tokens of a few rows can be
    compared (a batch smaller than top_k, many steps). `max_len` is an attribute only."""

    def __init__(self, vocab: int, max_len: int = 64):
        super().__init__()
        self.max_len = max_len
        self.logits = torch.nn.Parameter(torch.linspace(1.5, -1.5, vocab) + 0.1 * torch.randn(vocab))

    def forward(self, tokens):
        B, T = tokens.shape
        return self.logits.expand(B, T, -1).clone()


FIXTURES = {"toy_unigram_lm": ToyUnigramLM, "toy_seq2seq": ToySeq2Seq, "toy_lm": ToyLM, "toy_seq2seq_masked": ToySeq2SeqMasked,
            "toy_cache_lm": ToyCacheLM}


# -- drivers: a probe call that runs the student's object inside a small procedure -----------
# A call whose `method` is "@name" runs DRIVERS[name](obj, *args, **kwargs): notebook 12's
# optimizer, gradient clipping, checkpoints, batches and evaluation are judged on what they do
# to a model trained here, with the other half of each procedure written independently here
# (the checkpoint's reader and writer, the training loop), never the course's solution.

def _toy_params(seed: int):
    """The parameters of a small two-layer network and a regression batch, from `seed`."""
    g = torch.Generator().manual_seed(int(seed))
    shapes = [(8, 6), (8,), (3, 8), (3,)]
    params = [(0.5 * torch.randn(s, generator=g)).requires_grad_(True) for s in shapes]
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)
    return params, x, y


def _toy_loss(params, x, y):
    w1, b1, w2, b2 = params
    return ((torch.tanh(x @ w1.T + b1) @ w2.T + b2 - y) ** 2).mean()


def lr_factor(t: int) -> float:
    """The multiplier a probe's schedule applies to the learning rate before step t (0-based):
    it changes at every step, so an optimizer that reads lr once cannot follow it."""
    return 0.25 + 0.75 * ((t * 5) % 7) / 6


def drive_optimizer(cls, seed, steps, kwargs, schedule=False, resume_at=None):
    """`steps` steps of `cls(params, **kwargs)` on the toy regression; the parameters after
    them and the losses on the way. `schedule`: group["lr"] is set to lr * lr_factor(t) before
    each step t, as a training loop's schedule does. `resume_at`: after that many steps a new
    optimizer of the same class takes over from `load_state_dict(opt.state_dict())`, as a
    resumed checkpoint does; `n_state` is how many parameters its state_dict's "state" held."""
    params, x, y = _toy_params(seed)
    opt = cls(params, **kwargs)
    base = kwargs.get("lr", 1e-3)
    losses, out = [], {}
    for t in range(int(steps)):
        if resume_at is not None and t == int(resume_at):
            sd = opt.state_dict()
            out["n_state"] = torch.tensor(len(sd.get("state", {})))
            opt = cls(params, **kwargs)
            opt.load_state_dict(sd)
        if schedule:
            for group in opt.param_groups:
                group["lr"] = base * lr_factor(t)
        for p in params:
            p.grad = None
        loss = _toy_loss(params, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {"params": [p.detach().clone() for p in params],
            "losses": torch.tensor(losses, dtype=torch.float64), **out}


def _clip_weights(seed, shape):
    """A parameter's values (not zero, and unlike its gradient: a norm of the weights shows)."""
    g = torch.Generator().manual_seed(int(seed) + 99991 + 7 * len(shape) + shape[0])
    return (2.0 * torch.randn(shape, generator=g)).requires_grad_(True)


def drive_clip(fn, seed, max_norm, scale, as_generator=False):
    """fn(parameters, max_norm) on parameters with seeded gradients (one without a gradient);
    the returned norm and every gradient afterwards."""
    g = torch.Generator().manual_seed(int(seed))
    params = [_clip_weights(seed, s) for s in [(4, 5), (5,), (3, 4), (7,)]]
    for i, p in enumerate(params):
        if i != 2:
            p.grad = scale * torch.randn(p.shape, generator=g)
    norm = fn(iter(params) if as_generator else params, max_norm)
    return {"norm": torch.as_tensor(norm, dtype=torch.float64).detach().reshape(()),
            "grads": [p.grad.clone() for p in params if p.grad is not None]}


def drive_schedule(fn, steps, *args):
    """fn(step, *args) for every step of `steps` (float64)."""
    return torch.tensor([float(fn(int(s), *args)) for s in steps], dtype=torch.float64)


class _CkptModel(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(int(seed))
        self.lin1 = torch.nn.Linear(6, 8)
        self.lin2 = torch.nn.Linear(8, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=g))

    def forward(self, x):
        return self.lin2(torch.tanh(self.lin1(x)))


def _ckpt_run(seed, save, load, before, after):
    """Train `before` steps, save, train `after` steps; then a fresh model and optimizer,
    load, `after` steps again. The learning rate depends on the step, so the step counts."""
    g = torch.Generator().manual_seed(int(seed) + 1)
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)

    def lr(step):
        return 0.05 * (0.9 ** step)

    def train(model, opt, start, n):
        out = []
        for step in range(start, start + n):
            for gr in opt.param_groups:
                gr["lr"] = lr(step)
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            out.append(float(loss.detach()))   # the value logged, not a graph
        return out

    model = _CkptModel(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr(0), weight_decay=0.1)
    train(model, opt, 0, int(before))
    path = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"tfs-checkpoint-{os.getpid()}-{seed}.pt")
    try:
        save(model, opt, int(before), path)
        straight = train(model, opt, int(before), int(after))
        model2 = _CkptModel(int(seed) + 7)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=lr(0), weight_decay=0.1)
        step = load(path, model2, opt2)
    finally:
        if os.path.exists(path):
            os.remove(path)
    resumed = train(model2, opt2, int(step), int(after))
    # bit for bit is a property of one process: the resumed losses against the straight ones
    # computed here, exactly; the losses themselves are compared with the reference's at the
    # float tolerance (another machine's or thread count's last bits differ)
    return {"step": int(step), "straight": torch.tensor(straight, dtype=torch.float64),
            "resumed": torch.tensor(resumed, dtype=torch.float64),
            "bit_for_bit": resumed == straight}


def drive_save(fn, seed, before, after):
    """The student's save_checkpoint; the checkpoint read back here as the notebook states it:
    torch.load(path) is {"model": ..., "optimizer": ..., "step": ...}."""
    def load(path, model, opt):
        ck = torch.load(path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        return ck["step"]
    return _ckpt_run(seed, fn, load, before, after)


def drive_load(fn, seed, before, after):
    """The student's load_checkpoint on a checkpoint written here in the notebook's format."""
    def save(model, opt, step, path):
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
    return _ckpt_run(seed, save, fn, before, after)


class _EvalLM(torch.nn.Module):
    """A small causal LM with dropout (so the mode matters): logits (B, T, V), or (logits,
    None) when `tuple_out`, like 09's ModernDecoderLM."""

    def __init__(self, seed, vocab, tuple_out):
        super().__init__()
        g = torch.Generator().manual_seed(int(seed))
        self.tuple_out = tuple_out
        self.embed = torch.nn.Parameter(torch.randn(vocab, 8, generator=g))
        self.head = torch.nn.Parameter(torch.randn(vocab, 8, generator=g))
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, tokens):
        T = tokens.shape[1]
        h = self.embed[tokens].cumsum(1) / torch.arange(1, T + 1).view(1, T, 1)
        logits = self.drop(torch.tanh(h)) @ self.head.T
        return (logits, None) if self.tuple_out else logits


def drive_evaluate(fn, seed, vocab, n_tokens, context_length, batch_size, tuple_out=False,
                   train=True, numpy=False):
    """fn(model, data, context_length, batch_size) on a seeded model and data; its loss and
    perplexity as float64, and whether the model is in training mode afterwards."""
    g = torch.Generator().manual_seed(int(seed))
    model = _EvalLM(seed, vocab, tuple_out).train(bool(train))
    data = torch.randint(0, vocab, (int(n_tokens),), generator=g)
    out = fn(model, data.numpy() if numpy else data, context_length, batch_size=batch_size)
    loss, ppl = out
    return {"loss": torch.as_tensor(float(loss), dtype=torch.float64),
            "perplexity": torch.as_tensor(float(ppl), dtype=torch.float64),
            "training_after": bool(model.training)}


def drive_batch(fn, seed, n_tokens, batch_size, context_length, calls=1, numpy=False,
                device="cpu", dtype=None):
    """fn(data, batch_size, context_length, device, generator) on data whose token at i is i
    (so a window shows where it starts): x and y of the first call, the starts over `calls`
    calls (one generator), whether the same seed repeats the batch, and the device."""
    data = torch.arange(int(n_tokens))
    src = data.numpy() if numpy else data
    if dtype:                          # ids stored compactly (uint16, as nanoGPT and CS336 do)
        src = data.numpy().astype(dtype)
    gen = torch.Generator().manual_seed(int(seed))
    x, y = fn(src, batch_size, context_length, device, gen)
    out = {"device": f"{x.device.type},{y.device.type}", "dtype": f"{x.dtype},{y.dtype}",
           "shape": torch.tensor([list(x.shape), list(y.shape)])}
    if x.device.type == "meta" or y.device.type == "meta" or x.dim() != 2 or x.shape != y.shape:
        return out
    x, y = x.cpu().long(), y.cpu().long()
    span = int(n_tokens) - int(context_length)
    out.update(x_is_window=bool((x[:, 1:] - x[:, :-1] == 1).all() and (x[:, 0] >= 0).all()),
               y_is_next=bool(torch.equal(y, x + 1)), y_equals_x=bool(torch.equal(y, x)),
               in_bounds=bool(y.max() < int(n_tokens) and x.min() >= 0),
               same_start=bool(x.shape[0] > 1 and (x[:, 0] == x[0, 0]).all()))
    if int(calls) > 1:
        starts = [x[:, 0].clone()]
        for _ in range(int(calls) - 1):
            xs, _ys = fn(src, batch_size, context_length, device, gen)
            starts.append(xs[:, 0].cpu().long().clone())
        starts = torch.cat(starts)
        # the valid starts are 0 ... span - 1 (a start of span runs past the end)
        out["starts_seen"] = torch.bincount(starts.clamp(0, span), minlength=span + 1)[:span] > 0
    again = fn(src, batch_size, context_length, device, torch.Generator().manual_seed(int(seed)))
    out["repeatable"] = bool(torch.equal(again[0].cpu().long(), x))
    return out


def drive_flash_backward(cls, q, k, v, grad_out, block_size, causal):
    """Notebook 10's FlashAttention (an autograd.Function): forward through `cls.apply`, then
    backward with `grad_out`. Returns (output, dq, dk, dv, saved): `saved` is how many elements
    the tensors saved for backward hold in all (counted by saved_tensors_hooks as the forward
    saves them, whether by ctx.save_for_backward or by autograd through plain operations)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = cls.apply(q, k, v, block_size, causal)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        return out, None, None, None, torch.tensor(sum(saved))
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad, torch.tensor(sum(saved))


# -- notebook 11's tokenizer format ------------------------------------------------------------

def gpt2_byte_map() -> dict:
    """GPT-2's {byte: printable character}, written here from its definition: bytes 33-126,
    161-172 and 174-255 stand for themselves, the other 68 take U+0100 on in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def drive_b2u(fn):
    """fn() -> {byte: str}: the code point each byte maps to (-1 where no 1-character str)."""
    m = fn()
    chars = [ord(m[b]) if isinstance(m.get(b), str) and len(m[b]) == 1 else -1 for b in range(256)]
    return {"chars": torch.tensor(chars), "int_keys": all(isinstance(k, int) for k in m),
            "size": torch.tensor(len(m))}


def drive_tok_save(fn, vocab, merges):
    """fn(vocab, merges) -> (vocab.json text, merges.txt text); read back here by GPT-2's format:
    the vocabulary {id: bytes}, the merges in the file's order, whether the #version line leads."""
    import json
    vocab_json, merges_txt = fn(vocab, merges)
    enc, lines = json.loads(vocab_json), merges_txt.split("\n")
    u2b = {c: b for b, c in gpt2_byte_map().items()}
    header = bool(lines) and lines[0].startswith("#version")
    body = [ln for ln in lines[1 if header else 0:] if ln]
    return {"vocab": {int(i): bytes(u2b[c] for c in s) for s, i in enc.items()},
            "merges": [tuple(bytes(u2b[c] for c in t) for t in ln.split(" ")) for ln in body],
            "header": header}


def drive_tok_load(fn, vocab, merges):
    """GPT-2-format texts written here; fn(vocab_json, merges_txt) -> (vocab, merges)."""
    import json
    b2u = gpt2_byte_map()
    spell = lambda b: "".join(b2u[x] for x in b)   # noqa: E731
    vocab_json = json.dumps({spell(b): i for i, b in vocab.items()}, ensure_ascii=False)
    merges_txt = "#version: 0.2\n" + "".join(f"{spell(a)} {spell(b)}\n" for a, b in merges)
    v, m = fn(vocab_json, merges_txt)
    return {"vocab": dict(v), "merges": [tuple(p) for p in m]}


DRIVERS = {"b2u": drive_b2u, "tok_save": drive_tok_save, "tok_load": drive_tok_load,
           "optimizer": drive_optimizer, "clip": drive_clip, "schedule": drive_schedule,
           "save": drive_save, "load": drive_load, "evaluate": drive_evaluate,
           "batch": drive_batch, "flash_backward": drive_flash_backward}
