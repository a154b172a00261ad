"""How a check's verdict looks in the notebook: one compact box per failure, one grey line for
an exercise not done yet, one green line per pass.

IPython (and so JupyterLab, nbclient and nbgrader, which all run an IPython kernel) asks an
exception for `_render_traceback_()` before it formats a traceback; `CheckFailed` and `NotDone`
(core.py) answer with the lines built here. The cell still ends in an error output, so nbgrader
scores it 0 exactly as before, but what that output shows is:

    ✘ check_softmax_rows: Rows sum to 1 along the last axis, ...      (what was checked)
      softmax(x) raised RuntimeError: ...                               (the check's message:
      called with: tensor of shape (3, 4), dtype torch.float32           actual vs expected,
      <hint>                                                             and the hint)
      your code, Cell In[5], line 7, in softmax:                        (the student's own line,
          return e / e.sum(dim=0)                                        when it failed there)

and no frame of this package. `install_ipython_hook` (run when tfscratch.checks is imported in a
kernel) also routes other exceptions: a stub's bare NotImplementedError anywhere (a demo cell
calling an exercise not done yet) becomes the same grey line, an unexpected exception inside a
check becomes a box, and everything else gets IPython's usual traceback. Outside IPython nothing
changes: str(exception) is the message.
Set TFS_FULL_TRACEBACK=1 (or call `details()` after a failure) for the full traceback.
"""
from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import traceback
from pathlib import Path

__all__ = ["render_failure", "render_not_done", "stub_name", "green", "details", "in_ipython"]

_PKG = str(Path(__file__).resolve().parents[1])  # .../tfscratch
_LIBS = tuple(sorted({str(Path(p).resolve()) for k, p in sysconfig.get_paths().items()
                      if k in ("stdlib", "platstdlib", "purelib", "platlib") and p}))

RED, GREY, GREEN, CYAN, BOLD, RESET = "\x1b[31m", "\x1b[90m", "\x1b[32m", "\x1b[36m", "\x1b[1m", "\x1b[0m"


def _shell():
    ip = sys.modules.get("IPython")
    if ip is None:
        return None
    try:
        return ip.get_ipython()
    except Exception:  # noqa: BLE001
        return None


def in_ipython() -> bool:
    return _shell() is not None


def green(text: str) -> str:
    """Green in a notebook (ANSI colours render in JupyterLab and nbconvert); plain elsewhere."""
    return f"{GREEN}{text}{RESET}" if in_ipython() else text


def _is_course(filename: str) -> bool:
    try:
        return str(Path(filename).resolve()).startswith(_PKG)
    except (OSError, ValueError):
        return False


def _is_user(filename: str) -> bool:
    """Code the student wrote: a notebook cell or their own file, not this package, not a
    library, not Python itself."""
    if not filename or filename.startswith("<frozen") or filename == "<string>":
        return False
    if filename.startswith("<"):  # <ipython-input-...>, <cell ...>
        return True
    try:
        f = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return not f.startswith(_PKG) and not f.startswith(_LIBS)


def _frames(tb):
    out = []
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _chain(exc):
    seen, out = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return out


def _student_frames(exc, limit=3):
    """The student's frames that the course's code called into, deepest last: from the first
    exception in the chain that failed inside the student's code."""
    for e in _chain(exc):
        frames = _frames(e.__traceback__)
        first_course = next((i for i, (f, _) in enumerate(frames)
                             if _is_course(f.f_code.co_filename)), None)
        start = 0 if first_course is None else first_course + 1
        if first_course is None and e is exc:
            continue  # raised straight from the cell: IPython's own traceback says where
        user = [(f, ln) for f, ln in frames[start:] if _is_user(f.f_code.co_filename)]
        if user:
            return user[-limit:]
    return []


def _where(frame, lineno) -> str:
    fn = frame.f_code.co_filename
    shell = _shell()
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(fn)
    place = f"Cell In[{number}], line {lineno}" if number is not None else \
        f"{Path(fn).name}, line {lineno}"
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return place if name == "<module>" else f"{place}, in {name}"


def _check_frame(exc):
    """The outermost frame of a check function (checks/*.py) in the traceback."""
    for f, _ in _frames(exc.__traceback__):
        if _is_course(f.f_code.co_filename) and f.f_code.co_name.startswith("check_"):
            return f
    return None


def _what_was_checked(exc) -> str:
    if getattr(exc, "title", None):
        return exc.title
    f = _check_frame(exc)
    if f is None:
        return "check failed"
    name = f.f_code.co_name
    fn = f.f_globals.get(name)
    doc = " ".join((getattr(fn, "__doc__", None) or "").split())
    if doc:
        first = doc.split(". ")[0].rstrip(".")
        if len(first) > 110:
            first = first[:107].rstrip() + "..."
        return f"{name}: {first}"
    return name


def render_failure(exc) -> list[str]:
    """The lines IPython shows for a CheckFailed: title, message, the student's line."""
    try:
        lines = [f"{RED}{BOLD}\u2718 {_what_was_checked(exc)}{RESET}"]
        lines += [f"  {ln}" for ln in str(exc).rstrip().splitlines()]
        for frame, lineno in _student_frames(exc):
            src = linecache.getline(frame.f_code.co_filename, lineno,
                                    frame.f_globals).strip()
            lines.append(f"  {CYAN}your code, {_where(frame, lineno)}:{RESET}")
            if src:
                lines.append(f"      {BOLD}{src}{RESET}")
        if os.environ.get("TFS_FULL_TRACEBACK"):
            lines += [f"{GREY}full traceback (TFS_FULL_TRACEBACK is set):{RESET}"]
            lines += "".join(traceback.format_exception(exc)).splitlines()
        return ["\n".join(lines)]
    except Exception:  # noqa: BLE001 - never let the display hide the verdict
        return [f"{type(exc).__name__}: {exc}"]


def render_not_done(exc) -> list[str]:
    return [f"{GREY}\u25cb {exc}{RESET}"]


def raised_by_student(err: BaseException) -> bool:
    """True when the innermost frame of the traceback is the student's own code."""
    frames = _frames(err.__traceback__)
    return bool(frames) and _is_user(frames[-1][0].f_code.co_filename)


def stub_name(err: BaseException, fn) -> str:
    """Name of what is not implemented yet: the student's function that raised (a method as
    Class.method, __init__ as the class), and the exercise that needed it when different."""
    top = getattr(fn, "__name__", None) or type(fn).__name__
    user = [f for f, _ in _frames(err.__traceback__) if _is_user(f.f_code.co_filename)]
    if not user:
        return top
    code = user[-1].f_code
    name = getattr(code, "co_qualname", code.co_name).split("<locals>.")[-1]
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    if name.endswith(".forward") and name.split(".")[0] == top:
        name = top
    if name.split(".")[0] != top:
        return f"{name} (needed by {top})"
    return name


def details(exc: BaseException | None = None) -> None:
    """Print the full traceback of the last failure (or of `exc`), course frames included."""
    exc = exc or getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None:
        print("no failure yet")
        return
    print("".join(traceback.format_exception(exc)), end="")


def _in_checks(tb) -> bool:
    checks = str(Path(__file__).resolve().parent)
    return any(str(Path(f.f_code.co_filename).resolve()).startswith(checks)
               for f, _ in _frames(tb) if not f.f_code.co_filename.startswith("<"))


def render_crash(value) -> list[str]:
    """An unexpected exception inside a check (say, the student's code returned a list where
    the check expected a tensor): the same box as a CheckFailed, with the error as message."""
    msg = (f"the check could not finish: {type(value).__name__}: {value}\n"
           "Check what your code returns (type and shape) against the docstring.")
    crash = _Crash(msg).with_traceback(value.__traceback__)
    crash.__cause__ = value
    return render_failure(crash)


class _Crash(Exception):
    pass


def _handler(shell, etype, value, tb, tb_offset=None):
    """IPython custom handler: a stub's NotImplementedError anywhere in a cell (a demo cell
    that calls an exercise not done yet, too) is one grey line; an unexpected exception inside
    a check is a compact box; everything else gets IPython's usual traceback."""
    try:
        if hasattr(value, "_render_traceback_"):
            stb = value._render_traceback_()
        elif issubclass(etype, NotImplementedError) and _is_stub(tb, value):
            code = _frames(tb)[-1][0].f_code
            name = getattr(code, "co_qualname", code.co_name).split("<locals>.")[-1]
            name = name[: -len(".__init__")] if name.endswith(".__init__") else name
            stb = [f"{GREY}\u25cb {name}: not implemented yet{RESET}"]
        elif _in_checks(tb):
            stb = render_crash(value)
        else:
            shell.showtraceback(running_compiled_code=True)  # what IPython does without us
            return None
    except Exception:  # noqa: BLE001
        stb = [f"{etype.__name__}: {value}"]
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # for details(), %debug
    sys.last_exc = value
    shell._showtraceback(etype, value, stb)
    return None


def _is_stub(tb, value) -> bool:
    frames = _frames(tb)
    return bool(frames) and _is_user(frames[-1][0].f_code.co_filename) and not str(value)


__all__ += ["raised_by_student", "install_ipython_hook"]


def install_ipython_hook() -> None:
    """Route exceptions through `_handler` in this IPython kernel (unless another custom
    handler is already installed)."""
    shell = _shell()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return
    current = getattr(shell, "custom_exceptions", ())
    if current and current != (Exception,):
        return
    shell.set_custom_exc((Exception,), _handler)
