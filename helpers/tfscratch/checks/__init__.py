"""Checks called by the notebooks' test cells, one module per notebook.

Test cells must write nothing to stderr (nbgrader scores such a cell 0), yet the notebooks do
not silence warnings: a warning the student's own code raises in a demo cell teaches something.
So every public `check_*` function of every check module runs with warnings caught: whatever
the student's code or the check itself warns about inside a test cell stays out of stderr.
"""
import functools
import importlib
import pkgutil
import warnings

from .core import CheckFailed, NotDone, ShortcutUsed, no_shortcuts  # noqa: F401
from .display import details, install_ipython_hook
from .runner import check, notebook  # noqa: F401

def _quiet(fn):
    if getattr(fn, "_tfs_quiet", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    wrapper._tfs_quiet = True
    return wrapper


def _silence(module):
    for name, obj in list(vars(module).items()):
        if name.startswith("check_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__:
            setattr(module, name, _quiet(obj))


for _m in pkgutil.iter_modules(__path__):  # every check module, those added later included
    if _m.name not in ("core", "runner", "display") and not _m.name.startswith("_"):
        _silence(importlib.import_module(f"{__name__}.{_m.name}"))

install_ipython_hook()  # in a notebook: a stub's NotImplementedError is one grey line
