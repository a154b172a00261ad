"""A notebook's own definitions, read from its source, for the benches: a bench measures the
code the notebook runs, not a copy of it (one source of truth).

    ns = notebook_defs("09_modern_decoder", "V_COPY", "HALF", "copy_batch", "train_copy")
    ns["train_copy"](model, 150)

Only the named top-level functions, classes and assignments of the source's ordinary code
cells are run, in the order they appear, in a namespace holding torch, torch.nn.functional as
F, math and time (what those cells use)."""
from __future__ import annotations

import ast
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tfsgrade import build, paths


def _binds(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def notebook_defs(assignment: str, *names: str) -> dict:
    src = Path(paths.SOURCES) / f"{assignment}.py"
    ns = {"torch": torch, "F": F, "math": math, "time": time}
    wanted = set(names)
    for cell in build.parse_cells(src.read_text(encoding="utf-8"), str(src)):
        if cell.kind is not None or cell.source.lstrip().startswith(("%", "!")):
            continue
        keep = [n for n in ast.parse(cell.source).body if _binds(n) & wanted]
        if keep:
            exec(compile(ast.Module(keep, type_ignores=[]), f"<{assignment}>", "exec"), ns)  # noqa: S102
    missing = wanted - set(ns)
    if missing:
        raise KeyError(f"{assignment}'s source defines none of {sorted(missing)}")
    return ns
