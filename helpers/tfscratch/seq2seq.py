"""The synthetic translation task of notebook 07 and the helpers to train on it.

Task: rewrite a date written in one of three human formats into ISO 8601,

    "15 mar 2024"      ->  "2024-03-15"
    "mar 15 , 2024"    ->  "2024-03-15"
    "15 / 03 / 2024"   ->  "2024-03-15"       (tokens: 1 5 / 0 3 / 2 0 2 4)

one token per digit, month word or separator. The alignment is not the identity: the year
comes last in the source and first in the target, the day and month swap places, a month
word becomes two digits, a one-digit day gains a leading zero. Everything is generated in
code from a seed; the held-out dates never occur in the training set, in any format.
"""
from __future__ import annotations

import datetime as _dt
import os
import random
import time
from dataclasses import dataclass, field

import torch

__all__ = [
    "PAD", "BOS", "EOS", "VOCAB", "STOI", "MONTHS", "FORMATS", "MODEL_CONFIG", "TRAIN_CONFIG",
    "LABEL_SMOOTHING",
    "DateTask", "make_task", "format_date", "format_of", "alignment",
    "encode", "decode_ids", "pad_batch", "noam_lr", "make_optimizer", "train",
    "exact_match", "save_model", "load_model", "save_checkpoint", "load_checkpoint", "TrainResult",
]

PAD, BOS, EOS = 0, 1, 2
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
VOCAB = ["<pad>", "<s>", "</s>"] + [str(d) for d in range(10)] + ["-", "/", ","] + MONTHS
STOI = {t: i for i, t in enumerate(VOCAB)}
FORMATS = ("d mon yyyy", "mon d , yyyy", "dd / mm / yyyy")

# The model and training settings of the notebook and of tools/bench_transformer.py.
MODEL_CONFIG = dict(src_vocab=len(VOCAB), tgt_vocab=len(VOCAB), d_model=64, n_heads=4,
                    n_layers=2, d_ff=128, dropout=0.0, max_len=64, pad_id=PAD)
TRAIN_CONFIG = dict(steps=450, batch_size=128, warmup=100, factor=0.2)
LABEL_SMOOTHING = 0.1  # notebook 07 trains with label smoothing, as the paper does


def format_date(date: _dt.date, fmt: str) -> tuple[list[str], list[str]]:
    """(source tokens, target tokens) for one date written in format `fmt`."""
    day, mon = str(date.day), MONTHS[date.month - 1]
    year = list(f"{date.year:04d}")
    if fmt == "d mon yyyy":
        src = list(day) + [mon] + year
    elif fmt == "mon d , yyyy":
        src = [mon] + list(day) + [","] + year
    elif fmt == "dd / mm / yyyy":
        src = list(f"{date.day:02d}") + ["/"] + list(f"{date.month:02d}") + ["/"] + year
    else:
        raise ValueError(f"unknown format {fmt!r}; choose one of {FORMATS}")
    tgt = year + ["-"] + list(f"{date.month:02d}") + ["-"] + list(f"{date.day:02d}")
    return src, tgt


def format_of(src_text: str) -> str:
    """Which of FORMATS a source string ("15 mar 2 0 2 4"-style, tokens separated by spaces) uses."""
    toks = src_text.split()
    if "/" in toks:
        return FORMATS[2]
    return FORMATS[1] if toks[0] in MONTHS else FORMATS[0]


def alignment(src_tokens) -> list[list[int]]:
    """For each of the 11 target labels (yyyy-mm-dd and EOS), the source positions that hold
    its information: a year digit its digit, a month digit the month word or digit, a day digit
    its digit (a leading zero that the source lacks: none); separators and EOS: none."""
    toks = list(src_tokens)
    fmt = format_of(" ".join(toks))
    n = len(toks)
    year = [[n - 4 + k] for k in range(4)]  # the last four tokens of the raw source
    if fmt == FORMATS[2]:  # dd / mm / yyyy
        month, day = [[3], [4]], [[0], [1]]
    else:
        mon = [i for i, t in enumerate(toks) if t in MONTHS][0]
        month = [[mon], [mon]]
        digits = list(range(0, mon)) if fmt == FORMATS[0] else list(range(1, toks.index(",")))
        day = [[digits[0]], [digits[1]]] if len(digits) == 2 else [[], [digits[0]]]
    return year + [[]] + month + [[]] + day + [[]]


def encode(tokens, bos_eos=False) -> list[int]:
    ids = [STOI[t] for t in tokens]
    return [BOS] + ids + [EOS] if bos_eos else ids


def decode_ids(ids, strip=True) -> list[str]:
    """Token ids -> token strings; with strip, drop BOS/PAD and stop at the first EOS."""
    out = []
    for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
        if strip and i == EOS:
            break
        if strip and i in (PAD, BOS):
            continue
        out.append(VOCAB[i])
    return out


def pad_batch(seqs, pad_id=PAD) -> torch.Tensor:
    """A list of id lists -> (B, L_max) LongTensor, right-padded with pad_id."""
    L = max(len(s) for s in seqs)
    out = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


@dataclass
class DateTask:
    """Token tensors of one split: src (N, Ls) padded, tgt (N, Lt) = BOS .. EOS (padded)."""
    src: torch.Tensor
    tgt: torch.Tensor
    text: list = field(repr=False)  # (source string, target string) pairs, for printing

    def __len__(self):
        return self.src.size(0)

    def batch(self, idx):
        src, tgt = self.src[idx], self.tgt[idx]
        ls = int((src != PAD).sum(1).max())  # trim columns that are padding in every row
        lt = int((tgt != PAD).sum(1).max())
        return src[:, :ls], tgt[:, :lt]


def make_task(n_train=20000, n_test=1000, seed=0, first_year=1900, last_year=2099):
    """Train and held-out splits. Dates are drawn without replacement and split first, so no
    held-out date appears in training under any format; each example picks a random format."""
    rng = random.Random(seed)
    start = _dt.date(first_year, 1, 1).toordinal()
    n_days = _dt.date(last_year, 12, 31).toordinal() - start + 1
    days = rng.sample(range(n_days), n_test + min(n_train, n_days - n_test))
    test_days, train_days = days[:n_test], days[n_test:]
    splits = []
    for ds, n in ((train_days, n_train), (test_days, n_test)):
        srcs, tgts, text = [], [], []
        for i in range(n):
            date = _dt.date.fromordinal(start + ds[i % len(ds)])
            s, t = format_date(date, rng.choice(FORMATS))
            srcs.append(encode(s) + [EOS])  # the source ends with EOS too: an anchor
            tgts.append(encode(t, bos_eos=True))
            text.append((" ".join(s), " ".join(t)))
        splits.append(DateTask(pad_batch(srcs), pad_batch(tgts), text))
    return splits[0], splits[1]


# --------------------------------------------------------------------------- training
def noam_lr(step, d_model, warmup=400, factor=1.0):
    """The learning rate of 'Attention Is All You Need' (section 5.3):
    factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1.
    It rises linearly for `warmup` steps, then decays as 1/sqrt(step)."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def make_optimizer(model, d_model, warmup=400, factor=1.0):
    """Adam with the paper's betas and eps, driven by the warm-up schedule."""
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: noam_lr(i + 1, d_model, warmup, factor))  # LambdaLR counts from 0
    return opt, sched


@dataclass
class TrainResult:
    losses: list
    lrs: list
    seconds: float
    steps: int
    val_steps: list = field(default_factory=list)   # steps (1-based) at which val_losses were taken
    val_losses: list = field(default_factory=list)  # mean loss on the held-out batch, eval mode


def _autograding() -> bool:
    return bool(os.environ.get("NBGRADER_EXECUTION"))


@torch.no_grad()
def held_out_loss(model, loss_fn, src, tgt) -> float:
    """loss_fn on a fixed held-out batch, in eval mode (no dropout) and without gradients;
    the model's train/eval mode is restored afterwards."""
    was = model.training
    model.eval()
    try:
        return float(loss_fn(model, src, tgt))
    finally:
        model.train(was)


def train(model, data: DateTask, loss_fn, steps=1000, batch_size=128, warmup=400, factor=1.0,
          seed=0, progress=None, time_limit=None, clip=1.0, val_data: DateTask | None = None,
          val_every=25, val_size=500):
    """Train `model` with `loss_fn(model, src, tgt)` on random batches of `data`.

    Adam + the warm-up schedule, gradient clipping at `clip`. Shows a tqdm progress bar when
    `progress` is true (default: yes, except under autograde, where NBGRADER_EXECUTION is
    set). With `val_data`, the loss on its first `val_size` pairs is measured every `val_every`
    steps and after the last one. Stops early after `time_limit` seconds if one is given.
    Returns a TrainResult with the loss and learning rate of every step and the held-out
    losses."""
    if progress is None:
        progress = not _autograding()
    d_model = getattr(model, "d_model", None) or model.src_embed.weight.size(1)
    opt, sched = make_optimizer(model, d_model, warmup, factor)
    gen = torch.Generator().manual_seed(seed)
    losses, lrs = [], []
    val_steps, val_losses = [], []
    val_batch = val_data.batch(torch.arange(min(val_size, len(val_data)))) if val_data else None
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(bar, desc="training", unit="step", mininterval=0.5)
    model.train()
    t0 = time.perf_counter()
    for step in bar:
        idx = torch.randint(len(data), (batch_size,), generator=gen)
        src, tgt = data.batch(idx)
        loss = loss_fn(model, src, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(loss.item())
        out_of_time = time_limit is not None and time.perf_counter() - t0 > time_limit
        if val_batch is not None and ((step + 1) % val_every == 0 or step + 1 == steps
                                      or out_of_time):
            val_steps.append(step + 1)
            val_losses.append(held_out_loss(model, loss_fn, *val_batch))
        if progress and step % 20 == 0:
            post = {"loss": f"{losses[-1]:.3f}"}
            if val_losses:
                post["held-out"] = f"{val_losses[-1]:.3f}"
            bar.set_postfix(post)
        if out_of_time:
            break
    if progress:
        bar.close()
    model.eval()
    return TrainResult(losses, lrs, time.perf_counter() - t0, len(losses), val_steps, val_losses)


@torch.no_grad()
def exact_match(model, data: DateTask, decode_fn, batch_size=500, **kw):
    """Fraction of examples whose decoded output equals the target exactly (EOS included),
    and the decoded tensors. decode_fn(model, src, max_len, bos_id, eos_id, **kw)."""
    model.eval()
    hits, outs = 0, []
    for i in range(0, len(data), batch_size):
        idx = torch.arange(i, min(i + batch_size, len(data)))
        src, tgt = data.batch(idx)
        out = decode_fn(model, src, tgt.size(1), BOS, EOS, **kw)
        outs.append(out)
        for o, t in zip(out.tolist(), tgt.tolist()):
            hits += _strip(o) == _strip(t)
    return hits / len(data), outs


def _strip(ids):
    """Ids up to and including the first EOS (what a decoder is judged on)."""
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


# --------------------------------------------------------------------------- checkpoints
# 07's own format (weights and constructor arguments); named save_model/load_model since 12's
# exercises (exported as tfscratch.reference.save_checkpoint) took the checkpoint names. The old
# names stay as aliases, so 07's source reads as before.
def save_model(path, model, config: dict, **extra):
    """Save the weights with the constructor arguments needed to rebuild the model."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({"config": dict(config), "state_dict": model.state_dict(), **extra}, path)


def load_model(path, model_cls):
    """Rebuild `model_cls(**config)`, load the weights, return (model in eval mode, checkpoint)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = model_cls(**ckpt["config"])
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt


save_checkpoint, load_checkpoint = save_model, load_model
