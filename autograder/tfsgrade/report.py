"""The class report: per-exercise pass rates and a score histogram, from nbgrader's gradebook."""
from __future__ import annotations

import base64
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def pass_rates(root: Path, items, names, db_url=None):
    """{assignment: [(grade_id, points, n_full, n_graded)]} read from the gradebook."""
    from nbgrader.api import Gradebook
    out = {}
    with Gradebook(db_url or f"sqlite:///{root / 'gradebook.db'}") as gb:
        for a in names:
            graded = [it for it in items if it.assignment == a and it.status == "graded"]
            nb = gb.find_notebook(a, a)
            rows = []
            for gc in sorted(nb.grade_cells, key=lambda g: g.name):
                full = 0
                for it in graded:
                    g = gb.find_grade(gc.name, a, a, it.student)
                    if g.score is not None and abs(g.score - gc.max_score) < 1e-9:
                        full += 1
                rows.append((gc.name, gc.max_score, full, len(graded)))
            out[a] = rows
    return out


def write_report(out: Path, items, names, root: Path, db_url=None):
    rates = pass_rates(root, items, names, db_url)
    students = sorted({it.student for it in items})
    totals = {s: sum(it.score for it in items if it.student == s and it.status == "graded")
              for s in students}
    max_total = sum(max((it.max_score for it in items if it.assignment == a), default=0)
                    for a in names)

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(list(totals.values()), bins=min(10, max(3, len(students))), range=(0, max_total or 1),
            color="#4c72b0", edgecolor="white")
    ax.set_xlabel(f"total score (out of {max_total:g})")
    ax.set_ylabel("number of students")
    ax.set_title("Score distribution")
    fig.tight_layout()
    png = out / "score_histogram.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)

    md = ["# Class report", "", f"Students: {len(students)}; assignments: {', '.join(names)}", ""]
    md += ["## Scores", "", "| student | " + " | ".join(names) + " | total | status |",
           "|---|" + "---|" * len(names) + "---|---|"]
    for s in students:
        mine = {it.assignment: it for it in items if it.student == s}
        cells = [f"{mine[a].score:g}/{mine[a].max_score:g}" if a in mine and mine[a].status == "graded"
                 else "flagged" for a in names]
        status = "flagged" if any(i.status == "flagged" for i in mine.values()) else "graded"
        md.append(f"| {s} | " + " | ".join(cells) + f" | {totals[s]:g}/{max_total:g} | {status} |")
    md += ["", "![score histogram](score_histogram.png)", "", "## Pass rate per exercise test", "",
           "Share of graded submissions with full points on each graded test cell.", ""]
    for a in names:
        md += [f"### {a}", "", "| test | points | full marks | pass rate |", "|---|---|---|---|"]
        for gid, pts, full, n in rates[a]:
            pct = f"{100 * full / n:.0f}%" if n else "n/a"
            md.append(f"| {gid} | {pts:g} | {full}/{n} | {pct} |")
        md.append("")
    flagged = [(it, r) for it in items for r in it.reasons]
    md += ["## Flagged submissions", ""]
    if flagged:
        md += [f"- **{it.student} / {it.assignment}** ({it.status}): {r}" for it, r in flagged]
    else:
        md.append("None.")
    text = "\n".join(md) + "\n"
    (out / "report.md").write_text(text)

    img = base64.b64encode(png.read_bytes()).decode()
    body = []
    for line in md:
        if line.startswith("!["):
            body.append(f'<img alt="score histogram" src="data:image/png;base64,{img}">')
        elif line.startswith("### "):
            body.append(f"<h3>{html.escape(line[4:])}</h3>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("|---"):
            continue
        elif line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        elif line.startswith("- "):
            body.append(f"<p>&bull; {html.escape(line[2:]).replace('**', '')}</p>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    joined, page, in_table = body, [], False
    for b in joined:
        if b.startswith("<tr>") and not in_table:
            page.append("<table border=1 cellspacing=0 cellpadding=4>")
            in_table = True
        if not b.startswith("<tr>") and in_table:
            page.append("</table>")
            in_table = False
        page.append(b)
    if in_table:
        page.append("</table>")
    (out / "report.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Class report</title></head><body>"
        + "\n".join(page) + "</body></html>\n")
