"""Checks called by the notebooks' test cells, one module per notebook."""
from .core import CheckFailed, ShortcutUsed, no_shortcuts  # noqa: F401
