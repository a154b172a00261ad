"""The course manifest: what the course holds, read from `solutions/src/*.py` and nothing else.

    from tfsgrade import manifest
    m = manifest.load()
    m.names()                              ['01_attention', '02_masks', ...]
    nb = m["03_multihead"]
    nb.exercises[2].name, .points          'MultiHeadAttention', 17
    [t.grade_id for t in nb.exercises[2].tests]
    nb.module, nb.exports                  'multihead', ('split_heads', ...)  (tfscratch.reference)
    nb.reference_imports                   what its [setup] cell imports from tfscratch.reference
    nb.may_import                          what it may import: the exports of earlier notebooks
    nb.answers                             free-text questions graded by hand (grade_id, points)

`tfs-grade manifest` prints it as JSON. The grader, the tests, the browser tests and the bench
read this instead of keeping their own lists, so a new notebook is its source, its check
module, its catalogue and a README row (docs/architecture.md).
"""
from __future__ import annotations

import ast
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from . import build, paths, reference_writer


@dataclass(frozen=True)
class Test:
    grade_id: str
    points: float


@dataclass(frozen=True)
class Exercise:
    name: str  # the solution cell's grade_id = the function or class it defines
    tests: tuple[Test, ...]
    exported: bool  # its solution is in tfscratch.reference

    @property
    def points(self) -> float:
        return sum(t.points for t in self.tests)


@dataclass(frozen=True)
class Notebook:
    name: str  # = the nbgrader assignment id and the file stem, e.g. "01_attention"
    title: str
    source: str  # path relative to the repository
    module: str | None  # tfscratch.reference.<module> it exports to, if any
    exports: tuple[str, ...]  # that module's __all__
    setup_ids: tuple[str, ...]
    exercises: tuple[Exercise, ...]
    reference_imports: tuple[str, ...]  # `from tfscratch.reference import ...` in its setup
    may_import: tuple[str, ...]  # exports of the earlier notebooks
    answers: tuple[Test, ...] = ()  # free-text questions graded by hand (`[answer]` cells)

    @property
    def number(self) -> int:
        return int(self.name[:2])

    @property
    def points(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def grade_ids(self) -> tuple[str, ...]:
        return tuple(t.grade_id for e in self.exercises for t in e.tests)

    def owners(self) -> dict[str, str]:
        """{graded test cell: the exercise it checks}, as the exercises' specs declare them."""
        return {t.grade_id: e.name for e in self.exercises for t in e.tests}

    def exercise(self, name: str) -> Exercise:
        for e in self.exercises:
            if e.name == name:
                return e
        raise KeyError(f"{self.name} has no exercise {name!r}")


@dataclass(frozen=True)
class Manifest:
    notebooks: tuple[Notebook, ...]

    def names(self) -> list[str]:
        return [nb.name for nb in self.notebooks]

    def __getitem__(self, name: str) -> Notebook:
        for nb in self.notebooks:
            if nb.name == name:
                return nb
        raise KeyError(f"no notebook {name!r} in solutions/src/")

    def __iter__(self):
        return iter(self.notebooks)

    def modules_before(self, name: str) -> list[str]:
        """The reference modules of the notebooks before `name`: all that its sandbox holds
        of tfscratch.reference (what it may import; never its own module or a later one)."""
        number = self[name].number
        return [nb.module for nb in self.notebooks if nb.module and nb.number < number]

    def exercises(self) -> list[tuple[str, Exercise]]:
        """(notebook, exercise) for every exercise of the course, in order."""
        return [(nb.name, e) for nb in self.notebooks for e in nb.exercises]

    def to_dict(self) -> dict:
        out = []
        for nb in self.notebooks:
            d = asdict(nb)
            d["points"] = nb.points
            for e, ed in zip(nb.exercises, d["exercises"]):
                ed["points"] = e.points
            out.append(d)
        return {"notebooks": out}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False)


def _reference_imports(cells) -> tuple[str, ...]:
    names = []
    for c in cells:
        if c.kind != "setup":
            continue
        code = "\n".join(ln for ln in c.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        for node in ast.parse(code).body:
            if isinstance(node, ast.ImportFrom) and node.module == reference_writer.PACKAGE:
                names += [a.name for a in node.names]
    return tuple(names)


def read_notebook(src: Path, earlier: tuple[str, ...] = ()) -> Notebook:
    text = src.read_text(encoding="utf-8")
    rel = f"solutions/src/{src.name}"
    cells = build.parse_cells(text, rel)
    ex = reference_writer.collect(src)
    exercises, current = [], None
    for c in cells:
        if c.kind == "solution":
            current = [c.grade_id, [], c.export and ex is not None]
            exercises.append(current)
        elif c.kind == "test":
            owner = next((e for e in reversed(exercises) if e[0] == c.exercise), None)
            if owner is None:   # the [tests] line of an exercise comes after its [solution] cell
                raise build.SourceError(f"{rel}: the tests of {c.exercise} come before its [solution] cell")
            owner[1].append(Test(c.grade_id, c.points))
    return Notebook(
        name=src.stem, title=reference_writer._title(cells), source=rel,
        module=ex.module if ex else None, exports=tuple(ex.names) if ex else (),
        setup_ids=tuple(c.grade_id for c in cells if c.kind == "setup"),
        exercises=tuple(Exercise(n, tuple(t), x) for n, t, x in exercises),
        reference_imports=_reference_imports(cells), may_import=earlier,
        answers=tuple(Test(c.grade_id, c.points) for c in cells if c.kind == "answer"))


def owners(assignment: str) -> dict[str, str]:
    """{graded test cell: its exercise} of one notebook of this course ({} for none)."""
    try:
        return load()[assignment].owners()
    except KeyError:
        return {}


_CACHE: dict = {}


def load(src_dir: Path | None = None) -> Manifest:
    """The manifest of every `NN_name.py` in src_dir (default solutions/src), in order.
    Recomputed whenever a source changes (cached on the files' size and mtime)."""
    src_dir = Path(src_dir or paths.SOURCES)
    sources = sorted(src_dir.glob("[0-9][0-9]_*.py"))
    key = (str(src_dir),) + tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sources)
    if key not in _CACHE:
        notebooks, earlier = [], ()
        for src in sources:
            nb = read_notebook(src, earlier)
            notebooks.append(nb)
            earlier = earlier + nb.exports
        _CACHE.clear()
        _CACHE[key] = Manifest(tuple(notebooks))
    return _CACHE[key]
