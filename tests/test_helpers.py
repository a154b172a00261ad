"""Unit tests of the helpers package: checks, the shortcut guard, plots, explorers."""
import contextlib
import io

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tfscratch import plots, widgets  # noqa: E402
from tfscratch.checks import core  # noqa: E402


def test_guard_catches_every_spelling_of_softmax():
    x = torch.randn(3, 4)
    from torch.nn.functional import softmax as imported_early
    for f in (lambda: torch.softmax(x, -1), lambda: F.softmax(x, -1), lambda: x.softmax(-1),
              lambda: nn.Softmax(-1)(x), lambda: imported_early(x, -1),
              lambda: torch.special.softmax(x, -1)):
        with pytest.raises(core.ShortcutUsed, match="Shortcut used"):
            with core.no_shortcuts("softmax"):
                f()
    with core.no_shortcuts("softmax"):
        (x.exp() / x.exp().sum(-1, keepdim=True))  # basic ops are fine
    torch.softmax(x, -1)  # and the guard is gone afterwards


def test_guard_blocks_modules_and_restores_them():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 3, 8)
    with pytest.raises(core.ShortcutUsed):
        with core.no_shortcuts("multihead"):
            mha(x, x, x)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    with pytest.raises(core.ShortcutUsed):
        with core.no_shortcuts("transformer"):
            layer(x)
    mha(x, x, x)
    layer(x)
    for name in ("layer_norm", "batch_norm", "attention"):
        with pytest.raises(core.ShortcutUsed):
            with core.no_shortcuts(name):
                {"layer_norm": lambda: F.layer_norm(x, (8,)),
                 "batch_norm": lambda: nn.BatchNorm1d(8)(x[0]),
                 "attention": lambda: F.scaled_dot_product_attention(x, x, x)}[name]()


def test_call_reports_crashes_with_shapes_and_a_hint():
    def bad(x):
        return x @ torch.ones(5, 2)
    with pytest.raises(core.CheckFailed, match=r"shapes cannot be multiplied[\s\S]*\(3, 4\)"):
        core.call(bad, torch.ones(3, 4))

    def stub(x):
        raise NotImplementedError()
    with pytest.raises(NotImplementedError):
        core.call(stub, torch.ones(1))


def test_seeded_restores_the_global_rng():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    with core.seeded(7):
        a = torch.randn(3)
    with core.seeded(7):
        b = torch.randn(3)
    assert torch.equal(a, b)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_checks_write_nothing_to_stderr():
    from tfscratch import checks
    from tfscratch.reference import scaled_dot_product_attention, softmax
    chk = checks.notebook("01_attention")
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        chk.test_softmax_rows(softmax)
        chk.test_scaled_dot_product_attention_weights(scaled_dot_product_attention)
    assert err.getvalue() == ""
    assert out.getvalue().count("\u2714") == 2


def test_plots_return_labelled_figures():
    w = torch.softmax(torch.randn(3, 4), -1)
    fig = plots.attention_heatmap(w, ["a", "b", "c"], ["w", "x", "y", "z"])
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    plt.close(fig)
    fig = plots.heatmap_grid(torch.rand(2, 3, 4, 4), row_titles=["L1", "L2"], col_titles=["h1", "h2", "h3"])
    assert len(fig.axes) == 6
    plt.close(fig)
    with pytest.raises(ValueError, match="2-D"):
        plots.heatmap(torch.rand(2, 2, 2))
    fig = plots.curves([1, 2, 3], {"a": [1, 2, 3], "b": [3, 2, 1]}, xlabel="x", ylabel="y")
    assert fig.axes[0].get_legend() is not None
    plt.close(fig)
    assert plt.get_fignums() == []  # no state left behind


def test_explorer_static_without_front_end(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert not widgets.widgets_available()
    calls = []

    def draw(n=3, flag=False):
        calls.append((n, flag))
        fig, ax = plt.subplots()
        ax.plot(range(n))
        return fig
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.append(a) or None)
    ex = widgets.explore(draw, n=(1, 10, 1, 3), flag=False)
    assert calls == [(3, False)] and ex.widgets == {}
    fig = ex.render(n=5)
    assert fig is not None and calls[-1] == (5, False)

    def broken(n=1):
        raise ValueError("boom")
    ex2 = widgets.Explorer(broken, {"n": (1, 3)})
    assert ex2.render(n=2) is None and "boom" in ex2.error


def test_explorer_builds_widgets_when_interactive(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)

    def draw(d=2, scale=True, temp=1.0, kind="a"):
        fig, ax = plt.subplots()
        ax.set_title(f"{d}{scale}{temp}{kind}")
        return fig
    ex = widgets.Explorer(draw, {"d": (1, 9, 1, 2), "scale": True, "temp": (0.1, 5.0, 0.1, 1.0),
                                 "kind": ["a", "b"]}).show(interactive=True)
    import ipywidgets as w
    assert isinstance(ex.widgets["d"], w.IntSlider) and isinstance(ex.widgets["scale"], w.Checkbox)
    assert isinstance(ex.widgets["temp"], w.FloatSlider) and isinstance(ex.widgets["kind"], w.Dropdown)
    ex.widgets["d"].value = 7  # a slider move redraws with the new value
    assert ex.values["d"] == 7 and ex.figure is not None
    assert ex.figure.axes[0].get_title().startswith("7")


def test_not_done_and_the_compact_box():
    """A stub becomes NotDone (one grey line naming it); a crash in the student's code becomes a
    box that names the check, the message and the student's own line, and no course frame."""
    from tfscratch import checks
    from tfscratch.checks.display import render_failure
    chk = checks.notebook("01_attention")

    def softmax(x, dim=-1):
        raise NotImplementedError()
    with pytest.raises(core.NotDone) as info:
        chk.test_softmax_rows(softmax)
    assert str(info.value) == "softmax: not implemented yet"
    assert info.value._render_traceback_() == ["\x1b[90m\u25cb softmax: not implemented yet\x1b[0m"]

    def softmax(x, dim=-1):  # noqa: F811
        e = x.exp()
        return e @ torch.ones(5, 2)  # the student's failing line
    with pytest.raises(core.CheckFailed) as info:
        chk.test_softmax_rows(softmax)
    box = "\n".join(info.value._render_traceback_())
    assert box.count("test_softmax_rows") == 1 and "shapes cannot be multiplied" in box
    assert "return e @ torch.ones(5, 2)" in box and "in test_not_done_and_the_compact_box" in box
    assert "tfscratch" not in box and "core.py" not in box and "Traceback" not in box
    assert render_failure(core.CheckFailed("plain")) == ["\x1b[31m\x1b[1m\u2718 check failed\x1b[0m\n  plain"]


def test_progress_runs_the_checks_again():
    from tfscratch import checks, progress
    chk = checks.notebook("01_attention")

    def stub(x, dim=-1):
        raise NotImplementedError()

    def wrong(x, dim=-1):
        return x.exp()
    tests = [("test_a", 1, "chk.test_softmax_rows(softmax)"),
             ("test_b", 2, "chk.test_softmax_rows(wrong)"), ("test_c", 1, "chk.test_softmax_rows(gone)")]
    ns = {"chk": chk, "softmax": stub, "wrong": wrong}
    rows = progress.run_checks(tests, ns)
    assert [r["status"] for r in rows] == ["not done", "failed", "not done"]
    assert "exp(x) without dividing" in rows[1]["detail"] and "run the exercise" in rows[2]["detail"]
    ns["softmax"] = lambda x, dim=-1: (x - x.amax(dim, keepdim=True)).exp() / \
        (x - x.amax(dim, keepdim=True)).exp().sum(dim, keepdim=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert progress.check_all(tests, ns) is None
    assert "1 of 4 points" in out.getvalue() and "\u2714 test_a" in out.getvalue()
    assert progress.strip_hidden("a\n### BEGIN HIDDEN TESTS\nb\n### END HIDDEN TESTS\nc") == "a\nc"


def test_progress_checks_the_learners_own_function_behind_a_course_wrapper():
    """10 rebinds flash_attention to a wrapper that trains through the learner's FlashAttention
    and marks it with `learners_loop`; the table's checks of Exercise 2 still see the learner's
    loop, so a broken FlashAttention does not show as a failed flash_attention. A wrapper of
    the learner's own (functools.wraps, no mark) is checked as it is."""
    import functools

    from tfscratch import checks, progress
    chk = checks.notebook("01_attention")

    def softmax(x, dim=-1):  # the learner's, right
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim, keepdim=True)

    @functools.wraps(softmax)
    def wrapper(x, dim=-1):
        return x.exp()  # what the wrapper routes to is broken
    tests = [("test_a", 1, "chk.test_softmax_rows(softmax)")]
    ns = {"chk": chk, "softmax_own": softmax, "softmax": wrapper}
    assert progress.run_checks(tests, ns)[0]["status"] == "failed"    # no mark: checked as it is
    wrapper.learners_loop = softmax
    assert progress.run_checks(tests, ns)[0]["status"] == "passed"


def test_checks_catch_the_warnings_of_student_code():
    """The notebooks no longer silence warnings globally (a warning in a demo cell teaches);
    a test cell must stay silent, so every check runs with warnings caught."""
    import importlib
    import pkgutil
    import warnings

    import tfscratch.checks as checks
    from tfscratch.reference import softmax
    chk = checks.notebook("01_attention")

    def noisy_softmax(x, dim=-1):
        warnings.warn("nn.Softmax() without dim is deprecated", UserWarning)  # what students hit
        return softmax(x, dim)

    err, out = io.StringIO(), io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as a fresh kernel without PYTHONWARNINGS would show it
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            chk.test_softmax_rows(noisy_softmax)
    assert err.getvalue() == "" and "\u2714" in out.getvalue()
    loud = [f"{m.name}.{n}" for m in pkgutil.iter_modules(checks.__path__) if m.name != "core"
            for n, f in vars(importlib.import_module(f"tfscratch.checks.{m.name}")).items()
            if n.startswith("check_") and callable(f) and f.__module__.endswith(f".{m.name}")
            and not getattr(f, "_tfs_quiet", False)]
    assert not loud, f"checks that do not catch warnings: {loud}"


def test_seq2seq_train_records_validation_loss_and_stays_quiet_under_autograde(monkeypatch):
    from tfscratch import reference as R
    from tfscratch import seq2seq as s2s
    train_set, val_set = s2s.make_task(n_train=200, n_test=40, seed=0)
    torch.manual_seed(0)
    model = R.Transformer(**dict(s2s.MODEL_CONFIG, n_layers=1, d_ff=32))
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        r = s2s.train(model, train_set, R.teacher_forcing_loss, steps=7, batch_size=8,
                      warmup=2, val_data=val_set, val_every=3, val_size=16)
    assert err.getvalue() == "", "no progress bar under autograde"
    assert r.val_steps == [3, 6, 7] and len(r.val_losses) == 3 and len(r.losses) == 7
    assert not model.training
    src, tgt = val_set.batch(torch.arange(16))
    assert r.val_losses[-1] == pytest.approx(s2s.held_out_loss(model, R.teacher_forcing_loss, src, tgt))


def test_a_not_implemented_error_from_pytorch_is_a_failure_not_a_stub():
    """PyTorch raising NotImplementedError (an op without a kernel) inside the student's code
    is reported as a crash with its message, not as "not implemented yet"."""
    def _raise_like_torch():
        raise NotImplementedError("Could not run 'aten::foo' with arguments from the 'Meta' backend")
    # a frame that lives in PyTorch's own files, as PyTorch's error would
    _raise_like_torch.__code__ = _raise_like_torch.__code__.replace(co_filename=torch.__file__)

    def uses_an_unsupported_op(x):
        return _raise_like_torch()
    with pytest.raises(core.CheckFailed, match="Could not run"):
        core.call(uses_an_unsupported_op, torch.ones(1))


def test_check_all_without_arguments_reads_the_kernels_notebook(monkeypatch):
    """check_all() in any cell: the graded test cells of the notebook JupyterLab says this
    kernel runs (JPY_SESSION_NAME), hidden tests stripped."""
    from pathlib import Path

    from tfscratch import progress
    nb = Path(__file__).resolve().parents[1] / "solutions" / "01_attention.ipynb"
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    monkeypatch.setattr(progress, "_LAST", [])
    tests = progress._tests_from_session_notebook()
    assert [t[0] for t in tests][:2] == ["test_softmax_rows", "test_softmax_dim"]
    assert sum(t[1] for t in tests) == 15 and not any("HIDDEN" in t[2] or "9173" in t[2] for t in tests)


def test_progress_table_lists_the_free_text_answers():
    """Issue 41.8: the table counts every point: the free-text questions are rows of their own
    ("by hand"), named, with their points, and the summary says they are graded by hand."""
    from tfscratch.progress import _Table, run_checks
    rows = run_checks([("test_ok", 2, "pass")], {})
    table = _Table(rows, [("q_shift", 1), ("q_scale", 1)])
    text = repr(table)
    assert "2 of 2 points" in text and "2 free-text answers (2 points) are graded by hand" in text, text
    assert "q_shift" in text and "q_scale" in text and "by hand" in table._repr_html_()
