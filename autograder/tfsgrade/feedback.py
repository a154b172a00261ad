"""Stage 4, feedback and grades: nbgrader's feedback HTML per graded notebook, nbgrader's
own export, and grades.csv (columns scripts rely on: student_id, one per notebook, total,
max_total, status, notes; newer columns only after those)."""
from __future__ import annotations

import csv
import shutil
import threading

from . import course, intake, sanitise



def write_feedback(items, s) -> None:
    from . import judges
    fb_out = s.out / "feedback"
    shutil.rmtree(fb_out, ignore_errors=True)
    judges.clean_autograded(items, s)  # no hidden tests, no endless output, no active content
    # nbgrader's own export only reads the gradebook, which is final after merge: it runs
    # beside generate_feedback (about 3 s of nbgrader start-up that nobody waits for)
    export = threading.Thread(target=course.run_nbgrader, daemon=True, kwargs=dict(
        root=s.course, args=["export", "--to", str(s.out / "nbgrader_export.csv")], timeout=300))
    export.start()
    graded = [it for it in items if it.status == "graded"]
    if graded:   # every graded notebook of the run in one nbgrader process (see merge)
        r = course.run_nbgrader(s.course, ["generate_feedback", "*", "--force"], timeout=600 + 5 * len(graded))
        if r.returncode != 0:
            s.log(f"  generate_feedback reported problems: {(r.stdout + r.stderr)[-600:]}")
    export.join()
    for it in items:
        src = s.course / "feedback" / it.student / it.assignment / f"{it.assignment}.html"
        if it.status == "graded" and src.exists():
            sanitise.page(src)   # the course's copy too (nbgrader's release_feedback sends it)
            (fb_out / it.student).mkdir(parents=True, exist_ok=True)
            dst = fb_out / it.student / f"{it.assignment}.html"
            shutil.copyfile(src, dst)
            judges.sanitise_page(dst)
        elif it.status == "graded":
            it.reasons.append("feedback could not be generated")


def write_grades(items, s) -> None:
    """grades.csv and the LMS exports (nbgrader's own export is written by write_feedback)."""
    names = list(s.names)
    max_by_a = {a: max((it.max_score for it in items if it.assignment == a), default=0.0) for a in names}
    students = sorted({it.student for it in items})
    with (s.out / "grades.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", *names, "total", "max_total", "status", "notes", "sandbox",
                    "flags", "submitted_at", "lms_late"])
        for st in students:
            mine = {it.assignment: it for it in items if it.student == st}
            row = [st]
            for a in names:
                it = mine.get(a)
                row.append(f"{it.score:g}" if it and it.status == "graded" else "")
            total = sum(it.score for it in mine.values() if it.status == "graded")
            status = "flagged" if any(it.status == "flagged" for it in mine.values()) else "graded"
            notes = "; ".join(f"{it.assignment}: {r}" for it in mine.values() for r in it.reasons)
            flags = "; ".join(f"{it.assignment}: {f}" for it in mine.values() for f in it.flags)
            row += [f"{total:g}", f"{sum(max_by_a.values()):g}", status, notes,
                    "on" if s.sandbox else "OFF (--no-sandbox)", flags,
                    intake.submitted_at(mine.values()), intake.lms_late(mine.values())]
            w.writerow(row)
    from .exports import write_exports
    write_exports(s.out, [{"student_id": st, **{a: next((f"{it.score:g}" for it in items
                   if it.student == st and it.assignment == a and it.status == "graded"), "")
                   for a in names}} for st in students], max_by_a, notebooks=names)
