"""The course manifest (tfsgrade.manifest) agrees with the generated notebooks and with the
files a notebook needs; notebooks import from the reference only what earlier ones built."""
import json
import re

from catalogue import modules
from nbtools import REPO, SOLUTIONS, read
from tfsgrade import cli, course, manifest

M = manifest.load()


def test_manifest_lists_every_source_in_order():
    names = M.names()
    assert names == sorted(p.stem for p in (REPO / "solutions" / "src").glob("[0-9][0-9]_*.py"))
    assert course.assignments() == names
    assert [nb.number for nb in M] == sorted({nb.number for nb in M}), "notebook numbers repeat"


def test_manifest_matches_the_solution_notebooks():
    """Exercises, grade ids and points as nbgrader will read them from solutions/*.ipynb."""
    for nb in M:
        cells = [c.metadata["nbgrader"] for c in read(SOLUTIONS / f"{nb.name}.ipynb").cells
                 if "nbgrader" in c.metadata]
        answers = {t.grade_id: t.points for t in nb.answers}
        assert [c["grade_id"] for c in cells if c.get("solution") and c["grade_id"] not in answers] \
            == [e.name for e in nb.exercises]
        assert {c["grade_id"]: c["points"] for c in cells if c.get("grade")} == \
            {**{t.grade_id: t.points for e in nb.exercises for t in e.tests}, **answers}
        assert 2 <= len(nb.answers) <= 3, f"{nb.name}: two or three free-text questions expected"
        assert all(e.tests for e in nb.exercises), f"{nb.name}: an exercise without a graded test"


def test_notebooks_import_only_what_earlier_notebooks_built():
    """`from tfscratch.reference import X` in a setup cell would hide the learner's own X if X
    were this notebook's exercise; demo fallbacks (`R.X`) may use the notebook's own exports."""
    for nb in M:
        assert set(nb.reference_imports) <= set(nb.may_import), \
            f"{nb.name} imports {set(nb.reference_imports) - set(nb.may_import)} from the reference"
        text = (REPO / nb.source).read_text()
        used = set(re.findall(r"\bR\.([A-Za-z_]\w*)", text))
        assert used <= set(nb.may_import) | set(nb.exports), \
            f"{nb.name} uses R.{sorted(used - set(nb.may_import) - set(nb.exports))}"


def test_each_notebook_has_its_spec_catalogue_and_readme_row():
    """A notebook is its source, its spec module, its catalogue and a README row (issue 18):
    its test cells run its spec (`chk = checks.notebook("NN_name")`), no check module."""
    from tfscratch.specs import engine
    cats = {m.ASSIGNMENT: m for m in modules()}
    readme = (REPO / "README.md").read_text()
    for nb in M:
        setup = (REPO / nb.source).read_text()
        assert f'chk = checks.notebook("{nb.name}")' in setup, \
            f"{nb.name}: its setup cell does not set chk = checks.notebook({nb.name!r})"
        assert engine.has_spec(nb.name), f"{nb.name} has no spec module in tfscratch/specs"
        assert nb.name in cats, f"{nb.name} has no catalogue tests/catalogue/nbNN_*.py"
        have = {e.name for e in nb.exercises}
        assert set(cats[nb.name].EXERCISES) == have, \
            f"{nb.name}: the catalogue covers {sorted(cats[nb.name].EXERCISES)}, the notebook has {sorted(have)}"
        assert f"| `{nb.name}` |" in readme, f"README's notebook table has no row for {nb.name}"
    assert set(cats) <= set(M.names()), f"catalogues for no notebook: {set(cats) - set(M.names())}"


def test_manifest_command_prints_json(capsys):
    assert cli.main(["manifest"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in data["notebooks"]] == M.names()
    first = data["notebooks"][0]
    assert first["points"] == sum(e["points"] for e in first["exercises"]) > 0


def test_forbidden_shortcuts_are_told_to_the_learner():
    """What an exercise may not use is its spec's `shortcuts=` (the rows of tfscratch.shortcuts
    that the kernel's guard, the probe machine and the scan read); the notebook's own text names
    the first built-in of each row's label, so the learner was told."""
    from tfscratch import shortcuts
    from tfscratch.specs import engine
    listed = [(nb, e, engine.shortcut_table().get(e.name, ())) for nb in M for e in nb.exercises]
    listed = [x for x in listed if x[2]]
    assert {e.name for _, e, _ in listed} >= {"softmax", "MultiHeadAttention", "layer_norm",
                                              "batch_norm", "Transformer", "AdamW"}
    for nb, e, groups in listed:
        text = (REPO / nb.source).read_text().split("\n# %%", 1)[1]  # the notebook, not the header
        for g in groups:
            name = re.findall(r"[\w.]+\.\w+", shortcuts.GROUPS[g].label)[0]
            assert name in text, f"{nb.name}:{e.name} forbids {name} ({g}) but never says so"


def test_a_forbid_line_is_refused_now_that_the_spec_owns_it(tmp_path):
    import pytest
    from tfsgrade import build
    src = tmp_path / "01_a.py"
    src.write_text("#| forbid f: F.softmax\n# %% [solution] f\ndef f(x):\n    return x\n")
    with pytest.raises(build.SourceError, match="unknown directive"):
        manifest.load(tmp_path)
