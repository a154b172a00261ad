"""Where the course's files are: the one place that knows the repository's layout. Imports
nothing of tfsgrade (every other module may import it).

The course repository is this source tree, or, for an installed wheel (a worker image, a
grading machine), the folder the TFS_COURSE environment variable names."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(os.environ.get("TFS_COURSE") or Path(__file__).resolve().parents[2]).resolve()
SOLUTIONS = REPO / "solutions"             # instructor notebooks (built)
SOURCES = SOLUTIONS / "src"                # their percent-format sources: the source of truth
NOTEBOOKS = REPO / "notebooks"             # student notebooks (released)
CONFIG = REPO / "autograder" / "nbgrader_config.py"
REFERENCE = REPO / "helpers" / "tfscratch" / "reference"   # generated from the solution cells
