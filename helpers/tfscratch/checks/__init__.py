"""What the notebooks' test cells call: `check(grade_id, obj)` and `notebook(assignment)`
(tfscratch.checks.kernel) run the exercise's spec (tfscratch.specs) in the kernel against the
stored expectations of the public seed; `core` holds the exceptions and the shortcut guard,
`display` the compact boxes a student sees.

Test cells must write nothing to stderr (nbgrader scores such a cell 0), yet the notebooks do
not silence warnings: a warning the student's own code raises in a demo cell teaches something.
So `kernel.check` runs with warnings caught: whatever the student's code or the check warns
about inside a test cell stays out of stderr.
"""
from .core import CheckFailed, NotDone, ShortcutUsed, no_shortcuts  # noqa: F401
from .display import install_ipython_hook
from .display import details  # noqa: F401
from .kernel import check, notebook  # noqa: F401

install_ipython_hook()  # in a notebook: a stub's NotImplementedError is one grey line
