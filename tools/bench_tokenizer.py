"""Benchmark of notebook 11 (issue 30): the reference `train_bpe` (pure Python, incremental pair
counts) against Hugging Face `tokenizers`' BPE trainer (Rust) on the same generated corpus, in
the same run; then `Tokenizer.encode` throughput against `tokenizers`' encoder built from the
same vocabulary and merges.

    .venv/bin/python tools/bench_tokenizer.py [--mb 5] [--vocab 10000]

The corpus is generated, seeded: the course's English and Chinese samples, and words drawn
from a Zipf law over pseudo-words (letters, digits, punctuation, some CJK), so that it has the
long tail of real text (never downloaded). Peak memory is the growth of the process's peak
resident set (ru_maxrss) during each trainer, ours first (tracemalloc would slow ours 5x).
Exit status 0 when ours stays within 50x of the Rust trainer's time (the issue's goal).
"""
from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

from tfscratch import corpus
from tfscratch.reference import Tokenizer, train_bpe

LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


def make_corpus(mb: float, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = []
    for _ in range(30000):   # a vocabulary of pseudo-words with a realistic length spread
        n = max(1, int(rng.expovariate(1 / 5)))
        words.append("".join(rng.choice(LETTERS) for _ in range(n)))
    words += [str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(3000)]
    words += ["".join(chr(0x4E00 + rng.randrange(3000)) for _ in range(rng.randint(1, 3))) for _ in range(3000)]
    weights = [1 / (r + 1) for r in range(len(words))]
    parts = [corpus.sample("english"), corpus.sample("chinese")]
    size = sum(len(p.encode()) for p in parts)
    while size < mb * 2 ** 20:
        line = " ".join(rng.choices(words, weights, k=12)) + rng.choice([".", ",", "!", "?", ";"]) + "\n"
        parts.append(line)
        size += len(line.encode())
    return "".join(parts)


def ours(text: str, vocab_size: int):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    vocab, merges = train_bpe(text, vocab_size, special_tokens=["<|endoftext|>"])
    secs = time.perf_counter() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return vocab, merges, secs, grown


def rust(text: str, vocab_size: int):
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, trainers
    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    secs = time.perf_counter() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return tok, secs, grown


def encode_speed(vocab, merges, text: str):
    """MB/s of ours and of tokenizers' encoder built from the same vocab and merges (the
    comparison test's own builder, tests/test_tokenizer_hf.hf_from)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_tokenizer_hf import hf_from
    hf = hf_from(vocab, merges)
    mb = len(text.encode()) / 2 ** 20
    tok = Tokenizer(vocab, merges, special_tokens=["<|endoftext|>"])
    t0 = time.perf_counter()
    ids = tok.encode(text)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf_ids = hf.encode(text).ids
    t_hf = time.perf_counter() - t0
    return mb / t_ours, mb / t_hf, ids == hf_ids, len(text.encode()) / len(ids)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=5.0)
    ap.add_argument("--vocab", type=int, default=10000)
    a = ap.parse_args()
    text = make_corpus(a.mb)
    mb = len(text.encode()) / 2 ** 20
    vocab, merges, t_ours, peak = ours(text, a.vocab)
    _, t_rust, grown = rust(text, a.vocab)
    speed, speed_hf, same, bpt = encode_speed(vocab, merges, text[: 2 ** 20])
    ratio = t_ours / t_rust
    print(f"corpus {mb:.2f} MB, vocabulary {a.vocab}: {len(merges)} merges")
    print(f"train_bpe (ours, Python): {t_ours:.1f} s, resident growth {peak / 2**20:.0f} MiB")
    print(f"tokenizers BpeTrainer (Rust): {t_rust:.2f} s, resident growth {grown / 2**20:.0f} MiB")
    print(f"ratio ours / Rust: {ratio:.1f}x (goal <= 50x)")
    print(f"encode, 1 MB: ours {speed:.2f} MB/s, tokenizers {speed_hf:.2f} MB/s; same ids: {same}; "
          f"{bpt:.2f} bytes per token")
    return 0 if ratio <= 50 else 1


if __name__ == "__main__":
    sys.exit(main())
