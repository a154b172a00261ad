"""tfs-grade: the instructor's command.

    tfs-grade build                 solutions/src/*.py -> solutions/*.ipynb and the reference
                                    package helpers/tfscratch/reference/ (tfsgrade.reference_writer)
    tfs-grade release               build, then nbgrader generate_assignment -> notebooks/
              [--student-bundle OUT --closed N]  and what a class receives (tfsgrade.bundle)
    tfs-grade check                 fail if solutions/, notebooks/ or the reference are stale
    tfs-grade new NN_name           a new notebook: its source, spec and catalogue from a template
    tfs-grade manifest              print the course manifest (tfsgrade.manifest) as JSON
    tfs-grade grade SUBMISSIONS     autograde a folder or zip; write grades.csv, feedback, report
    tfs-grade course DIR            make an nbgrader course directory (for the formgrader)
    tfs-grade formgrader OUT        nbgrader's formgrader on OUT's course (hand grading)
    tfs-grade export OUT            after hand grading (or new dates): rewrite every output of
                                    OUT from the gradebook (grades.csv, report, LMS, feedback)
    tfs-grade release-feedback OUT --to DIR [--zip]   the feedback, per student

OUT is the record of the term: grading into it again (everyone, or --student) keeps every hand
grade; due dates, extensions and the late policy given once are kept in it.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import build, course, reference_writer


def build_sources(log=print, names=None) -> list[Path]:
    """solutions/src/*.py -> solutions/*.ipynb and helpers/tfscratch/reference/*.py, and the
    stored expectations of `names` (every notebook by default)."""
    written = build.build_all(course.SOURCES, course.SOLUTIONS)
    written += reference_writer.write(course.SOURCES, course.REFERENCE)
    written += _stored("write", names)
    for p in written:
        log(f"built {p.relative_to(course.REPO)}")
    return written


def _stored(cmd: str, names=None) -> list:
    """The kernel checks' stored expectations (tfscratch.specs.stored): `write` returns the
    files written, `check` what is stale. A fresh process, so it imports the reference just
    exported, not one this process loaded before."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "tfscratch.specs.stored", cmd, *(names or course.assignments())],
                       capture_output=True, text=True, cwd=course.REPO)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if cmd == "write":
        if r.returncode != 0:
            raise SystemExit(f"cannot store the checks' expectations:\n{r.stderr[-3000:]}")
        return [Path(ln) for ln in lines]
    return lines + ([f"tfscratch.specs.stored failed: {r.stderr[-1000:]}"] if r.returncode not in (0, 1) else [])


def release(out_dir: Path = course.NOTEBOOKS, names=None, log=print) -> list[Path]:
    build_sources(log=lambda *_: None, names=names)
    names = names or course.assignments()
    with tempfile.TemporaryDirectory(prefix="tfs-release-") as tmp:
        root = course.make_course(Path(tmp), names)
        course.generate(root, names)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for a in names:
            src = course.notebook_path(root, "release", a)
            dst = out_dir / f"{a}.ipynb"
            kept = _keep_work(dst, src)
            if kept is not None:
                log(f"{dst.name} held work of yours (outputs, or cells changed since it was released): "
                    f"copied to {kept} before releasing it again")
            shutil.copyfile(src, dst)
            written.append(dst)
            log(f"released {dst.relative_to(course.REPO) if dst.is_relative_to(course.REPO) else dst}")
    return written


def _keep_work(dst: Path, src: Path) -> Path | None:
    """A copy of the notebook about to be released again when someone worked in it (it has
    outputs, or differs from the committed file), in <folder>/.backup/; its path, else None."""
    if not dst.exists() or filecmp.cmp(dst, src, shallow=False):
        return None
    try:
        cells = json.loads(dst.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        cells = []
    worked = any(c.get("outputs") or c.get("execution_count") for c in cells)
    if not worked:
        rel = dst.resolve().relative_to(course.REPO) if dst.resolve().is_relative_to(course.REPO) else None
        r = subprocess.run(["git", "-C", str(course.REPO), "show", f"HEAD:{rel}"], capture_output=True) \
            if rel is not None else None
        worked = r is None or r.returncode != 0 or r.stdout != dst.read_bytes()
    if not worked:
        return None
    backup = dst.parent / ".backup" / f"{dst.stem}.{time.strftime('%Y%m%d-%H%M%S')}{dst.suffix}"
    backup.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(dst, backup)
    return backup


def stale(notebooks: bool = True) -> list[str]:
    """Names of generated files that differ from what the sources give now. notebooks=False
    skips notebooks/ (the one check that needs nbgrader, ~30 s)."""
    problems = reference_writer.stale(course.SOURCES, course.REFERENCE)
    if not problems:                    # the expectations come from a current reference
        problems += _stored("check")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        built = build.build_all(course.SOURCES, tmp / "solutions")
        problems += _differ(built, course.SOLUTIONS, "[0-9][0-9]_*.ipynb", "has no source in solutions/src/")
        if problems or not notebooks:
            return problems
        rel = release(tmp / "notebooks", log=lambda *_: None)
        problems += _differ(rel, course.NOTEBOOKS, "*.ipynb", "is not generated from solutions/")
    return problems


def _has_outputs(path: Path) -> bool:
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return False
    return any(c.get("outputs") for c in cells)


def _differ(made: list, committed: Path, pattern: str, orphan: str) -> list[str]:
    """What differs between freshly generated files and the committed folder: stale files, and
    committed files nothing generates."""
    out = [f"{committed.name}/{p.name} " + ("holds outputs (saved from JupyterLab?): clear them "
                                          "(Edit > Clear Outputs of All Cells, then save) or run "
                                          "`make release`" if _has_outputs(committed / p.name) else
                                          "is stale: run `make release`") for p in made
           if not (committed / p.name).exists() or not filecmp.cmp(p, committed / p.name, shallow=False)]
    extra = {p.name for p in committed.glob(pattern)} - {p.name for p in made}
    return out + [f"{committed.name}/{n} {orphan}" for n in sorted(extra)]


def _term_args(p) -> None:
    p.add_argument("--term", type=Path, metavar="FILE",
                   help="due dates, late policy and extensions in TOML (see tfsgrade.term)")
    p.add_argument("--due", action="append", metavar="[ASSIGNMENT=]DATE",
                   help="a due date: 2026-10-02T23:59+02:00 or '01_attention=2026-10-02 23:59 "
                        "Europe/Berlin' (repeatable; kept for later runs)")
    p.add_argument("--extensions", type=Path, metavar="CSV",
                   help="student_id,assignment,extension (2d, 36h, or a new due date)")
    p.add_argument("--late-policy", choices=["none", "per-day", "zero-after"])
    p.add_argument("--penalty-per-day", type=float, metavar="SHARE",
                   help="with per-day: the share of the score taken per started day (0.1 = 10%%)")
    p.add_argument("--cutoff-days", type=float, metavar="DAYS",
                   help="later than this: the notebook scores 0 (negative: no cut-off)")


def _term_options(a) -> dict:
    return dict(term_file=a.term, due=a.due or (), extensions=a.extensions, policy=a.late_policy,
                penalty_per_day=a.penalty_per_day, cutoff_days=a.cutoff_days)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tfs-grade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="solutions/src/*.py -> solutions/*.ipynb")
    r = sub.add_parser("release", help="build, then regenerate notebooks/ with nbgrader")
    r.add_argument("--student-bundle", type=Path, metavar="OUT",
                   help="also write what a class receives: the student notebooks and the course "
                        "package without the reference of open notebooks (OUT/, OUT.zip)")
    r.add_argument("--closed", type=int, default=0, metavar="N",
                   help="with --student-bundle: the first N notebooks are closed (their reference "
                        "is shipped, later notebooks import it); default 0")
    sub.add_parser("check", help="exit 1 if solutions/, notebooks/ or the reference are stale")
    n = sub.add_parser("new", help="a new notebook from the template: its source, spec and catalogue")
    n.add_argument("name", help="NN_name, e.g. 13_mixture_of_experts")
    n.add_argument("--title", help="the notebook's title (default: from the name)")
    n.add_argument("--module", help="the reference module (default: the name without NN_)")
    sub.add_parser("manifest", help="print the course manifest as JSON")
    _grade_args(sub.add_parser("grade", help="grade a folder or zip of submissions"))
    f = sub.add_parser("formgrader", help="nbgrader's formgrader on a grading folder (hand grading)")
    f.add_argument("out", type=Path, help="the --out folder of a grading run")
    f.add_argument("--port", type=int, default=8890)
    f.add_argument("--ip", default="127.0.0.1", help="0.0.0.0 to reach it from outside a container")
    rf = sub.add_parser("release-feedback", help="copy the feedback out, per student")
    rf.add_argument("out", type=Path, help="the --out folder of a grading run")
    rf.add_argument("--to", type=Path, required=True, help="TO/<student>/<notebook>.html")
    rf.add_argument("--zip", action="store_true", help="one TO/<student>.zip each instead")
    c = sub.add_parser("course", help="make an nbgrader course directory for the formgrader")
    c.add_argument("dir", type=Path)
    e = sub.add_parser("export", help="after hand grading or new dates: rewrite every output")
    e.add_argument("out", type=Path, help="the --out folder of a grading run")
    e.add_argument("--db-url", help="gradebook URL (default: the one the grading run used)")
    e.add_argument("--no-feedback", action="store_true", help="do not regenerate the feedback HTML")
    e.add_argument("--roster", type=Path, metavar="FILE",
                   help="a roster for the Canvas/Moodle files from now on (see grade --roster)")
    e.add_argument("--id-field", action="append", metavar="NAME",
                   help="how the Canvas/Moodle files identify students (see grade --id-field)")
    _term_args(e)
    return ap


def _grade_args(g) -> None:
    g.add_argument("submissions", type=Path)
    g.add_argument("--out", type=Path, default=Path("grading"), help="output folder (default ./grading)")
    g.add_argument("--assignment", "-a", action="append", help="grade only these (repeatable)")
    g.add_argument("--db-url", help="gradebook URL (default: SQLite in OUT/course)")
    g.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    g.add_argument("--notebook-timeout", type=int, default=900,
                   help="seconds per notebook before the run is killed (default 900)")
    g.add_argument("--mem-gb", type=float, default=6.0,
                   help="memory cap per notebook, all its processes together (GiB)")
    g.add_argument("--student", action="append", help="regrade only this student (repeatable)")
    g.add_argument("--scheduler", help="grade on an existing Dask cluster: tcp://host:8786")
    g.add_argument("--workers", type=int, default=0, help="local workers (default: one per core)")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run student code WITHOUT isolation (the report says so)")
    g.add_argument("--probe-seed", type=int, default=None,
                   help="one fixed seed for the independent check's inputs of every submission, "
                        "to reproduce a run (default: each submission its own, derived from the "
                        "secret, the student, the notebook and its bytes)")
    g.add_argument("--probe-secret", type=Path, default=None, metavar="FILE",
                   help="the secret the inputs are derived from (default OUT/probe_secret, made "
                        "once with mode 0600; keep it to regrade with the same inputs; never "
                        "inside a folder the sandbox mounts)")
    g.add_argument("--roster", type=Path, metavar="FILE",
                   help="the class list (CSV: student_id,name,canvas_id,sis_user_id,sis_login_id,"
                        "section,moodle_id,idnumber,username,email, any subset; Canvas's gradebook "
                        "export and Moodle's grading worksheet are read as they are): maps the "
                        "download's ids to student ids, lists unknown and missing students, fills "
                        "the Canvas/Moodle files (kept in OUT for later runs)")
    g.add_argument("--id-field", action="append", metavar="NAME",
                   help="how the Canvas/Moodle files identify students: ID, 'SIS User ID', "
                        "'SIS Login ID' (Canvas; default SIS Login ID) or 'ID number', 'Email "
                        "address', Username (Moodle; default: what the roster has); repeatable")
    g.add_argument("--layout", choices=["auto", "folders", "canvas", "moodle", "nbgrader"],
                   default="auto", help="what SUBMISSIONS is: student folders, Canvas's or "
                   "Moodle's download, nbgrader's submitted/ or inbound/ (default: detected)")
    g.add_argument("--reveal-hidden", action="store_true",
                   help="feedback shows hidden tests' code and inputs (after the deadline)")
    g.add_argument("--run-demos", nargs="*", metavar="STUDENT", default=None,
                   help="run the demonstration cells too, for every student or only those named "
                        "(by default the sandbox leaves out the unchanged ones that nothing graded "
                        "needs: figures, explorers, training)")
    _term_args(g)


def _cmd_build(a) -> int:
    build_sources()
    return 0


def _cmd_release(a) -> int:
    release()
    if a.student_bundle:
        from . import bundle
        print(f"wrote the student bundle {bundle.build(a.student_bundle, a.closed)}")
    return 0


def _cmd_check(a) -> int:
    problems = stale()
    for p in problems:
        print(p)
    if problems:
        return 1
    print("solutions/, notebooks/ and helpers/tfscratch/reference/ are current")
    return 0


def _cmd_manifest(a) -> int:
    from . import manifest
    print(manifest.load().to_json())
    return 0


def _cmd_grade(a) -> int:
    from .grade import grade
    from .manual import command
    items = grade(a.submissions, a.out, names=a.assignment, db_url=a.db_url,
                  timeout=a.timeout, notebook_timeout=a.notebook_timeout, mem_gb=a.mem_gb,
                  students=a.student, scheduler=a.scheduler, workers=a.workers,
                  sandbox=not a.no_sandbox, reveal_hidden=a.reveal_hidden,
                  run_demos=a.run_demos or a.run_demos == [],  # [] (no names): everyone
                  probe_seed=a.probe_seed, probe_secret=a.probe_secret,
                  roster=a.roster, layout=a.layout, id_fields=a.id_field or (),
                  term_options=_term_options(a))
    kept = [it for it in items if (it.result or {}).get("from_cache")]
    flagged = [it for it in items if it.status == "flagged"]
    noted = [it for it in items if it.reasons and it not in kept]
    print(f"graded {sum(it.status == 'graded' for it in items)} notebook(s): {len(items) - len(kept)} run now, "
          f"{len(kept)} unchanged since an earlier run; {len(flagged)} flagged")
    for it in noted:     # one line per notebook run now; the rest are in grades.csv's notes
        print(f"  {it.student}/{it.assignment}: " + "; ".join(it.reasons))
    print(f"wrote {a.out / 'grades.csv'}, {a.out / 'report.html'}, {a.out / 'feedback'}/")
    print(f"free-text answers to grade by hand: {a.out / 'manual_review.md'} "
          f"(`{command('formgrader', a.out)}`, then `{command('export', a.out)}`)")
    return 0


def _cmd_export(a) -> int:
    from . import lms, lms_export, term
    from .manual import export
    if not (a.out / "record.json").exists():
        raise SystemExit(f"{a.out / 'record.json'} not found: grade the class first (tfs-grade grade)")
    try:
        if a.roster or a.id_field:   # kept in OUT: every later export uses them
            lms_export.split_id_fields(a.id_field)
            roster = lms.Roster.load(a.roster) if a.roster else lms.saved_roster(a.out)
            lms.save(a.out, roster=roster, id_fields=a.id_field,
                     given=bool(a.roster) or lms.saved_settings(a.out).get("roster_given", False))
        term.configure(a.out, **_term_options(a))
    except (ValueError, OSError) as err:
        raise SystemExit(f"cannot export: {err}") from None
    try:
        path = export(a.out, a.db_url, feedback=not a.no_feedback)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    print(f"wrote {path}, {a.out / 'report.md'}, {a.out / 'manual_review.md'}, the LMS files "
          f"and {a.out / 'feedback'}/ from the gradebook")
    return 0


def _cmd_formgrader(a) -> int:
    from . import formgrader
    try:
        return formgrader.main(a.out, port=a.port, ip=a.ip)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None


def _cmd_release_feedback(a) -> int:
    from .outputs import release_feedback
    try:
        written = release_feedback(a.out, a.to, zip_each=a.zip)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    print(f"wrote {len(written)} file(s) under {a.to}")
    return 0


def _cmd_new(a) -> int:
    from . import scaffold
    try:
        written = scaffold.new(a.name, a.title, a.module)
    except (ValueError, FileExistsError) as e:
        raise SystemExit(f"tfs-grade new: {e}") from None
    for p in written:
        print(f"wrote {p.relative_to(course.REPO)}")
    print("next: edit the three files, then `make release` (builds, exports the reference, "
          "stores the checks' expectations, releases the student notebook)")
    return 0


def _cmd_course(a) -> int:
    root = course.make_course(a.dir, course.assignments())
    course.generate(root, course.assignments(), reuse=True)
    print(f"nbgrader course directory ready at {root}")
    return 0


COMMANDS = {"build": _cmd_build, "release": _cmd_release, "check": _cmd_check,
            "manifest": _cmd_manifest, "grade": _cmd_grade, "export": _cmd_export,
            "formgrader": _cmd_formgrader, "release-feedback": _cmd_release_feedback,
            "course": _cmd_course, "new": _cmd_new}


def main(argv=None):
    a = _parser().parse_args(argv)
    return COMMANDS[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
