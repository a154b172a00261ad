"""The stored expectations (helpers/tfscratch/expected) are rewritten by `make release` only
where they differ by more than another CPU's last bits, so a release twice leaves `git status`
clean (issue 41.10); a real change is always written."""
import json
import shutil

import numpy as np

from tfscratch.specs import stored

A = "01_attention"


def _copy(tmp_path):
    for suffix in (".npz", ".json"):
        shutil.copyfile(stored.DIR / f"{A}{suffix}", tmp_path / f"{A}{suffix}")
    return tmp_path / f"{A}.npz", tmp_path / f"{A}.json"


def test_last_bits_do_not_rewrite_the_files(tmp_path):
    npz, js = _copy(tmp_path)
    arrays, doc = stored._read(A, tmp_path)
    nudged = {k: (v * (1 + 1e-9) if v.dtype.kind == "f" else v) for k, v in arrays.items()}
    npz.write_bytes(stored._npz_bytes(nudged))           # as another CPU would have stored them
    before = npz.read_bytes(), js.read_bytes()
    stored.write(A, tmp_path)
    assert (npz.read_bytes(), js.read_bytes()) == before


def test_a_real_change_is_written(tmp_path):
    npz, js = _copy(tmp_path)
    arrays, doc = stored._read(A, tmp_path)
    wrong = {k: (v + 1.0 if v.dtype.kind == "f" else v) for k, v in arrays.items()}
    npz.write_bytes(stored._npz_bytes(wrong))
    assert stored.stale(A, tmp_path, shown="x")
    stored.write(A, tmp_path)
    assert stored.stale(A, tmp_path, shown="x") == []
    assert json.loads(js.read_text()) == doc
    assert np.load(npz)  # still a readable npz
