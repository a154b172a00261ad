"""Grade a class, in stages (each its own module, each testable alone):

    intake     folder or zip -> one Item per (student, notebook)      tfsgrade.intake
    normalise  repair metadata, restore test cells from the source     tfsgrade.normalise
    run        execute each notebook in a sandbox, in parallel (Dask)  tfsgrade.dispatch/.sandbox
    merge      score with nbgrader into the term's gradebook; judges;   tfsgrade.merge/.hand
               hand grades kept, answers changed since flagged
    outputs    from the gradebook and the record: grades.csv, nbgrader  tfsgrade.record/.outputs
               export, LMS files, report, review list, feedback

One Settings object (tfsgrade.settings) is built once and read by every stage. A bad
submission is flagged with its reason and never stops the rest of the class.

OUT is the record of the term: its course directory and gradebook are kept from one run to the
next (a regrade, of everyone or `--student`, keeps every hand grade, comment and override), and
OUT/record.json keeps what each run found about each submission. Every submission still runs in
a fresh sandbox; only the coordinator writes the gradebook and the record.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from . import course, dispatch, hygiene, intake, merge, nbproc, normalise, outputs, record, term
from .intake import Item  # noqa: F401  (re-exported: scripts and tests import it from here)
from .settings import Settings


def grade(submissions: Path, out: Path, *, names: list[str] | None = None, term_options=None,
          **options) -> list[Item]:
    """`term_options`: due dates, extensions and the late policy (tfsgrade.term.configure's
    keywords), kept in OUT for later runs."""
    s = Settings.build(out, names=names, **options)
    _require_sandbox(s)
    nbproc.start(course.nbgrader_env())   # nbgrader's imports, while the tasks run
    with record.writing(s.out), tempfile.TemporaryDirectory(prefix="tfs-grade-") as work, \
            dispatch.workers(s):
        try:
            term.configure(s.out, **(term_options or {}))
        except (ValueError, OSError) as e:
            raise SystemExit(f"cannot grade: {e}") from None
        root_in = intake.unpack(Path(submissions), Path(work))
        got = intake.prepare(root_in, Path(work), out=s.out, roster=s.roster, layout=s.layout,
                             from_zip=Path(submissions).is_file(), id_fields=s.id_fields, log=s.log)
        root_in = got.root   # LMS downloads: converted to <student>/<assignment>.ipynb
        s = s.with_names(_assignments(names, intake.students_in(root_in)))
        s.log(f"grading {len(intake.students_in(root_in))} student folder(s) on {', '.join(s.names)}"
              + (f" (running {', '.join(s.students)} again; the others' unchanged notebooks keep their "
                 "results)" if s.students else ""))
        _timed(s, "course", lambda: merge.term_course(s))
        items = intake.collect(root_in, list(s.names), intake=got)
        _timed(s, "normalise", lambda: normalise_all(items, s))
        _timed(s, "run", lambda: dispatch.run_all(items, s))
        _timed(s, "merge", lambda: merge.merge(items, s))
        hygiene.clean_autograded(items, s)  # no hidden tests, no endless output, no active content
        record.update(s.out, items, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      sandbox="on" if s.sandbox else "OFF (--no-sandbox)")
        _timed(s, "outputs", lambda: outputs.write_all(
            s.out, db_url=s.db_url, settings=s, run_items=items, log=s.log,
            feedback={(it.student, it.assignment) for it in items}))
    return items


def normalise_all(items: list[Item], s: Settings) -> None:
    templates = {a: normalise.template(s.course, a, s.db_url) for a in s.names}
    for it in items:
        if it.status == "pending":
            try:
                it.notebook, notes = normalise.normalise(it.notebook, templates[it.assignment])
                it.reasons += notes
            except Exception as e:  # noqa: BLE001 - a notebook nbformat cannot read at all
                it.status, it.notebook = "flagged", None
                it.reasons.append(f"malformed notebook: {type(e).__name__}: {str(e).splitlines()[0][:200]}")


def _assignments(names, students) -> list[str]:
    known = course.assignments()
    if names:
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise SystemExit(f"unknown assignment(s) {unknown}; known: {known}")
        return list(names)
    return intake.assignments_present(students, known)


def _require_sandbox(s: Settings) -> None:
    if s.sandbox and not s.scheduler:
        from .sandbox import SandboxUnavailable, check
        try:
            check()
        except SandboxUnavailable as e:
            raise SystemExit(f"cannot grade in a sandbox: {e}") from None


def _timed(s: Settings, stage: str, fn) -> None:
    t = time.perf_counter()
    fn()
    s.log(f"  {stage}: {time.perf_counter() - t:.1f} s")
