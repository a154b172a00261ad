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


def test_check_close_prints_actual_and_expected():
    e = torch.zeros(2, 3)
    a = e.clone()
    a[1, 2] = 0.5
    with pytest.raises(core.CheckFailed) as info:
        core.check_close(a, e, "the thing", "a hint")
    msg = str(info.value)
    assert "(1, 2)" in msg and "actual 0.5" in msg and "expected 0" in msg and "a hint" in msg
    core.check_close(e + 1e-7, e, "ok")
    with pytest.raises(core.CheckFailed, match="wrong shape"):
        core.check_close(torch.zeros(3, 2), e, "shape")
    with pytest.raises(core.CheckFailed, match="NaN"):
        core.check_close(torch.full((2, 3), float("nan")), e, "nan")


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
    from tfscratch.checks import attention as chk
    from tfscratch.reference import scaled_dot_product_attention, softmax
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        chk.check_softmax_rows(softmax)
        chk.check_attention_weights(scaled_dot_product_attention)
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
