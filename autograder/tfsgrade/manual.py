"""Free-text answers, graded by hand in nbgrader's formgrader.

Each notebook asks two or three short questions in nbgrader "manually graded answer" cells
(markdown cells with `solution: true, grade: true, points`; grade ids start with `q_`). The
autograder cannot score them: nbgrader gives an unchanged answer cell 0 ("No response") and
marks every other one as needing a manual grade. This module

- lists, per student and notebook, the answers waiting for review (`OUT/manual_review.md`),
  with the student's text, so an instructor can see the work before opening the formgrader;
- re-reads nbgrader's gradebook after manual grading and rewrites `OUT/grades.csv`
  (`tfs-grade export OUT`), so that scores entered in the formgrader, or through
  `nbgrader.api.Gradebook`, show up in the grades.

`grades.csv` gains one column, `manual_pending`: the answers of that student still waiting for
a grade ("01_attention:q_masked_row"), empty when none are.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path

import nbformat

from . import course

PENDING = "manual_pending"


def course_root(out: Path) -> Path:
    return Path(out).resolve() / "course"


def db_url_of(out: Path, db_url: str | None = None) -> str:
    """The gradebook a grading run used: the one given, else the one its nbgrader_config.py
    names, else the default SQLite file in OUT/course."""
    if db_url:
        return db_url
    root = course_root(out)
    cfg = root / "nbgrader_config.py"
    if cfg.exists():
        found = re.findall(r"^c\.CourseDirectory\.db_url = (['\"])(.*)\1$", cfg.read_text(), re.M)
        if found:
            return found[-1][1]
    return f"sqlite:///{root / 'gradebook.db'}"


def answer_cells(gb, assignment: str) -> list:
    """The manually graded answer cells of an assignment (grade cells that are also solution
    cells, i.e. the student writes in them), in notebook order of their names."""
    nb = gb.find_notebook(assignment, assignment)
    solution_names = {c.name for c in nb.solution_cells}
    return sorted((gc for gc in nb.grade_cells if gc.name in solution_names), key=lambda g: g.name)


def _answer_text(root: Path, student: str, assignment: str, grade_id: str) -> str:
    path = root / "autograded" / student / assignment / f"{assignment}.ipynb"
    if not path.exists():
        return ""
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return c.source
    return ""


def pending(out: Path, names: list[str] | None = None, db_url: str | None = None) -> list[dict]:
    """Every manual answer of every graded submission: one dict per (student, notebook, cell)
    with its state: 'pending' (answered, not graded yet), 'graded' (a manual score is in) or
    'no response' (left as released: 0, nothing to grade)."""
    from nbgrader.api import Gradebook, MissingEntry
    root = course_root(out)
    rows = []
    with Gradebook(db_url_of(out, db_url)) as gb:
        names = names or [a.name for a in gb.assignments]
        for a in sorted(names):
            try:
                cells = answer_cells(gb, a)
            except MissingEntry:
                continue
            for sub in sorted(gb.assignment_submissions(a), key=lambda s: s.student.id):
                sid = sub.student.id
                for gc in cells:
                    try:
                        g = gb.find_grade(gc.name, a, a, sid)
                    except MissingEntry:
                        continue
                    if g.manual_score is not None:
                        state = "graded"
                    elif g.needs_manual_grade:
                        state = "pending"
                    else:
                        state = "no response"
                    rows.append({"student": sid, "assignment": a, "grade_id": gc.name,
                                 "max_score": float(gc.max_score), "score": float(g.score or 0),
                                 "state": state})
    return rows


def _quote(text: str) -> str:
    text = text.strip() or "(empty)"
    return "\n".join("    " + ln for ln in text.splitlines())  # an indented block: shown as typed


def write_review(out: Path, names: list[str] | None = None, db_url: str | None = None) -> Path:
    """OUT/manual_review.md: the free-text answers awaiting review, per student and notebook,
    and how to grade them in the formgrader."""
    out = Path(out).resolve()
    root = course_root(out)
    rows = pending(out, names, db_url)
    todo = [r for r in rows if r["state"] == "pending"]
    md = ["# Free-text answers to grade by hand", "",
          f"{len(todo)} answer(s) waiting for review; "
          f"{sum(r['state'] == 'graded' for r in rows)} graded; "
          f"{sum(r['state'] == 'no response' for r in rows)} left unanswered (scored 0).", "",
          "Grade them in nbgrader's formgrader: `cd " + str(root) + " && jupyter lab`, open "
          "*Nbgrader → Formgrader → Gradebook* (\"Manual Grading\"), pick the assignment, the "
          "notebook and a submission, and enter a score (and a comment) for each answer cell. Then run `tfs-grade export " + str(out) + "` to put "
          "the scores into grades.csv and the feedback.", ""]
    by_student: dict[str, list[dict]] = {}
    for r in todo:
        by_student.setdefault(r["student"], []).append(r)
    for sid in sorted(by_student):
        md += [f"## {sid}", ""]
        for r in by_student[sid]:
            md += [f"### {r['assignment']} · `{r['grade_id']}` ({r['max_score']:g} point(s))", "",
                   _quote(_answer_text(root, sid, r["assignment"], r["grade_id"])), ""]
    path = out / "manual_review.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def export(out: Path, db_url: str | None = None, *, feedback: bool = True, log=print) -> Path:
    """Re-read the gradebook and rewrite OUT/grades.csv: every graded notebook's score becomes
    the gradebook's (autograded points plus the manual scores entered since), totals follow, and
    `manual_pending` lists the answers still waiting. Flagged submissions, their notes and
    everything else in the file stay as they were. With `feedback`, nbgrader's feedback HTML is
    regenerated so that students see the manual scores and comments too."""
    from nbgrader.api import Gradebook, MissingEntry
    out = Path(out).resolve()
    path = out / "grades.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: grade the class first (tfs-grade grade)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    with Gradebook(db_url_of(out, db_url)) as gb:
        known = {a.name for a in gb.assignments}
    names = [c for c in fields if c in known]  # the per-notebook score columns
    waiting: dict[str, list[str]] = {}
    for r in pending(out, names, db_url):
        if r["state"] == "pending":
            waiting.setdefault(r["student"], []).append(f"{r['assignment']}:{r['grade_id']}")
    with Gradebook(db_url_of(out, db_url)) as gb:
        max_total = 0.0
        for a in names:
            try:
                max_total += float(gb.find_assignment(a).max_score)
            except MissingEntry:
                pass
        for row in rows:
            sid = row["student_id"]
            total = 0.0
            for a in names:
                if row.get(a, "") == "":  # flagged: nothing was graded
                    continue
                try:
                    row[a] = f"{float(gb.find_submission(a, sid).score):g}"
                except MissingEntry:
                    pass
                total += float(row[a])
            row["total"] = f"{total:g}"
            row["max_total"] = f"{max_total:g}"
            row[PENDING] = " ".join(waiting.get(sid, []))
    if PENDING not in fields:
        fields.append(PENDING)  # new columns go after the ones scripts already read
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    from .exports import write_exports  # Canvas / Moodle files follow the new scores
    with Gradebook(db_url_of(out, db_url)) as gb:
        maxima = {a: float(gb.find_assignment(a).max_score) for a in names}
    write_exports(out, rows, maxima, notebooks=names)
    if feedback:
        _refresh_feedback(out, names, {r["student_id"] for r in rows}, log)
    return path


def _refresh_feedback(out: Path, names: list[str], students: set, log):
    import shutil

    from . import judges, sanitise
    root = course_root(out)
    for a in names:
        if not (root / "autograded").exists():
            return
        r = course.run_nbgrader(root, ["generate_feedback", a, "--force"], timeout=600)
        if r.returncode != 0:
            log(f"  generate_feedback {a} reported problems: {(r.stdout + r.stderr)[-300:]}")
        for sid in students:
            src = root / "feedback" / sid / a / f"{a}.html"
            if src.exists():
                sanitise.page(src)   # the course's copy too (nbgrader's release_feedback)
                (out / "feedback" / sid).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out / "feedback" / sid / f"{a}.html")
                judges.sanitise_page(out / "feedback" / sid / f"{a}.html")


def after_grading(out: Path, names: list[str], db_url: str | None = None) -> None:
    """Called once at the end of a grading run: list the answers to review and add the
    `manual_pending` column to grades.csv."""
    write_review(out, names, db_url)
    export(out, db_url, feedback=False)
