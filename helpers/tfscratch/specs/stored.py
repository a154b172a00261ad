"""What the notebooks' own checks compare with, stored: the plan and the reference's captures
of every exercise on the public seed, written by `make release` to `tfscratch/expected/` and
guarded by `make check` like the reference export.

The checks a student runs in the kernel (`chk.<grade_id>(obj)`, checks/kernel.py) judge the
public seed's captures against these files, so the kernel never needs the graded notebook's
reference: a grading sandbox and a class's student bundle do not hold it (issue 26). The
files are an answer key for the public inputs only; the grade is decided on other inputs,
drawn per student from the instructor's secret, outside the student's process.

One notebook, two files: `<assignment>.npz` (arrays `plan/<exercise>/<tensor>` and
`want/<exercise>/<capture>`, written with fixed zip dates so a rewrite of equal content is
byte-identical) and `<assignment>.json` ({exercise: {"plan": the plan without tensors,
"meta": the reference's meta}}).
"""
from __future__ import annotations

import io
import json
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np

PUBLIC_SEED = 0
DIR = Path(__file__).resolve().parents[1] / "expected"


def compute(assignment: str) -> tuple[dict, dict]:
    """(arrays, doc) for a notebook, from the reference (instructor side only)."""
    from . import engine
    arrays, doc = {}, {}
    for ex in engine.specs_for(assignment):
        plan, tensors = engine.build_plan(ex, PUBLIC_SEED)
        want = engine.reference_run(ex, PUBLIC_SEED)
        arrays.update({f"plan/{ex.name}/{k}": np.asarray(v) for k, v in tensors.items()})
        arrays.update({f"want/{ex.name}/{k}": np.asarray(v) for k, v in want["caps"].items()})
        doc[ex.name] = {"plan": plan, "meta": want["meta"]}
    return arrays, doc


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for k in sorted(arrays):
            info = zipfile.ZipInfo(f"{k}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w") as f:
                np.lib.format.write_array(f, np.asarray(arrays[k], order="C"), allow_pickle=False)
    return buf.getvalue()


def _json(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":")) + "\n"   # key order kept: a load order matters


def write(assignment: str, out_dir: Path = DIR) -> list[Path]:
    """The stored files, rewritten only where they differ by more than another CPU's last bits
    (as `stale` judges), so that `make release` twice leaves `git status` clean."""
    arrays, doc = compute(assignment)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{assignment}.npz", out_dir / f"{assignment}.json"]
    try:
        if _same(*_read(assignment, out_dir), arrays, doc):
            return paths
    except (OSError, ValueError):
        pass
    for p, data in zip(paths, (_npz_bytes(arrays), _json(doc).encode())):
        if not p.exists() or p.read_bytes() != data:
            p.write_bytes(data)
    return paths


def _read(assignment: str, out_dir: Path):
    with np.load(out_dir / f"{assignment}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads((out_dir / f"{assignment}.json").read_text(encoding="utf-8"))


def stale(assignment: str, out_dir: Path = DIR, shown: str = "helpers/tfscratch/expected") -> list[str]:
    """What differs between the stored files and what the sources give now (values compared
    at a tolerance far below every check's, so another CPU's last bits do not count)."""
    try:
        arrays, doc = _read(assignment, out_dir)
    except (OSError, ValueError) as e:
        return [f"{shown}/{assignment}.npz/.json missing or unreadable ({type(e).__name__}): "
                "run `make release`"]
    new_arrays, new_doc = compute(assignment)
    if _same(arrays, doc, new_arrays, new_doc):
        return []
    return [f"{shown}/{assignment}.* differs from what the specs and the reference give: run `make release`"]


def _same(arrays, doc, new_arrays, new_doc) -> bool:
    """The stored plan and captures equal the new ones: the plans exactly, values at a
    tolerance far below every check's."""
    if _json(new_doc) != _json(doc) or set(arrays) != set(new_arrays):
        return False
    for k, v in new_arrays.items():
        a = arrays[k]
        if a.shape != v.shape or a.dtype != v.dtype:
            return False
        if a.dtype.kind in "fc":
            if not np.allclose(a, v, atol=1e-6, rtol=1e-5, equal_nan=True):
                return False
        elif not np.array_equal(a, v):
            return False
    return True


@lru_cache(maxsize=None)
def _load(assignment: str, out_dir: str):
    try:
        return _read(assignment, Path(out_dir))
    except OSError:
        return None


def public(assignment: str, exercise: str):
    """(plan, tensors, want) of one exercise on the public seed, or None where not stored."""
    found = _load(assignment, str(DIR))
    if found is None or exercise not in found[1]:
        return None
    arrays, doc = found
    tensors = {k.split("/", 2)[2]: v for k, v in arrays.items() if k.startswith(f"plan/{exercise}/")}
    caps = {k.split("/", 2)[2]: v for k, v in arrays.items() if k.startswith(f"want/{exercise}/")}
    entry = doc[exercise]
    return json.loads(json.dumps(entry["plan"])), tensors, {"caps": caps, "meta": dict(entry["meta"])}


def main(argv=None) -> int:
    """python -m tfscratch.specs.stored write|check ASSIGNMENT...: run by `tfs-grade release`
    and `tfs-grade check` in a fresh process, so the reference just exported is the one used."""
    import sys
    cmd, *names = argv if argv is not None else sys.argv[1:]
    if cmd == "write":
        for a in names:
            for p in write(a):
                print(p)
        return 0
    problems = [m for a in names for m in stale(a)]
    for m in problems:
        print(m)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
