"""tfscratch.memtrack, which notebook 10 and its checks rely on: the recorder sees every
operation's outputs (factory functions included), and peak_memory counts live tensor bytes."""
import torch

from tfscratch.memtrack import TensorRecorder, peak_memory
from tfscratch.reference import flash_attention, naive_attention
from tfscratch.specs.efficient_attention import full_matrix


def full_matrix_tensors(records, batch, Lq, Lk):
    """The recorded outputs that hold an (Lq, Lk) matrix per slice, by notebook 10's spec rule."""
    return full_matrix([[0] * (6 - len(s)) + list(s) for r in records for s in r.out_shapes
                        if len(s) <= 6], batch, Lq, Lk)


def test_recorder_sees_factories_and_reductions():
    x = torch.randn(3, 10)
    with TensorRecorder() as rec:
        torch.ones(4, 4).tril()
        x.amax(dim=-1, keepdim=True)
    ops = [r.op for r in rec.records]
    assert "aten.ones.default" in ops and "aten.tril.default" in ops
    red = next(r for r in rec.records if r.base == "amax")
    assert red.in_shape == (3, 10) and red.dims == (1,)


def test_full_matrix_detection():
    q, k, v = torch.randn(3, 2, 3, 32, 4).unbind(0)
    with TensorRecorder() as rec:
        naive_attention(q, k, v, causal=True)
    assert full_matrix_tensors(rec.records, (2, 3), 32, 32)
    with TensorRecorder() as rec:
        flash_attention(q, k, v, block_size=8, causal=True)
    assert not full_matrix_tensors(rec.records, (2, 3), 32, 32)


def test_peak_memory_grows_with_the_square_for_naive_attention():
    peaks = {}
    for L in (256, 512):
        q, k, v = torch.randn(3, 1, 2, L, 16).unbind(0)
        _, peaks[("naive", L)] = peak_memory(naive_attention, q, k, v)
        _, peaks[("block", L)] = peak_memory(flash_attention, q, k, v, 64)
    assert 3.0 < peaks[("naive", 512)] / peaks[("naive", 256)] < 5.0
    assert 1.5 < peaks[("block", 512)] / peaks[("block", 256)] < 2.5
    assert peaks[("naive", 256)] >= 4 * 2 * 256 * 256  # at least one (H, L, L) float32 matrix
