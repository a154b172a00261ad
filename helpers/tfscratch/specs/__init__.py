"""Exercise specs (one module per notebook) and their engine; see `engine.py` for the
table's columns and `../README.md` ("Adding an exercise's spec") for how to add one.

`vm.py` is the probe machine the grader runs inside the student's kernel; `engine.py`
builds plans, runs them on the reference and judges, in the grader only."""
