"""Progress at a glance: run a notebook's visible checks again and show one table.

Every built notebook ends with a generated cell (autograder/tfsgrade/build.py) that calls

    check_all([(grade_id, points, visible_test_source), ...], globals())

with the visible part of each graded test cell (hidden tests stripped). The table is computed
by running those sources again now, never from stored results. `check_all()` with no arguments,
in any cell, runs the same list again: the one the last cell passed, or else the graded test
cells of the notebook this kernel belongs to (JupyterLab tells the kernel its path).

Like the checks, this never writes to stderr, never raises, and returns None (a number as a
cell's last value would become nbgrader partial credit).
"""
from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
import sys
import types
import warnings
from pathlib import Path

__all__ = ["check_all", "run_checks", "strip_hidden"]

_LAST: list = []
_LAST_ANSWERS: list = []
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?",
                     re.M | re.S)


def strip_hidden(source: str) -> str:
    return _HIDDEN.sub("", source).rstrip()


def _first_line(text: str, width: int = 160) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def _as_written(ns) -> dict:
    """A copy of `ns` in which a course wrapper of an exercise is replaced by the learner's own
    function: 10 rebinds `flash_attention` to a wrapper that trains through FlashAttention and
    marks it with `learners_loop` (the learner's loop); the checks of Exercise 2 are about
    that loop. Only a function carrying that mark is replaced."""
    def own(v):
        if isinstance(v, types.FunctionType) and isinstance(v.__dict__.get("learners_loop"), types.FunctionType):
            return v.__dict__["learners_loop"]
        return v
    return {k: own(v) for k, v in ns.items()}


def run_checks(tests, ns) -> list[dict]:
    """Run each visible test source in a copy of `ns`; one result per test:
    {grade_id, points, earned, status: passed | failed | not done, detail}."""
    from .checks.core import CheckFailed
    rows = []
    for grade_id, points, source in tests:
        status, detail = "passed", ""
        sink = io.StringIO()
        try:
            code = compile(source, f"<progress {grade_id}>", "exec")
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(code, _as_written(ns))  # a copy: a test cell's names do not leak into yours
        except NotImplementedError as e:
            status, detail = "not done", _first_line(e) or "not implemented yet"
        except NameError as e:
            status, detail = "not done", f"{_first_line(e)}: run the exercise cell above it"
        except CheckFailed as e:
            status, detail = "failed", _first_line(e)
        except Exception as e:  # noqa: BLE001 - a crash is a failed check, not a crash here
            status, detail = "failed", f"{type(e).__name__}: {_first_line(e)}"
        rows.append({"grade_id": grade_id, "points": points,
                     "earned": points if status == "passed" else 0, "status": status,
                     "detail": detail})
    return rows


_MARK = {"passed": ("\u2714", "#1a7f37"), "failed": ("\u2718", "#cf222e"),
         "not done": ("\u25cb", "#6e7781"), "by hand": ("\u270e", "#6e7781")}
BY_HAND = "a free-text answer: write it in the cell under the question; graded by hand"


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


class _Table:
    """Rich (HTML) and plain views of the results; its repr is never a number."""

    def __init__(self, rows, answers=()):
        self.rows = rows + [{"grade_id": gid, "points": pts, "earned": "-", "status": "by hand",
                             "detail": BY_HAND} for gid, pts in answers]
        self.earned = sum(r["earned"] for r in rows)
        self.total = sum(r["points"] for r in rows)
        self.by_hand = sum(p for _, p in answers)
        self.counts = {s: sum(r["status"] == s for r in self.rows) for s in _MARK}

    def summary(self) -> str:
        c = self.counts
        hand = (f" {c['by hand']} free-text answer{'s' if c['by hand'] != 1 else ''} "
                f"({_fmt(self.by_hand)} point{'s' if self.by_hand != 1 else ''}) "
                f"{'are' if c['by hand'] != 1 else 'is'} graded by hand." if c["by hand"] else "")
        return (f"Progress: {_fmt(self.earned)} of {_fmt(self.total)} points from the visible "
                f"checks ({c['passed']} passed, {c['failed']} failed, {c['not done']} not done). "
                "Hidden tests are graded too." + hand)

    def __repr__(self) -> str:
        w = max([len(r["grade_id"]) for r in self.rows] + [4])
        lines = [self.summary()]
        for r in self.rows:
            mark = _MARK[r["status"]][0]
            lines.append(f"{mark} {r['grade_id']:<{w}} {_fmt(r['earned']):>3}/{_fmt(r['points']):<3}"
                         f" {r['status']}" + (f": {r['detail']}" if r["detail"] else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        body = []
        for r in self.rows:
            mark, colour = _MARK[r["status"]]
            body.append(
                f"<tr><td style='text-align:left'><code>{html.escape(r['grade_id'])}</code></td>"
                f"<td>{_fmt(r['earned'])} / {_fmt(r['points'])}</td>"
                f"<td style='color:{colour};text-align:left;white-space:nowrap'>{mark} "
                f"{r['status']}</td>"
                f"<td style='text-align:left'>{html.escape(r['detail'])}</td></tr>")
        return ("<div class='tfs-progress'><p><b>" + html.escape(self.summary()) + "</b></p>"
                "<table><thead><tr><th style='text-align:left'>test</th><th>points</th>"
                "<th style='text-align:left'>status</th><th style='text-align:left'>what the "
                "check says</th></tr></thead><tbody>" + "".join(body) + "</tbody></table></div>")


def _tests_from_session_notebook():
    """The graded test cells of the notebook this kernel runs, read from disk (JupyterLab sets
    JPY_SESSION_NAME to its path)."""
    name = os.environ.get("JPY_SESSION_NAME")
    if not name:
        return []
    for path in (Path(name), Path.cwd() / Path(name).name):
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        tests = []
        for cell in nb.get("cells", []):
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.get("cell_type") == "code" and meta.get("grade") and \
                    str(meta.get("grade_id", "")).startswith("test_"):
                src = cell.get("source", "")
                src = "".join(src) if isinstance(src, list) else src
                tests.append((meta["grade_id"], meta.get("points", 0), strip_hidden(src)))
        return tests
    return []


def check_all(tests=None, ns=None, answers=None) -> None:
    """Run the notebook's visible checks again and show passed / failed / not done, with
    points, and list the free-text answers (`answers`: [(grade_id, points)]), which are graded
    by hand. In a notebook: `check_all()` in any cell."""
    try:
        global _LAST, _LAST_ANSWERS
        if ns is None:
            ns = sys._getframe(1).f_globals
        if tests is None:
            tests = _LAST or _tests_from_session_notebook()
            answers = _LAST_ANSWERS if answers is None else answers
        else:
            _LAST = list(tests)
            _LAST_ANSWERS = list(answers or ())
        if not tests:
            print("No checks to run: run the last cell of the notebook (Progress) once, or "
                  "pass the tests to check_all.")
            return None
        table = _Table(run_checks(tests, ns), answers or ())
        try:
            from IPython import get_ipython
            from IPython.display import display
            if get_ipython() is not None:
                display(table)
                return None
        except ImportError:
            pass
        print(repr(table))
    except Exception as e:  # noqa: BLE001 - the progress table must never fail a notebook
        print(f"(progress table unavailable: {type(e).__name__}: {e})")
    return None
