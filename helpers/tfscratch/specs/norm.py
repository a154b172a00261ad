"""04_normalization: what the grader runs on the student's `layer_norm`, `LayerNorm`,
`batch_norm`, `BatchNorm` and the extra exercise `rms_norm`, on inputs drawn for each grading
run.

- `layer_norm` / `rms_norm`: rows of every rank, constant and tiny-variance rows (where eps
  placement shows), non-default eps, weight and bias separately, large offsets (where
  E[x^2] - E[x]^2 loses its digits), gradients.
- `batch_norm`: the running statistics it updates IN PLACE are captured after each call
  (`keep=`); several steps on the same statistics chain them through earlier outputs: the
  first two calls of such a probe return the starting statistics (eval mode with weight 0
  returns its bias), and the later calls update those very tensors (`prev`). A last eval call
  with a backward on the updated statistics fails if a training step left them inside the
  autograd graph.
- `LayerNorm` / `BatchNorm`: built with the exercise's constructor, given the reference's
  (perturbed) parameters by name; BatchNorm's buffers are read with `get_buffer`, so running
  statistics that are plain attributes or parameters fail; `.eval()` / `.train()` are calls
  of the probe, so one object goes through train, eval and train again.
- `rms_norm`: the reference is 09's `modern_decoder.rms_norm` (04's cell is not exported);
  both default to eps=1e-6, and most calls pass eps explicitly.
"""

ASSIGNMENT = "04_normalization"
import torch

from .engine import Exercise, Probe, call, ctor, given, prev, randn


# -- inputs ---------------------------------------------------------------------------------

def _normal(*shape, scale=1.0, offset=0.0):
    """scale * randn + offset, float32."""
    def build(g):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).float()
    return given(build, f"randn{tuple(shape)} x{scale:g} + {offset:g}")


def _const(*shape, value=0.0):
    return given(lambda g: torch.full(shape, float(value)), f"full{tuple(shape)}={value:g}")


def _positive(*shape):
    """Variances to start from: uniform in [0.5, 1.5)."""
    return given(lambda g: torch.rand(*shape, generator=g) + 0.5, f"rand{tuple(shape)} + 0.5")


def _constant_rows(N, D):
    """Every row constant (variance exactly 0): a missing eps gives 0/0."""
    return given(lambda g: (torch.randn(N, 1, generator=g) * 3).expand(N, D).contiguous(),
                 f"constant rows ({N}, {D})")


def _tiny_rows(N, D, spread=1e-3, offset=0.5):
    """Rows whose variance (~spread^2) is below eps=1e-5: eps placement decides the output."""
    return given(lambda g: torch.randn(N, D, generator=g) * spread + offset,
                 f"rows of variance ~{spread ** 2:g}")


def _one_tiny_row(N, D):
    """Random rows (x2 + 0.5), row 0 shrunk by 1e-3 (tiny variance)."""
    def build(g):
        x = torch.randn(N, D, generator=g) * 2 + 0.5
        x[0] = x[0] * 1e-3
        return x
    return given(build, f"({N}, {D}) with a tiny-variance row")


def _tiny_features(N, D):
    """Features of very different spread: some with a variance far below eps."""
    def build(g):
        x = torch.randn(N, D, generator=g) * 2 + 1
        scale = torch.tensor([1e-3, 3e-3, 1.0, 1e-2] * (D // 4 + 1))[:D]
        return x * scale
    return given(build, f"({N}, {D}) with feature variances from ~1e-6 to ~4")


def _shifted(*shape, scale=2.0):
    """scale * randn plus a random per-feature mean: statistics differ from 0 and 1."""
    D = shape[-1]
    def build(g):
        return torch.randn(*shape, generator=g) * scale + torch.randn(D, generator=g) * 2
    return given(build, f"randn{tuple(shape)} x{scale:g} + a mean per feature")


# -- batch_norm: statistics that persist over calls -----------------------------------------

def _start(D):
    """Two calls that RETURN the starting running_mean (random) and running_var (positive):
    eval mode with weight 0 returns its bias. Later calls pass `prev(0)` and `prev(1)`, the
    same tensors, which training updates in place."""
    zero, one = _const(D), _const(D, value=1.0)
    return [call(zero, zero, one, zero, randn(D)),
            call(zero, zero, one, zero, _positive(D))]


def _steps(shapes, D, momentum=None, eps=None, affine=True, last_eval="full"):
    """Training calls on the statistics of `_start` (calls 0 and 1: a chain opens its probe),
    then one eval call; the statistics are captured after every call, the input gradient
    too (a backward through the eval call fails when training left the statistics inside the
    autograd graph). `last_eval="graph"`: the eval call has weight 0 and keeps nothing, so it
    only asks that the statistics be out of the graph (its output is its bias whatever eval
    mode does: eval mistakes are other cells' business)."""
    kw = {}
    if momentum is not None:
        kw["momentum"] = momentum
    if eps is not None:
        kw["eps"] = eps
    w, b = (randn(D), randn(D)) if affine else (None, None)
    out = []
    for shape in shapes[:-1]:
        out.append(call(_shifted(*shape), prev(0), prev(1), w, b, training=True,
                        keep=(1, 2), grad=(0,), backward=randn(*shape), **kw))
    shape = shapes[-1]
    if last_eval == "graph":
        out.append(call(_shifted(*shape), prev(0), prev(1), _const(D), randn(D), training=False,
                        grad=(0,), backward=randn(*shape), **kw))
    else:
        out.append(call(_shifted(*shape), prev(0), prev(1), w, b, training=False,
                        keep=(1, 2), grad=(0,), backward=randn(*shape), **kw))
    return out


def _chain(shapes, D, **kw):
    return _start(D) + _steps(shapes, D, **kw)


def _outputs_only(key, got, want):
    """Chains compare outputs and statistics: their backward passes are there to free the
    graph (and test_batch_norm_gradient charges gradients), so input gradients are skipped."""
    return None if ".grad." in key else "default"


# -- BatchNorm module: train, eval, train again ---------------------------------------------

def _buffers():
    return [call("running_mean", method="get_buffer"), call("running_var", method="get_buffer")]


def _train_eval(lead, d, steps):
    shape = (*lead, d)
    calls = [call(_shifted(*shape), grad=(0,), backward=randn(*shape))] + _buffers()
    for _ in range(steps - 1):
        calls += [call(_shifted(*shape))] + _buffers()
    calls += [call(method="eval"), call(_shifted(*shape))] + _buffers()
    calls += [call(method="train"), call(_shifted(*shape))] + _buffers()
    return calls


EXERCISES = [
    Exercise("layer_norm", ref="norm.layer_norm", probes=[
        Probe("basic", ("test_layer_norm_basic", "test_layer_norm_random"),
              [call(_normal(5, 7, scale=2.0, offset=1.0)), call(_normal(6, 6, scale=3.0))],
              what="rows of a (5, 7) and of a square (6, 6) input, no weight or bias"),
        Probe("affine", ("test_layer_norm_affine",),
              [call(_normal(4, 5, scale=2.0, offset=1.0), randn(5), randn(5)),
               call(_normal(4, 5, scale=2.0, offset=1.0), weight=randn(5)),
               call(_normal(4, 5, scale=2.0, offset=1.0), bias=randn(5))],
              what="weight and bias, weight alone, bias alone"),
        Probe("eps", ("test_layer_norm_eps",),
              [call(_constant_rows(3, 4)), call(_tiny_rows(5, 8)),
               call(_normal(3, 7, scale=0.3), randn(7), randn(7), eps=1e-2),
               call(_normal(3, 7, scale=0.3), randn(7), randn(7), eps=0.5)],
              atol=6e-5,  # rows of variance 1e-6 around 0.5: float32 keeps ~1e-5 of x - mean
              what="constant rows, rows of variance ~1e-6, eps=0.01 and eps=0.5"),
        Probe("batch axes", ("test_layer_norm_batch_axes",),
              [call(_normal(6, scale=2.0), randn(6), randn(6)),
               call(_normal(2, 5, 8, scale=3.0, offset=-1.0), randn(8), randn(8)),
               call(_normal(2, 3, 4, 6, offset=2.0), randn(6), randn(6))],
              what="inputs of shape (6,), (2, 5, 8) and (2, 3, 4, 6)"),
        Probe("gradient", ("test_layer_norm_gradient",),
              [call(_normal(3, 4, 6, scale=2.0), randn(6), randn(6), grad=(0, 1, 2),
                    backward=randn(3, 4, 6))],
              atol=1e-4, rtol=1e-3, what="gradients of x, weight and bias"),
        Probe("random", ("test_layer_norm_random",),
              [call(_normal(7, 13, scale=4.0), randn(13), randn(13), 1e-3),
               call(_normal(3, 9, 32, scale=4.0), randn(32), randn(32), eps=0.1),
               call(_normal(2, 2, 5, 3, scale=4.0), randn(3), randn(3)),
               call(_normal(11, scale=4.0), randn(11), randn(11), eps=1e-5),
               call(_tiny_rows(6, 12, spread=3e-3, offset=0.0), randn(12), randn(12), eps=1e-6)],
              what="random shapes, weights and eps values (0.001, 0.1, 1e-5, 1e-6)"),
        Probe("offset", ("test_layer_norm_random",),
              [call(_normal(5, 24, offset=100.0), randn(24), randn(24)),
               call(_normal(2, 4, 7, offset=100.0), randn(7), randn(7))],
              atol=2.1e-4, what="inputs with a large mean (randn + 100)"),
    ]),
    Exercise("LayerNorm", ref="norm.LayerNorm", probes=[
        Probe("init", ("test_LayerNorm_init",), [], make=ctor(7), params=True,
              after=("weight", "bias"),
              what="LayerNorm(7) as constructed: parameters weight (ones) and bias (zeros)"),
        Probe("default eps", ("test_LayerNorm_matches_torch",),
              [call(_one_tiny_row(4, 6), grad=(0,), backward=randn(4, 6))],
              make=ctor(6), load="reference", params=True, param_grads=True,
              atol=1e-4, rtol=1e-3,
              what="LayerNorm(6) (default eps) with a tiny-variance row, and its gradients"),
        Probe("eps", ("test_LayerNorm_matches_torch",),
              [call(_normal(2, 5, 8, scale=2.0, offset=0.5), grad=(0,), backward=randn(2, 5, 8))],
              make=ctor(8, eps=1e-3), load="reference", params=True, param_grads=True,
              atol=1e-4, rtol=1e-3, what="LayerNorm(8, eps=0.001) on (2, 5, 8), and its gradients"),
        Probe("large eps", ("test_LayerNorm_matches_torch",),
              [call(_normal(2, 3, 4, 5)), call(_normal(5, scale=0.3))],
              make=ctor(5, eps=0.2), load="reference", params=True,
              what="LayerNorm(5, eps=0.2) on (2, 3, 4, 5) and on one (5,) vector"),
    ]),
    Exercise("batch_norm", ref="norm.batch_norm", probes=[
        Probe("train", ("test_batch_norm_train", "test_batch_norm_random"),
              [call(_normal(6, 4, scale=2.0, offset=1.0), _const(4), _const(4, value=1.0),
                    training=True, keep=(1, 2)),
               call(_normal(6, 4, scale=6.0, offset=1.0), _const(4), _const(4, value=1.0),
                    randn(4), randn(4), training=True, keep=(1, 2))],
              what="training mode on (6, 4): batch statistics per feature, weight and bias"),
        Probe("tiny variance", ("test_batch_norm_train",),
              [call(_tiny_features(6, 4), _const(4), _const(4, value=1.0), training=True,
                    keep=(1, 2))],
              what="training mode with feature variances from ~1e-6 to ~4 (eps=1e-5)"),
        Probe("running stats", ("test_batch_norm_running_stats",),
              _chain([(5, 3)] * 4, 3, affine=False, last_eval="graph"),
              compare=_outputs_only,
              what="three training steps on the same running statistics (momentum 0.1), "
                   "then a backward through them"),
        Probe("momentum", ("test_batch_norm_running_stats",),
              _chain([(5, 3)] * 4, 3, momentum=0.3, affine=False, last_eval="graph"),
              compare=_outputs_only,
              what="three training steps with momentum=0.3, then a backward through them"),
        Probe("eval", ("test_batch_norm_eval",),
              [call(_normal(4, 3, scale=2.0), randn(3), _positive(3), keep=(1, 2)),
               call(_normal(4, 3, scale=2.0), randn(3), _positive(3), randn(3), randn(3),
                    training=False, eps=1e-3, keep=(1, 2)),
               call(_normal(1, 3, scale=2.0), randn(3), _positive(3), randn(3), randn(3),
                    training=False, keep=(1, 2))],
              what="eval mode (the default, eps=0.001, a batch of one): running statistics "
                   "used and left unchanged"),
        Probe("sequences", ("test_batch_norm_sequences",),
              _chain([(3, 5, 4), (1, 6, 4), (3, 5, 4)], 4)
              + [call(_shifted(3, 5, 4), _const(4), _const(4, value=1.0), training=True,
                      keep=(1, 2))],
              compare=_outputs_only,
              what="(B, L, D) inputs, a single sequence (1, 6, 4), training and eval mode"),
        Probe("gradient", ("test_batch_norm_gradient",),
              [call(_normal(4, 3, 5, offset=1.0), _const(5), _const(5, value=1.0), randn(5),
                    randn(5), training=True, grad=(0, 3, 4), backward=randn(4, 3, 5))],
              atol=1e-4, rtol=1e-3, what="training-mode gradients of x, weight and bias"),
        Probe("random a", ("test_batch_norm_random",),
              _chain([(13, 7)] * 5, 7, momentum=0.25),
              compare=_outputs_only, what="four steps on (13, 7), momentum 0.25, then eval"),
        Probe("random b", ("test_batch_norm_random",),
              _chain([(3, 11, 6)] * 4, 6, momentum=0.05, eps=1e-3),
              compare=_outputs_only,
              what="three steps on (3, 11, 6), momentum 0.05, eps=0.001, then eval"),
        Probe("random c", ("test_batch_norm_random",),
              _chain([(2, 3, 4, 5)] * 3, 5, momentum=0.7, eps=0.1),
              compare=_outputs_only,
              what="two steps on (2, 3, 4, 5), momentum 0.7, eps=0.1, then eval"),
        Probe("random d", ("test_batch_norm_random",),
              _chain([(1, 9, 4)] * 4, 4),
              compare=_outputs_only, what="three steps on one sequence (1, 9, 4), then eval"),
        Probe("random e", ("test_batch_norm_random",),
              _chain([(64, 2)] * 3, 2, momentum=0.9),
              compare=_outputs_only, what="two steps on (64, 2), momentum 0.9, then eval"),
    ]),
    Exercise("BatchNorm", ref="norm.BatchNorm", probes=[
        Probe("init", ("test_BatchNorm_init",), _buffers(), make=ctor(5), params=True,
              after=("weight", "bias"),
              what="BatchNorm(5) as constructed: weight/bias parameters, running_mean/"
                   "running_var buffers"),
        Probe("2-D", ("test_BatchNorm_train_eval",), _train_eval((6,), 4, 3),
              make=ctor(4), load="reference", mode="train", params=True, param_grads=True,
              after=("running_mean", "running_var"),
              atol=1e-4, rtol=1e-3,
              what="BatchNorm(4) on (6, 4): three training steps, eval, training again"),
        Probe("3-D", ("test_BatchNorm_train_eval",), _train_eval((3, 4), 5, 2),
              make=ctor(5, momentum=0.3), load="reference", mode="train", params=True,
              param_grads=True, after=("running_mean", "running_var"), atol=1e-4, rtol=1e-3,
              what="BatchNorm(5, momentum=0.3) on (3, 4, 5): train, eval, train again"),
        Probe("eps", ("test_BatchNorm_train_eval",), _train_eval((2, 6), 6, 2),
              make=ctor(6, eps=0.1, momentum=0.2), load="reference", mode="train",
              params=True, param_grads=True, after=("running_mean", "running_var"),
              atol=1e-4, rtol=1e-3,
              what="BatchNorm(6, eps=0.1, momentum=0.2) on (2, 6, 6): train, eval, train again"),
    ]),
    Exercise("rms_norm", ref="modern_decoder.rms_norm", probes=[
        Probe("basic", ("test_rms_norm_basic",),
              [call(_normal(3, 5, scale=2.0, offset=1.0)), call(_tiny_rows(2, 5, offset=0.0)),
               call(_normal(3, 5, scale=2.0, offset=1.0), randn(5), grad=(0, 1),
                    backward=randn(3, 5))],
              atol=1e-4, rtol=1e-3,
              what="(3, 5) rows, tiny rows (mean square ~1e-6), weight and gradients"),
        Probe("random", ("test_rms_norm_random",),
              [call(_normal(9, 17, scale=5.0, offset=1.0), randn(17), eps=1e-6),
               call(_normal(2, 5, 32, scale=5.0, offset=1.0), randn(32), eps=1e-3),
               call(_normal(3, scale=5.0, offset=1.0), randn(3), eps=0.3),
               call(_normal(4, 8), randn(8), eps=0.1),
               call(_tiny_rows(3, 6, spread=1e-3, offset=0.0), randn(6), eps=1e-6)],
              what="random shapes and weights, eps 1e-6, 0.001, 0.3, 0.1"),
    ]),
]
