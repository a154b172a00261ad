"""The import rules of docs/architecture.md, enforced by reading every import statement
(module level and inside functions) of the two packages."""
import ast
from pathlib import Path

import pytest

from nbtools import REPO

DEMO = ("tfscratch.plots", "tfscratch.widgets", "tfscratch.fallback", "tfscratch.seq2seq")
TESTS = ("tests", "nbtools", "catalogue", "tools")
# (folder, imports it must never make, why)
RULES = [
    ("helpers/tfscratch", ("tfsgrade", "nbgrader") + TESTS,
     "the helpers run inside the learner's kernel: they never import the grader or the tests"),
    ("helpers/tfscratch/reference", ("tfscratch.checks", "matplotlib", "ipywidgets") + DEMO,
     "the checks import the reference (a cycle), and it must not load plotting on import"),
    ("helpers/tfscratch/checks", ("matplotlib", "ipywidgets") + DEMO,
     "checks judge; they draw nothing and do not depend on the notebooks' demo code"),
    ("helpers/tfscratch/specs", ("tfscratch.checks", "matplotlib", "ipywidgets") + DEMO,
     "the independent check must not depend on the in-kernel checks or demo code"),
    ("autograder/tfsgrade", DEMO + TESTS,
     "the grader imports the specs (tfscratch.checks, tfscratch.reference), never demo code"),
]


def module_name(path: Path, root: Path = REPO) -> str:
    rel = path.relative_to(root)
    parts = list(rel.parts[1:])  # drop helpers/ or autograder/
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, relative ones resolved."""
    mod = module_name(path, root)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from pkg import sub` may import a submodule: judge pkg.sub too
            out += [(node.lineno, target)] + [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return out


def violations(folder: str, forbidden, root: Path = REPO) -> list[str]:
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        for line, target in imports(path, root):
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(root)}:{line} imports {target}")
    return sorted(set(bad))


@pytest.mark.parametrize("folder,forbidden,why", RULES, ids=[r[0] for r in RULES])
def test_import_rules(folder, forbidden, why):
    bad = violations(folder, forbidden)
    assert not bad, f"{why}:\n" + "\n".join(bad)


OUTSIDE = ("nbgrader", "matplotlib", "ipywidgets")   # the outside libraries the picture shows


def _part(module: str) -> str | None:
    """The part of the course a module belongs to: tfsgrade, tfscratch.<first name>, or one of
    OUTSIDE (None: anything else, torch and the standard library included)."""
    p = module.split(".")
    if p[0] == "tfsgrade":
        return "tfsgrade"
    if p[0] == "tfscratch":
        return ".".join(p[:2])
    return p[0] if p[0] in OUTSIDE else None


def import_graph(root: Path = REPO) -> dict:
    """{part: the other parts it imports}, from every import statement of the two packages."""
    graph: dict = {}
    for folder in ("autograder/tfsgrade", "helpers/tfscratch"):
        for path in (root / folder).rglob("*.py"):
            src = _part(module_name(path, root))
            for _, target in imports(path, root):
                dst = _part(target)
                if dst and dst != src:
                    graph.setdefault(src, set()).add(dst)
    return graph


def test_the_architecture_picture_is_the_import_graph():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```imports\n", 1)[1].split("```", 1)[0]
    drawn = {}
    for line in block.strip().splitlines():
        src, dsts = (x.strip() for x in line.split("->"))
        drawn[src] = {d.strip() for d in dsts.split(",")}
    actual = import_graph()
    lines = [f"{k} -> {', '.join(sorted(v))}" for k, v in sorted(actual.items())]
    assert drawn == actual, ("docs/architecture.md's import graph is not the code's; the code "
                             "has:\n" + "\n".join(lines))


def _block(text: str, name: str) -> list[tuple[str, str]]:
    """The lines `left: right` (or `left -> right`) of a fenced block of docs/architecture.md."""
    body = text.split(f"```{name}\n", 1)[1].split("```", 1)[0]
    sep = ":" if name == "stages" else "->"
    return [tuple(x.strip() for x in ln.split(sep, 1)) for ln in body.strip().splitlines()]


def test_every_grader_module_has_one_stage_and_the_picture_is_the_stage_graph():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = _block(text, "stages")
    order = [s for s, _ in rows]
    listed = [(m.strip(), s) for s, mods in rows for m in mods.split(",")]
    stage = dict(listed)
    mods = {p.stem for p in (REPO / "autograder" / "tfsgrade").glob("*.py")}
    assert len(listed) == len(stage), "a module is in two stages"
    assert set(stage) == mods, f"without a stage: {sorted(mods - set(stage))}; gone: {sorted(set(stage) - mods)}"
    actual: dict = {}
    for p in (REPO / "autograder" / "tfsgrade").glob("*.py"):
        for _, t in imports(p):
            parts = t.split(".")
            if parts[0] == "tfsgrade" and len(parts) > 1 and parts[1] in stage \
                    and stage[parts[1]] != stage[p.stem]:
                actual.setdefault(stage[p.stem], set()).add(stage[parts[1]])
    drawn = {s: {d.strip() for d in ds.split(",")} for s, ds in _block(text, "stage-imports")}
    lines = [f"{k:8} -> {', '.join(sorted(v, key=order.index))}" for k, v in
             sorted(actual.items(), key=lambda kv: order.index(kv[0]))]
    assert drawn == actual, "docs/architecture.md's stage graph is not the code's:\n" + "\n".join(lines)
    later = {(a, b) for a, bs in actual.items() for b in bs if order.index(b) > order.index(a)}
    excused = {(a, rest.split(":", 1)[0].strip()) for a, rest in _block(text, "stage-exceptions")}
    assert later == excused, f"imports of a later stage without a reason: {sorted(later - excused)}; " \
                             f"reasons for none: {sorted(excused - later)}"


def test_the_scan_finds_a_violation(tmp_path):
    pkg = tmp_path / "helpers" / "tfscratch" / "reference"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text("def f():\n    from ..checks import core\n    return core\n")
    (pkg / "fine.py").write_text("import torch\nfrom .bad import f\n")
    assert violations("helpers/tfscratch/reference", RULES[1][1], tmp_path) == [
        "helpers/tfscratch/reference/bad.py:2 imports tfscratch.checks",
        "helpers/tfscratch/reference/bad.py:2 imports tfscratch.checks.core",
    ]


@pytest.mark.parametrize("name", ["vm.py", "fixtures.py"])
def test_the_probe_machine_imports_torch_numpy_and_the_standard_library_only(name):
    """The check's process runs fixtures.py's text and then vm.py's as one fresh module: neither
    may import the course. vm.py imports fixtures.py only when it is imported from the package,
    where nobody has put that text first."""
    path = REPO / "helpers/tfscratch/specs" / name
    mods = {t for _, t in imports(path) if not (name == "vm.py" and t.startswith("tfscratch.specs.fixtures"))}
    assert {m.split(".")[0] for m in mods} <= {
        "base64", "ctypes", "io", "json", "os", "resource", "sys", "traceback", "types", "warnings",
        "numpy", "torch", "IPython"}, mods   # ctypes: malloc_trim and mallopt


def test_the_checks_machine_carries_the_stand_ins_first_and_imports_nothing_of_the_course():
    """The machine the check's process runs: fixtures.py's text, then vm.py's without its
    PACKAGE_ONLY import, so nothing in the course package as the sandbox holds it is used."""
    from tfscratch.specs import fixtures
    from tfsgrade import verdict
    text = verdict.VM_SOURCE
    assert text.startswith(Path(fixtures.__file__).read_text())
    found = {a.name if isinstance(n, ast.Import) else (n.module or "") for n in ast.walk(ast.parse(text))
             if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert not [m for m in found if m.startswith(("tfscratch", "tfsgrade", "."))], found
    assert not [ln for ln in text.splitlines() if ln.rstrip().endswith(verdict.PACKAGE_ONLY)]
    ns = {"__builtins__": __builtins__, "__name__": "tfs_probe_vm"}
    exec(compile(text, "tfs_probe_vm", "exec"), ns)   # noqa: S102 - the course's own text
    assert set(ns["FIXTURES"]) == set(fixtures.FIXTURES) and set(ns["DRIVERS"]) == set(fixtures.DRIVERS)
    assert ns["FIXTURES"]["toy_lm"].__module__ == "tfs_probe_vm", "the stand-ins came from the package"


def _module_level_deps(pkg: Path, name: str) -> dict:
    """{module: the modules of the same package it imports at module level}."""
    graph = {}
    for p in pkg.glob("*.py"):
        deps = set()
        for n in ast.parse(p.read_text()).body:
            if isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                if n.level == 1:
                    deps |= {mod.split(".")[0]} if mod else {a.name for a in n.names}
                elif mod == name:
                    deps |= {a.name for a in n.names}
                elif mod.startswith(name + "."):
                    deps.add(mod.split(".")[1])
        graph[p.stem] = deps & {q.stem for q in pkg.glob("*.py")}
    return graph


def _cycle(graph: dict) -> list | None:
    state, path = {}, []

    def visit(u):
        state[u] = "open"
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                return path[path.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        state[u] = "done"
        path.pop()
        return None
    return next((c for u in sorted(graph) if u not in state and (c := visit(u))), None)


def test_no_import_circle_in_the_grader():
    """The grader's modules import one another without a circle (issue 28); where a stage needs
    a later one it imports it inside a function. `paths` imports nothing of the package."""
    graph = _module_level_deps(REPO / "autograder" / "tfsgrade", "tfsgrade")
    assert _cycle(graph) is None, f"import circle: {' -> '.join(_cycle(graph))}"
    assert graph["paths"] == set()
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]      # the check can fail


def test_no_function_over_60_lines():
    """Issue 28: a function of the grader or the helpers fits on a screen (the generated
    reference is the solutions' code and is left out)."""
    long = []
    for folder in ("autograder", "helpers"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if "reference" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > 60:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these:\n" + "\n".join(long)
