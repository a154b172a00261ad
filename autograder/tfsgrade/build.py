"""Build the instructor notebooks in solutions/ from their percent-format sources.

A source `solutions/src/NN_name.py` is a Python file split into cells by `# %%` lines:

    # %% [markdown]                   markdown; each line loses its leading "# "
    # %%                              an ordinary code cell
    # %% [setup] setup_imports        a read-only code cell that the checks rely on
    # %% [solution] softmax           the exercise cell (grade_id = the name it defines)
    # %% [tests] softmax              the exercise's graded test cells, generated from its spec
                                      (tfscratch.specs: `Exercise(..., graded=(Graded(id,
                                      points, hidden_seed=...), ...))`): one read-only cell per
                                      Graded, `chk.<id>(softmax)`, and the same call on the
                                      hidden seed between nbgrader's hidden-test markers
    # %% [export]                     an ordinary code cell whose code is also exported
    # %% [keep]                       an ordinary code cell that grading always runs (tagged
                                      `keep`): by default the grader leaves out unchanged
                                      ordinary cells that no later cell reads a name from
                                      (tfsgrade.demos); use it for a side effect that later
                                      cells rely on without naming it

Exporting to the reference package (`tfsgrade.reference_writer`, run by `make release`):

    #| default_exp attention          first line(s) of the file, before any cell: the module
                                      helpers/tfscratch/reference/attention.py that this
                                      source exports to (no line: nothing is exported)
    # %% [solution] softmax           every solution cell is exported (markers removed)...
    # %% [solution] softmax noexport  ...unless marked noexport (a later notebook redefines it)
    # %% [export]                     supporting code the reference needs, shown as a plain cell
    # %% [answer] q_masked_row 1        a free-text answer, graded by hand (1 point): a markdown
                                      cell; its model answer sits between "### BEGIN SOLUTION"
                                      and "### END SOLUTION" lines, which the student version
                                      replaces by "YOUR ANSWER HERE"

The file diffs well and runs as plain Python; the .ipynb files it produces are what nbgrader
reads. `build_all` is deterministic: the same source always gives the same bytes.

Two things are added to what the source says:
- test cells and ordinary (demo) code cells are tagged `raises-exception`, so that JupyterLab's
  Run All goes on past a failing check or a demo that needs an exercise not done yet (the cell
  still shows its error, and a test cell still scores 0: nbgrader reads its error output);
  setup and solution cells are not, so Run All still stops where everything after would fail;
- a last, ungraded cell "progress" runs the visible part of every test cell again and shows a
  table (tfscratch.progress.check_all), generated here so the source stays the one truth.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import NamedTuple

import nbformat

HEADER = re.compile(r"^# %%(?:\s+\[(?P<kind>\w+)\])?(?:\s+(?P<id>[\w.-]+))?(?:\s+(?P<points>[\d.]+))?"
                    r"(?:\s+(?P<flag>noexport))?\s*$")
KINDS = {None, "markdown", "setup", "solution", "tests", "export", "answer", "keep"}
DIRECTIVE = re.compile(r"^#\| (?P<key>\w+) (?P<value>.+?)\s*$")
DIRECTIVES = {"default_exp"}   # which shortcuts an exercise may not use: its spec (tfscratch.shortcuts)


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
    if kind == "answer":  # nbgrader's "manually graded answer" cell
        return {**base, "grade": True, "grade_id": grade_id, "locked": False, "points": points,
                "solution": True}
    return None


class Cell(NamedTuple):
    kind: str | None  # None (plain code), markdown, setup, solution, test, export, answer, keep
    grade_id: str | None
    points: float | int | None
    source: str
    export: bool  # its code goes to the reference module (solution cells unless noexport)
    exercise: str | None = None   # a test cell's exercise (the [tests] line it was made from)


def test_cells(exercise: str, graded) -> list[Cell]:
    """The test cells of one exercise, from its spec's Graded entries."""
    out = []
    for g in graded:
        text = f"chk.{g.id}({exercise})"
        if g.hidden_seed is not None:
            text += (f"\n### BEGIN HIDDEN TESTS\nchk.{g.id}({exercise}, seed={g.hidden_seed})"
                     "\n### END HIDDEN TESTS")
        out.append(Cell("test", g.id, g.points, text, False, exercise))
    return out


def _spec_of(name: str) -> dict:
    """{exercise: its Graded cells} of the notebook whose source is `name` (its file stem is
    the assignment: solutions/src/01_attention.py -> 01_attention)."""
    from tfscratch.specs import engine
    return {ex.name: ex.graded for ex in engine.specs_for(Path(name).stem)}


def directives(text: str, name: str = "<source>") -> dict:
    """The `#| key value` lines before the first cell: {"default_exp": "attention"}."""
    out: dict = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            break
        m = DIRECTIVE.match(line)
        if m:
            if m["key"] not in DIRECTIVES:
                raise SourceError(f"{name}:{lineno}: unknown directive {line!r} "
                                  f"(known: {', '.join(sorted(DIRECTIVES))})")
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", m["value"]):
                raise SourceError(f"{name}:{lineno}: {m['value']!r} is not a module name")
            out[m["key"]] = m["value"]
    return out


def parse(text: str, name: str = "<source>"):
    """Split a percent source into (kind, grade_id, points, source) tuples."""
    return [c[:4] for c in parse_cells(text, name)]


def parse_cells(text: str, name: str = "<source>", graded: dict | None = None) -> list[Cell]:
    """Split a percent source into Cells (parse() gives the same as plain tuples); each
    `[tests] exercise` line becomes that exercise's test cells, from `graded` ({exercise:
    Graded cells}; default: the spec of the notebook `name` names)."""
    cells, cur = [], None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            m = HEADER.match(line)
            if m and m["kind"] == "test":
                raise SourceError(f"{name}:{lineno}: {line!r}: test cells are generated from the "
                                  "exercise's spec; write `# %% [tests] <exercise>` once, after its "
                                  "[solution] cell, and declare the cells in its spec "
                                  "(Exercise(..., graded=(Graded(id, points, hidden_seed=...), ...)))")
            if not m or m["kind"] not in KINDS:
                raise SourceError(f"{name}:{lineno}: bad cell header {line!r}")
            kind, gid = m["kind"], m["id"]
            if kind in ("setup", "solution", "tests", "answer") and not gid:
                raise SourceError(f"{name}:{lineno}: a [{kind}] cell needs an id")
            if kind in ("export", "keep") and (gid or m["points"]):
                raise SourceError(f"{name}:{lineno}: an [{kind}] cell takes no id or points")
            if kind == "tests" and m["points"]:
                raise SourceError(f"{name}:{lineno}: a [tests] line names its exercise only; "
                                  "the points are its spec's (Graded)")
            if m["flag"] and kind != "solution":
                raise SourceError(f"{name}:{lineno}: only a [solution] cell can be noexport")
            if kind == "answer" and not gid.startswith("q_"):
                raise SourceError(f"{name}:{lineno}: answer ids start with q_, got {gid!r}")
            points = (float(m["points"]) if m["points"]
                      else (1.0 if kind == "answer" else None))
            if points is not None and points.is_integer():
                points = int(points)
            export = kind == "export" or (kind == "solution" and not m["flag"])
            cur = [kind, gid, points, [], export]
            cells.append(cur)
        elif cur is None:
            if line.strip() and not DIRECTIVE.match(line):
                raise SourceError(f"{name}:{lineno}: text before the first '# %%' header "
                                  "(only `#| default_exp MODULE` may come first)")
        else:
            cur[3].append(line)
    out, seen = [], set()
    for kind, gid, points, lines, export in cells:
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if kind == "tests":
            out += _tests(name, gid, lines, graded, seen)
            continue
        if kind in ("markdown", "answer"):
            lines = [re.sub(r"^# ?", "", ln) if ln.startswith("#") else ln for ln in lines]
        if gid:
            if gid in seen:
                raise SourceError(f"{name}: duplicate cell id {gid!r}")
            seen.add(gid)
        if kind == "answer" and not ("### BEGIN SOLUTION" in lines and "### END SOLUTION" in lines):
            raise SourceError(f"{name}: answer cell {gid!r} needs a model answer between "
                              "'### BEGIN SOLUTION' and '### END SOLUTION' lines")
        out.append(Cell(kind, gid, points, "\n".join(lines), export))
    return out


def _tests(name: str, exercise: str, lines: list, graded: dict | None, seen: set) -> list[Cell]:
    if lines:
        raise SourceError(f"{name}: the [tests] cell of {exercise!r} is generated from its spec; "
                          "it holds no text")
    graded = _spec_of(name) if graded is None else graded
    if not graded.get(exercise):
        raise SourceError(f"{name}: [tests] {exercise}: no exercise {exercise!r} with graded cells "
                          f"in the spec of {Path(name).stem} (its exercises: {', '.join(graded) or 'none'})")
    cells = test_cells(exercise, graded[exercise])
    for c in cells:
        if c.grade_id in seen:
            raise SourceError(f"{name}: duplicate cell id {c.grade_id!r}")
        seen.add(c.grade_id)
    return cells


def build_notebook(src: Path) -> nbformat.NotebookNode:
    cells = []
    for i, (kind, gid, points, source) in enumerate(parse(src.read_text(), str(src))):
        cid = gid or hashlib.sha1(f"{src.stem}-{i}".encode()).hexdigest()[:12]
        if kind in ("markdown", "answer"):
            cell = nbformat.v4.new_markdown_cell(source, id=cid)
        else:
            cell = nbformat.v4.new_code_cell(source, id=cid)
        meta = _nbgrader_meta(kind, gid, points)
        if meta:
            cell.metadata["nbgrader"] = meta
        if kind == "test":
            cell.metadata["tags"] = ["graded-test", "raises-exception"]
        elif kind is None:
            cell.metadata["tags"] = ["raises-exception"]
        elif kind == "keep":
            cell.metadata["tags"] = ["keep", "raises-exception"]
        cells.append(cell)
    cells.append(progress_cell(parse(src.read_text(), str(src))))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nbformat.validate(nb)
    return nb


PROGRESS_ID = "progress"
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?",
                    re.M | re.S)


def progress_cell(parsed):
    """The generated last cell: the visible source of every test cell, run again by
    tfscratch.progress.check_all. Not graded, and it never raises."""
    rows, answers = [], []
    for kind, gid, points, source in parsed:
        if kind == "test":
            visible = HIDDEN.sub("", source).rstrip()
            rows.append(f"    ({gid!r}, {points!r}, {visible!r}),")
        elif kind == "answer":     # graded by hand: listed, so the table counts every point
            answers.append(f"({gid!r}, {points!r})")
    source = "\n".join([
        "# Progress: the visible checks of this notebook, run again now (passed / failed / not",
        "# done), and the free-text answers graded by hand. Generated from the cells above;",
        "# call check_all() in any cell to see it.",
        "from tfscratch.progress import check_all",
        "",
        "check_all([",
        *rows,
        f"], globals(), answers=[{', '.join(answers)}])",
    ])
    cell = nbformat.v4.new_code_cell(source, id=PROGRESS_ID)
    cell.metadata["tags"] = ["progress"]
    cell.metadata["editable"] = False
    cell.metadata["jupyter"] = {"source_hidden": True}  # the table is what matters, not the list
    return cell


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
