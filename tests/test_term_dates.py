"""Due dates, extensions and late policies (issue 29, item 4), without nbgrader runs: the
policy table, nbgrader's plugin interface, what --due / --extensions / --term accept, and how a
feedback page shows a late or pending notebook."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tfsgrade import outputs, term

DAY = term.DAY


@pytest.mark.parametrize("policy, per_day, cutoff, late_s, want", [
    ("none", 0.0, None, 5 * DAY, 0.0),
    ("per-day", 0.1, None, 0, 0.0),              # on time
    ("per-day", 0.1, None, 1, 1.0),              # one second late: a started day
    ("per-day", 0.1, None, DAY + 1, 2.0),        # two started days
    ("per-day", 0.25, None, 10 * DAY, 10.0),     # never more than the score
    ("per-day", 0.1, 3, 3 * DAY + 1, 10.0),      # past the cut-off: 0
    ("zero-after", 0.0, None, 60, 10.0),         # late at all: 0
    ("zero-after", 0.0, 2, DAY, 0.0),            # inside the grace period
    ("zero-after", 0.0, 2, 2 * DAY + 1, 10.0),
])
def test_penalty_table(policy, per_day, cutoff, late_s, want):
    t = term.Term(policy=policy, penalty_per_day=per_day, cutoff_days=cutoff)
    assert t.penalty(10.0, late_s) == pytest.approx(want)
    plugin = term.TermLatePenalty(policy=policy, penalty_per_day=per_day,
                                  cutoff_days=-1 if cutoff is None else cutoff)
    assert plugin.late_submission_penalty("s", 10.0, late_s) == pytest.approx(want)  # nbgrader's view


def test_due_dates_and_extensions(tmp_path):
    ext = tmp_path / "ext.csv"
    ext.write_text("student_id,assignment,extension\nada,01_attention,2d\nben,,36h\n"
                   "cleo,01_attention,2026-10-09 23:59 UTC\n")
    t = term.configure(tmp_path, due=["01_attention=2026-10-02 23:59 UTC", "2026-12-01T12:00+01:00"],
                       extensions=ext, policy="per-day", penalty_per_day=0.1)
    due = t.due_of("01_attention")
    assert term.iso(due) == "2026-10-02T23:59:00Z"
    assert term.iso(t.due_of("02_masks")) == "2026-12-01T11:00:00Z"       # "*": every other one
    assert t.extension_of("ada", "01_attention", due) == timedelta(days=2)
    assert t.extension_of("ben", "02_masks", due) == timedelta(hours=36)  # every assignment
    assert t.extension_of("cleo", "01_attention", due) == timedelta(days=7)
    assert t.extension_of("dan", "01_attention", due) == timedelta(0)
    again = term.load(tmp_path)                                           # kept in OUT
    assert again == t


def test_term_file(tmp_path):
    (tmp_path / "ext.csv").write_text("student_id,extension\nada,1d\n")
    (tmp_path / "term.toml").write_text(
        '[due]\n"01_attention" = "2026-10-02 23:59 Europe/Berlin"\n'
        '[late]\npolicy = "zero-after"\ncutoff_days = 2\n[extensions]\nfile = "ext.csv"\n')
    t = term.configure(tmp_path / "out", term_file=tmp_path / "term.toml")
    assert term.iso(t.due_of("01_attention")) == "2026-10-02T21:59:00Z"   # CEST is UTC+2
    assert t.policy == "zero-after" and t.cutoff_days == 2
    assert t.extension_of("ada", "02_masks", None) == timedelta(days=1)


@pytest.mark.parametrize("kw, message", [
    (dict(due=["01_attention=next friday"]), "not a date"),
    (dict(policy="per-day"), "penalty-per-day"),
    (dict(policy="sometimes"), "late policy"),
])
def test_bad_settings_say_what_is_wrong(tmp_path, kw, message):
    with pytest.raises(ValueError, match=message):
        term.configure(tmp_path, **kw)


def test_bad_extension_row_names_its_line(tmp_path):
    p = tmp_path / "ext.csv"
    p.write_text("student_id,extension\nada,2d\nben,\n")
    with pytest.raises(ValueError, match="line 3"):
        term.read_extensions(p)


PAGE = ('<h4>01_attention (Score: 14.0 / 17.0)</h4><div id="toc"><ol>'
        '<li><a href="#q_one">Written response</a> (Score: 0.0 / 1.0)</li>'
        '<li><a href="#q_two">Written response</a> (Score: 1.0 / 1.0)</li></ol></div>'
        '<a name="q_one"></a><div class="panel-heading"><span class="nbgrader-label">Student\'s '
        'answer</span><span class="pull-right">Score: 0.0 / 1.0 <a href="#top">(Top)</a></span></div>'
        '<a name="q_two"></a><div class="panel-heading"><span class="pull-right">Score: 1.0 / 1.0 '
        '<a href="#top">(Top)</a></span></div>')


def test_feedback_page_says_waiting_and_late():
    m = outputs.Mark(raw=15, penalty=1, max=17, waiting=[("q_one", 1.0)], late="1.2 day(s) late: -1 point(s)")
    page = outputs.mark_page(PAGE, m)
    assert page.count("Score: waiting for a grader / 1.0") == 2      # contents and the cell
    assert "Score: 1.0 / 1.0" in page                                 # a graded answer stays
    assert "1 answer(s) (1 point(s)) waiting for a grader" in page
    assert "Submitted 1.2 day(s) late" in page


def test_one_writer_at_a_time(tmp_path):
    from tfsgrade import record
    with record.writing(tmp_path):
        with pytest.raises(SystemExit, match="another tfs-grade run"):
            with record.writing(tmp_path):
                pass
    with record.writing(tmp_path):      # released: the next run goes ahead
        pass


def test_a_students_own_timestamp_is_not_evidence(tmp_path):
    """In student folders, a timestamp.txt is the student's to write: lateness comes from the
    file's time instead (nbgrader's exchange layout keeps nbgrader's timestamp.txt)."""
    from nbtools import A01, student_notebook, write
    from tfsgrade import intake
    write(student_notebook(A01), tmp_path / "ada" / f"{A01}.ipynb")
    (tmp_path / "ada" / "timestamp.txt").write_text("2020-01-01 00:00:00 UTC")
    it = next(i for i in intake.collect(tmp_path, [A01]) if i.student == "ada")
    assert it.submitted_from == "file time" and not it.submitted_at.startswith("2020")


def test_a_later_ungradable_submission_never_hides_a_grade(tmp_path):
    """Week 2's download lacks ada's 01 (or holds a broken copy): her 01 grade from week 1
    stands in the record, with a note; a student never graded stays flagged."""
    from tfsgrade import record
    from tfsgrade.intake import Item
    record.update(tmp_path, [Item("ada", "01_attention", status="graded", flags=["x"])], "2026-10-01T00:00:00Z")
    record.update(tmp_path, [Item("ada", "01_attention", status="flagged", reasons=["missing notebook"]),
                             Item("ben", "01_attention", status="flagged", reasons=["missing notebook"])],
                  "2026-10-08T00:00:00Z")
    got = {it.student: it for it in record.items(tmp_path)}
    assert got["ada"].status == "graded" and got["ada"].graded_at == "2026-10-01T00:00:00Z"
    assert "not graded: missing notebook" in got["ada"].reasons[0] and "x" in got["ada"].flags
    assert got["ben"].status == "flagged"
