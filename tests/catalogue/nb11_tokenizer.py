"""Catalogue for 11_tokenizer: realistic mistakes and correct variants.

Each entry is the solution cell of solutions/src/11_tokenizer.py with one change (`_edit`), so
an entry reads as the mistake it makes: the line that is wrong and what it should be.
"""
import re

from . import REPO, Mistake, Variant

ASSIGNMENT = "11_tokenizer"
EXERCISES = ["train_bpe", "Tokenizer", "bytes_to_unicode", "to_gpt2_format", "from_gpt2_format"]


def _solution(name):
    src = (REPO / "solutions" / "src" / "11_tokenizer.py").read_text(encoding="utf-8")
    cell = re.search(rf"^# %% \[solution\] {name}\n(.*?)(?=^# %%)", src, re.S | re.M).group(1)
    return "\n".join(ln for ln in cell.splitlines() if "### BEGIN SOLUTION" not in ln
                     and "### END SOLUTION" not in ln) + "\n"


HEAP, TOK = _solution("train_bpe"), _solution("Tokenizer")
B2U, SAVE, LOAD = _solution("bytes_to_unicode"), _solution("to_gpt2_format"), _solution("from_gpt2_format")
_PRINTABLE = 'printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]'
_NTH = "table.update({b: chr(256 + i) for i, b in enumerate(moved)})"
_SPELL = "vocab_json = json.dumps({spell(b): i for i, b in vocab.items()}, ensure_ascii=False)"
_MERGES_OUT = 'merges_txt = "#version: 0.2\\n" + "".join(f"{spell(a)} {spell(b)}\\n" for a, b in merges)'
_LINES = 'lines = [ln for ln in merges_txt.split("\\n") if ln and not ln.startswith("#version")]'
_RAW = "return bytes(u2b[c] for c in s)"


def _edit(code, *swaps):
    for old, new in zip(swaps[::2], swaps[1::2]):
        assert old in code, f"catalogue edit does not apply: {old!r}"
        code = code.replace(old, new, 1)
    return code


# The solution finds the best pair with a heap; most students write a `max` over the counts (a
# valid variant, below), so the trainer's mistakes are edits of that plainer version.
TRAIN = _edit(
    HEAP,
    "    def entry(p):  # heap order: most frequent first, then the greatest pair (bytes inverted)\n"
    "        return (-pairs[p], *(tuple(255 - x for x in b) + (256,) for b in p), p)\n\n"
    "    heap = [entry(p) for p in pairs]\n    heapq.heapify(heap)\n    merges = []",
    "    merges = []",
    "        *key, best = heapq.heappop(heap)\n"
    "        if pairs.get(best) != -key[0]:  # stale: the count changed after this entry was pushed\n"
    "            continue\n",
    "        best = max(pairs, key=lambda p: (pairs[p], p))  # most frequent, then greatest pair\n",
    "        changed = set()\n", "",
    "                changed.add(p)\n                if pairs[p] == 0:", "                if pairs[p] == 0:",
    "                where[p].add(i)\n                changed.add(p)\n", "                where[p].add(i)\n",
    "        for p in changed & pairs.keys():  # their new counts, the old entries left stale\n"
    "            heapq.heappush(heap, entry(p))\n", "")


_BEST = "best = max(pairs, key=lambda p: (pairs[p], p))  # most frequent, then greatest pair"
_SPLIT = ('pieces = regex.split("|".join(regex.escape(t) for t in special_tokens), text) '
          'if special_tokens else [text]')
_HEAD = TRAIN[:TRAIN.index("def train_bpe")]

# a trainer that recounts every pair before each merge: valid, only slower
_RECOUNT = _HEAD + '''
def train_bpe(text, vocab_size, special_tokens=()):
    vocab = {i: bytes([i]) for i in range(256)}
    for tok in special_tokens:
        vocab[len(vocab)] = tok.encode("utf-8")
    pieces = regex.split("|".join(map(regex.escape, special_tokens)), text) if special_tokens else [text]
    counts = Counter(w for p in pieces for w in pretokenize(p))
    words = {w: tuple(bytes([b]) for b in w.encode("utf-8")) for w in counts}
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for w, c in counts.items():
            s = words[w]
            for i in range(len(s) - 1):
                pairs[s[i], s[i + 1]] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        for w, s in words.items():
            out, i = [], 0
            while i < len(s):
                if s[i:i + 2] == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            words[w] = tuple(out)
    return vocab, merges
'''

# positional updates that read the ORIGINAL neighbours instead of the merged ones
_NEIGHBOURS = _edit(TRAIN, '''        for i in where.pop(best):  # only the pre-tokens holding the pair change
            w, f = words[i], freq[i]
            for p in zip(w, w[1:]):  # take out the old pairs...
                pairs[p] -= f
                if pairs[p] == 0:
                    del pairs[p]
            merged, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == best:
                    merged.append(w[j] + w[j + 1])
                    j += 2
                else:
                    merged.append(w[j])
                    j += 1
            for p in zip(merged, merged[1:]):  # ...and put the new ones in
                pairs[p] += f
                where[p].add(i)
            words[i] = merged''', '''        new = best[0] + best[1]
        del pairs[best]
        for i in where.pop(best):
            w, f = words[i], freq[i]
            merged, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == best:
                    if j > 0:  # left neighbour, as it was before this merge
                        pairs[w[j - 1], w[j]] -= f
                        pairs[w[j - 1], new] += f
                        where[w[j - 1], new].add(i)
                    if j + 2 < len(w):
                        pairs[w[j + 1], w[j + 2]] -= f
                        pairs[new, w[j + 2]] += f
                        where[new, w[j + 2]].add(i)
                    merged.append(new)
                    j += 2
                else:
                    merged.append(w[j])
                    j += 1
            words[i] = merged
        pairs = Counter({p: c for p, c in pairs.items() if c > 0})''')

MISTAKES = [
    Mistake("train_bpe", "pairs counted across pre-token boundaries (BPE on the raw text)",
            r"across pre-token boundaries",
            _edit(TRAIN, "counts = Counter(w for piece in pieces for w in pretokenize(piece))",
                  "counts = Counter(piece for piece in pieces if piece)")),
    Mistake("train_bpe", "ties broken by the smallest pair", r"smallest pair|wins the tie",
            _edit(TRAIN, _BEST, "top = max(pairs.values())\n"
                  "        best = min(p for p in pairs if pairs[p] == top)")),
    Mistake("train_bpe", "ties broken by first occurrence (max over the counts alone)",
            r"seen first|wins the tie",
            _edit(TRAIN, _BEST, "best = max(pairs, key=pairs.get)")),
    Mistake("train_bpe", "ties broken by the token ids instead of the bytes", r"wins the tie",
            _edit(TRAIN, _BEST, "tid = {b: i for i, b in vocab.items()}\n"
                  "        best = max(pairs, key=lambda p: (pairs[p], tid[p[0]], tid[p[1]]))")),
    Mistake("train_bpe", "special tokens trained on as ordinary text", r"ordinary text",
            _edit(TRAIN, _SPLIT, "pieces = [text]")),
    Mistake("train_bpe", "special tokens removed and the pieces around them joined",
            r"joined the pieces",
            _edit(TRAIN, _SPLIT, "pieces = [text]\n    for t in special_tokens:\n"
                  "        pieces = [p.replace(t, '') for p in pieces]")),
    Mistake("train_bpe", "special tokens split without regex.escape (`|` means 'or')", r"regex\.escape",
            _edit(TRAIN, _SPLIT, 'pieces = [p for p in regex.split("|".join(special_tokens), text) if p] '
                  'if special_tokens else [text]')),
    Mistake("train_bpe", "special tokens replaced by a space", r"replaced each special token by a space",
            _edit(TRAIN, _SPLIT, "pieces = [text]\n    for t in special_tokens:\n"
                  "        pieces = [p.replace(t, ' ') for p in pieces]")),
    Mistake("train_bpe", "special tokens numbered after the merges", r"numbered after the merges",
            _edit(TRAIN, '''    for tok in special_tokens:
        vocab[len(vocab)] = tok.encode("utf-8")
''', "", "    return vocab, merges", '''    for tok in special_tokens:
        vocab[len(vocab)] = tok.encode("utf-8")
    return vocab, merges''', "while len(vocab) < vocab_size and pairs:",
                  "while len(vocab) + len(special_tokens) < vocab_size and pairs:")),
    Mistake("train_bpe", "vocab_size counted without the special tokens", r"not counted in vocab_size",
            _edit(TRAIN, "while len(vocab) < vocab_size and pairs:",
                  "while len(merges) < vocab_size - 256 and pairs:")),
    Mistake("train_bpe", "one merge too many (<= instead of <)", r"one more or one fewer",
            _edit(TRAIN, "while len(vocab) < vocab_size and pairs:",
                  "while len(vocab) <= vocab_size and pairs:")),
    Mistake("train_bpe", "pre-tokenized with str.split() instead of GPT-2's pattern", r"str\.split",
            _edit(TRAIN, "counts = Counter(w for piece in pieces for w in pretokenize(piece))",
                  "counts = Counter(w for piece in pieces for w in piece.split())")),
    Mistake("train_bpe", "incremental update from the original neighbours (counts drift)",
            r"counts drift", _NEIGHBOURS),
    Mistake("train_bpe", "vocabulary of str instead of bytes", r"str, not bytes",
            _edit(TRAIN, "vocab = {i: bytes([i]) for i in range(256)}",
                  "vocab = {i: chr(i) for i in range(256)}",
                  'vocab[len(vocab)] = tok.encode("utf-8")', "vocab[len(vocab)] = tok",
                  "vocab[len(vocab)] = best[0] + best[1]",
                  "vocab[len(vocab)] = (best[0] + best[1]).decode('utf-8', 'replace')")),

    Mistake("Tokenizer", "special tokens encoded as ordinary text", r"encoded as ordinary text",
            _edit(TOK, "pieces = self.special_split.split(text) if self.special_split else [text]",
                  "pieces = [text]")),
    Mistake("Tokenizer", "special tokens put into the pattern without regex.escape", r"regex\.escape",
            _edit(TOK, '"|".join(regex.escape(t) for t in self.special_tokens)', '"|".join(self.special_tokens)')),
    Mistake("Tokenizer", "encode_iterable cuts the buffer at the last space or newline",
            r"inside a\s+run of spaces",
            _edit(TOK, "            cut = safe_cut(buffer)\n",
                  '            cut = max(buffer.rfind(" "), buffer.rfind("\\n"))  # keep the last word back\n'
                  "            cut = cut if cut > 0 and not any(t.startswith(buffer[-k:]) for t in self.special_tokens\n"
                  "                                             for k in range(1, len(t))) else 0\n")),
    Mistake("Tokenizer", "overlapping special tokens matched shortest first", r"shortest first",
            _edit(TOK, "self.special_tokens = sorted(special_tokens or [], key=len, reverse=True)",
                  "self.special_tokens = sorted(special_tokens or [], key=len)")),
    Mistake("Tokenizer", "merges applied to the whole piece, not per pre-token",
            r"across pre-token boundaries",
            _edit(TOK, "for word in pretokenize(piece):", "for word in ([piece] if piece else []):")),
    Mistake("Tokenizer", "the leftmost mergeable pair merged first, not the lowest rank",
            r"LOWEST\s+rank|leftmost",
            _edit(TOK, "rank, best = min((self.ranks.get(p, len(self.ranks)), p) for p in zip(parts, parts[1:]))",
                  "known = [p for p in zip(parts, parts[1:]) if p in self.ranks]\n"
                  "                rank, best = (0, known[0]) if known else (len(self.ranks), None)")),
    Mistake("Tokenizer", "decode with errors='strict' crashes on half a character", r"crashed",
            _edit(TOK, 'decode("utf-8", errors="replace")', 'decode("utf-8")')),
    Mistake("Tokenizer", "decode token by token", r"decode lost characters|decoding each token",
            _edit(TOK, 'return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")',
                  'return "".join(self.vocab[i].decode("utf-8", errors="replace") for i in ids)')),
    Mistake("Tokenizer", "decode with errors='ignore'", r"errors='ignore'",
            _edit(TOK, 'decode("utf-8", errors="replace")', 'decode("utf-8", errors="ignore")')),
    Mistake("Tokenizer", "encode_iterable encodes each chunk on its own", r"each chunk on its own",
            _edit(TOK, '''        buffer = ""
        for chunk in iterable:''', '''        for chunk in iterable:
            yield from self.encode(chunk)
        buffer = ""
        for chunk in []:''')),
    Mistake("Tokenizer", "encode_iterable reads the whole stream first", r"whole stream",
            _edit(TOK, '''        buffer = ""
        for chunk in iterable:''', '''        text = "".join(iterable)
        yield from self.encode(text)
        buffer = ""
        for chunk in []:''')),
    Mistake("Tokenizer", "encode_iterable forgets the rest of the buffer", r"lost the end",
            _edit(TOK, '''        if buffer:
            yield from self.encode(buffer)''', "")),
]

MISTAKES += [
    Mistake("bytes_to_unicode", "every byte mapped to chr(b) (no remapping)", r"maps to chr\(b\)",
            _edit(B2U, _NTH, "table.update({b: chr(b) for b in moved})")),
    Mistake("bytes_to_unicode", "the other bytes numbered from chr(0)", r"chr\(0\), chr\(1\)",
            _edit(B2U, _NTH, "table.update({b: chr(i) for i, b in enumerate(moved)})")),
    Mistake("bytes_to_unicode", "chr(256 + b) instead of chr(256 + n)", r"chr\(256 \+ b\)",
            _edit(B2U, _NTH, "table.update({b: chr(256 + b) for b in moved})")),
    Mistake("bytes_to_unicode", "the printable ranges without their last byte (range end exclusive)",
            r"lost its last byte",
            _edit(B2U, _PRINTABLE, 'printable = [*range(ord("!"), ord("~")), *range(ord("¡"), ord("¬")), *range(ord("®"), ord("ÿ"))]')),
    Mistake("bytes_to_unicode", "the soft hyphen (0xad) kept: one range from ¡ to ÿ", r"soft hyphen",
            _edit(B2U, _PRINTABLE, 'printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("ÿ") + 1)]')),
    Mistake("bytes_to_unicode", "the inverse map returned ({character: byte})", r"the inverse",
            _edit(B2U, "    return table\n", "    return {c: b for b, c in table.items()}\n")),

    Mistake("to_gpt2_format", "vocab.json written as {id: token}", r"not the id to the\s+token",
            _edit(SAVE, _SPELL, "vocab_json = json.dumps({i: spell(b) for i, b in vocab.items()}, ensure_ascii=False)")),
    Mistake("to_gpt2_format", "tokens written as UTF-8 text (decode with errors='replace')",
            r"not spelled with bytes_to_unicode",
            _edit(SAVE, 'return "".join(b2u[x] for x in b)', 'return b.decode("utf-8", errors="replace")')),
    Mistake("to_gpt2_format", "tokens written as latin-1 text (a space stays a space)",
            r"not spelled with bytes_to_unicode",
            _edit(SAVE, 'return "".join(b2u[x] for x in b)', 'return b.decode("latin-1")')),
    Mistake("to_gpt2_format", "merges.txt without its #version line", r"#version",
            _edit(SAVE, 'merges_txt = "#version: 0.2\\n" + ', "merges_txt = ")),
    Mistake("to_gpt2_format", "the merges written sorted, not in merge order", r"merge order",
            _edit(SAVE, "for a, b in merges)", "for a, b in sorted(merges))")),
    Mistake("to_gpt2_format", "the special tokens left out of vocab.json", r"lacks entries",
            _edit(SAVE, "for i, b in vocab.items()}", 'for i, b in vocab.items() if not b.startswith(b"<|")}')),

    Mistake("from_gpt2_format", "the #version line read as a merge", r"#version",
            _edit(LOAD, _LINES, 'lines = [ln for ln in merges_txt.split("\\n") if ln]')),
    Mistake("from_gpt2_format", "lines split with split(' ') on the whole text's lines kept with their newline",
            r"newline",
            _edit(LOAD, _LINES, 'lines = [ln for ln in merges_txt.splitlines(keepends=True) if ln.strip() and not ln.startswith("#version")]')),
    Mistake("from_gpt2_format", "tokens read back as UTF-8 (str.encode) instead of the inverse map",
            r"read back as UTF-8",
            _edit(LOAD, _RAW, 'return s.encode("utf-8")')),
    Mistake("from_gpt2_format", "vocab.json returned as it is ({string: id})", r"\{id: bytes\}",
            _edit(LOAD, "vocab = {i: raw(s) for s, i in json.loads(vocab_json).items()}", "vocab = json.loads(vocab_json)")),
    Mistake("from_gpt2_format", "the merges collected in a set and sorted", r"file's order",
            _edit(LOAD, "return vocab, merges", "return vocab, sorted(set(merges))")),
    Mistake("from_gpt2_format", "tokens read back as latin-1 (ord of each character)", r"other bytes than were written",
            _edit(LOAD, _RAW, "return bytes(ord(c) % 256 for c in s)")),
]

VARIANTS = [
    Variant("bytes_to_unicode", "GPT-2's own construction: two lists zipped",
            "def bytes_to_unicode():\n"
            "    bs = list(range(ord('!'), ord('~') + 1)) + list(range(ord('¡'), ord('¬') + 1)) + list(range(ord('®'), ord('ÿ') + 1))\n"
            "    cs = bs[:]\n    n = 0\n    for b in range(256):\n        if b not in bs:\n"
            "            bs.append(b)\n            cs.append(256 + n)\n            n += 1\n"
            "    return dict(zip(bs, [chr(c) for c in cs]))\n"),
    Variant("bytes_to_unicode", "str.isprintable on latin-1 characters, the space and 0xad excluded",
            "def bytes_to_unicode():\n    out, n = {}, 0\n    for b in range(256):\n"
            "        c = chr(b)\n        if c.isprintable() and c != ' ' and b != 0xAD:\n            out[b] = c\n"
            "        else:\n            out[b] = chr(256 + n)\n            n += 1\n    return out\n"),
    Variant("bytes_to_unicode", "a counter from itertools, one loop", _edit(
        B2U, _NTH, "import itertools\n    fresh = itertools.count(256)\n    for b in moved:\n"
        "        table[b] = chr(next(fresh))\n    table = dict(sorted(table.items()))")),


    Variant("to_gpt2_format", "json with ASCII escapes (ensure_ascii left on)",
            _edit(SAVE, _SPELL, "vocab_json = json.dumps({spell(b): i for i, b in vocab.items()})")),
    Variant("to_gpt2_format", "the lines of merges.txt joined, sorted by id in vocab.json", _edit(
        SAVE, _MERGES_OUT, 'merges_txt = "\\n".join(["#version: 0.2"] + [spell(a) + " " + spell(b) for a, b in merges]) + "\\n"',
        "for i, b in vocab.items()}", "for i, b in sorted(vocab.items())}")),
    Variant("to_gpt2_format", "str.translate with a table of the 256 bytes", _edit(
        SAVE, 'return "".join(b2u[x] for x in b)', 'return b.decode("latin-1").translate(b2u)')),

    Variant("from_gpt2_format", "line.split() (tokens never hold a space)", _edit(
        LOAD, '(ln.split(" ") for ln in lines)', "(ln.split() for ln in lines)")),
    Variant("from_gpt2_format", "splitlines, the first line dropped", _edit(
        LOAD, _LINES, "lines = [ln for ln in merges_txt.splitlines()[1:] if ln]")),
    Variant("from_gpt2_format", "the vocabulary sorted by id", _edit(
        LOAD, "vocab = {i: raw(s) for s, i in json.loads(vocab_json).items()}",
        "vocab = {i: raw(s) for s, i in sorted(json.loads(vocab_json).items(), key=lambda kv: kv[1])}")),
    Variant("train_bpe", "a fresh count of every pair before each merge (slow, but right)", _RECOUNT),
    Variant("train_bpe", "the best pair by a max over the counts, no heap", TRAIN),
    Variant("train_bpe", "the best pair by sorting the counts",
            _edit(TRAIN, _BEST, "best = sorted(pairs.items(), key=lambda kv: (kv[1], kv[0]))[-1][0]")),
    Variant("train_bpe", "special tokens cut out one at a time with str.split",
            _edit(TRAIN, _SPLIT, "pieces = [text]\n    for t in special_tokens:\n"
                  "        pieces = [q for p in pieces for q in p.split(t)]")),
    Variant("train_bpe", "pre-tokens with regex.finditer",
            _edit(TRAIN, "counts = Counter(w for piece in pieces for w in pretokenize(piece))",
                  "counts = Counter(m.group() for piece in pieces for m in GPT2_SPLIT.finditer(piece))")),

    Variant("Tokenizer", "every merge applied in rank order, one pass (equivalent, slower)",
            _edit(TOK, '''            while len(parts) > 1:
                rank, best = min((self.ranks.get(p, len(self.ranks)), p) for p in zip(parts, parts[1:]))
                if rank == len(self.ranks):
                    break
''', '''            for best in self.ranks:  # dicts keep insertion order: rank order
                if len(parts) < 2:
                    break
''')),
    Variant("Tokenizer", "decode through a bytearray, no cache in encode",
            _edit(TOK, 'return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")',
                  'buf = bytearray()\n        for i in ids:\n            buf += self.vocab[i]\n'
                  '        return bytes(buf).decode("utf-8", "replace")',
                  "if word not in self.cache:", "if True:")),
    Variant("Tokenizer", "encode_iterable that holds back the last three pre-tokens",
            _edit(TOK, "return last + min([starts[-1]] + late)", "return last + starts[max(0, len(starts) - 3)]")),
    Variant("Tokenizer", "encode_iterable that buffers about 2 KB before cutting (within the stated bound)",
            _edit(TOK, "            cut = safe_cut(buffer)\n",
                  "            cut = safe_cut(buffer) if len(buffer) > 2048 else 0  # fewer, larger encode calls\n")),
    Variant("Tokenizer", "special tokens matched with str.find, longest first",
            _edit(TOK, "pieces = self.special_split.split(text) if self.special_split else [text]",
                  '''pieces, rest = [], text
        while self.special_tokens:
            hits = [(rest.find(t), -len(t), t) for t in self.special_tokens if t in rest]
            if not hits:
                break
            at, _, t = min(hits)
            pieces += [rest[:at], t]
            rest = rest[at + len(t):]
        pieces.append(rest)''')),
]
