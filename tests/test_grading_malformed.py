"""No file ends the class: a corpus of malformed notebooks (JSON nested 100,000 levels deep,
binary bytes, a bad encoding, cells that are not a list, a list of nulls, an empty file, a
huge metadata string) graded in one class beside honest students, whose rows stay exact;
every malformed one is flagged with its reason."""
import csv
import json

import nbformat
import pytest

from nbtools import A01, points, solution_sources, student_notebook, write

pytestmark = [pytest.mark.sandbox, pytest.mark.nbgrader, pytest.mark.slow]


def _text(nb) -> str:
    return nbformat.writes(nb)


def corpus() -> dict:
    """{student: (the file's bytes, words its reason holds)}."""
    plain = json.loads(_text(student_notebook(A01)))
    deep = json.dumps(plain).replace('"metadata": {', '"metadata": {"deep": ' + "[" * 100000
                                     + "]" * 100000 + ", ", 1)
    nulls = dict(plain, cells=[None, 3, "x"])
    huge = json.loads(_text(student_notebook(A01)))
    huge["metadata"]["blob"] = "x" * 3_000_000
    return {"deep": (deep.encode(), "nested more than 100 levels"),
            "binary": (b"\x00\x01" * 500, "binary data"),
            "latin1": (_text(student_notebook(A01)).encode().replace(b"softmax", b"softm\xe4x", 2),
                       "not valid JSON"),
            "cells_dict": (json.dumps(dict(plain, cells={"a": 1})).encode(), "no 'cells' list"),
            "nulls": (json.dumps(nulls).encode(), "malformed"),
            "empty": (b"", "not valid JSON"),
            "huge_meta": (json.dumps(huge).encode(), None)}


def test_malformed_notebooks_are_flagged_and_the_class_is_graded(tmp_path):
    from tfsgrade.grade import grade
    subs, out = tmp_path / "subs", tmp_path / "out"
    sols = solution_sources(A01)
    write(student_notebook(A01, sols), subs / "honest" / f"{A01}.ipynb")
    write(student_notebook(A01, {"softmax": sols["softmax"]}), subs / "partial" / f"{A01}.ipynb")
    for sid, (data, _) in corpus().items():
        (subs / sid).mkdir(parents=True)
        (subs / sid / f"{A01}.ipynb").write_bytes(data)
    grade(subs, out, names=[A01], timeout=30, log=lambda *a: None)
    with (out / "grades.csv").open() as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    cells = points(A01)
    assert float(rows["honest"][A01]) == sum(cells.values()), rows["honest"]
    assert float(rows["partial"][A01]) == sum(p for g, p in cells.items() if g.startswith("test_softmax"))
    assert rows["honest"]["status"] == rows["partial"]["status"] == "graded"
    for sid, (_, words) in corpus().items():
        row = rows[sid]
        if words is None:       # odd but readable: graded as far as it goes, never the class's end
            assert row["status"] in ("graded", "flagged"), row
            continue
        assert row["status"] == "flagged" and words in row["notes"], (sid, row["notes"])
