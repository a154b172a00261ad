"""nbgrader in the browser: the Validate button of the notebook toolbar, and the formgrader
for an instructor course directory (made with `tfs-grade course`)."""
import time

import pytest

from labdriver import SHOTS, TIMINGS, validate_targets

pytestmark = [pytest.mark.browser, pytest.mark.slow]   # JupyterLab in Chromium

TARGETS = validate_targets()


@pytest.mark.parametrize("nb", TARGETS, ids=[str(n) for n in TARGETS])
def test_validate_button(runs, nb):
    run = runs.get(nb)
    t0 = time.monotonic()
    res = run.notebook.validate()
    run.timings["validate_s"] = round(time.monotonic() - t0, 1)
    said = f"the dialog said: {res.title}: {res.text[:3000]}"
    if nb.kind == "solution":
        assert res.status == "success", f"{nb}: Validate does not report success; {said}"
        assert "passes all the tests" in res.text
    else:
        assert res.status == "failed", f"{nb}: Validate does not report failing tests; {said}"
        # the stubs' one grey line, not a traceback through the course's code
        assert "not implemented yet" in res.text and "tfscratch/" not in res.text, f"{nb}: {said}"


def test_formgrader_opens(lab, course_dir):
    """Nbgrader > Formgrader shows the course directory's assignments."""
    names = sorted(p.name for p in (course_dir / "source").iterdir())
    assert names, f"tfs-grade course made no assignments in {course_dir}"
    t0 = time.monotonic()
    frame = lab.open_formgrader()
    frame.get_by_text("Manage Assignments").first.wait_for(timeout=60_000)
    for name in names:
        frame.get_by_text(name, exact=True).first.wait_for(timeout=30_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    lab.page.screenshot(path=str(SHOTS / "formgrader.png"))
    lab.page.evaluate("""() => { const s = window.jupyterapp.shell;
        const w = s.currentWidget; if (w && w.title.label.toLowerCase().includes('formgrader')) w.close(); }""")
    TIMINGS["session"]["formgrader_s"] = round(time.monotonic() - t0, 1)
