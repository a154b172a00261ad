"""Explorers: sliders that redraw a figure when a widget front end is there, and the same
figure, drawn once, everywhere else.

The figure is always a plain image output (so it is in the saved notebook, in nbconvert and
in autograde); the sliders update that output in place through its display id. Nothing here
waits for the front end, so headless execution never blocks.
"""
from __future__ import annotations

import os
import traceback

import matplotlib.pyplot as plt

__all__ = ["explore", "Explorer", "widgets_available"]


def widgets_available() -> bool:
    """True when running in a Jupyter kernel with ipywidgets, outside autograde."""
    if os.environ.get("NBGRADER_EXECUTION") or os.environ.get("TFS_STATIC"):
        return False
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def _control(name, spec):
    import ipywidgets as w
    if isinstance(spec, w.Widget):
        return spec
    common = dict(description=name, continuous_update=False, style={"description_width": "initial"})
    if isinstance(spec, bool):
        return w.Checkbox(value=spec, description=name)
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(s, int) for s in spec) and len(spec) in (2, 3, 4):
        lo, hi, *rest = spec
        step = rest[0] if rest else 1
        value = rest[1] if len(rest) > 1 else lo
        return w.IntSlider(min=lo, max=hi, step=step, value=value, **common)
    if isinstance(spec, tuple) and len(spec) in (2, 3, 4):
        lo, hi, *rest = spec
        step = rest[0] if rest else (hi - lo) / 50
        value = rest[1] if len(rest) > 1 else lo
        return w.FloatSlider(min=lo, max=hi, step=step, value=value, **common)
    if isinstance(spec, list):
        return w.Dropdown(options=spec, value=spec[0], description=name)
    raise TypeError(f"control {name!r}: use (lo, hi[, step[, value]]), a list of options, a bool "
                    f"or an ipywidgets widget, not {spec!r}")


def _initial(spec):
    try:
        import ipywidgets as w
        if isinstance(spec, w.Widget):
            return spec.value
    except ImportError:
        pass
    if isinstance(spec, bool):
        return spec
    if isinstance(spec, tuple) and len(spec) in (2, 3, 4):
        return spec[3] if len(spec) == 4 else spec[0]
    if isinstance(spec, list):
        return spec[0]
    raise TypeError(f"cannot take an initial value from {spec!r}")


class Explorer:
    """Holds the draw function, the current values and (with a front end) the widgets."""

    def __init__(self, draw, controls: dict):
        self.draw = draw
        self.specs = controls
        self.values = {k: _initial(v) for k, v in controls.items()}
        self.widgets = {}
        self.handle = None
        self.figure = None
        self.error = None

    def render(self, **changes):
        """Redraw with some values changed; return the new figure (None if draw raised)."""
        self.values.update(changes)
        try:
            fig = self.draw(**self.values)
            self.error = None
        except Exception:  # shown in place of the figure, never raised into the front end
            self.error = traceback.format_exc()
            fig = None
        if self.handle is not None:
            if fig is not None:
                self.handle.update(fig)
            else:
                from IPython.display import Pretty
                self.handle.update(Pretty("explorer error:\n" + self.error))
        if fig is not None:
            plt.close(fig)
        self.figure = fig
        return fig

    def show(self, interactive=None):
        from IPython.display import display
        interactive = widgets_available() if interactive is None else interactive
        if interactive:
            import ipywidgets as w
            self.widgets = {k: _control(k, v) for k, v in self.specs.items()}
            for k, wid in self.widgets.items():
                wid.observe(lambda ch, k=k: self.render(**{k: ch["new"]}), names="value")
            display(w.HBox(list(self.widgets.values()), layout=w.Layout(flex_flow="row wrap")))
        fig = self.draw(**self.values)
        self.figure = fig
        self.handle = display(fig, display_id=True)
        plt.close(fig)
        return self

    def _ipython_display_(self):  # the explorer has already displayed itself
        pass


def explore(draw, **controls) -> Explorer:
    """explore(draw, d_k=(1, 512, 1, 64), scale=True) draws draw(**values) at once and, in a
    live notebook, shows a slider per control that redraws it.

    Controls: (lo, hi[, step[, initial]]) ints -> IntSlider, floats -> FloatSlider, a list -> a
    dropdown (first item initial), a bool -> a checkbox, or any ipywidgets value widget."""
    return Explorer(draw, controls).show()
