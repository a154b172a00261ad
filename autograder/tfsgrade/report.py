"""The class report: per-exercise pass rates and a score histogram, from nbgrader's gradebook."""
from __future__ import annotations

import base64
import html
import json
import re
from collections import Counter
from pathlib import Path

import matplotlib

from . import course, manifest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def pass_rates(root: Path, items, names, db_url=None):
    """{assignment: [(grade_id, points, n_full, n_graded, n_waiting)]} read from the gradebook:
    an answer waiting for a grader counts in n_waiting, not in n_graded (never as a 0)."""
    from nbgrader.api import Gradebook
    out = {}
    with Gradebook(db_url or f"sqlite:///{root / 'gradebook.db'}") as gb:
        for a in names:
            graded = [it for it in items if it.assignment == a and it.status == "graded"]
            nb = gb.find_notebook(a, a)
            answers = {c.name for c in nb.solution_cells}
            rows = []
            for gc in sorted(nb.grade_cells, key=lambda g: g.name):
                full = n = waiting = 0
                for it in graded:
                    g = gb.find_grade(gc.name, a, a, it.student)
                    if gc.name in answers and g.manual_score is None and g.needs_manual_grade:
                        waiting += 1
                        continue
                    n += 1
                    if g.score is not None and abs(g.score - gc.max_score) < 1e-9:
                        full += 1
                rows.append((gc.name, gc.max_score, full, n, waiting))
            out[a] = rows
    return out


_NOT_DONE = "not attempted (the exercise still raises NotImplementedError)"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GENERIC = re.compile(r"does not match the reference|has the wrong shape\.?$| raised \w+", re.I)


def _first_line(output: dict) -> str:
    """The first line of the failure message a student saw in a test cell's error output (with
    its last line when the first only says what differs: "... does not match the reference",
    "... has the wrong shape", "... raised RuntimeError: ...")."""
    ename = output.get("ename", "")
    value = _ANSI.sub("", output.get("evalue", "") or "").strip()
    if ename in ("NotImplementedError", "NotDone"):
        return _NOT_DONE
    lines = [ln.strip() for ln in value.splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    # comparisons and crashes state WHAT differs first and the likely mistake last: keep both
    last = next((ln for ln in reversed(value.splitlines())
                 if ln.strip() and not ln.startswith(" ")), "").strip()
    if _GENERIC.search(line) and last and last != line:
        line = f"{line} ... {last}"
    if ename in ("CheckFailed", "ShortcutUsed") and line:
        return line
    return f"{ename}: {line}" if line else ename or "error"


def notebook_diagnoses(path: Path) -> dict:
    """{exercise: first line of the first failing test cell's message, in notebook order},
    read from an autograded notebook's error outputs (what the student's feedback shows)."""
    nb = json.loads(Path(path).read_text())
    cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    meta = [c.get("metadata", {}).get("nbgrader", {}) for c in cells]
    owners = manifest.owners(Path(path).stem)     # autograded/<student>/<a>/<a>.ipynb
    found: dict = {}
    for c, m in zip(cells, meta):
        if not m.get("grade") or m.get("solution"):
            continue
        ex = owners.get(m.get("grade_id", ""))
        if ex is None or ex in found:
            continue
        err = next((o for o in c.get("outputs", []) if o.get("output_type") == "error"), None)
        if err is not None:
            found[ex] = _first_line(err)
    return found


def class_diagnoses(root: Path, items, names):
    """{assignment: {exercise: (n_graded, Counter(first diagnosis))}} over the graded
    submissions: per student and exercise, the first failure message (first line) they saw."""
    out = {}
    for a in names:
        graded = [it for it in items if it.assignment == a and it.status == "graded"]
        per_ex: dict = {}
        for it in graded:
            path = course.notebook_path(root, "autograded", a, it.student)
            if not path.exists():
                continue
            try:
                found = notebook_diagnoses(path)
            except (OSError, ValueError):
                continue
            for ex, line in found.items():
                per_ex.setdefault(ex, Counter())[line] += 1
        out[a] = {ex: (len(graded), c) for ex, c in per_ex.items()}
    return out


def _diagnosis_lines(diag, names, top=5):
    md = ["## What the class got wrong", "",
          "Per exercise, the most frequent first diagnosis: the first line of the first failing "
          "test's message, as each student saw it in their feedback.", ""]
    for a in names:
        md += [f"### {a}", ""]
        if not diag.get(a):
            md += ["No failing exercise.", ""]
            continue
        for ex, (n, counts) in sorted(diag[a].items()):
            md.append(f"**{ex}**: {sum(counts.values())} of {n} failed")
            for line, k in counts.most_common(top):
                md.append(f"- {k} of {n}: {line}")
        md.append("")
    return md


def write_report(out: Path, items, names, root: Path, db_url=None, settings=None, marks=None,
                 run_items=None):
    """report.md and report.html. `marks`: {(student, notebook): tfsgrade.outputs.Mark} (scores
    after late penalties, answers waiting for a grader, lateness); `run_items`: the Items of the
    run that wrote it (its timings), none after `tfs-grade export`."""
    marks = marks or {}
    students = sorted({it.student for it in items})
    totals = {s: sum(it.score for it in items if it.student == s and it.status == "graded")
              for s in students}
    max_total = sum(max((it.max_score for it in items if it.assignment == a), default=0)
                    for a in names)
    png = _histogram(out, list(totals.values()), max_total, len(students))
    md = ["# Class report", "", f"Students: {len(students)}; assignments: {', '.join(names)}", ""]
    md += _score_lines(items, names, marks, totals, max_total)
    md += ["", "![score histogram](score_histogram.png)", ""]
    md += _rate_lines(pass_rates(root, items, names, db_url), names)
    late = [(k, m.late) for k, m in sorted(marks.items()) if m.late]
    md += ["## Late submissions", ""]
    md += [f"- **{st} / {a}**: {why}" for (st, a), why in late] or ["None."]
    md.append("")
    md += _diagnosis_lines(class_diagnoses(root, items, names), names)
    md += _review_lines(items)
    run = out / "grading_run.md"   # the last run's section stays in reports written by export
    if settings is not None and run_items:
        run.write_text("\n".join(run_section(run_items, settings)) + "\n")
    if run.exists():
        md += ["", *run.read_text().splitlines()]
    (out / "report.md").write_text("\n".join(md) + "\n")
    _write_html(out, md, png)


def _histogram(out: Path, totals: list, max_total: float, n: int) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(totals, bins=min(10, max(3, n)), range=(0, max_total or 1),
            color="#4c72b0", edgecolor="white")
    ax.set_xlabel(f"total score (out of {max_total:g})")
    ax.set_ylabel("number of students")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))   # whole students, never 0.5
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Score distribution")
    fig.tight_layout()
    png = out / "score_histogram.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _score_lines(items, names, marks, totals, max_total) -> list[str]:
    md = ["## Scores", "", "Scores after any late penalty; answers waiting for a grader are "
          "shown apart (\"+ N waiting\"), never as 0.", "",
          "| student | " + " | ".join(names) + " | total | status |",
          "|---|" + "---|" * len(names) + "---|---|"]
    for s in sorted(totals):
        mine = {it.assignment: it for it in items if it.student == s}
        cells = [_score_cell(mine[a], marks.get((s, a))) if a in mine and mine[a].status == "graded"
                 else "flagged" if a in mine else "" for a in names]
        status = ("flagged" if any(i.status == "flagged" for i in mine.values()) else
                  "review" if any(i.review for i in mine.values()) else "graded")
        if any(marks.get((s, a)) and marks[(s, a)].waiting for a in names):
            status += ", waiting for a grader"
        md.append(f"| {s} | " + " | ".join(cells) + f" | {totals[s]:g}/{max_total:g} | {status} |")
    return md


def _rate_lines(rates, names) -> list[str]:
    md = ["## Pass rate per exercise test", "",
          "Share of graded submissions with full points on each graded cell; answers waiting "
          "for a grader are counted apart, not as failures.", ""]
    for a in names:
        md += [f"### {a}", "", "| test | points | full marks | pass rate | waiting for a grader |",
               "|---|---|---|---|---|"]
        for gid, pts, full, n, waiting in rates[a]:
            pct = f"{100 * full / n:.0f}%" if n else "n/a"
            md.append(f"| {gid} | {pts:g} | {full}/{n} | {pct} | {waiting or ''} |")
        md.append("")
    return md


def _review_lines(items) -> list[str]:
    review = [(it, f) for it in items for f in getattr(it, "flags", [])]
    md = ["## For review: scan findings and similar work", "",
          "The static scan of every submission (a certain shortcut already scored 0; the rest "
          "is for you to judge), solution cells too similar to the course's, the reference's "
          "or a classmate's, the instructor's solution notebook handed in, free-text answers "
          "equal to the model answer or a classmate's (side by side in similarity.html), and "
          "answers changed since you graded them by hand.", ""]
    md += [f"- **{it.student} / {it.assignment}**: {f}" for it, f in review] or ["None."]
    md += ["", "## Status review: code the scan cannot read", "",
           "Inside an exercise: a name computed at run time, code run from a string, a loader, "
           "the interpreter's objects searched, PyTorch's internals. The points it earned are "
           "counted above; decide them in the formgrader, where its test cells are listed.", ""]
    md += [f"- **{it.student} / {it.assignment}**: {r}" for it in items for r in it.review] or ["None."]
    md += ["", "## Flagged submissions", ""]
    flagged = [(it, r) for it in items for r in it.reasons]
    md += [f"- **{it.student} / {it.assignment}** ({it.status}): {r}" for it, r in flagged] or ["None."]
    return md


def _html_line(line: str, img: str) -> str | None:
    """One markdown line of the report as HTML, everything in it escaped."""
    if line.startswith("!["):
        return f'<img alt="score histogram" src="data:image/png;base64,{img}">'
    for mark, tag in (("### ", "h3"), ("## ", "h2"), ("# ", "h1")):
        if line.startswith(mark):
            return f"<{tag}>{html.escape(line[len(mark):])}</{tag}>"
    if line.startswith("|---"):
        return None
    if line.startswith("|"):
        cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
        return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
    if line.startswith("- "):
        return f"<p>&bull; {html.escape(line[2:]).replace('**', '')}</p>"
    return f"<p>{html.escape(line).replace('**', '')}</p>" if line else None


STYLE = """<style>
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       max-width: 72rem; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.8rem; } h2 { font-size: 1.35rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1.1rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; }
th, td { border: 1px solid #d0d7de; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } tr:nth-child(even) td { background: #fafbfc; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
img { max-width: 100%; }
</style>"""


def _write_html(out: Path, md: list[str], png: Path) -> None:
    img = base64.b64encode(png.read_bytes()).decode()
    page, in_table = [], False
    for b in filter(None, (_html_line(line, img) for line in md)):
        if b.startswith("<tr>") != in_table:     # a table starts or ends here
            page.append("<table>" if not in_table else "</table>")
            in_table = not in_table
            if in_table:                         # its first row is the header
                b = b.replace("<td>", "<th>").replace("</td>", "</th>")
        page.append(b)
    if in_table:
        page.append("</table>")
    sim = out / "similarity.html"
    if sim.exists():  # already escaped by tfsgrade.similarity.render_html
        text = sim.read_text(encoding="utf-8")
        page.append(text[text.find("<body>") + 6:text.rfind("</body>")] if "<body>" in text else text)
    (out / "report.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Class report</title>" + STYLE
        + "</head><body>"
        + "\n".join(page) + "</body></html>\n")


def _score_cell(it, m) -> str:
    text = f"{it.score:g}/{it.max_score:g}"
    if m is not None and m.waiting:
        text += f" + {sum(p for _, p in m.waiting):g} waiting"
    if m is not None and m.penalty:
        text += f" (late -{m.penalty:g})"
    return text


def run_section(items, s) -> list[str]:
    """How this run graded: the sandbox (or its absence), limits, per-task timings."""
    md = ["## Grading run", ""]
    if s.sandbox:
        caps = sorted({(it.result or {}).get("sandbox", {}).get("memory_cap", "?") for it in items if it.result})
        starts = [it.result["sandbox"]["start_ms"] for it in items
                  if it.result and "start_ms" in it.result.get("sandbox", {})]
        md.append(f"Sandbox: ON (bubblewrap: read-only system and course, no network, own PID "
                  f"namespace, scratch-only writes; memory cap via {', '.join(caps) or 'n/a'}). "
                  + (f"Sandbox + runner start: median {sorted(starts)[len(starts) // 2]:.0f} ms." if starts else ""))
    else:
        md.append("Sandbox: OFF (--no-sandbox): student code ran unisolated, as the instructor.")
    lim = s.limits
    md += ["", f"Limits: {lim.cell_timeout}s per cell, {lim.notebook_timeout}s per notebook, "
           f"{lim.mem_gb:g} GB memory, {lim.max_procs} processes, {lim.output_mb:g} MB output; "
           f"workers: {s.scheduler or s.workers}.", "",
           "Demonstration cells: " + ("all run (--run-demos)." if s.run_demos is True else
                                      "unchanged ones that nothing graded reads were left out "
                                      "(the feedback says so under each; --run-demos runs them"
                                      + (f", as it did for {', '.join(s.run_demos)}" if s.run_demos else "")
                                      + ")."), "",
           "| student | notebook | task s | slowest cell s | kernel restarts | demos left out | worker |",
           "|---|---|---|---|---|---|---|"]
    for it in items:
        r = it.result or {}
        if not r:
            continue
        secs = r.get("seconds") or {}
        md.append(f"| {it.student} | {it.assignment} | {r.get('timings', {}).get('total_s', '')} | "
                  f"{max(secs.values()) if secs else ''} | {r.get('restarts', 0)} | "
                  f"{r.get('demos_left_out', '')} | {r.get('host', '')} |")
    return md
