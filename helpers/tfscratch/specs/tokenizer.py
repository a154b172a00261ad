"""11_tokenizer: what the grader runs on the student's `train_bpe` and `Tokenizer`, on texts
drawn for each grading run.

`train_bpe` is judged on its whole result: every entry of the vocabulary and every merge, in
order, and how many of each (`sizes=True`), on small corpora (the textbook example, random
English-like text whose frequent pairs straddle pre-token boundaries, corpora full of ties,
documents joined by special tokens, mixed Chinese, English and emoji). The reference it is
compared with is the course's trainer; the diagnoses replay a brute-force merge loop written
here (`bpe`: a fresh count of every pair before each merge), right and in each known wrong way,
and name the one the student's merges follow.

`Tokenizer` is built from a vocabulary and merges that this module's brute-force trainer learns
on a seeded corpus (so a student's `train_bpe` never decides the `Tokenizer` grade), and judged
on `encode` ids, `decode` text (partial UTF-8 sequences included), round trips on random Unicode
(Chinese, emoji, combining marks, whitespace runs), special tokens (overlapping ones: longest
first) and `encode_iterable` on random cuts of a text and on a stream that refuses to be read
far ahead (the `$chunks` stream of the probe machine: lazy code yields its first ids after a
few chunks).
"""
import random
from collections import Counter
from functools import lru_cache

import numpy as np
import regex
import torch

from . import vm
from .engine import Exercise, Probe, call, ctor, given, grades, prev, variants, when

ASSIGNMENT = "11_tokenizer"

PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPLIT = regex.compile(PATTERN)
EOT = "<|endoftext|>"


# -- the brute-force reference: a fresh count before every merge ------------------------------

def _pieces(text, specials, mode="split"):
    if not specials or mode == "text":
        return [text]
    if mode == "space":                # each special token replaced by a space
        for t in specials:
            text = text.replace(t, " ")
        return [text]
    if mode == "noescape":             # the tokens used as a regular expression: `|` means "or"
        return [p for p in regex.split("|".join(specials), text) if p is not None]
    parts = regex.split("|".join(regex.escape(t) for t in specials), text)
    return ["".join(parts)] if mode == "join" else parts


def bpe(text, vocab_size, specials=(), across=False, tie="max", mode="split", pretok="gpt2",
        specials_last=False, size_without_specials=False):
    """(vocab, merges) by a fresh count of every pair before each merge; the keyword arguments
    replay known mistakes (counting across pre-tokens, another tie rule, special tokens trained
    on as text or removed and joined, str.split pre-tokens, special ids after the merges)."""
    pieces = _pieces(text, specials, mode)
    if across:
        words = Counter(p for p in pieces if p)
    elif pretok == "split":
        words = Counter(w for p in pieces for w in p.split())
    else:
        words = Counter(w for p in pieces for w in SPLIT.findall(p))
    seqs = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
    n_special = 0 if size_without_specials else len(specials)
    merges = []
    while 256 + n_special + len(merges) < vocab_size:
        pairs = Counter()
        order = {}
        for w, c in words.items():
            s = seqs[w]
            for p in zip(s, s[1:]):
                pairs[p] += c
                order.setdefault(p, len(order))
        if not pairs:
            break
        if tie == "max":
            best = max(pairs, key=lambda p: (pairs[p], p))
        elif tie == "min":
            top = max(pairs.values())
            best = min(p for p in pairs if pairs[p] == top)
        else:  # first seen
            best = max(pairs, key=lambda p: (pairs[p], -order[p]))
        merges.append(best)
        for w in seqs:
            seqs[w] = _merge(seqs[w], best)
    vocab = {i: bytes([i]) for i in range(256)}
    tail = [a + b for a, b in merges]
    enc = [t.encode("utf-8") for t in specials]
    for b in (tail + enc if specials_last else enc + tail):
        vocab[len(vocab)] = b
    return vocab, merges


def _merge(parts, pair):
    """Every occurrence of `pair`, left to right, without overlaps, made one token (written
    independently of the course's solution, which the grader does not share)."""
    out = list(parts)
    i = 0
    while i < len(out) - 1:
        if (out[i], out[i + 1]) == pair:
            out[i:i + 2] = [out[i] + out[i + 1]]   # the merged token is not paired again here
        i += 1
    return out


def _pair_counts(text, specials, merges):
    """The pair counts (inside pre-tokens) after `merges` were made."""
    words = Counter(w for p in _pieces(text, specials) for w in SPLIT.findall(p))
    seqs = {w: [bytes([b]) for b in w.encode("utf-8")] for w in words}
    for m in merges:
        seqs = {w: _merge(s, m) for w, s in seqs.items()}
    pairs = Counter()
    for w, c in words.items():
        for p in zip(seqs[w], seqs[w][1:]):
            pairs[p] += c
    return pairs


def encode(vocab, merges, specials, text, special_order="longest", pretok=True, rule="rank"):
    """Brute-force encoding (and known wrong ways of doing it) for the diagnoses."""
    ids = {b: i for i, b in sorted(vocab.items(), reverse=True)}
    for t in specials or []:
        if t.encode("utf-8") not in ids:
            ids[t.encode("utf-8")] = len(ids)
    ranks = {p: r for r, p in enumerate(merges)}
    specials = list(specials or [])
    if special_order == "longest":
        specials = sorted(specials, key=len, reverse=True)
    elif special_order == "shortest":
        specials = sorted(specials, key=len)
    pieces = (regex.split("(" + "|".join(regex.escape(t) for t in specials) + ")", text)
              if specials and special_order != "none" else [text])
    out = []
    for k, piece in enumerate(pieces):
        if k % 2:
            out.append(ids[piece.encode("utf-8")])
            continue
        for w in (SPLIT.findall(piece) if pretok else ([piece] if piece else [])):
            parts = [bytes([b]) for b in w.encode("utf-8")]
            while len(parts) > 1:
                found = [(ranks[p], i, p) for i, p in enumerate(zip(parts, parts[1:])) if p in ranks]
                if not found:
                    break
                best = min(found)[2] if rule == "rank" else min(found, key=lambda f: f[1])[2]
                parts = _merge(parts, best)
            out.extend(ids[p] for p in parts)
    return out


# -- inputs -----------------------------------------------------------------------------------

TOY = ("low low low low low lower lower widest widest widest newest newest newest newest newest "
       "newest")
WORDS = ("the of and to in is was that it he for as with his on be at by had not are but from "
         "nation dedicated great war people here we can they have men dead living shall "
         "summer fair love time eternal lines truth wisdom darkness light earth face waters "
         "don't it's we'll they're I've hahaha").split()
ZH = ("床前明月光 疑是地上霜 举头望明月 低头思故乡 春眠不觉晓 处处闻啼鸟 学而时习之 不亦说乎 "
      "有朋自远方来 温故而知新 道可道 非常道 千里之行 始于足下 上善若水").split()
EMOJI = ["🙂", "🚀", "👍🏽", "🇨🇳", "❤️"]


def _rng(g) -> random.Random:
    return random.Random(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))


def _english(r, n):
    """n words, Zipf-like frequencies, with punctuation, numbers and line breaks."""
    weights = [1 / (k + 1) for k in range(len(WORDS))]
    out = []
    for i in range(n):
        w = r.choices(WORDS, weights)[0]
        if i and r.random() < 0.08:
            out.append(r.choice([",", ".", ";", "!", "?"]))
        if r.random() < 0.04:
            w = str(r.randint(0, 99999))
        x = r.random()
        out.append((" " if out and x < 0.9 else "\n" if x < 0.96 else "\n    ") + w)
    return "".join(out).lstrip()


def _mixed(r, n):
    parts = []
    for _ in range(n):
        x = r.random()
        if x < 0.45:
            parts.append(_english(r, r.randint(3, 10)))
        elif x < 0.85:
            parts.append("".join(r.choice(ZH)[: r.randint(2, 5)] for _ in range(r.randint(1, 3))) + r.choice("，。！？"))
        else:
            parts.append(r.choice(EMOJI) * r.randint(1, 3))
    return " ".join(parts)


def _ties(r):
    """Words made of random letters (Latin and accented), each occurring exactly twice: most
    pairs tie, and multi-byte letters make the byte order matter."""
    letters = "abcdefghijéüçñ"
    words = {"".join(r.choice(letters) for _ in range(r.randint(2, 6))) for _ in range(40)}
    words = sorted(words)
    r.shuffle(words)
    return " ".join(words + words[::-1])


def _docs(r, n_docs):
    docs = ["once " + _english(r, r.randint(8, 30)) + " the end" for _ in range(n_docs)]
    text = EOT.join(docs)
    # a special token glued between two words, and a second special token
    return text + EOT + "dog" + EOT + "cat" + "<pad>" + "the" + EOT + EOT + " end"


def _tricky_docs(r, n_docs):
    """Documents whose ordinary text holds what a special token is made of: `<`, `|`, `>`, the
    words `endoftext` and `pad`, a broken `<|endoftext`: only an escaped split keeps them."""
    bits = ["a<b", "x | y", "<html>", "endoftext", "pad", "padding", "||", "<|endoftext", "pad>", "->"]
    docs = [" ".join(r.choice(bits) if r.random() < 0.3 else w for w in _english(r, r.randint(8, 20)).split(" "))
            for _ in range(n_docs)]
    return EOT.join(docs) + "<pad>" + "the end <pad>"


def _code(r, n_lines):
    """Python-like lines: indentation runs of 4 and 8 spaces, blank lines, a few tabs."""
    out = []
    for _ in range(n_lines):
        x = r.random()
        indent = "" if x < 0.2 else "    " if x < 0.6 else "        " if x < 0.95 else "\t"
        out.append(indent + " ".join(r.choice(WORDS[:25]) for _ in range(r.randint(1, 5))) + r.choice(["", ":", "()", ","]))
        if r.random() < 0.25:
            out.append("")
    return "\n".join(out) + "\n"


def _whitespace_cuts(what):
    """Code cut at random places and inside whitespace runs (between two spaces, two newlines)."""
    def build(g):
        r = _rng(g)
        s = _code(r, 40)
        inside = [i for i in range(1, len(s)) if s[i - 1].isspace() and s[i].isspace()]
        cuts = sorted(set(r.sample(inside, min(len(inside), 12)) + r.sample(range(1, len(s)), 8)))
        return [s[a:b] for a, b in zip([0] + cuts, cuts + [len(s)])]
    return given(build, what)


@lru_cache(maxsize=16)
def _trained_code(seed: int, vocab_size: int, specials: tuple):
    r = random.Random(seed)
    return bpe(_code(r, 200) + EOT + _code(r, 100), vocab_size, specials)


def _text(fn, what):
    return given(lambda g: fn(_rng(g)), what)


def _unicode(r, n):
    """Random Unicode: ASCII, whitespace runs, accents, Greek, Chinese, Hangul, Arabic,
    combining marks, emoji; no surrogates."""
    ranges = [(0x20, 0x7E, 6), (0x4E00, 0x9FFF, 4), (0x1F300, 0x1F64F, 2), (0xC0, 0x17F, 2),
              (0x391, 0x3C9, 1), (0xAC00, 0xD7A3, 1), (0x621, 0x64A, 1), (0x300, 0x36F, 1),
              (0x3000, 0x303F, 1)]
    out = []
    for _ in range(n):
        if r.random() < 0.08:
            out.append(r.choice([" ", "  ", "\n", "\t", " \n ", "\r\n"]))
            continue
        lo, hi, _w = r.choices(ranges, [w for *_, w in ranges])[0]
        out.append(chr(r.randint(lo, hi)))
    return "".join(out)


@lru_cache(maxsize=16)
def _trained(seed: int, vocab_size: int, specials: tuple):
    r = random.Random(seed)
    text = _mixed(r, 60) + EOT + _english(r, 300) + EOT + _mixed(r, 40)
    return bpe(text, vocab_size, specials)


def _vocab(vocab_size, specials=(EOT,)):
    """The vocabulary this module's brute-force trainer learns on a corpus drawn for the probe
    (the same corpus for `_merges` of the same probe: keyed by the probe's seed)."""
    return given(lambda g: _trained(g.initial_seed(), vocab_size, tuple(specials))[0],
                 f"a vocabulary of {vocab_size} trained on a random corpus")


def _merges(vocab_size, specials=(EOT,)):
    return given(lambda g: _trained(g.initial_seed(), vocab_size, tuple(specials))[1],
                 "its merges")


def _cuts(text_fn, what, single=False):
    def build(g):
        r = _rng(g)
        s = text_fn(r)
        if single:
            return list(s)
        cuts = sorted(r.sample(range(1, len(s)), min(len(s) - 1, r.randint(5, 30))))
        return [s[a:b] for a, b in zip([0] + cuts, cuts + [len(s)])]
    return given(build, what)


# The bound the notebook states for encode_iterable: its first ids come before it has read 16 KB
# (16,384 characters) of the stream. The probe's chunks are about 1 KB, and it may read 20 of
# them: a buffer of up to 16 KB plus one chunk passes, a reader of the whole stream does not.
STREAM_BOUND = 16_384


def _stream(n_chunks, limit):
    def build(g):
        r = _rng(g)
        chunks = []
        for _ in range(n_chunks):
            lines = []
            while sum(map(len, lines)) < 1000:
                lines.append(_english(r, r.randint(12, 20)).replace("\n", " ") + "\n")
            chunks.append("".join(lines))
        return {"$chunks": chunks, "limit": limit}
    return given(build, f"a stream of {n_chunks} chunks of about 1 KB that may be read {limit} chunks "
                        f"ahead (the notebook's bound: first ids before {STREAM_BOUND:,} characters)")


def _partial_ids(g):
    """Byte ids that end in, start in and skip parts of multi-byte characters."""
    r = _rng(g)
    zh = list(r.choice(ZH).encode("utf-8"))
    emoji = list(r.choice(EMOJI).encode("utf-8"))
    ids = list(b"ok ") + zh[:-1] + list(b" ") + emoji[:2] + list(b"x") + zh[1:] + zh[:2]
    return ids


# -- comparisons and diagnoses ----------------------------------------------------------------

def _show_bytes(key, got, want):
    """Merges and vocabulary entries shown as bytes, not as arrays of numbers."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype == np.uint8 and (got.shape != want.shape or not np.array_equal(got, want)):
        from .engine import label
        where = label(key).replace("output[0]", "vocab").replace("output[1]", "merges")
        return f"{where} is {bytes(got.astype(np.uint8).tolist())!r}, expected {bytes(want.tolist())!r}"
    return "default"


def _show_text(key, got, want):
    """Ids shown from the first difference; decoded text shown as text."""
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype == np.uint8:
        if got.shape == want.shape and np.array_equal(got, want):
            return None
        g = bytes(got.astype(np.uint8).tolist()).decode("utf-8", "replace")
        w = bytes(want.tolist()).decode("utf-8", "replace")
        return f"decode gave {_clip(g)!r}, expected {_clip(w)!r}"
    if want.dtype == np.int64 and want.ndim == 1 and got.ndim == 1:
        if got.shape == want.shape and np.array_equal(got, want):
            return None
        n = min(len(got), len(want))
        k = next((i for i in range(n) if got[i] != want[i]), n)
        return (f"the ids differ from position {k} on (you gave {len(got)} ids, expected "
                f"{len(want)}): got {got[k:k + 8].tolist()}, expected {want[k:k + 8].tolist()}")
    return "default"


def _clip(s, n=60):
    return s if len(s) <= n else s[:n] + "..."


def _got_merges(e, ci):
    out = []
    for i in range(100000):
        a, b = e.got(f"{ci}.out.1.{i}.0"), e.got(f"{ci}.out.1.{i}.1")
        if a is None or b is None:
            return out
        out.append((bytes(np.asarray(a).astype(np.uint8).tolist()), bytes(np.asarray(b).astype(np.uint8).tolist())))
    return out


def _got_vocab(e, ci):
    prefix = f"{e.p.name}.{ci}.out.0."
    out = {}
    for k, v in e._got["caps"].items():
        rest = k[len(prefix):] if k.startswith(prefix) else ""
        if rest.isdigit():
            out[int(rest)] = bytes(np.asarray(v).astype(np.uint8).tolist())
    return out


def _calls(e):
    """[(ci, text, vocab_size, specials)] of the probe's calls."""
    res = []
    for ci in range(len(e.pd["calls"])):
        args, kwargs = e.args(ci)
        text, size = args[0], args[1]
        specials = args[2] if len(args) > 2 else kwargs.get("special_tokens", ())
        res.append((ci, text, size, tuple(specials)))
    return res


def _follows(**mistake):
    """The student's merges equal the brute-force trainer's with this mistake, on every call
    where the mistake gives other merges than the rule."""
    def test(e):
        telling = 0
        for ci, text, size, specials in _calls(e):
            wrong = bpe(text, size, specials, **mistake)[1]
            got = _got_merges(e, ci)
            n = min(len(got), len(wrong))
            if n == 0 or got[:n] != wrong[:n]:
                return False
            right = bpe(text, size, specials)[1]
            telling += wrong[:n] != right[:n]
        return telling > 0
    return test


def _first_wrong_merge(e):
    """(call, index, the student's pair, the right pair, counts) at the first merge that
    differs, or None."""
    for ci, text, size, specials in _calls(e):
        got, right = _got_merges(e, ci), bpe(text, size, specials)[1]
        for i, (g, w) in enumerate(zip(got, right)):
            if g != w:
                return ci, i, g, w, _pair_counts(text, specials, right[:i])
    return None


def _unescaped(e):
    """encode raised a KeyError on a fragment of a special token: the tokens were put into the
    regular expression as they are, and `|` split them into their pieces."""
    if "KeyError" not in e.error:
        return False
    vocab, merges, specials = _made(e)
    return any(frag and repr(frag.encode("utf-8")) in e.error
               for t in specials or [] for frag in regex.split(r"[|.*+?()\[\]{}^$\\]", t))


def _tie(e):
    found = _first_wrong_merge(e)
    if not found:
        return False
    ci, i, g, w, counts = found
    return counts.get(g, -1) == counts[w]


def _drift(e):
    found = _first_wrong_merge(e)
    return bool(found) and found[1] > 0


def _specials_after_merges(e):
    for ci, text, size, specials in _calls(e):
        v = _got_vocab(e, ci)
        if specials and v and v.get(256) != specials[0].encode() and \
                v.get(max(v) - len(specials) + 1) == specials[0].encode():
            return True
    return False


def _size_off(e, without_specials):
    for ci, text, size, specials in _calls(e):
        v = _got_vocab(e, ci)
        if not v:
            continue
        right = len(bpe(text, size, specials)[0])
        if without_specials and specials and len(v) == right + len(specials):
            return True
        if not without_specials and abs(len(v) - right) == 1:
            return True
    return False


def _str_tokens(e):
    return any(str(v) == "str" for k, v in e._got["meta"].items() if ".out.0." in k or ".out.1." in k)


TRAIN_DIAGNOSES = [
    when("your vocabulary or merges hold str, not bytes: byte-level BPE works on UTF-8 bytes "
         "(`tok.encode('utf-8')`, `bytes([b])`), so that every string, Chinese and emoji included, "
         "can be spelled with the 256 single bytes.", _str_tokens),
    when("the special tokens are numbered after the merges: ids 0-255 are the bytes, then the "
         "special tokens in the order given, then one id per merge.", _specials_after_merges),
    when("the special tokens were not counted in vocab_size: the vocabulary ends up "
         "len(special_tokens) entries too large. Stop when len(vocab) == vocab_size, with the "
         "bytes and the special tokens already in it.", lambda e: _size_off(e, True)),
    when("you counted pairs across pre-token boundaries (BPE on the raw text): merges such as "
         "(b'e', b' ') glue the end of one word to the next. Split the text with `pretokenize` "
         "first and count pairs inside each pre-token only.", _follows(across=True)),
    when("the special tokens were trained on as ordinary text: their pieces (`<|`, `endoftext`) "
         "were counted and merged. Split the text on the special tokens first and train on the "
         "pieces between them.", _follows(mode="text")),
    when("the special tokens were put into the regular expression without regex.escape: in "
         "`<|endoftext|>` the `|` means 'or', so the split cut at every `<`, `>` and `endoftext` of "
         "the ordinary text too. Build the pattern from regex.escape(t) for each special token.",
         _follows(mode="noescape")),
    when("you replaced each special token by a space: the pieces around it were glued into one "
         "text, so pre-tokens and pairs were counted across the special token (and a space was "
         "added that is not in the text). Split the text on the special tokens instead and "
         "pre-tokenize each piece on its own.", _follows(mode="space")),
    when("you removed the special tokens but joined the pieces around them, so pairs were counted "
         "across a special token (`dog<|endoftext|>cat` became `dogcat`). Split on the special "
         "tokens and pre-tokenize each piece on its own.", _follows(mode="join")),
    when("you pre-tokenized with str.split() (whitespace) instead of GPT-2's pattern: use "
         "`pretokenize` (regex.findall with the GPT-2 pattern), which keeps the space with the "
         "next word and separates punctuation and numbers.", _follows(pretok="split")),
    when("ties between equally frequent pairs were broken by the smallest pair: the rule takes "
         "the lexicographically GREATEST (bytes, bytes) pair: max(pairs, key=lambda p: (pairs[p], p)).",
         _follows(tie="min")),
    when("ties between equally frequent pairs were broken by which pair was seen first "
         "(Counter.most_common or max over the counts alone): among equal counts take the "
         "lexicographically greatest (bytes, bytes) pair: max(pairs, key=lambda p: (pairs[p], p)).",
         _follows(tie="first")),
    when(lambda e: (lambda f: f"merge {f[1]} is {f[2]!r}, but {f[3]!r} has the same count ({f[4][f[3]]}) "
                    "and wins the tie: among equally frequent pairs take the lexicographically "
                    "greatest (bytes, bytes) pair, comparing the byte strings, not ids or str.")(_first_wrong_merge(e)),
         _tie),
    when("one more or one fewer merge than asked: stop exactly when len(vocab) == vocab_size (or "
         "when no pair is left).", lambda e: _size_off(e, False)),
    when(lambda e: (lambda f: f"your first {f[1]} merges are right, then the counts drift: merge "
                    f"{f[1]} is {f[2]!r} (count {f[4].get(f[2], 0)} after the earlier merges), "
                    f"expected {f[3]!r} (count {f[4][f[3]]}). After a merge, update every pre-token "
                    "that holds the pair: subtract the counts of ALL its old pairs, merge every "
                    "occurrence left to right (in 'aaaa', (a, a) occurs twice, not three times), "
                    "add the counts of its new pairs.")(_first_wrong_merge(e)),
         _drift),
]


def _made(e):
    """(vocab, merges, special_tokens) the probe's Tokenizer was built with."""
    mk = e.pd["make"]
    ctx = vm._Ctx(e.tensors, {})
    args = ctx.value(mk.get("args", []))
    kwargs = ctx.value(mk.get("kwargs", {}))
    specials = args[2] if len(args) > 2 else kwargs.get("special_tokens")
    return args[0], args[1], specials


def _ids(e, ci):
    g = e.out(ci)
    return None if g is None or np.asarray(g).dtype.kind not in "iu" else np.asarray(g).tolist()


def _text_out(e, ci):
    g = e.out(ci)
    return None if g is None else bytes(np.asarray(g).astype(np.uint8).tolist()).decode("utf-8", "replace")


def _encodes_like(**mistake):
    """The student's encode ids equal the brute-force encoder's with this mistake on every
    `encode` call, and differ from the right ids on one."""
    def test(e):
        vocab, merges, specials = _made(e)
        telling = n = 0
        for ci, c in enumerate(e.pd["calls"]):
            if c.get("method") != "encode":
                continue
            got = _ids(e, ci)
            text = e.args(ci)[0][0]
            wrong = encode(vocab, merges, specials, text, **mistake)
            if got != wrong:
                return False
            n += 1
            telling += wrong != encode(vocab, merges, specials, text)
        return n > 0 and telling > 0
    return test


def _decoded_per_token(e):
    vocab, merges, specials = _made(e)
    for ci, c in enumerate(e.pd["calls"]):
        if c.get("method") != "decode":
            continue
        g = _text_out(e, ci)
        w = e.want_out(ci)
        w = None if w is None else bytes(np.asarray(w).tolist()).decode("utf-8")
        if g is not None and w is not None and g != w and g.count("\ufffd") > w.count("\ufffd"):
            return True
    return False


def _decoded_without_replace(e):
    for ci, c in enumerate(e.pd["calls"]):
        g, w = _text_out(e, ci), e.want_out(ci)
        if c.get("method") == "decode" and g is not None and w is not None:
            w = bytes(np.asarray(w).tolist()).decode("utf-8")
            if "\ufffd" in w and g == w.replace("\ufffd", ""):
                return True
    return False


def _per_chunk(e):
    vocab, merges, specials = _made(e)
    telling = 0
    for ci, c in enumerate(e.pd["calls"]):
        if c.get("method") != "encode_iterable" or not isinstance(e.args(ci)[0][0], list):
            continue
        chunks = e.args(ci)[0][0]
        wrong = [i for ch in chunks for i in encode(vocab, merges, specials, ch)]
        if _ids(e, ci) != wrong:
            return False
        telling += wrong != encode(vocab, merges, specials, "".join(chunks))
    return telling > 0


def _lost_tail(e):
    for ci, c in enumerate(e.pd["calls"]):
        g, w = _ids(e, ci), e.want_out(ci)
        if c.get("method") == "encode_iterable" and g is not None and w is not None:
            w = np.asarray(w).tolist()
            if len(g) < len(w) and w[:len(g)] == g:
                return True
    return False


TOKENIZER_DIAGNOSES = [
    when("the special tokens were put into the regular expression without regex.escape: in "
         "`<|endoftext|>` the `|` means 'or', so the text was split at `<`, `endoftext` and `>` and "
         "their pieces looked up as tokens. Build the alternation from regex.escape(t).", _unescaped),
    when("decode crashed on bytes that end in the middle of a character (a model can generate "
         "half a Chinese character or emoji): join the bytes, then "
         "`.decode('utf-8', errors='replace')`.", lambda e: "UnicodeDecodeError" in e.error),
    when(f"encode_iterable read more than the notebook's bound ({STREAM_BOUND:,} characters) before "
         "yielding its first ids, as if it read the whole stream first: make it a generator "
         "that keeps a bounded buffer, yields the ids of what can no longer change, and reads on "
         "(`yield from self.encode(buffer[:cut])`).", lambda e: "StreamReadTooFar" in e.error),
    *variants(_encodes_like, [
        ({"special_order": "none"},
         "the special tokens were encoded as ordinary text (split into bytes and merged): cut them "
         "out first (regex.split with a capturing group) and give each its own id."),
        ({"special_order": "shortest"},
         "overlapping special tokens were matched shortest first: `<|endoftext|><|endoftext|>` "
         "must be one token when it is a special token. Sort the special tokens by length, "
         "longest first, before building the alternation."),
        ({"pretok": False},
         "merges were applied across pre-token boundaries (to the whole text at once): "
         "pre-tokenize each piece with `pretokenize` and merge inside each pre-token."),
        ({"rule": "left"},
         "you applied the leftmost mergeable pair first; BPE applies the pair with the LOWEST "
         "rank (learned earliest) first, wherever it is, and repeats."),
    ]),
    when("decode lost characters: decoding each token's bytes on its own (or bytes.decode per "
         "id) breaks Chinese characters and emoji that span several tokens. Join all the bytes "
         "first, then decode once with errors='replace'.", _decoded_per_token),
    when("decode dropped the bytes it could not decode (errors='ignore'): use errors='replace', "
         "which writes U+FFFD (\ufffd) for them, so the text keeps its length and shows the break.",
         _decoded_without_replace),
    when("encode_iterable encoded each chunk on its own: a chunk may end in the middle of a word "
         "or a special token. Keep the end of the buffer (the last pre-token, and any suffix "
         "that could start a special token) until the next chunk arrives.", _per_chunk),
    when("encode_iterable lost the end of the text: after the loop over the chunks, encode what "
         "is left in the buffer.", _lost_tail),
    when("encode_iterable gave other ids than encode of the whole text where a chunk ended inside a "
         "run of spaces or newlines: GPT-2's pattern makes a whitespace run one pre-token (and this "
         "vocabulary merges runs of spaces and newlines), so a buffer cut at the last space or "
         "newline splits it. Cut only at the start of the last pre-token, which no later text can "
         "change.", lambda e: e.out(0) is not None, probes=("whitespace",)),
]


# -- GPT-2's file format: bytes_to_unicode, to_gpt2_format, from_gpt2_format -------------------

def _chars(e):
    c = e.out(0, "chars")
    return None if c is None else np.asarray(c).tolist()


def _gpt2_chars():
    from .fixtures import gpt2_byte_map
    m = gpt2_byte_map()
    return [ord(m[b]) for b in range(256)]


_KEEP = [*range(33, 127), *range(161, 173), *range(174, 256)]


def _b2u_like(kind):
    """The student's map follows a known wrong construction (written here)."""
    def test(e):
        got = _chars(e)
        if got is None:
            return False
        if kind == "identity":
            return got == list(range(256))
        if kind == "from_zero":
            extra = [b for b in range(256) if b not in _KEEP]
            return all(got[b] == i for i, b in enumerate(extra)) and all(got[b] == b for b in _KEEP)
        if kind == "plus_byte":
            return all(got[b] == (b if b in _KEEP else 256 + b) for b in range(256))
        if kind == "ends":          # a printable range without its last byte
            wrong = [b for b in range(256) if got[b] != _gpt2_chars()[b]]
            return bool(wrong) and any(got[b] >= 256 for b in (126, 172, 255))
        if kind == "soft_hyphen":   # 0xad kept as printable
            return got[0xAD] == 0xAD
        return False
    return test


B2U_DIAGNOSES = [
    when("the keys must be the byte values 0-255 (ints) and each value one character: you returned "
         "another mapping (the inverse, {str: int}?). bytes_to_unicode() maps byte -> character; "
         "invert it where you read files back.", lambda e: e.out(0, "int_keys") is not None
         and not bool(e.out(0, "int_keys"))),
    *variants(_b2u_like, {
        "identity": "every byte maps to chr(b): then the space is still a space, which breaks "
                    "merges.txt, and control bytes are unprintable. Only the 188 printable bytes "
                    "(! to ~, ¡ to ¬, ® to ÿ) stand for themselves; the other 68 map to chr(256), "
                    "chr(257), ... in byte order ('Ġ' for the space).",
        "from_zero": "the bytes that are not printable got chr(0), chr(1), ...: they must start at "
                     "chr(256) (chr(256 + n), n counting them), beyond every byte value.",
        "plus_byte": "the bytes that are not printable got chr(256 + b): it is chr(256 + n), where n "
                     "counts those bytes (0, 1, 2, ...), so the space (the 33rd) becomes 'Ġ' (U+0120).",
        "soft_hyphen": "byte 0xad (the soft hyphen) is not in GPT-2's printable set: the ranges are "
                       "! to ~, ¡ to ¬ and ® to ÿ, so 0xad is remapped like the control bytes.",
        "ends": "a printable range lost its last byte: the ranges include both ends, "
                "range(ord('!'), ord('~') + 1) and so on ('~', '¬' and 'ÿ' stand for themselves).",
    }),
]


def _save_keyerror(e):
    return "KeyError" in e.error


SAVE_DIAGNOSES = [
    when("vocab.json maps each token's string to its id ({'Ġthe': 262}), not the id to the "
         "token: json.dumps({spell(b): i for i, b in vocab.items()}).",
         lambda e: "ValueError" in e.error and "int()" in e.error),
    when("a token in your files is not spelled with bytes_to_unicode (a plain space, or a "
         "character outside GPT-2's 256): map every byte b of a token to bytes_to_unicode()[b]. "
         "Decoding tokens as UTF-8 or latin-1 instead loses pieces of characters and leaves "
         "spaces that break merges.txt.", _save_keyerror),
    when("merges.txt must start with the line '#version: 0.2', as GPT-2's does.",
         lambda e: e.out(0, "header") is not None and not bool(e.out(0, "header"))),
    when("vocab.json lacks entries of the vocabulary: write every one, the special tokens "
         "included (`<|endoftext|>` is printable, so it is spelled as it is).",
         lambda e: bool(set(_entries(e, e._want)) - set(_entries(e, e._got)))),
    when("one merge per line, its two tokens separated by one space, in merge order: read back, "
         "your merges.txt gives other pairs.", lambda e: _pairs(e, e.got) != _pairs(e, e.want)),
]

LOAD_DIAGNOSES = [
    when("the '#version: 0.2' line was read as a merge: skip it (GPT-2's merges.txt starts with "
         "it).", lambda e: any(isinstance(e.out(0, f"merges.0.{j}"), np.ndarray)
                              and bytes(np.asarray(e.out(0, f"merges.0.{j}")).astype(np.uint8).tolist()).startswith(b"#version")
                              for j in (0,))),
    when("a token ends in the newline of its line: split the text into lines first "
         "(merges_txt.split('\\n') or splitlines()), or strip each line.", lambda e: "KeyError: '\\n'" in e.error),
    when("the tokens were read back as UTF-8 ('Ġ'.encode() is b'\\xc4\\xa0', not a space): "
         "invert bytes_to_unicode and map each character back to its byte, "
         "bytes(u2b[c] for c in s).", lambda e: _load_utf8(e)),
    when("return vocab as {id: bytes} (vocab.json holds {string: id}: invert it, and turn each "
         "string into bytes).", lambda e: "str" in str(e._got["meta"].get(f"{e.p.name}.0.out.vocab", ""))
         or any(str(v) == "str" for k, v in e._got["meta"].items() if ".out.vocab." in k)),
    when("a token came back as other bytes than were written: map each character back through "
         "the inverse of bytes_to_unicode ('Ġ' is the space, chr(256 + n) the n-th non-printable "
         "byte), not with ord(c) or the character's UTF-8.",
         lambda e: any(_entries(e, e._got).get(i) not in (None, b) for i, b in _entries(e, e._want).items())),
    when("the merges must keep the file's order (the rank of a merge is its line): a list, not a "
         "set or a sorted copy.", lambda e: _pairs(e, e.got) != _pairs(e, e.want)
         and sorted(_pairs(e, e.got)) == sorted(_pairs(e, e.want))),
]


def _entries(e, side):
    """{id: bytes} of the vocabulary a files probe captured (the student's or the reference's)."""
    prefix, out = f"{e.p.name}.0.out.vocab.", {}
    for k, v in side["caps"].items():
        if k.startswith(prefix) and k[len(prefix):].isdigit():
            out[int(k[len(prefix):])] = bytes(np.asarray(v).astype(np.uint8).tolist())
    return out


def _pairs(e, read):
    out = []
    for i in range(100000):
        a, b = read(f"0.out.merges.{i}.0"), read(f"0.out.merges.{i}.1")
        if a is None or b is None:
            return out
        out.append((bytes(np.asarray(a).astype(np.uint8).tolist()), bytes(np.asarray(b).astype(np.uint8).tolist())))
    return out


def _load_utf8(e):
    for k, v in e._got["caps"].items():
        if ".out.vocab." in k and isinstance(v, np.ndarray):
            b = bytes(np.asarray(v).astype(np.uint8).tolist())
            if b"\xc4\xa0" in b:
                return True
    return False


def _files(kind):
    return call(_vocab(256 + 1 + 80), _merges(256 + 1 + 80), method="@" + kind)


# -- the exercises ----------------------------------------------------------------------------

def _train(text, vocab_size, *specials):
    return call(text, vocab_size, list(specials))


EXERCISES = [
    Exercise("train_bpe", ref="tokenizer.train_bpe", diagnose=TRAIN_DIAGNOSES,
             graded=grades(tiny=1, pretokens=1, ties=1, special_tokens=1, unicode=(2, 1103)),
             probes=[
        Probe("tiny", ("tiny",), [call(TOY, 256 + 6), call(TOY, 256 + 10)],
              sizes=True, compare=_show_bytes, what="the textbook example (low, lower, widest, newest)"),
        Probe("pretokens", ("pretokens",),
              [call(_text(lambda r: _english(r, 220), "random English words"), 256 + 30)],
              sizes=True, compare=_show_bytes, what="English-like text: pairs inside pre-tokens only"),
        Probe("ties", ("ties",),
              [call(_text(_ties, "words that each occur twice"), 256 + 25), call("ab ab", 300)],
              sizes=True, compare=_show_bytes, what="a corpus full of ties; a corpus that runs out of pairs"),
        Probe("special", ("special_tokens",),
              [call(_text(lambda r: _docs(r, 12), "documents joined by <|endoftext|>"), 256 + 2 + 25,
                    [EOT, "<pad>"]),
               call(_text(lambda r: _docs(r, 4), "documents joined by <|endoftext|>"), 256 + 2 + 15,
                    special_tokens=["<pad>", EOT]),
               call(_text(lambda r: _tricky_docs(r, 10), "documents whose text holds <, |, >, endoftext, pad"),
                    256 + 2 + 25, [EOT, "<pad>"])],
              sizes=True, compare=_show_bytes, what="special tokens: numbered after the bytes, never merged"),
        Probe("unicode", ("unicode",),
              [call(_text(lambda r: _mixed(r, 40), "Chinese, English and emoji"), 256 + 1 + 60, [EOT])],
              sizes=True, compare=_show_bytes, what="Chinese, English and emoji"),
    ]),
    Exercise("Tokenizer", ref="tokenizer.Tokenizer", diagnose=TOKENIZER_DIAGNOSES,
             graded=grades(encode=(2, 1104), roundtrip=(2, 1105), decode=1, special_tokens=1,
                           encode_iterable=(2, 1106)),
             probes=[
        Probe("encode", ("encode",),
              [call(_text(lambda r: _english(r, 60), "English-like text"), method="encode"),
               call(_text(lambda r: _mixed(r, 12), "Chinese, English and emoji"), method="encode"),
               call("It's 2024: we'll   pay $1234567.89\n\n  don't\tstop  \n    the end\n        of the", method="encode"),
               call("", method="encode")],
              make=ctor(_vocab(256 + 1 + 120), _merges(256 + 1 + 120), [EOT]),
              compare=_show_text, what="encode: ids of English, Chinese, numbers, whitespace"),
        Probe("roundtrip", ("roundtrip",),
              [call(_text(lambda r: _unicode(r, 80), "random Unicode"), method="encode"),
               call(prev(0), method="decode"),
               call(_text(lambda r: _unicode(r, 40) + EOT + _mixed(r, 5), "random Unicode"), method="encode"),
               call(prev(2), method="decode")],
              make=ctor(_vocab(256 + 1 + 80), _merges(256 + 1 + 80), [EOT]),
              compare=_show_text, what="decode(encode(s)) == s on random Unicode (Chinese, emoji, accents)"),
        Probe("decode", ("decode",),
              [call(given(_partial_ids, "bytes cut inside characters"), method="decode"),
               call(given(lambda g: list(range(256, 256 + 1 + 60)), "every merged token"), method="decode")],
              make=ctor(_vocab(256 + 1 + 60), _merges(256 + 1 + 60), [EOT]),
              compare=_show_text, what="decode: partial UTF-8 sequences give U+FFFD, no crash"),
        Probe("special", ("special_tokens",),
              [call(f"a{EOT}{EOT}b{EOT}c {EOT}<|endoftext", method="encode"),
               call(prev(0), method="decode"),
               call(_text(lambda r: EOT.join(_english(r, 6) for _ in range(4)) + EOT, "documents"),
                    method="encode"),
               call(_text(lambda r: _tricky_docs(r, 3), "text holding <, |, >, endoftext"), method="encode")],
              make=ctor(_vocab(256 + 1 + 60), _merges(256 + 1 + 60), [EOT, EOT + EOT]),
              compare=_show_text, what="special tokens kept whole, overlapping ones longest first"),
        Probe("iterable", ("encode_iterable",),
              [call(_cuts(lambda r: _mixed(r, 10) + EOT + "we'll" + EOT + EOT + _english(r, 30) + " ",
                          "a text cut at random places"), method="encode_iterable", take=0),
               call(_cuts(lambda r: "it'll " + _english(r, 12) + EOT + "中文 " + EOT, "one character per chunk",
                          single=True), method="encode_iterable", take=0),
               call(_stream(40, 20), method="encode_iterable", take=25)],
              make=ctor(_vocab(256 + 1 + 80), _merges(256 + 1 + 80), [EOT, EOT + EOT]),
              compare=_show_text, what="encode_iterable: lazy, and equal to encode of the whole text"),
        Probe("whitespace", ("encode_iterable",),
              [call(_whitespace_cuts("code cut inside its runs of spaces and newlines"),
                    method="encode_iterable", take=0)],
              make=ctor(given(lambda g: _trained_code(g.initial_seed(), 256 + 1 + 60, (EOT,))[0],
                              "a vocabulary of 317 trained on code (merges of spaces and newlines)"),
                        given(lambda g: _trained_code(g.initial_seed(), 256 + 1 + 60, (EOT,))[1], "its merges"),
                        [EOT]),
              compare=_show_text, what="encode_iterable on code, cut inside whitespace runs, with a "
                                       "vocabulary that merges spaces and newlines"),
    ]),
    Exercise("bytes_to_unicode", ref="tokenizer.bytes_to_unicode", diagnose=B2U_DIAGNOSES,
             graded=grades(values=1),
             probes=[Probe("map", ("values",), [call(method="@b2u")],
                           what="the 256 byte values mapped to GPT-2's printable characters")]),
    Exercise("to_gpt2_format", ref="tokenizer.to_gpt2_format", diagnose=SAVE_DIAGNOSES,
             graded=grades(files=(2, 1107)),
             probes=[Probe("files", ("files",), [_files("tok_save")], compare=_show_bytes, sizes=True,
                           what="a vocabulary and its merges written as GPT-2's vocab.json and merges.txt, read back "
                                "by GPT-2's rules (bytes_to_unicode spelling, the #version line)")]),
    Exercise("from_gpt2_format", ref="tokenizer.from_gpt2_format", diagnose=LOAD_DIAGNOSES,
             graded=grades(files=(2, 1108)),
             probes=[Probe("files", ("files",), [_files("tok_load")], compare=_show_bytes, sizes=True,
                           what="GPT-2-format vocab.json and merges.txt (spaces as 'Ġ', newlines as 'Ċ', pieces of "
                                "Chinese characters) read back into {id: bytes} and the merges")]),
]
