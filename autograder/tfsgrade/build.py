"""Build the instructor notebooks in solutions/ from their percent-format sources.

A source `solutions/src/NN_name.py` is a Python file split into cells by `# %%` lines:

    # %% [markdown]                   markdown; each line loses its leading "# "
    # %%                              an ordinary code cell
    # %% [setup] setup_imports        a read-only code cell that the checks rely on
    # %% [solution] softmax           the exercise cell (grade_id = the name it defines)
    # %% [test] test_softmax_rows 2   a graded, read-only test cell worth 2 points

The file diffs well and runs as plain Python; the .ipynb files it produces are what nbgrader
reads. `build_all` is deterministic: the same source always gives the same bytes.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import nbformat

HEADER = re.compile(r"^# %%(?:\s+\[(?P<kind>\w+)\])?(?:\s+(?P<id>[\w.-]+))?(?:\s+(?P<points>[\d.]+))?\s*$")
KINDS = {None, "markdown", "setup", "solution", "test"}


class SourceError(ValueError):
    pass


def _nbgrader_meta(kind, grade_id, points):
    base = {"schema_version": 3, "task": False}
    if kind == "solution":
        return {**base, "grade": False, "grade_id": grade_id, "locked": False, "solution": True}
    if kind == "test":
        return {**base, "grade": True, "grade_id": grade_id, "locked": True, "points": points,
                "solution": False}
    if kind == "setup":
        return {**base, "grade": False, "grade_id": grade_id, "locked": True, "solution": False}
    return None


def parse(text: str, name: str = "<source>"):
    """Split a percent source into (kind, grade_id, points, source) tuples."""
    cells, cur = [], None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            m = HEADER.match(line)
            if not m or m["kind"] not in KINDS:
                raise SourceError(f"{name}:{lineno}: bad cell header {line!r}")
            kind, gid = m["kind"], m["id"]
            if kind in ("setup", "solution", "test") and not gid:
                raise SourceError(f"{name}:{lineno}: a [{kind}] cell needs an id")
            if kind == "test" and not gid.startswith("test_"):
                raise SourceError(f"{name}:{lineno}: test ids start with test_, got {gid!r}")
            points = float(m["points"]) if m["points"] else (1.0 if kind == "test" else None)
            if points is not None and points.is_integer():
                points = int(points)
            cur = [kind, gid, points, []]
            cells.append(cur)
        elif cur is None:
            if line.strip():
                raise SourceError(f"{name}:{lineno}: text before the first '# %%' header")
        else:
            cur[3].append(line)
    out, seen = [], set()
    for kind, gid, points, lines in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "markdown":
            lines = [re.sub(r"^# ?", "", ln) if ln.startswith("#") else ln for ln in lines]
        if gid:
            if gid in seen:
                raise SourceError(f"{name}: duplicate cell id {gid!r}")
            seen.add(gid)
        out.append((kind, gid, points, "\n".join(lines)))
    return out


def build_notebook(src: Path) -> nbformat.NotebookNode:
    cells = []
    for i, (kind, gid, points, source) in enumerate(parse(src.read_text(), str(src))):
        cid = gid or hashlib.sha1(f"{src.stem}-{i}".encode()).hexdigest()[:12]
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(source, id=cid)
        else:
            cell = nbformat.v4.new_code_cell(source, id=cid)
        meta = _nbgrader_meta(kind, gid, points)
        if meta:
            cell.metadata["nbgrader"] = meta
        if kind == "test":
            cell.metadata["tags"] = ["graded-test"]
        cells.append(cell)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nbformat.validate(nb)
    return nb


def write(nb, path: Path):
    path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")


def build_all(src_dir: Path, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(src_dir.glob("[0-9][0-9]_*.py")):
        path = out_dir / f"{src.stem}.ipynb"
        write(build_notebook(src), path)
        written.append(path)
    return written
