"""The grader: `tfs-grade` and its stages (README, docs/architecture.md)."""
import sys

# nbformat validates through jsonschema, which imports the optional IRI syntax checker
# rfc3987_syntax; that module builds a Lark grammar at import, 1.2 s in every process that
# reads a notebook (each submission's sandbox runner, each nbgrader run, each Dask worker).
# Notebooks and nbgrader's schemas have no IRI field, and jsonschema skips a format whose
# checker cannot be imported. course.NO_IRI does the same in the nbgrader processes we start;
# the sandbox runner, which imports nothing of ours, has its own line.
sys.modules.setdefault("rfc3987_syntax", None)
