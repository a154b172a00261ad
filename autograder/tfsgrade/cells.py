"""What a cell says, read safely from any notebook (a hostile submission's too, where metadata
or source may have any type): its nbgrader metadata and its source text. Imports nothing of
tfsgrade."""
from __future__ import annotations


def meta(cell) -> dict:
    """A cell's nbgrader metadata as a dict, whatever a submission put there."""
    m = cell.get("metadata", {}) if isinstance(cell, dict) else {}
    m = m.get("nbgrader") if isinstance(m, dict) else None
    return m if isinstance(m, dict) else {}


def source(cell) -> str:
    """A cell's source as one string (nbformat allows a list of lines)."""
    s = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(s) if isinstance(s, list) else str(s or "")
