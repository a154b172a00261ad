"""The layout of COURSE_SPEC section 2, the generated files current, the two dependency
lists in step, the README's two commands."""
import re
import tomllib

import pytest

from nbtools import NOTEBOOKS, REPO, SOLUTIONS, assignments, read
from tfsgrade import build, cli, manifest

# COURSE_SPEC section 3: the notebooks and the exercise names it fixes. The one hand-kept list
# of the course: everything else (tests, grader, bench, browser tests) reads the manifest that
# tfsgrade.manifest computes from solutions/src/*.py, and this test holds the two together.
SPEC = {
    "01_attention": ["softmax", "scaled_dot_product_attention"],
    "02_masks": ["make_padding_mask", "make_causal_mask", "make_decoder_mask",
                 "scaled_dot_product_attention"],
    "03_multihead": ["split_heads", "combine_heads", "MultiHeadAttention"],
    "04_normalization": ["layer_norm", "batch_norm", "LayerNorm", "BatchNorm"],
    "05_positional_encoding": ["sinusoidal_positional_encoding", "PositionalEncoding",
                               "pe_shift_matrix"],
    "06_blocks": ["FeedForward", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder"],
    "07_transformer": ["Transformer", "label_smoothing_cross_entropy", "greedy_decode"],
    "08_decoder_only": ["DecoderOnlyLM", "generate"],
    "09_modern_decoder": ["rms_norm", "RMSNorm", "apply_rope", "SwiGLU", "GroupedQueryAttention",
                          "ModernDecoderLM", "top_p_filter"],
    "10_efficient_attention": ["online_softmax", "flash_attention"],
    "11_tokenizer": ["train_bpe", "Tokenizer"],
    "12_training": ["get_batch", "AdamW", "cosine_schedule", "clip_grad_norm", "save_checkpoint",
                    "load_checkpoint", "evaluate"],
}


def test_layout():
    for p in ["notebooks", "solutions", "autograder", "helpers", "tests", "environment.yml",
              "pyproject.toml", "README.md", "Makefile", ".ci/run"]:
        assert (REPO / p).exists(), f"missing {p}"
    names = assignments()
    assert names, "no solution notebooks"
    assert set(names) <= set(SPEC), f"notebooks the spec does not list: {set(names) - set(SPEC)}"
    for a in names:
        assert (NOTEBOOKS / f"{a}.ipynb").exists(), f"notebooks/{a}.ipynb was not released"
        assert (SOLUTIONS / "src" / f"{a}.py").exists()


def test_sources_build_to_the_committed_files():
    """solutions/*.ipynb and helpers/tfscratch/reference/ (no nbgrader: the fast lane)."""
    problems = cli.stale(notebooks=False)
    assert not problems, "\n".join(problems)


@pytest.mark.nbgrader   # a release into a temporary folder
@pytest.mark.slow
def test_generated_notebooks_are_current():
    """Also notebooks/, through nbgrader's generate_assignment (marked nbgrader, slow)."""
    problems = cli.stale()
    assert not problems, "\n".join(problems)


def test_student_notebooks_have_no_solutions_or_hidden_tests():
    for a in assignments():
        text = (NOTEBOOKS / f"{a}.ipynb").read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS"):
            assert marker not in text, f"notebooks/{a}.ipynb contains {marker!r}"
        nb = read(NOTEBOOKS / f"{a}.ipynb")
        stubs = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
        code = [c for c in stubs if c.cell_type == "code"]
        answers = [c for c in stubs if c.cell_type == "markdown"]
        assert code and all("raise NotImplementedError()" in c.source for c in code)
        assert answers and all(c.source.strip() == "YOUR ANSWER HERE" for c in answers), \
            f"notebooks/{a}.ipynb: answer cells must be released empty"


def test_cell_conventions():
    """Solution grade_id = the name it defines; tests named test_<exercise>...; points set."""
    for a in assignments():
        nb = read(SOLUTIONS / f"{a}.ipynb")
        exercises, answers = [], []
        for c in nb.cells:
            m = c.metadata.get("nbgrader", {})
            if m.get("solution") and c.cell_type == "markdown":  # a free-text answer, by hand
                assert m.get("grade") and m["points"] > 0 and not m["locked"], (a, m)
                assert m["grade_id"].startswith("q_"), f"{a}: answer ids start with q_"
                assert "### BEGIN SOLUTION" in c.source, f"{a}: {m['grade_id']} has no model answer"
                answers.append(m["grade_id"])
                continue
            if m.get("solution"):
                gid = m["grade_id"]
                assert re.search(rf"^(def|class) {re.escape(gid)}\b", c.source, re.M), \
                    f"{a}: solution cell {gid} does not define {gid}"
                exercises.append(gid)
            if m.get("grade"):
                assert m["points"] > 0 and m["locked"]
                assert manifest.owners(a).get(m["grade_id"]) in exercises, \
                    f"{a}: {m['grade_id']} follows no exercise"
                assert "BEGIN HIDDEN TESTS" not in c.source or c.source.index("BEGIN HIDDEN") > 0
        for e in exercises:
            assert e in manifest.owners(a).values(), f"{a}: exercise {e} has no graded test"
        assert 2 <= len(answers) <= 3, f"{a}: {len(answers)} free-text questions (want 2 or 3)"


def test_spec_exercises_present():
    m = manifest.load()
    for nb in m:
        have = {e.name for e in nb.exercises}
        assert set(SPEC[nb.name]) <= have, f"{nb.name} lacks exercises {set(SPEC[nb.name]) - have}"


def _names(reqs):
    return {re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for r in reqs if r.strip()}


def test_dependency_lists_agree():
    py = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pip_names = _names(py["dependencies"] + py["optional-dependencies"]["test"])
    env = (REPO / "environment.yml").read_text()
    conda = set()
    for line in env.split("dependencies:", 1)[1].splitlines():
        m = re.match(r"\s+- ([A-Za-z0-9_.-]+)", line)
        if m and m.group(1) not in ("pip", "python", "cpuonly", "-e"):
            conda.add(m.group(1).lower().replace("_", "-"))
    conda = {"torch" if n in ("pytorch", "pytorch-cpu") else n for n in conda}
    assert pip_names == conda, f"pip only: {pip_names - conda}; conda only: {conda - pip_names}"
    for must in ("torch", "jupyterlab", "nbgrader", "matplotlib", "ipywidgets", "pytest"):
        assert must in pip_names


def test_readme_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    head = text[: text.find("\n## ", 10) if "\n## " in text[10:] else 2000]
    assert "make lab" in head and "make test" in head, "README must open with make lab / make test"
    mk = (REPO / "Makefile").read_text()
    assert re.search(r"^lab:", mk, re.M) and re.search(r"^test:", mk, re.M)
    assert "make test" in (REPO / ".ci" / "run").read_text()


# (a source, what the refusal says)
BAD_SOURCES = [
    ("# %% [test] test_x_rows 1\nchk.test_x_rows(x)\n", "test cells are generated from the exercise's spec"),
    ("# %% [tests] x\n", "no exercise 'x' with graded cells in the spec of 99_bad"),
    ("# %% [tests] x 2\n", "names its exercise only"),
    ("x = 1\n# %%\n", "before the first"),
    ("# %% [answer] why 1\n# ### BEGIN SOLUTION\n# because\n# ### END SOLUTION\n", "answer ids start with q_"),
    ("# %% [answer] q_why 2\n# because\n", "needs a model answer"),
]


def test_build_is_deterministic_and_rejects_bad_sources(tmp_path):
    for a in assignments():
        one = build.build_notebook(SOLUTIONS / "src" / f"{a}.py")
        two = build.build_notebook(SOLUTIONS / "src" / f"{a}.py")
        assert one == two
    import pytest
    bad = tmp_path / "99_bad.py"
    for text, why in BAD_SOURCES:
        bad.write_text(text)
        with pytest.raises(build.SourceError, match=why):
            build.build_notebook(bad)


def test_test_cells_are_generated_from_the_spec():
    """`# %% [tests] softmax` becomes the exercise's Graded cells: the visible call, the hidden
    seed's call between nbgrader's markers, the points; the manifest's points are the spec's."""
    from tfscratch.specs import engine
    from tfscratch.specs.engine import Graded
    graded = {"x": (Graded("test_x_rows", 2), Graded("test_x_random", 1, hidden_seed=7))}
    cells = build.parse_cells("# %% [solution] x\ndef x(): ...\n\n# %% [tests] x\n", "99_t.py", graded)
    assert [c[:4] for c in cells[1:]] == [
        ("test", "test_x_rows", 2, "chk.test_x_rows(x)"),
        ("test", "test_x_random", 1,
         "chk.test_x_random(x)\n### BEGIN HIDDEN TESTS\nchk.test_x_random(x, seed=7)\n### END HIDDEN TESTS")]
    assert {c.exercise for c in cells[1:]} == {"x"}
    import pytest
    with pytest.raises(build.SourceError, match="holds no text"):
        build.parse_cells("# %% [tests] x\nchk.test_x_rows(x)\n", "99_t.py", graded)
    for a in assignments():
        m = manifest.load()[a]
        for ex in engine.specs_for(a):
            tests = m.exercise(ex.name).tests
            assert [(t.grade_id, t.points) for t in tests] == [(g.id, g.points) for g in ex.graded]


def test_answer_cells_are_manually_graded_markdown(tmp_path):
    src = tmp_path / "99_q.py"
    src.write_text("# %% [markdown]\n# Why?\n\n# %% [answer] q_why 2\n# ### BEGIN SOLUTION\n"
                   "# Because.\n# ### END SOLUTION\n")
    nb = build.build_notebook(src)
    cell = nb.cells[1]
    assert cell.cell_type == "markdown" and cell.id == "q_why"
    assert cell.source == "### BEGIN SOLUTION\nBecause.\n### END SOLUTION"
    assert cell.metadata.nbgrader == {"schema_version": 3, "task": False, "grade": True,
                                      "grade_id": "q_why", "locked": False, "points": 2,
                                      "solution": True}


def test_keep_cells_are_plain_code_that_grading_always_runs(tmp_path):
    """`# %% [keep]`: an ordinary code cell tagged `keep`; tfsgrade.demos never leaves it out,
    even when no later cell reads a name from it."""
    import pytest

    from tfsgrade import demos
    src = tmp_path / "99_keep.py"
    src.write_text("# %% [keep]\ntorch.set_printoptions(precision=3)\n\n# %%\nprint(1)\n")
    nb = build.build_notebook(src)
    keep, plain = nb.cells[0], nb.cells[1]
    assert keep.cell_type == "code" and "nbgrader" not in keep.metadata
    assert keep.metadata.tags == ["keep", "raises-exception"]
    demos.mark(nb.cells, demos.demo_texts(nb))
    assert not keep.metadata.get(demos.MARK) and plain.metadata.get(demos.MARK)
    src.write_text("# %% [keep] some_id\nx = 1\n")
    with pytest.raises(build.SourceError, match=r"\[keep\] cell takes no id"):
        build.build_notebook(src)


def test_the_contract_is_in_the_repo_and_current():
    """COURSE_SPEC lives in the repo as docs/course-spec.md (a clone reads it without the shared
    folder); where the shared copy is present, the two are the same text."""
    ours = REPO / "docs" / "course-spec.md"
    assert ours.is_file() and "## " in ours.read_text()
    shared = REPO.parent / "shared" / "COURSE_SPEC.md"
    if not shared.is_file():
        pytest.skip(f"no shared contract at {shared} to compare with")
    assert ours.read_text() == shared.read_text(), "docs/course-spec.md differs from ../shared/COURSE_SPEC.md: copy it again"


def test_release_keeps_a_copy_of_work_in_a_notebook(tmp_path):
    """Releasing again never overwrites work without a copy and a word (issue 41.10): a
    notebook with outputs, or changed since it was committed, is copied to .backup/ first; a
    notebook as committed (the course changed, nobody worked in it) is simply replaced."""
    import json as _json

    from tfsgrade import cli, course
    committed = course.NOTEBOOKS / "01_attention.ipynb"
    new = tmp_path / "new.ipynb"
    nb = _json.loads(committed.read_text(encoding="utf-8"))
    nb["cells"][0]["source"] = "a changed course cell"
    new.write_text(_json.dumps(nb), encoding="utf-8")
    assert cli._keep_work(committed, committed) is None           # the same file: nothing to keep
    assert cli._keep_work(committed, new) is None                 # as committed: replaced
    worked = tmp_path / "notebooks" / "01_attention.ipynb"
    worked.parent.mkdir()
    nb["cells"][1].update(outputs=[{"output_type": "stream", "name": "stdout", "text": "hi"}],
                          execution_count=1)
    worked.write_text(_json.dumps(nb), encoding="utf-8")
    kept = cli._keep_work(worked, new)
    assert kept is not None and kept.parent.name == ".backup" and kept.read_bytes() == worked.read_bytes()


def test_check_says_when_a_committed_notebook_holds_outputs(tmp_path):
    """`make check` on a notebook JupyterLab saved with its outputs says so, not "stale"."""
    import json as _json

    from tfsgrade import cli
    made, committed = tmp_path / "made", tmp_path / "committed"
    made.mkdir()
    committed.mkdir()
    nb = {"cells": [{"cell_type": "code", "source": "1", "metadata": {}, "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (made / "01_x.ipynb").write_text(_json.dumps(nb))
    nb["cells"][0].update(outputs=[{"output_type": "stream", "name": "stdout", "text": "1"}])
    (committed / "01_x.ipynb").write_text(_json.dumps(nb))
    said = cli._differ([made / "01_x.ipynb"], committed, "*.ipynb", "orphan")
    assert said and "holds outputs" in said[0] and "Clear Outputs" in said[0], said
