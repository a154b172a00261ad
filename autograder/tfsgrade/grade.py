"""Grade a class: a folder or zip of submissions -> nbgrader gradebook -> autograde ->
feedback HTML -> grades.csv -> a class report.

Accepted layouts (a zip may wrap either in one top folder):
    SUBMISSIONS/<student>/<assignment>.ipynb
    SUBMISSIONS/<student>/<assignment>/<assignment>.ipynb

A submission that cannot be graded (missing, unreadable JSON, not a notebook, a kernel that
dies, a run past the time limit) is flagged with its reason in grades.csv and the report;
every other submission is still graded.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import course

STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")


@dataclass
class Item:
    student: str
    assignment: str
    path: Path | None = None
    status: str = "pending"  # graded | flagged
    reasons: list[str] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0


def _unpack(src: Path, work: Path) -> Path:
    if src.is_file() and zipfile.is_zipfile(src):
        dest = work / "unzipped"
        with zipfile.ZipFile(src) as z:
            for m in z.infolist():
                p = Path(m.filename)
                if p.is_absolute() or ".." in p.parts:
                    raise ValueError(f"unsafe path in zip: {m.filename}")
            z.extractall(dest)
        entries = [p for p in dest.iterdir() if not p.name.startswith(("__MACOSX", "."))]
        # one wrapping folder whose children are all folders: descend into it
        if len(entries) == 1 and entries[0].is_dir():
            kids = [p for p in entries[0].iterdir() if not p.name.startswith(".")]
            if kids and all(k.is_dir() for k in kids) and not any(
                    k.name in course.assignments() for k in kids):
                return entries[0]
        return dest
    if src.is_dir():
        return src
    raise FileNotFoundError(f"{src} is neither a folder nor a zip file")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _find(student_dir: Path, a: str) -> tuple[Path | None, str | None]:
    """Find the notebook for assignment `a`; return (path, note about renaming)."""
    for cand in (student_dir / f"{a}.ipynb", student_dir / a / f"{a}.ipynb"):
        if cand.is_file():
            return cand, None
    pool = list(student_dir.glob("*.ipynb")) + list((student_dir / a).glob("*.ipynb"))
    pool = [p for p in pool if not p.name.startswith(".")]
    close = [p for p in pool if _norm(a) in _norm(p.stem)]
    if len(close) == 1:
        return close[0], f"notebook was renamed to {close[0].name!r}; graded as {a}.ipynb"
    inside = list((student_dir / a).glob("*.ipynb"))
    if len(inside) == 1:
        return inside[0], f"notebook was renamed to {inside[0].name!r}; graded as {a}.ipynb"
    return None, None


def _validate(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError as e:
        return f"cannot read file: {e}"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"malformed notebook: not valid JSON ({e})"
    if not isinstance(data, dict) or "cells" not in data:
        return "malformed notebook: no 'cells' list (not a Jupyter notebook)"
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # noqa: BLE001
        return f"malformed notebook: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


def _restore_test_cells(sub_path: Path, src_path: Path) -> list[str]:
    """Put graded test cells the student deleted back where the source has them, so the
    student's code is still tested (nbgrader would score a missing test cell 0). Returns
    the grade_ids restored."""
    sub = nbformat.read(sub_path, as_version=4)
    src = nbformat.read(src_path, as_version=4)
    have = {c.metadata.get("nbgrader", {}).get("grade_id") for c in sub.cells}
    restored, prev_id = [], None
    for c in src.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid and c.metadata["nbgrader"].get("grade") and gid not in have:
            pos = len(sub.cells)
            for i, sc in enumerate(sub.cells):
                if prev_id is not None and (sc.get("id") == prev_id or
                                            sc.metadata.get("nbgrader", {}).get("grade_id") == prev_id):
                    pos = i + 1
                    break
            sub.cells.insert(pos, nbformat.from_dict(c))
            restored.append(gid)
        prev_id = gid or c.get("id")
    if restored:
        nbformat.write(sub, sub_path)
    return restored


def _tail(text: str, n=6) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    errs = [ln for ln in lines if "ERROR" in ln or "Error" in ln or "error" in ln]
    pick = errs[-n:] if errs else lines[-n:]
    return " | ".join(s.strip()[:240] for s in pick)


def _read_log(group: list[Item], text: str, timeout: int):
    """Attach what nbgrader's log says about each student to that student's item."""
    segments, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Creating/updating student with ID '([^']+)'", line)
        if m:
            cur = m.group(1)
        if cur:
            segments.setdefault(cur, []).append(line)
    for it in group:
        seg = "\n".join(segments.get(it.student, []))
        if "Timeout waiting for execute reply" in seg or "CellTimeoutError" in seg:
            it.reasons.append(f"a cell ran past the {timeout}s limit (an infinite loop?) and was "
                              "interrupted; the rest of the notebook was graded")
        if "DeadKernelError" in seg or "Kernel died" in seg or "kernel died" in seg.lower():
            it.reasons.append("the kernel died while running the notebook (out of memory or a "
                              "crash); cells after that point score 0")
        if "unresponsive" in seg:
            it.reasons.append("the kernel became unresponsive and could not be interrupted")


def _graded_students(root: Path, db_url, a: str) -> set:
    from nbgrader.api import Gradebook
    with Gradebook(db_url or f"sqlite:///{root / 'gradebook.db'}") as gb:
        return {s.student.id for s in gb.assignment_submissions(a)
                if (root / "autograded" / s.student.id / a / f"{a}.ipynb").exists()}


def grade(submissions: Path, out: Path, *, names: list[str] | None = None,
          db_url: str | None = None, timeout: int = 120, notebook_timeout: int = 900,
          mem_gb: float = 6.0, log=print) -> list[Item]:
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tfs-grade-"))
    try:
        root_in = _unpack(Path(submissions), work)
        students = sorted(p for p in root_in.iterdir()
                          if p.is_dir() and not p.name.startswith((".", "__")))
        known = course.assignments()
        if names:
            unknown = sorted(set(names) - set(known))
            if unknown:
                raise SystemExit(f"unknown assignment(s) {unknown}; known: {known}")
        else:
            present = set()
            for s in students:
                for p in list(s.glob("*.ipynb")) + list(s.glob("*/*.ipynb")):
                    for a in known:
                        if _norm(a) in _norm(p.stem) or _norm(a) == _norm(p.parent.name):
                            present.add(a)
            names = sorted(present) or known
        log(f"grading {len(students)} student folder(s) on {', '.join(names)}")

        root = course.make_course(out / "course", names, db_url=db_url, timeout=timeout)
        shutil.rmtree(root / "submitted", ignore_errors=True)
        shutil.rmtree(root / "autograded", ignore_errors=True)
        shutil.rmtree(root / "feedback", ignore_errors=True)
        course.generate(root, names)

        from nbgrader.api import Gradebook
        items: list[Item] = []
        for sdir in students:
            sid = sdir.name
            if not STUDENT_RE.match(sid):
                items.append(Item(sid, "*", status="flagged",
                                  reasons=[f"student folder name {sid!r} is not a usable id"]))
                continue
            for a in names:
                it = Item(sid, a)
                items.append(it)
                path, note = _find(sdir, a)
                if note:
                    it.reasons.append(note)
                if path is None:
                    found = sorted(str(p.relative_to(sdir)) for p in sdir.rglob("*") if p.is_file())[:10]
                    it.status = "flagged"
                    it.reasons.append(f"missing notebook {a}.ipynb (found: {', '.join(found) or 'nothing'})")
                    continue
                bad = _validate(path)
                if bad:
                    it.status, it.path = "flagged", path
                    it.reasons.append(bad)
                    continue
                dst = root / "submitted" / sid / a / f"{a}.ipynb"
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dst)
                it.path = dst
                restored = _restore_test_cells(dst, root / "source" / a / f"{a}.ipynb")
                if restored:
                    it.reasons.append("test cells deleted by the student were put back from the "
                                      f"source and graded: {', '.join(restored)}")

        with Gradebook(f"sqlite:///{root / 'gradebook.db'}" if not db_url else db_url) as gb:
            for it in items:
                if it.path is not None and it.status == "pending":
                    gb.update_or_create_student(it.student)

        pending = [it for it in items if it.status == "pending"]
        # One nbgrader run per assignment grades the whole class (start-up paid once; nbgrader
        # isolates students: one student's failure is logged and the others go on). Students
        # left without a result, e.g. when the whole run had to be killed, are retried alone.
        for a in names:
            group = [it for it in pending if it.assignment == a]
            if not group:
                continue
            log(f"  autograde {a}: {len(group)} submission(s)")
            r = course.run_nbgrader(root, ["autograde", a, "--force"],
                                    timeout=notebook_timeout * len(group), mem_gb=mem_gb)
            _read_log(group, (r.stdout or "") + "\n" + (r.stderr or ""), timeout)
            if r.returncode != 0:
                done = _graded_students(root, db_url, a)
                for it in group:
                    if it.student in done:
                        continue
                    log(f"  autograde {a} again for {it.student} alone")
                    r1 = course.run_nbgrader(root, ["autograde", a, "--student", it.student, "--force"],
                                             timeout=notebook_timeout, mem_gb=mem_gb)
                    text = (r1.stdout or "") + "\n" + (r1.stderr or "")
                    _read_log([it], text, timeout)
                    if r1.returncode != 0:
                        it.reasons.append(f"nbgrader autograde failed ({r1.returncode}): {_tail(text)}")

        with Gradebook(db_url or f"sqlite:///{root / 'gradebook.db'}") as gb:
            for it in items:
                if it.status != "pending":
                    continue
                try:
                    sub = gb.find_submission(it.assignment, it.student)
                    it.score, it.max_score = float(sub.score), float(sub.max_score)
                    it.status = "graded"
                except Exception:  # noqa: BLE001 - nbgrader recorded nothing for it
                    it.status = "flagged"
                    if not it.reasons:
                        it.reasons.append("autograde produced no result")
            max_by_a = {a: float(gb.find_assignment(a).max_score) for a in names}
        for it in items:
            if it.assignment in max_by_a:
                it.max_score = max_by_a[it.assignment]

        # feedback: nbgrader's own HTML, one file per graded student and assignment
        fb_out = out / "feedback"
        shutil.rmtree(fb_out, ignore_errors=True)
        for a in names:
            if any(it.assignment == a and it.status == "graded" for it in items):
                r = course.run_nbgrader(root, ["generate_feedback", a, "--force"], timeout=600)
                if r.returncode != 0:
                    log(f"  generate_feedback {a} reported problems: {_tail(r.stdout + r.stderr)}")
        for it in items:
            src = root / "feedback" / it.student / it.assignment / f"{it.assignment}.html"
            if it.status == "graded" and src.exists():
                (fb_out / it.student).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, fb_out / it.student / f"{it.assignment}.html")
            elif it.status == "graded":
                it.reasons.append("feedback could not be generated")

        course.run_nbgrader(root, ["export", "--to", str(out / "nbgrader_export.csv")], timeout=300)
        _write_csv(out / "grades.csv", items, names, max_by_a)
        from .report import write_report
        write_report(out, items, names, root, db_url)
        return items
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_csv(path: Path, items: list[Item], names: list[str], max_by_a: dict):
    students = sorted({it.student for it in items})
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", *names, "total", "max_total", "status", "notes"])
        for s in students:
            mine = {it.assignment: it for it in items if it.student == s}
            row = [s]
            for a in names:
                it = mine.get(a)
                row.append(f"{it.score:g}" if it and it.status == "graded" else "")
            total = sum(it.score for it in mine.values() if it.status == "graded")
            status = "flagged" if any(it.status == "flagged" for it in mine.values()) else "graded"
            notes = "; ".join(f"{it.assignment}: {r}" for it in mine.values() for r in it.reasons)
            row += [f"{total:g}", f"{sum(max_by_a.values()):g}", status, notes]
            w.writerow(row)
