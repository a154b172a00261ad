"""Exercise specs (one module per notebook) and their engine; see `engine.py` for the
table's columns and `../README.md` ("Adding an exercise's spec") for how to add one.

`vm.py` is the probe machine that runs a plan inside the student's kernel, with the stand-in
models and drivers of `fixtures.py` (the probe cell carries both texts); `engine.py` builds
plans and judges: in the grader (the coordinator, against the reference, on each submission's
own seed) and in the kernel (tfscratch.checks.kernel, against the stored expectations of the
public seed: no reference needed, none shipped for an open notebook)."""
