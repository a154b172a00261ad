"""The grading fast path: which cells of a normalised submission only demonstrate, so the
sandbox may leave them out (issue 15, item 6). Runs in the coordinator, at normalise time.

A cell is left out only when all of these hold:
- it is a plain code cell of the released notebook (no nbgrader role, not tagged `keep`),
  handed in with exactly the released text: a cell the student wrote or edited always runs;
- nothing that runs after it reads a name it binds or changes. Names come from Python's
  own symbol tables: every notebook-level name a cell reads, inside its functions too (their
  parameters and locals excluded), so a student's answer that uses a variable a
  demonstration defined keeps that demonstration, and whatever it reads in turn.
A cell whose code cannot be parsed, or a cell magic, may read anything: every demonstration
above it runs.

What is left out runs nowhere; its only output is a line saying so (tfsgrade.sandbox_runner).
Nothing graded depends on it: the round trip proves that for the course (every solution
notebook keeps full marks with its demonstrations left out); `tfs-grade --run-demos` runs
everything.
"""
from __future__ import annotations

import ast
import functools

from .cells import key as _key

MARK = "tfsgrade_demo"     # cell metadata set here, read by the runner; never trusted from input
KEEP = "keep"              # a cell tag: the author says this plain cell must always run


@functools.lru_cache(maxsize=1)
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager()


def _python(src: str) -> str:
    try:
        return _transformer().transform_cell(src)
    except Exception:  # noqa: BLE001 - no IPython: magics make the cell unparsable below
        return src


def _tables(table):
    yield table
    for child in table.get_children():
        yield from _tables(child)


@functools.lru_cache(maxsize=4096)   # a class hands in the same demonstration texts again and again
def names(src: str) -> tuple[frozenset, frozenset] | None:
    """(binds, reads) of one cell, or None when unknown (it does not parse, a star import, or a
    cell magic such as %%time, whose body is a string to the parser).

    binds: the names the cell binds or changes in the notebook's namespace: assigned, defined,
    imported or deleted at the top, declared global and assigned in a function, or the base of
    an attribute or item it assigns (`x.a = ...`, `x[0] = ...`).
    reads: the notebook-level names it may read, at the top or inside its functions, classes and
    comprehensions (their own locals and parameters excluded); `x += 1` and `del x` read x."""
    import symtable
    if src.lstrip().startswith("%%"):
        return None
    code = _python(src)
    try:
        tree, top = ast.parse(code), symtable.symtable(code, "<cell>", "exec")
    except (SyntaxError, ValueError, TypeError):
        return None
    binds = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    reads = set()
    for t in _tables(top):
        binds |= {s.get_name() for s in t.get_symbols() if s.is_global() and s.is_assigned()}
        reads |= {s.get_name() for s in t.get_symbols() if s.is_global() and s.is_referenced()}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del):
            binds.add(node.id)
            reads.add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            reads.add(node.target.id)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            base = node.value
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(base, ast.Name):
                binds.add(base.id)
    return frozenset(binds), frozenset(reads)


def _plain(c) -> bool:
    nbg = c.get("metadata", {}).get("nbgrader")
    return c.get("cell_type") == "code" and not (isinstance(nbg, dict) and nbg)


def demo_texts(released) -> set[str]:
    """The texts of the released notebook's demonstration cells."""
    return {_key(c.source) for c in released.cells
            if _plain(c) and KEEP not in c.get("metadata", {}).get("tags", [])}


def mark(cells, texts: set[str]) -> int:
    """Set MARK on the cells that may be left out (any MARK the input carried is dropped);
    returns how many. One pass from the last cell up, carrying the names still needed."""
    needed: set[str] = set()
    anything = False                                # an unparsable cell below needs it all
    n = 0
    for c in reversed(cells):
        c.setdefault("metadata", {}).pop(MARK, None)
        if c.get("cell_type") != "code":
            continue
        found = names(c.source)
        if not anything and found is not None and _plain(c) and _key(c.source) in texts \
                and not (found[0] & needed):
            c.metadata[MARK] = True
            n += 1
            continue
        if found is None:
            anything = True
        else:
            needed |= found[1]
    return n
