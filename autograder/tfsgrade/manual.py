"""Free-text answers, graded by hand in nbgrader's formgrader.

Each notebook asks two or three short questions in nbgrader "manually graded answer" cells
(markdown cells with `solution: true, grade: true, points`; grade ids start with `q_`). The
autograder cannot score them: nbgrader gives an unchanged answer cell 0 ("No response") and
marks every other one as needing a manual grade. This module

- lists, per student and notebook, the answers waiting for review (`OUT/manual_review.md`),
  with the student's text, so an instructor can see the work before opening the formgrader;
- `tfs-grade export OUT` rewrites every output from the gradebook after manual grading
  (tfsgrade.outputs), so that scores entered in the formgrader, or through
  `nbgrader.api.Gradebook`, show up in grades.csv, the report, the LMS files and the feedback.

`grades.csv` gains one column, `manual_pending`: the answers of that student still waiting for
a grade ("01_attention:q_masked_row"), empty when none are.
"""
from __future__ import annotations

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
    path = course.notebook_path(root, "autograded", assignment, student)
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


def command(*args: str) -> str:
    """A tfs-grade command line as it runs here: by name when `tfs-grade` is on PATH, else
    through this interpreter (a venv that is not activated)."""
    import shlex
    import shutil
    import sys
    from pathlib import Path
    beside = Path(sys.executable).parent / "tfs-grade"     # the venv's own script (make install)
    if shutil.which("tfs-grade"):
        exe = "tfs-grade"
    elif beside.exists():
        try:
            exe = shlex.quote(str(beside.relative_to(Path.cwd())))
        except ValueError:
            exe = shlex.quote(str(beside))
    else:
        exe = f"{shlex.quote(sys.executable)} -m tfsgrade.cli"
    return " ".join([exe, *(shlex.quote(str(a)) for a in args)])


def write_review(out: Path, names: list[str] | None = None, db_url: str | None = None,
                 changed=()) -> Path:
    """OUT/manual_review.md: the free-text answers awaiting review, per student and notebook,
    those whose answer changed since they were graded by hand (`changed`: (student, notebook,
    grade id)), and how to grade them in the formgrader."""
    out = Path(out).resolve()
    root = course_root(out)
    rows = pending(out, names, db_url)
    todo = [r for r in rows if r["state"] == "pending"]
    md = ["# Free-text answers to grade by hand", "",
          f"{len(todo)} answer(s) waiting for review; "
          f"{sum(r['state'] == 'graded' for r in rows)} graded; "
          f"{sum(r['state'] == 'no response' for r in rows)} left unanswered (scored 0).", "",
          f"Grade them in nbgrader's formgrader: run `{command('formgrader', out)}`, open the "
          "address it prints, choose *Manual Grading*, the assignment, the notebook and a "
          "submission, and enter a score (and a comment) for each answer cell. Then run "
          f"`{command('export', out)}`: grades.csv, the report, the LMS files and the feedback "
          "are rewritten from the gradebook. A regrade into the same folder keeps every hand "
          "grade.", ""]
    if changed:
        md += ["## Answers changed since you graded them", "",
               "The student's newer submission differs from what you graded by hand; your score "
               "is kept until you review it (the formgrader lists it as needing a grade).", ""]
        md += [f"- {sid} · {a} · `{gid}`" for sid, a, gid in changed] + [""]
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
    """`tfs-grade export OUT`: after hand grading (or a change of due dates or late policy),
    rewrite every output from the gradebook (tfsgrade.outputs.write_all); with `feedback`, every
    student's feedback page too, so that they see the hand scores and comments."""
    from . import outputs, record
    out = Path(out).resolve()
    if not (out / "record.json").exists():
        raise FileNotFoundError(f"{out / 'record.json'} not found: grade the class first (tfs-grade grade)")
    with record.writing(out):
        return outputs.write_all(out, db_url=db_url, feedback="all" if feedback else "none", log=log)["grades"]
