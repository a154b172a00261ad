"""The static scan (autograder/tfsgrade/scan.py): the hostile corpus in tests/hostile/scan_cases.py
is caught with the right kind and certainty, a cheat costs only the exercise it cheats, and honest
code (solutions, the whole mistake and valid-variant catalogues) raises no flag except mistakes
that really use a shortcut, which are certain. Pure: no kernel, no nbgrader."""
from __future__ import annotations

import copy
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

from nbtools import NOTEBOOKS, SOLUTIONS, read, solution_sources, student_notebook
from tfsgrade import cells, manifest, scan

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from catalogue import modules  # noqa: E402


def _load_cases():
    spec = importlib.util.spec_from_file_location("scan_cases", HERE / "hostile" / "scan_cases.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scan_cases"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.CASES


CASES = _load_cases()


def build(case) -> nbformat.NotebookNode:
    """The released notebook, every exercise solved with the course's solution, then the case's
    fills and extra free cells."""
    fill = dict(solution_sources(case.assignment), **case.fill)
    nb = student_notebook(case.assignment, fill)
    for after, code in case.extra:
        pos = next(i for i, c in enumerate(nb.cells)
                   if c.metadata.get("nbgrader", {}).get("grade_id") == after)
        nb.cells.insert(pos + 1, nbformat.v4.new_code_cell(code))
    return nb


def test_corpus_size_and_names():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    assert len(CASES) >= 60
    by_nb = {c.assignment for c in CASES}
    assert {"01_attention", "03_multihead", "04_normalization"} <= by_nb
    honest = [c for c in CASES if not c.expect]
    assert len(honest) >= 10


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(case):
    res = scan.scan_notebook(build(case), case.assignment)
    got = {(f.kind, f.certainty, f.exercise) for f in res.findings}
    listing = "\n".join(f"  {f.certainty} {f.kind} {f.exercise}: {f.describe()}" for f in res.findings)
    if not case.expect:
        assert not res.findings, f"honest case {case.name} was flagged:\n{listing}"
        return
    for exp in case.expect:
        assert exp in got, f"{case.name}: expected {exp}, got:\n{listing or '  nothing'}"
    # a certain finding costs only the exercise it concerns, and only when the case expects it
    certain_expected = {e for k, c, e in case.expect if c == scan.CERTAIN}
    assert set(res.zeroed()) == certain_expected, f"{case.name}: zeroed {res.zeroed()}\n{listing}"
    for f in res.findings:  # every finding says where it is
        assert f.cell >= 0 and f.line >= 1 and f.message


def test_findings_point_at_the_cell_and_line():
    case = next(c for c in CASES if c.name == "sm_log_softmax_exp")
    nb = build(case)
    res = scan.scan_notebook(nb, case.assignment)
    [f] = res.certain
    assert nb.cells[f.cell].metadata.nbgrader.grade_id == "softmax" == f.grade_id
    assert f.line == 2 and "log_softmax" in f.code
    assert "softmax" in res.zeroed() and "log_softmax" in res.zeroed()["softmax"]
    assert any(n.startswith("0 points, softmax: cell") for n in res.notes())


def test_zeroed_cells_are_the_exercise_tests_only():
    case = next(c for c in CASES if c.name == "sm_ops_aten")
    nb = build(case)
    res = scan.scan_notebook(nb, case.assignment)
    tests = [c.metadata.nbgrader.grade_id for c in nb.cells
             if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata.nbgrader.get("solution")]
    owners = manifest.owners(case.assignment)
    assert set(tests) <= set(owners)
    cells = res.zeroed_cells(owners)
    assert sorted(cells) == sorted(t for t in tests if owners[t] == "softmax")
    assert all("torch.ops.aten.softmax" in why for why in cells.values())
    enc = scan.ScanResult("06_blocks", ["Encoder", "EncoderLayer"], [scan.Finding(
        1, "Encoder", 1, "shortcut", scan.CERTAIN, "Encoder", "x")])
    assert list(enc.zeroed_cells({"test_Encoder_shapes": "Encoder", "test_EncoderLayer_shapes": "EncoderLayer"})) \
        == ["test_Encoder_shapes"]


def test_review_never_zeroes():
    case = next(c for c in CASES if c.name == "patch_allclose")
    res = scan.scan_notebook(build(case), case.assignment)
    assert res.review and not res.certain and res.zeroed() == {}
    assert all(n.startswith("flagged for review") for n in res.notes())


def test_unchanged_course_cells_are_not_scanned():
    # 02 and 03 demo cells use nn.MultiheadAttention and the reference: course code, no flag
    for a in ("02_masks", "03_multihead", "07_transformer"):
        assert scan.scan_notebook(read(NOTEBOOKS / f"{a}.ipynb"), a).findings == []


def test_edited_course_cell_is_scanned():
    nb = student_notebook("01_attention")
    demo = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "nbgrader" not in c.metadata)
    nb.cells[demo].source += "\ntorch.allclose = lambda *a, **k: True\n"
    res = scan.scan_notebook(nb, "01_attention")
    assert [(f.cell, f.kind) for f in res.findings] == [(demo, "tamper")]


def test_a_course_cell_moved_above_its_exercises_checks_is_the_students():
    """10's course cell that makes flash_attention trainable (a wrapper around the names
    flash_attention_forward and FlashAttention) stands after the exercise's checks. Pasted above
    them, with flash_attention_forward bound in a free cell, the probe would grade the course's
    wrapper around the student's free code: the moved cell is scanned as the student's, and the
    exercise redefined outside its own cell is flagged (the red-team read found it silent)."""
    a = "10_efficient_attention"
    nb = student_notebook(a, solution_sources(a))
    wrap = next(i for i, c in enumerate(nb.cells) if "flash_attention_forward = getattr(" in c.source)
    first = next(i for i, c in enumerate(nb.cells)
                 if manifest.owners(a).get(c.metadata.get("nbgrader", {}).get("grade_id")) == "flash_attention")
    assert first < wrap and scan.scan_notebook(nb, a).findings == []
    moved = copy.deepcopy(nb)
    cell = moved.cells.pop(wrap)
    moved.cells[first:first] = [nbformat.v4.new_code_cell(
        "def flash_attention_forward(q, k, v, block_size=64, causal=False):\n"
        "    return q.softmax(-1) @ v\n"), cell]
    found = [(f.cell, f.exercise, f.message) for f in scan.scan_notebook(moved, a).findings]
    assert (first + 1, "flash_attention", "the exercise `flash_attention` is redefined outside its own cell") \
        in found, found


def test_relabelled_solution_cell_is_still_judged():
    nb = build(next(c for c in CASES if c.name == "sm_special_softmax"))
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    del cell.metadata["nbgrader"]  # the student stripped the cell's metadata
    res = scan.scan_notebook(nb, "01_attention")
    assert "softmax" in res.zeroed(), res.notes()


def test_hostile_metadata_never_crashes_the_scan():
    nb = build(next(c for c in CASES if c.name == "sm_special_softmax"))
    nb.cells[1].metadata["nbgrader"] = "not a dict"
    nb.cells[2].metadata["nbgrader"] = {"grade_id": ["softmax"], "solution": True}
    nb.cells[3].metadata["nbgrader"] = None
    extra = nbformat.v4.new_code_cell("x = 1")
    extra.source = ["import os\n", "os.listdir('/')\n"]
    nb.cells.append(extra)
    res = scan.scan_notebook(nb, "01_attention")
    assert "softmax" in res.zeroed()
    assert any(f.kind == "file-access" for f in res.findings)
    from tfsgrade import hygiene
    hygiene.clean_feedback_notebook(nb, read(SOLUTIONS / "01_attention.ipynb"))
    assert "softmax" in cells.solutions(nb)


def test_nbformat3_and_syntax_errors():
    nb = build(next(c for c in CASES if c.name == "sm_ops_aten"))
    v3 = nbformat.convert(copy.deepcopy(nb), 3)
    res = scan.scan_notebook(v3, "01_attention")
    assert "softmax" in res.zeroed()
    broken = student_notebook("01_attention", {"softmax": "def softmax(x, dim=-1:\n    return torch.softmax(x)\n"})
    assert scan.scan_notebook(broken, "01_attention").findings == []  # the kernel cannot run it either


def test_scan_code_entry_point():
    assert scan.scan_code("def softmax(x, dim=-1):\n    return F.softmin(-x, dim)\n", "softmax").zeroed()
    assert not scan.scan_code("def f(x):\n    return torch.softmax(x, -1)\n", "scaled_dot_product_attention").findings
    r = scan.scan_code("def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):\n"
                       "    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), "
                       "ignore_index=ignore_index, label_smoothing=smoothing)\n",
                       "label_smoothing_cross_entropy")
    assert "label_smoothing_cross_entropy" in r.zeroed()
    ok = scan.scan_code("def label_smoothing_cross_entropy(logits, target, smoothing=0.0, ignore_index=-100):\n"
                        "    logp = F.log_softmax(logits, -1)\n"
                        "    nll = F.nll_loss(logp.flatten(0, -2), target.flatten(), ignore_index=ignore_index)\n"
                        "    return nll\n", "label_smoothing_cross_entropy")
    assert not ok.findings
    for ex, code in [("online_softmax", "def online_softmax(x, block_size):\n    return x.softmax(-1)\n"),
                     ("flash_attention", "def flash_attention(q, k, v, block_size=64, causal=False):\n"
                                         "    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"),
                     ("GroupedQueryAttention", "class GroupedQueryAttention(nn.Module):\n"
                                               "    def forward(self, x, cache=None):\n"
                                               "        return torch.ops.aten.scaled_dot_product_attention(x, x, x, enable_gqa=True)\n"),
                     ("rms_norm", "def rms_norm(x, weight=None, eps=1e-6):\n    return F.rms_norm(x, x.shape[-1:], weight, eps)\n"),
                     ("RMSNorm", "class RMSNorm(nn.RMSNorm):\n    pass\n")]:
        assert ex in scan.scan_code(code, ex).zeroed(), ex
    # later exercises may use earlier built-ins
    assert not scan.scan_code("def flash_attention(q, k, v, block_size=64, causal=False):\n"
                              "    return torch.softmax(q @ k.mT, -1) @ v\n", "flash_attention").findings
    assert not scan.scan_code("class ModernDecoderLM(nn.Module):\n    def __init__(self):\n"
                              "        super().__init__()\n        self.norm = nn.RMSNorm(8)\n",
                              "ModernDecoderLM").findings


def test_one_table_feeds_the_three_guards():
    """The kernel's guard, the probe machine and the scan read one table (tfscratch.shortcuts),
    and which exercise forbids what is said once, by its spec: every name the kernel's guard
    blocks is certain for the scan too, and the scan checks exactly the spec's groups."""
    from tfscratch import shortcuts
    from tfscratch.checks import core
    from tfscratch.specs import engine
    for g, row in shortcuts.GROUPS.items():
        assert core._HUMAN[g] == scan.GROUPS[g]["label"] == row.label
        if g != "cross_entropy":   # certain only with label_smoothing= (test_label_smoothing_*)
            assert set(row.names) <= scan.GROUPS[g]["leaves"], g
    for ex, groups in engine.shortcut_table().items():
        assert {scan.GROUPS[g]["label"] for g in scan.exercise_groups(ex)} <= \
            {scan.GROUPS[g]["label"] for g in groups}
        assert bool(scan.exercise_groups(ex)) == bool(groups), ex
    assert scan.exercise_groups("greedy_decode") == ("transformer",)   # once only in the source
    plan, _ = engine.build_plan(next(e for e in engine.specs_for("10_efficient_attention")
                                     if e.name == "online_softmax"), 0)
    assert plan["forbid"] == shortcuts.plan_rows(("online_softmax",))


# ------------------------------------------------------------------ the catalogues and solutions
MODS = modules()
ITEMS = [(m.ASSIGNMENT, kind, x) for m in MODS
         for kind, xs in (("mistake", m.MISTAKES), ("variant", m.VARIANTS)) for x in xs]


_SOFTMAX_RE = r"torch\.softmax|F\.softmax|\.softmax\(|nn\.Softmax|softmin|log_softmax"
_ATTENTION_RE = r"F\.scaled_dot_product_attention|nn\.MultiheadAttention|multi_head_attention_forward"
_NAMES = {"softmax": _SOFTMAX_RE, "online_softmax": _SOFTMAX_RE, "attention": _ATTENTION_RE,
          "multihead": _ATTENTION_RE, "flash_attention": _ATTENTION_RE,
          "layer_norm": r"F\.layer_norm|nn\.LayerNorm|torch\.layer_norm|group_norm|instance_norm",
          "batch_norm": r"F\.batch_norm|nn\.BatchNorm|torch\.batch_norm",
          "rms_norm": r"F\.rms_norm|nn\.RMSNorm",
          "transformer": r"nn\.Transformer",
          "cross_entropy": r"label_smoothing=",
          "adamw": r"torch\.optim\.Adam|optim\.AdamW",
          "clip_grad_norm": r"clip_grad_norm_",
          "lr_scheduler": r"lr_scheduler"}


def _uses_shortcut(m) -> bool:
    """A catalogued mistake that really uses a forbidden built-in: it says "shortcut", or its
    description names a built-in that its own exercise forbids."""
    if re.search(r"shortcut", m.hint + " " + m.description, re.I):
        return True
    said = re.sub(r"\blike \S+", "", m.description)  # "returns (out, w) like nn.MultiheadAttention"
    return any(re.search(_NAMES[g], said) for g in scan.exercise_groups(m.exercise))


@pytest.mark.parametrize("assignment", [m.ASSIGNMENT for m in MODS])
def test_solutions_and_released_notebooks_raise_no_flag(assignment):
    assert scan.scan_notebook(read(SOLUTIONS / f"{assignment}.ipynb"), assignment).findings == []
    assert scan.scan_notebook(read(NOTEBOOKS / f"{assignment}.ipynb"), assignment).findings == []


@pytest.mark.slow   # ~25 s
@pytest.mark.parametrize("assignment", [m.ASSIGNMENT for m in MODS])
def test_catalogue_raises_no_flag_except_real_shortcuts(assignment):
    """Every valid variant and every mistake, in its exercise cell of the released notebook (the
    other exercises solved), raises no flag; mistakes that use a shortcut are certain for their
    exercise."""
    sols = solution_sources(assignment)
    problems = []
    for a, kind, x in ITEMS:
        if a != assignment:
            continue
        res = scan.scan_notebook(student_notebook(a, dict(sols, **{x.exercise: x.code})), a)
        label = f"{kind} {x.exercise}: {x.description}"
        if kind == "mistake" and _uses_shortcut(x):
            if x.exercise not in res.zeroed():
                problems.append(f"{label}: shortcut not caught as certain")
            stray = [f for f in res.findings if f.certainty != scan.CERTAIN]
            if stray:
                problems.append(f"{label}: also flagged {[f.describe() for f in stray]}")
        elif res.findings:
            problems.append(f"{label}: flagged {[f.describe() for f in res.findings]}")
    assert not problems, "\n".join(problems)


def test_a_bpe_library_inside_11_is_flagged_for_review():
    """11's exercises are BPE written by hand: a call into Hugging Face's tokenizers (which gives
    the same ids from the same merges) or tiktoken is flagged for review, with its line."""
    code = ("from tokenizers import Tokenizer as HF, models\n"
            "class Tokenizer:\n    def encode(self, text):\n"
            "        return HF(models.BPE(self.vocab, self.merges)).encode(text).ids\n")
    r = scan.scan_code(code, "Tokenizer")
    assert any("tokenizers" in f.message for f in r.findings), r.findings
    assert not scan.scan_code("def train_bpe(text, vocab_size, special_tokens=()):\n"
                              "    return {}, []\n", "train_bpe").findings


def test_course_cells_bind_an_exercise_name_only_after_its_checks():
    """The scan reads a course cell (by its text) as the course's, wherever it stands, except
    one that binds an exercise's name above that exercise's last check (`scan._rebinds_early`,
    which sees top-level def, class and `name =` only). So every course cell of every source
    that binds an exercise's name (at any depth, in any form) does it in one of those forms and
    after the exercise's checks: 10's trainable flash_attention is the one such cell today."""
    import ast

    from tfsgrade import build, course
    found = []
    for src in sorted(course.SOURCES.glob("[0-9][0-9]_*.py")):
        cells = build.parse_cells(src.read_text(), str(src))
        names = {c.grade_id for c in cells if c.kind == "solution"}
        last = {c.exercise: i for i, c in enumerate(cells) if c.kind == "tests"}
        for i, c in enumerate(cells):
            if c.kind in ("markdown", "answer", "solution", "tests"):
                continue
            tree = ast.parse(c.source.replace("%matplotlib inline", ""))
            top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
            bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            bound |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            bound |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                      if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
            for name in bound & names:
                found.append((src.stem, name))
                assert name in top, f"{src.name}: a course cell binds {name} in a form the scan misses"
                assert i > last.get(name, -1), f"{src.name}: a course cell binds {name} above its checks"
    assert found == [("10_efficient_attention", "flash_attention")], found
