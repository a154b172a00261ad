"""Stage 3, judge and merge: the coordinator alone writes the gradebook.

The executed notebooks (from the sandboxed tasks) go into a staging course that holds this
run's notebooks only and writes the term's gradebook, and nbgrader's autograde scores them
with its own preprocessors (locked cells restored from the gradebook, SaveAutoGrades) but
without executing anything: the course's nbgrader_config swaps Execute for RanInSandbox, which
only accepts outputs that the sandbox produced for exactly this cell text. Then the judges run,
in the order `tfsgrade.judges.in_order()` documents (the coordinator's verdict, the static
scan, the copying signals), through nbgrader's Gradebook API; hand grades are carried over
(tfsgrade.hand) and this run's folders move into the term's course directory (OUT/course).
"""
from __future__ import annotations

import hashlib
import shutil

from nbgrader.preprocessors import NbGraderPreprocessor

from . import course, hand, judges, sanitise, term


class RanInSandbox(NbGraderPreprocessor):
    """A code cell counts only with outputs the sandbox recorded for this exact source."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            ran = cell.metadata.get("tfsgrade", {}).get("ran")
            if ran != hashlib.sha256(cell.source.encode()).hexdigest()[:16]:
                cell.outputs = [{"output_type": "error", "ename": "NotExecuted",
                                 "evalue": "this cell was not executed in the grading sandbox",
                                 "traceback": ["NotExecuted: this cell was not executed in the "
                                               "grading sandbox"]}]
            cell.metadata.pop("tfsgrade", None)
        return cell, resources


def term_course(s) -> None:
    """The term's course directory: made by the first run into OUT and kept by every later one
    (its gradebook is the record of the term: hand grades, comments, overrides, times). Each run
    rewrites its nbgrader_config.py and releases the assignments it grades that are new to the
    course or whose solution notebook changed."""
    def src(a):
        p = course.notebook_path(s.course, "source", a)
        return p.read_bytes() if p.exists() else None
    before = {a: src(a) for a in s.names}
    course.make_course(s.course, list(s.names), db_url=s.db_url, timeout=s.limits.cell_timeout,
                       executed_elsewhere=True, extra=term.nbgrader_config(term.load(s.out)))
    todo = [a for a in s.names if before[a] != src(a)
            or not course.notebook_path(s.course, "release", a).exists()]
    if todo:
        course.generate(s.course, todo, reuse=True)


def fresh_course(s) -> None:
    """Only for tests and benchmarks that want nothing of an earlier run: a new course directory."""
    if s.course.exists():
        shutil.rmtree(s.course)
    term_course(s)


def _notes_from_events(it, nb, s) -> list[str]:
    """Say, per exercise, what happened, once and in plain words; never call graded what did
    not run. An endless loop is one clause for the exercise (which function did not return
    within how many seconds, how many of its test cells score 0) and one for each exercise
    built on it, however many cells it cost."""
    out, loops, lost, others = [], {}, {}, {}
    limit = s.limits.cell_timeout
    owner = {}
    cur = None
    for i, c in enumerate(nb.cells):
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        cur = gid or cur
        owner[i] = gid or (f"after {cur}" if cur else "before the first exercise")

    def graded(k):
        return bool(nb.cells[k].get("metadata", {}).get("nbgrader", {}).get("grade"))
    for e in it.result.get("events", []):
        if e["kind"] == "beside_check":   # a process ran while the check of an exercise did
            out.append(f"the independent check of {e['exercise']} could not vouch for its result: "
                       f"another process ran beside it, so the cells of {e['exercise']} score 0 "
                       "(an exercise must compute its answer itself and start no process)")
            continue
        where = f"cell {e['cell']} ({owner.get(e['cell'], '?')})"
        ex = e.get("exercise")
        if e["kind"] in ("timeout", "skipped") and ex:
            if e["kind"] == "timeout":
                loops.setdefault(ex, (e.get("limit") or limit, e.get("calls")))
            tally = lost if graded(e["cell"]) else others
            tally[ex] = tally.get(ex, 0) + 1
        elif e["kind"] == "timeout":
            out.append(f"{where} did not finish within {e.get('limit') or limit} s and was "
                       "interrupted; the cells after it were still run and graded")
        elif e["kind"] == "skipped":
            out.append(f"{where} was not run ({e['why']})" + (": scored 0" if graded(e["cell"]) else ""))
        elif e["kind"] == "stuck":
            out.append(f"{where} ran past the time limit and could not be interrupted: scored 0; "
                       "the kernel was restarted, the cells before it replayed, and the cells "
                       "after it run and graded")
        elif e["kind"] == "died":
            out.append(f"{where}: the kernel died (os._exit, a crash or the memory cap): scored 0; "
                       "a fresh kernel replayed the cells before it and the cells after it were "
                       "run and graded")
        elif e["kind"] == "not_run":
            gids = [owner[k] for k in e["cells"] if graded(k)]
            out.append(f"cells from {where} on were NOT run ({e['why']}); "
                       f"{'their tests score 0: ' + ', '.join(gids) if gids else 'no test among them'}")
    for ex, (lim, calls) in loops.items():
        n = lost.get(ex, 0)
        cells = f"its {n} test cell{'s' if n != 1 else ''} score{'' if n != 1 else 's'} 0"
        said = (f"{ex} calls {calls} and did not return within {lim} s either: {cells}" if calls else
                f"{ex} did not return within {lim} s (an endless loop, or far too slow): {cells}")
        if others.get(ex):
            k = others[ex]
            said += f"; {k} later cell{'s' if k != 1 else ''} that call{'' if k != 1 else 's'} it were not run"
        out.append(said)
    if loops:
        out.append("the other cells were run and graded")
    return out


def merge(items, s) -> None:
    import nbformat
    from nbgrader.api import Gradebook
    stage = _stage(s)
    for it in items:
        if it.status != "pending":
            continue
        res = it.result or {}
        if not res.get("notebook"):
            it.status = "flagged"
            it.reasons.append(res.get("error") or "the task produced no result")
            continue
        nb = nbformat.reads(res["notebook"], as_version=4)
        it.reasons += _notes_from_events(it, nb, s)
        # nothing the student wrote or printed may run in the formgrader or the feedback
        # (tfsgrade.sanitise): nbgrader derives autograded/ and feedback/ from this copy
        nb, notes = sanitise.notebook(nb)
        it.reasons += [f"shown safely: {n}" for n in notes]
        dst = course.notebook_path(stage, "submitted", it.assignment, it.student)
        dst.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dst)
        if it.submitted_at and it.time_known:     # nbgrader reads it into the submission
            (dst.parent / "timestamp.txt").write_text(it.submitted_at)
    with Gradebook(s.db_url) as gb:
        for it in items:
            if it.status == "pending":
                gb.update_or_create_student(it.student)
    pending = [it for it in items if it.status == "pending"]
    if pending:
        # one nbgrader process for every notebook of the run (its assignment argument is a glob;
        # the staging course holds exactly this run's pending items, and writes the term's
        # gradebook): its start-up (about 3 s) is paid once, not once per notebook
        r = course.run_nbgrader(stage, ["autograde", "*", "--force"], timeout=600 + 5 * len(pending))
        if r.returncode != 0:
            s.log(f"  nbgrader autograde reported problems: {(r.stdout + r.stderr)[-800:]}")
    with Gradebook(s.db_url) as gb:
        for judge in judges.in_order():   # one protocol, one documented order
            judge(items, s, gb)
        hand.carry(pending, s, stage, gb)   # hand grades kept; answers edited since: flagged
        _move_in(pending, s, stage)
        max_by_a = {a: float(gb.find_assignment(a).max_score) for a in s.names}
        for it in items:
            if it.status == "pending":
                try:
                    sub = gb.find_submission(it.assignment, it.student)
                    it.score, it.status = float(sub.score), "graded"
                except Exception:  # noqa: BLE001 - nbgrader recorded nothing for it
                    it.status = "flagged"
                    it.reasons.append("nbgrader's autograde recorded no result")
            if it.assignment in max_by_a:
                it.max_score = max_by_a[it.assignment]
    shutil.rmtree(stage, ignore_errors=True)


def _stage(s):
    """A course directory for this run's autograde only (OUT/.autograde): the same assignments
    and the term's gradebook, and in submitted/ this run's notebooks alone, so that nbgrader
    rescores nothing else (an earlier run's copies in OUT/course stay as they were graded)."""
    stage = s.out / ".autograde"
    shutil.rmtree(stage, ignore_errors=True)
    course.make_course(stage, list(s.names), db_url=s.db_url, timeout=s.limits.cell_timeout,
                       executed_elsewhere=True, extra=term.nbgrader_config(term.load(s.out)))
    return stage


def _move_in(pending, s, stage) -> None:
    """This run's submitted and autograded folders replace the course's (feedback follows)."""
    for it in pending:
        for folder in ("submitted", "autograded"):
            src = stage / folder / it.student / it.assignment
            dst = s.course / folder / it.student / it.assignment
            if src.exists():
                shutil.rmtree(dst, ignore_errors=True)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), str(dst))
