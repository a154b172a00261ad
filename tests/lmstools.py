"""Fixture downloads in each layout tfsgrade.lms reads, built in tmp dirs: Canvas's
"Download Submissions" zip, Moodle's "Download all submissions" zip (folders and flat), nbgrader's
submitted/ and inbound/ folders, and the rosters that go with them.

The class: ada, ben and cleo hand in 01_attention; dan is on the roster and hands in nothing;
zed is not on the roster. File names follow the LMS's own code (Canvas lib/content_zipper.rb,
Moodle mod/assign/locallib.php; see autograder/tfsgrade/lms.py)."""
from __future__ import annotations

import zipfile
from pathlib import Path

import nbformat

from nbtools import A01, solution_sources, student_notebook

# (student_id, name, canvas_id, sis_user_id, sis_login_id, section, moodle_id, email)
CLASS = [
    ("ada", "Lovelace, Ada", "1001", "S-1001", "ada.l", "Sec A", "201", "ada@uni.example"),
    ("ben", "Okafor, Ben", "1002", "S-1002", "ben.o", "Sec A", "202", "ben@uni.example"),
    ("cleo", "Park, Cleo", "1003", "S-1003", "cleo.p", "Sec B", "203", "cleo@uni.example"),
    ("dan", "Ito, Dan", "1004", "S-1004", "dan.i", "Sec B", "204", "dan@uni.example"),
]
HEADER = "student_id,name,canvas_id,sis_user_id,sis_login_id,section,moodle_id,email"
ZIP_TIME = (2025, 3, 1, 10, 30, 0)     # every entry's DOS time (no zone: read as local time)


def roster(path: Path, rows=CLASS) -> Path:
    lines = [HEADER] + [",".join(f'"{v}"' if "," in v else v for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def notebook_bytes(kind: str = "solution", marker: str = "") -> bytes:
    """The released 01 notebook: filled with the solutions, or untouched; `marker` goes into
    its metadata (to tell two copies apart)."""
    nb = student_notebook(A01, solution_sources(A01) if kind == "solution" else None)
    if marker:
        nb.metadata["fixture"] = marker
    return nbformat.writes(nb).encode()


def write_zip(path: Path, files: dict[str, bytes], date_time=ZIP_TIME) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=date_time)
            z.writestr(info, data)
    return path


def canvas_files(graded: bool = False) -> dict[str, bytes]:
    """Canvas's flat files: ada on time; ben late, two uploads of 01 (the later one is the
    re-submission Canvas renamed `-1`); cleo renamed her notebook and added a text file; zed
    (Canvas user 1999) is not on the roster. With graded=True only what the end-to-end test
    needs: ada (solution), ben (untouched, late, `-1`), zed."""
    if graded:
        return {
            f"lovelaceada_1001_5001_{A01}.ipynb": notebook_bytes("solution"),
            f"okaforben_LATE_1002_5006_{A01}-1.ipynb": notebook_bytes("untouched"),
            f"zedzed_1999_5009_{A01}.ipynb": notebook_bytes("solution"),
        }
    return {
        f"lovelaceada_1001_5001_{A01}.ipynb": notebook_bytes("solution", "ada"),
        f"okaforben_LATE_1002_5002_{A01}.ipynb": notebook_bytes("untouched", "ben first"),
        f"okaforben_LATE_1002_5006_{A01}-1.ipynb": notebook_bytes("solution", "ben second"),
        "parkcleo_1003_5003_attention final.ipynb": notebook_bytes("solution", "cleo"),
        "parkcleo_1003_5004_notes.txt": b"my notes",
        f"zedzed_1999_5009_{A01}.ipynb": notebook_bytes("solution", "zed"),
    }


def moodle_files(flat: bool = False) -> dict[str, bytes]:
    """Moodle's download: ada; ben renamed his notebook; cleo under a participant id the roster
    does not have (participant ids are per assignment: she is found by her name); zed is unknown;
    ada's online text is not a notebook."""
    sep = "" if flat else "/"
    return {
        f"Ada Lovelace_201_assignsubmission_file_{sep}{A01}.ipynb": notebook_bytes("solution", "ada"),
        f"Ben Okafor_202_assignsubmission_file_{sep}attention final.ipynb": notebook_bytes("solution", "ben"),
        f"Cleo Park_999_assignsubmission_file_{sep}{A01}.ipynb": notebook_bytes("solution", "cleo"),
        f"Zed Zed_777_assignsubmission_file_{sep}{A01}.ipynb": notebook_bytes("solution", "zed"),
        "Ada Lovelace_201_assignsubmission_onlinetext_/onlinetext.html": b"<p>hi</p>",
    }


MOODLE_WORKSHEET = (  # Moodle's "Download grading worksheet", used as the roster
    "Identifier,Full name,Email address,Status,Grade,Maximum Grade\n"
    "Participant 201,Ada Lovelace,ada@uni.example,Submitted,,20\n"
    "Participant 202,Ben Okafor,ben@uni.example,Submitted,,20\n"
    "Participant 203,Cleo Park,cleo@uni.example,Submitted,,20\n"
    "Participant 204,Dan Ito,dan@uni.example,No submission,,20\n")


def nbgrader_submitted(base: Path) -> Path:
    """A course directory after `nbgrader collect`: submitted/<student>/<assignment>/ with
    timestamp.txt (nbgrader's default format; ben's with an offset); ben renamed his notebook;
    zed is not on the roster."""
    sub = base / "course" / "submitted"
    for sid, fname, ts in (("ada", f"{A01}.ipynb", "2025-03-01 09:30:00.000000 UTC"),
                           ("ben", "mine.ipynb", "2025-03-02 18:00:00.250000 +0100"),
                           ("zed", f"{A01}.ipynb", "2025-03-01 08:00:00.000000 UTC")):
        d = sub / sid / A01
        d.mkdir(parents=True)
        (d / fname).write_bytes(notebook_bytes("solution", sid))
        (d / "timestamp.txt").write_text(ts)
    return base / "course"
