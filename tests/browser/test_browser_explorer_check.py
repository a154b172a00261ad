"""The slider check must fail when an explorer is broken. A small notebook, written to a temp
folder inside the lab's root, holds four explorers: a working one (the control), one whose draw
function raises for any value but the first (tfscratch.widgets shows the traceback in place of
the figure), one that always draws the same figure, and a hand-made ipywidgets slider whose
callback raises (the traceback goes to the kernel's log, the figure never changes)."""
import nbformat
import pytest

from labdriver import REPO

pytestmark = [pytest.mark.browser, pytest.mark.slow]   # JupyterLab in Chromium

SETUP = '''\
%matplotlib inline
import matplotlib.pyplot as plt
import ipywidgets as w
from IPython.display import display
from tfscratch.widgets import explore

def line(a):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, a])
    ax.set_ylim(0, 10)
    ax.set_title(f"a = {a}")
    return fig'''

WORKING = "explore(lambda a=1: line(a), a=(1, 9, 1, 1))"

BROKEN = '''\
def broken(a=1):
    if a != 1:
        raise ValueError("deliberately broken explorer")
    return line(a)

explore(broken, a=(1, 9, 1, 1))'''

FROZEN = "explore(lambda a=1: line(1), a=(1, 9, 1, 1))"

RAW = '''\
slider = w.IntSlider(value=1, min=1, max=9, description="a", continuous_update=False)
def on_change(change):
    raise RuntimeError("callback raises")
slider.observe(on_change, names="value")
display(slider)
handle = display(line(1), display_id=True)
plt.close("all")'''


class SelfTest:
    def __str__(self):
        return "selftest/broken_explorers"


def test_broken_explorer_fails_the_slider_check(runs, workdir):
    path = workdir / "selftest" / "broken_explorers.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in (SETUP, WORKING, BROKEN, FROZEN, RAW)]
    nbformat.write(nb, path)

    run = runs.get(SelfTest(), relpath=str(path.relative_to(REPO)))
    cells = {c.source: c for c in run.cells}
    errors = [e for c in run.cells for e in c.errors]
    assert not errors, f"the self-test notebook itself failed: {errors}"
    check = run.notebook.check_sliders

    working = check(cells[WORKING], timeout=30)
    broken = check(cells[BROKEN], timeout=15)
    frozen = check(cells[FROZEN], timeout=15)
    raw = check(cells[RAW], timeout=3)
    for name, res in (("working", working), ("broken", broken), ("frozen", frozen), ("raw", raw)):
        print(name, *res)

    assert len(working) == 1 and working[0].ok, f"the working explorer fails the check: {working}"
    assert len(broken) == 1 and not broken[0].ok, "a draw function that raises passed the check"
    assert "deliberately broken explorer" in broken[0].problem, broken[0].problem

    assert len(frozen) == 1 and not frozen[0].ok, "an explorer that never changes passed the check"

    assert len(raw) == 1 and not raw[0].ok, "a slider whose callback raises passed the check"
    assert "did not change" in raw[0].problem, raw[0].problem
