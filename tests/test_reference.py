"""The reference building blocks that later notebooks import: equal to PyTorch's modules,
and earning every point in their own notebook's tests (so equal to the solution there)."""
import pytest
import torch
from torch import nn

from catalogue import run_exercise
from tfscratch import reference as R
from tfscratch.checks.core import copy_mha_to_torch
from tfsgrade import manifest

# every exported exercise, run from the generated package through its notebook's test cells
CASES = [(nb.name, e.name) for nb in manifest.load() for e in nb.exercises if e.exported]


@pytest.mark.parametrize("assignment,exercise", CASES, ids=[f"{a}:{e}" for a, e in CASES])
def test_reference_earns_full_marks_in_its_notebook(assignment, exercise):
    res = run_exercise(assignment, exercise, f"from tfscratch.reference import {exercise}",
                       sandboxed=False)
    bad = [f"{r.grade_id}: {r.message}" for r in res if not r.passed]
    assert not bad, "\n".join(bad)


def test_reference_matches_pytorch_modules():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 16)
    assert torch.allclose(R.layer_norm(x), nn.functional.layer_norm(x, (16,)), atol=1e-5)
    bn, mine = nn.BatchNorm1d(16), R.BatchNorm(16)
    for _ in range(3):
        y = torch.randn(4, 7, 16) * 3 + 1
        assert torch.allclose(bn(y.transpose(1, 2)).transpose(1, 2), mine(y), atol=1e-5)
    assert torch.allclose(bn.running_var, mine.running_var, atol=1e-5)
    m = R.MultiHeadAttention(16, 4)
    t = nn.MultiheadAttention(16, 4, batch_first=True)
    copy_mha_to_torch(m, t)
    q, kv = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    tok = torch.tensor([[1, 2, 3, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]])
    mask = R.make_padding_mask(tok)
    assert torch.allclose(m(q, kv, kv, mask), t(q, kv, kv, key_padding_mask=~mask.squeeze(1))[0],
                          atol=1e-5)
    pe = R.sinusoidal_positional_encoding(50, 16)
    assert torch.allclose(pe[3:], pe[:-3] @ R.pe_shift_matrix(3, 16).T, atol=1e-5)
