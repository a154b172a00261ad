"""Let demo cells run before the exercises are done.

A demo that uses a learner's exercise would crash with NameError/NotImplementedError until
the exercise is solved, and every later cell would crash with it. `pick` tries the learner's
version first and, only if it is not implemented yet (or `check` finds it wrong), says so and
uses the course's reference implementation instead, where this installation has it:

    mha = pick("MultiHeadAttention", lambda: MultiHeadAttention(16, 4),
               lambda: R.MultiHeadAttention(16, 4), check=lambda m: m(x, x, x))

`check(obj)` runs the learner's object on a tiny case: raising NotImplementedError means "not
done yet"; returning False means "done, but wrong on this case" (a check that returns anything
else, None included, accepts the object). Either way the demos use the reference and one line
says why.

A class's student bundle and the grading sandbox hold no reference of a notebook that is not
closed yet (no answer key in the student's hands, issue 26): there `pick` stops the demo with
one grey line saying which exercise it needs, as a test cell of an unfinished exercise does,
and a learner's object that is merely wrong on the tiny case is used as it is.
"""
from __future__ import annotations

__all__ = ["pick"]


def pick(name: str, make_yours, make_reference, check=None):
    """Return make_yours() if it runs without NotImplementedError and check(obj), when given,
    neither raises NotImplementedError nor returns False; otherwise print a note and return
    make_reference(), or raise NotDone where the reference is not installed."""
    wrong = None
    try:
        obj = make_yours()
        if check is not None and check(obj) is False:
            wrong = obj
        else:
            return obj
    except (NotImplementedError, NameError):
        pass
    try:
        ref = make_reference()
    except (ImportError, AttributeError):   # this notebook's reference is not shipped here
        if wrong is not None:
            return wrong
        from .checks.core import NotDone
        raise NotDone(name) from None
    if wrong is not None:
        print(f"\u2139 {name} gives a wrong result on a small test case: the demos use the "
              "course's reference version until it passes. Fix the exercise (its check says "
              "what differs) and re-run them to see yours.")
    else:
        print(f"\u2139 {name} is not implemented yet: the demos use the course's reference "
              "version until it is. Solve the exercise and re-run them to see yours.")
    return ref
