"""Run an untouched student notebook headless and list every error that is not the
exercise stubs' NotImplementedError (a demo cell that crashes because an exercise is not
done yet is a bug: use tfscratch.fallback.pick there).

    python tools/student_errors.py notebooks/03_multihead.ipynb [...]
Exit status 1 if any such error is found."""
import os
import sys

import nbformat
from nbclient import NotebookClient

bad = 0
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    os.environ.pop("NBGRADER_EXECUTION", None)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}}).execute()
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if o.output_type == "error" and o.ename != "NotImplementedError":
                bad += 1
                gid = c.metadata.get("nbgrader", {}).get("grade_id", "")
                print(f"{path}: cell {i} {gid} {o.ename}: {o.evalue[:200]}")
    print(f"{path}: checked")
sys.exit(1 if bad else 0)
