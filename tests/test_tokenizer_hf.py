"""11_tokenizer against Hugging Face `tokenizers` (issue 30): a byte-level BPE built by
`tokenizers` from the course's vocab and merges (GPT-2's byte-to-unicode alphabet, the same
pre-tokenization pattern, `<|endoftext|>` as a special token) gives the same ids as the
course's `Tokenizer` on held-out text, and its own trainer learns the same first merges where
no tie decides. Not part of any student's grade: the reference is checked here, the grade
compares the student's code with the reference (tfscratch.specs.tokenizer)."""
import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers  # noqa: E402

from tfscratch import corpus  # noqa: E402
from tfscratch.reference.tokenizer import GPT2_PATTERN, Tokenizer, train_bpe  # noqa: E402

EOT = "<|endoftext|>"


def bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters (what byte-level BPE in
    `tokenizers` writes its vocabulary in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def hf_from(vocab, merges, specials=(EOT,)):
    m = bytes_to_unicode()
    s = lambda b: "".join(m[x] for x in b)  # noqa: E731
    hf_vocab = {s(b): i for i, b in vocab.items()}   # `<|endoftext|>` is printable ASCII: itself
    tok = tokenizers.Tokenizer(models.BPE(vocab=hf_vocab, merges=[(s(a), s(b)) for a, b in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    for t in specials:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)])
    ids = {t: next(i for i, b in vocab.items() if b == t.encode()) for t in specials}
    assert all(tok.token_to_id(t) == i for t, i in ids.items())
    return tok


@pytest.fixture(scope="module")
def trained():
    docs = corpus.sample("english").split("\n\n") + corpus.sample("chinese").split("\n\n")
    held = docs[3::4]
    train = EOT.join(d for i, d in enumerate(docs) if i % 4 != 3)
    vocab, merges = train_bpe(train, 900, [EOT])
    return vocab, merges, held


def test_same_ids_as_hugging_face_on_held_out_text(trained):
    vocab, merges, held = trained
    ours, hf = Tokenizer(vocab, merges, [EOT]), hf_from(vocab, merges)
    texts = held + [EOT.join(held), "It's 2024: we'll   pay $1234567.89\n\n  don't\tstop  ",
                    "naïve café 🙂🙂 👍🏽 中文，English 混合 text\r\n", ""]
    for text in texts:
        want = hf.encode(text).ids
        got = ours.encode(text)
        assert got == want, f"{text[:40]!r}: first difference at {next(i for i, (a, b) in enumerate(zip(got + [None], want + [None])) if a != b)}"
        assert ours.decode(got) == text == hf.decode(want, skip_special_tokens=False)


def test_hugging_face_trainer_agrees_on_the_first_merges():
    """`tokenizers`' own BPE trainer on the same pre-tokens: the same merges as long as no tie
    decides (its tie rule differs from the course's), so compare the merges made while the best
    count is unique."""
    from collections import Counter
    text = corpus.sample("english")
    vocab, merges = train_bpe(text, 256 + 60)
    m = bytes_to_unicode()
    s = lambda b: "".join(m[x] for x in b)  # noqa: E731
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=256 + 60, show_progress=False,
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    hf_merges = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x)
                 for x in __import__("json").loads(tok.to_str())["model"]["merges"]]
    words = Counter(__import__("regex").findall(GPT2_PATTERN, text))
    seqs = {w: [bytes([b]) for b in w.encode()] for w in words}
    n = 0
    for a, b in merges:
        pairs = Counter()
        for w, c in words.items():
            for p in zip(seqs[w], seqs[w][1:]):
                pairs[p] += c
        top = sorted(pairs.values(), reverse=True)[:2]
        if len(top) > 1 and top[0] == top[1]:
            break   # a tie: the two rules may differ from here on
        assert hf_merges[n] == (s(a), s(b)), f"merge {n}: {hf_merges[n]} vs {(a, b)}"
        n += 1
        for w in seqs:
            q, out, j = seqs[w], [], 0
            while j < len(q):
                if j + 1 < len(q) and (q[j], q[j + 1]) == (a, b):
                    out.append(a + b)
                    j += 2
                else:
                    out.append(q[j])
                    j += 1
            seqs[w] = out
    assert n >= 5, f"only {n} merges before the first tie"
