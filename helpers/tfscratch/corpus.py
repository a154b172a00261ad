"""Small public-domain text samples shipped with the course, so that notebooks and tests never
download anything at run time.

- `english`: the Gettysburg Address, Shakespeare's sonnets 18 and 116, the openings of *A Tale
  of Two Cities*, *Pride and Prejudice* and *Moby-Dick*, Genesis 1:1-5 (King James Version) and
  a sentence of the Declaration of Independence;
- `chinese`: Tang poems (李白, 孟浩然, 王之涣, 柳宗元, 王维, 白居易, 孟郊, 杜甫), sayings of the
  Analects (论语) and chapters of the Tao Te Ching (道德经).

All of them are in the public domain.
"""
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
SAMPLES = ("english", "chinese")


def sample(name: str = "english") -> str:
    """The text of one shipped sample (see SAMPLES)."""
    if name not in SAMPLES:
        raise KeyError(f"no sample {name!r}; samples: {SAMPLES}")
    return (DATA / f"{name}_sample.txt").read_text(encoding="utf-8")
