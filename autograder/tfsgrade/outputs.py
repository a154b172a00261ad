"""The one writer (issue 29, item 2): every output of a grading folder comes from the gradebook,
the record (tfsgrade.record) and the term (tfsgrade.term), through `write_all`, which both a
grading run and `tfs-grade export` call. No output can disagree with another:

    grades.csv              one row per student (the columns scripts rely on first)
    nbgrader_export.csv     nbgrader's own export (raw score, late penalty, score, times)
    canvas_grades.csv, moodle_grades.csv    the LMS imports (tfsgrade.lms_export)
    report.md / report.html the class report (tfsgrade.report)
    manual_review.md        the free-text answers waiting for a grader (tfsgrade.manual)
    feedback/<student>/<notebook>.html      nbgrader's feedback, and a page for a submission
                                            that could not be graded (what was wrong)

Before writing, the term's dates and policy go into the gradebook: due dates, extensions,
submission times, and each notebook's late penalty, recomputed from its current score (the
coordinator's verdict and hand grades change it after nbgrader's autograde computed one).

An answer waiting for a grader is never a 0: grades.csv says "waiting for a grader" (column
`waiting`), the report counts it apart, the feedback says so beside the cell, and the LMS files
leave that notebook's grade empty (the LMS keeps what it has) until it is graded.
"""
from __future__ import annotations

import csv
import html
import re
import shutil
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path

from . import course, manual, record, term

WAITING = "waiting for a grader"
REVIEW = "review"       # status: code the scan cannot read in an exercise (the points shown, a person decides)
COLUMNS = ["total", "max_total", "status", "notes", "sandbox", "flags", "submitted_at",
           "lms_late", manual.PENDING, "waiting", "late", "late_penalty"]


@dataclass
class Mark:
    """One (student, notebook) as every output shows it."""
    raw: float = 0.0                 # the gradebook's score (auto + hand)
    penalty: float = 0.0             # the late penalty taken off
    max: float = 0.0
    waiting: list = field(default_factory=list)     # [(grade id, points)] not graded yet
    late: str = ""                   # "1.5 day(s) late: -10%" / "late (Canvas): charged 1 day"

    @property
    def score(self) -> float:
        return max(0.0, self.raw - self.penalty)


def names_of(items) -> list[str]:
    have = {it.assignment for it in items}
    return [a for a in course.assignments() if a in have]


def write_all(out: Path, *, db_url: str | None = None, settings=None, run_items=None,
              feedback="all", log=print) -> dict:
    """Write every output of OUT from the gradebook. `feedback`: "all" (regenerate every
    student's), "none", or a set of (student, notebook) whose feedback is regenerated (a run's).
    `run_items`: this run's Items (the report's section on the run). Returns {name: path}."""
    from nbgrader.api import Gradebook
    out = Path(out).resolve()
    db_url = manual.db_url_of(out, db_url)
    items = record.items(out)
    names = names_of(items)
    t = term.load(out)
    with Gradebook(db_url) as gb:
        marks = {(it.student, it.assignment): _mark(gb, it, t) for it in items if it.status == "graded"}
    for it in items:
        m = marks.get((it.student, it.assignment))
        if m is not None:
            it.score, it.max_score = m.score, m.max
    paths = {"grades": write_grades(out, items, names, marks)}
    graded = _nbgrader_outputs(out, items, feedback, log)   # nbgrader's export and feedback
    paths["nbgrader_export"] = out / "nbgrader_export.csv"
    paths.update(_lms(out, items, names, marks, log))
    from . import report
    report.write_report(out, items, names, manual.course_root(out), db_url, settings=settings,
                        marks=marks, run_items=run_items)
    paths["report"] = out / "report.md"
    paths["review"] = manual.write_review(out, names, db_url, changed=_changed(items))
    if feedback != "none":
        _feedback(out, items, marks, feedback, graded)
    paths["feedback"] = out / "feedback"
    return paths


# ------------------------------------------------------------------------ the gradebook

def _mark(gb, it, t: term.Term) -> Mark:
    """Apply the term to one graded submission in the gradebook and read what it scores."""
    from nbgrader.api import MissingEntry
    try:
        sub = gb.find_submission(it.assignment, it.student)
    except MissingEntry:
        return Mark()
    due = t.due_of(it.assignment)
    sub.assignment.duedate = due.astimezone(timezone.utc).replace(tzinfo=None) if due else None
    ext = t.extension_of(it.student, it.assignment, due)
    sub.extension = ext if ext.total_seconds() > 0 else None
    sub.timestamp = (term._utc(it.submitted_at).replace(tzinfo=None)
                     if it.submitted_at and it.time_known else None)
    secs, late = float(sub.total_seconds_late or 0), ""
    if secs > 0:
        late = f"{secs / term.DAY:.1f} day(s) late"
    elif not it.time_known and it.lms_late and due is not None:
        if ext.total_seconds() > 0:
            late = "marked LATE by the LMS, which does not give the time: the extension may cover it (not penalised; check)"
        else:
            secs, late = 1.0, "marked LATE by the LMS, which does not give the time: charged as 1 day late"
    m = Mark(max=float(sub.max_score or 0))
    for nb in sub.notebooks:
        raw = float(nb.score or 0)
        pen = t.penalty(raw, secs)
        nb.late_submission_penalty = pen or None   # nbgrader's export and feedback subtract it
        m.raw += raw
        m.penalty += pen
        answers = {c.name for c in nb.notebook.solution_cells}
        m.waiting += [(g.name, float(g.max_score)) for g in nb.grades
                      if g.name in answers and g.manual_score is None and g.needs_manual_grade]
    if late and m.penalty:
        late += f": -{m.penalty:g} point(s) ({t.describe()})"
    elif late and t.policy == "none":
        late += " (no late penalty)"
    m.late = late
    gb.db.commit()
    return m


def _changed(items) -> list:
    return [(it.student, it.assignment, g) for it in items for g in (it.answer_changed or [])]


# ------------------------------------------------------------------------ grades.csv

def write_grades(out: Path, items, names, marks) -> Path:
    """grades.csv: student_id, one column per notebook (its score after any late penalty;
    empty when it was not graded), then COLUMNS."""
    saved = record.load(out)
    path = out / "grades.csv"
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", *names, *COLUMNS])
        for st in sorted({it.student for it in items}):
            w.writerow(_row(st, [it for it in items if it.student == st], names, marks, saved))
    tmp.replace(path)
    return path


def _row(st, mine, names, marks, saved) -> list:
    by_a = {it.assignment: it for it in mine}
    got = {a: marks[(st, a)] for a in names if (st, a) in marks and by_a[a].status == "graded"}
    max_total = sum(_max_of(marks, a) for a in names)
    waiting = [(a, g, p) for a, m in got.items() for g, p in m.waiting]
    status = ("flagged" if any(it.status == "flagged" for it in mine) else
              REVIEW if any(it.review for it in mine) else "graded")
    sandbox = next((saved.get(f"{st}/{it.assignment}", {}).get("sandbox") for it in mine), "") or ""
    from . import intake
    return [st, *[f"{got[a].score:g}" if a in got else "" for a in names],
            f"{sum(m.score for m in got.values()):g}", f"{max_total:g}", status,
            _per_notebook(mine, "reasons"), sandbox, _per_notebook(mine, "flags"),
            intake.submitted_at(mine), intake.lms_late(mine),
            " ".join(f"{a}:{g}" for a, g, _ in waiting),
            (f"{WAITING}: {len(waiting)} answer(s), {sum(p for *_, p in waiting):g} point(s)"
             if waiting else ""),
            "; ".join(f"{a}: {m.late}" for a, m in got.items() if m.late),
            f"{sum(m.penalty for m in got.values()):g}"]


def _per_notebook(mine, field: str) -> str:
    """One summary per notebook: "01_attention: what; what | 02_masks: what"."""
    return " | ".join(f"{it.assignment}: " + "; ".join(getattr(it, field))
                      for it in mine if getattr(it, field))


def _max_of(marks, a) -> float:
    return max((m.max for (_, x), m in marks.items() if x == a), default=0.0)


def _lms(out, items, names, marks, log) -> dict:
    """The LMS files: a notebook still waiting for a grader is left empty (the LMS keeps what
    it has), never sent as a partial score."""
    from .lms_export import write_exports
    rows, held = [], 0
    for st in sorted({it.student for it in items}):
        row = {"student_id": st}
        for a in names:
            m = marks.get((st, a))
            row[a] = f"{m.score:g}" if m is not None and not m.waiting else ""
            held += bool(m is not None and m.waiting)
        rows.append(row)
    if held:
        log(f"  {held} notebook(s) left empty in the Canvas/Moodle files: {WAITING}")
    return write_exports(out, rows, {a: _max_of(marks, a) for a in names}, notebooks=names)


# ------------------------------------------------------------------------ feedback

def _nbgrader_outputs(out: Path, items, which, log) -> list:
    """nbgrader's CSV export and its generate_feedback for the chosen graded submissions, in
    one nbgrader process. Returns the graded Items whose feedback was regenerated."""
    root = manual.course_root(out)
    graded = [it for it in items if it.status == "graded" and which != "none"
              and (which == "all" or (it.student, it.assignment) in which)]
    everyone = course.students_in(root, "autograded")
    r = course.export_and_feedback(root, export=out / "nbgrader_export.csv", feedback=bool(graded),
                                   exclude=everyone - {it.student for it in graded},
                                   timeout=600 + 5 * len(graded))
    if r.returncode != 0:
        log(f"  nbgrader's export or generate_feedback reported problems: {(r.stdout + r.stderr)[-600:]}")
    return graded


def _feedback(out: Path, items, marks, which, graded) -> None:
    """Each regenerated feedback page marked where answers wait for a grader, sanitised, copied
    to OUT/feedback; and a page for each submission that could not be graded."""
    from . import hygiene
    root = manual.course_root(out)
    formulas = {}
    for it in graded:
        src = course.notebook_path(root, "feedback", it.assignment, it.student, suffix=".html")
        dst = out / "feedback" / it.student / f"{it.assignment}.html"
        if not src.exists():
            it.reasons.append("feedback could not be generated")
            continue
        m = marks[(it.student, it.assignment)]
        if it.assignment not in formulas:
            formulas[it.assignment] = _course_formulas(root, it.assignment)
        # sanitised once; the course's copy is the same page (nbgrader's release_feedback sends it)
        page = hygiene.sanitise_html(mark_page(src.read_text(encoding="utf-8"), m), formulas[it.assignment])
        src.write_text(page, encoding="utf-8")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(page, encoding="utf-8")
    for it in items:
        if it.status == "flagged" and (which == "all" or (it.student, it.assignment) in which):
            flagged_page(out, it)


def _course_formulas(root: Path, assignment: str) -> frozenset:
    """The formulas of the course's own markdown cells of `assignment` (its source notebook):
    the only ones a feedback page draws as MathML."""
    import nbformat

    from . import mathml
    path = course.notebook_path(root, "source", assignment)
    try:
        nb = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return frozenset()
    return mathml.formulas_of(c.source for c in nb.cells if c.cell_type == "markdown"
                              and not c.get("metadata", {}).get("nbgrader", {}).get("solution"))


def mark_page(page: str, m: Mark) -> str:
    """nbgrader's feedback page, saying "waiting for a grader" where it would show 0 for an
    answer nobody graded yet, and how late the submission was."""
    for gid, pts in m.waiting:
        g = re.escape(gid)
        # the table of contents, then the cell's heading: "Score: 0.0 / 1.0"
        page = re.sub(rf'(<a href="#{g}">[^<]*</a> \()Score: [0-9.]+ / ([0-9.]+)\)',
                      rf'\1Score: {WAITING} / \2)', page)
        page = re.sub(rf'(<a name="{g}"></a>\s*<div class="panel-heading">.*?)Score: [0-9.]+ / ([0-9.]+)',
                      rf'\1Score: {WAITING} / \2', page, count=1, flags=re.S)
    notes = []
    if m.waiting:
        notes.append(f"{len(m.waiting)} answer(s) ({sum(p for _, p in m.waiting):g} point(s)) "
                     f"{WAITING}: the score above counts them as 0 until then.")
    if m.late:
        notes.append(f"Submitted {m.late}.")
    if notes:
        banner = "".join(f'<p class="tfs-note"><b>{html.escape(n)}</b></p>' for n in notes)
        page = re.sub(r"(<div id=\"toc\">)", banner.replace("\\", "\\\\") + r"\1", page, count=1)
    return page


HAND_IN = ("Hand in the notebook you were given, {a}.ipynb, saved from JupyterLab (File > Save "
           "Notebook) with your code in the cells marked YOUR CODE HERE: one .ipynb file, not "
           "renamed, not exported to another format, not a zip. Run Validate (or Kernel > Restart "
           "& Run All) first: every cell should run without an error you did not expect.")


def flagged_page(out: Path, it) -> Path | None:
    """OUT/feedback/<student>/<notebook>.html for a submission that could not be graded: what
    was wrong and what to hand in (the student's own text never appears in it)."""
    from .intake import STUDENT_RE
    if not STUDENT_RE.match(it.student) or it.assignment == "*":
        return None
    dst = out / "feedback" / it.student / f"{it.assignment}.html"
    dst.parent.mkdir(parents=True, exist_ok=True)
    why = "".join(f"<li>{html.escape(r)}</li>" for r in it.reasons) or "<li>(no reason recorded)</li>"
    dst.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>"
        f"{html.escape(it.assignment)}: not graded</title></head><body>"
        f"<h1>{html.escape(it.assignment)}: your submission could not be graded</h1>"
        f"<p>What the grader found:</p><ul>{why}</ul>"
        f"<h2>What to hand in</h2><p>{html.escape(HAND_IN.format(a=it.assignment))}</p>"
        "<p>Then hand it in again, or ask your instructor if the deadline has passed.</p>"
        "</body></html>\n", encoding="utf-8")
    return dst


def release_feedback(out: Path, to: Path, *, zip_each: bool = False) -> list[Path]:
    """Hand the feedback to the students: TO/<student>/<notebook>.html (a page for every
    notebook, graded or not), or with `zip_each` one TO/<student>.zip each, ready to upload
    to an LMS's per-student feedback. nbgrader's own layout is OUT/course/feedback/, from which
    `nbgrader release_feedback` sends it through the exchange."""
    import zipfile
    out, to = Path(out).resolve(), Path(to).resolve()
    src = out / "feedback"
    if not src.is_dir():
        raise FileNotFoundError(f"{src} not found: grade the class first (tfs-grade grade)")
    written = []
    for sdir in sorted(p for p in src.iterdir() if p.is_dir()):
        pages = sorted(sdir.glob("*.html"))
        if zip_each:
            to.mkdir(parents=True, exist_ok=True)
            z = to / f"{sdir.name}.zip"
            with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
                for p in pages:
                    f.write(p, f"{sdir.name}/{p.name}")
            written.append(z)
        else:
            (to / sdir.name).mkdir(parents=True, exist_ok=True)
            for p in pages:
                shutil.copyfile(p, to / sdir.name / p.name)
                written.append(to / sdir.name / p.name)
    return written
