"""01_attention: what the grader runs on the student's `softmax` and
`scaled_dot_product_attention`, on inputs drawn for each grading run."""

ASSIGNMENT = "01_attention"
import torch

from .engine import Exercise, Probe, call, given, randn


def _rows_apart(g):
    x = torch.randn(4, 7, generator=g) * 3
    x[1] -= 300.0          # a row far below the others: one global max underflows it
    x[2] += 900.0          # a row near +1000: exp overflows without a max
    return x


EXERCISES = [
    Exercise("softmax", ref="attention.softmax", probes=[
        Probe("rows", ("test_softmax_rows", "test_softmax_random"),
              [call(randn(6, 9, scale=3.0)), call(randn(5, 5, scale=3.0))],
              what="softmax along the last axis of random (6, 9) and (5, 5) inputs"),
        Probe("random", ("test_softmax_random",),
              [call(randn(7, 13, scale=60.0)), call(randn(3, 5, 11, scale=60.0), dim=0),
               call(randn(17, scale=60.0))],
              what="random logits x60 of other shapes and axes"),
        Probe("dim", ("test_softmax_dim", "test_softmax_random"),
              [call(randn(3, 4, 5), dim=d) for d in (0, 1, -2)] + [call(randn(2, 3, 6, 4), dim=1)],
              what="softmax along dim=0, 1, -2 of 3-D and 4-D inputs"),
        Probe("stable", ("test_softmax_stable",),
              [call(given(_rows_apart, "rows near -300 and +900")),
               call(randn(6, 3, scale=500.0), dim=0)],
              what="logits far apart (rows near -300 and +900, columns x500)"),
        Probe("gradient", ("test_softmax_gradient",),
              [call(randn(5, 8), grad=(0,), backward=randn(5, 8))],
              what="the gradient for a random upstream gradient"),
    ]),
    Exercise("scaled_dot_product_attention", ref="masks.scaled_dot_product_attention", probes=[
        Probe("shapes", ("test_scaled_dot_product_attention_shapes",
                         "test_scaled_dot_product_attention_random"),
              [call(randn(3, 4, 8), randn(3, 7, 8), randn(3, 7, 5))],
              what="Lq=4, Lk=7, d_k=8, d_v=5"),
        Probe("weights", ("test_scaled_dot_product_attention_weights",
                          "test_scaled_dot_product_attention_output",
                          "test_scaled_dot_product_attention_random"),
              [call(randn(2, 6, 32, scale=2.0), randn(2, 9, 32), randn(2, 9, 3))],
              what="d_k=32 with large scores"),
        Probe("batch axes", ("test_scaled_dot_product_attention_batch_axes",),
              [call(randn(5, 16), randn(11, 16), randn(11, 4)),
               call(randn(2, 3, 5, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 2))],
              what="no batch axis, and two batch axes"),
        Probe("gradient", ("test_scaled_dot_product_attention_output",),
              [call(randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 6), grad=(0, 1, 2),
                    backward=randn(2, 3, 6), backward_of="0")],
              what="gradients of q, k, v"),
    ]),
]
