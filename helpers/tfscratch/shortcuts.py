"""The shortcut table: one row per group of PyTorch built-ins that an exercise may not use, with
everything each of the three guards needs to refuse it. An exercise names its groups once, in
its spec (`Exercise(..., shortcuts=("softmax",))`); nothing else says which exercise forbids what.

The three guards read their columns of the same row:

- the kernel's guard (tfscratch.checks.core.no_shortcuts), in the student's own thread: the
  `names` of torch functions (matched on `__name__`, however imported) and the `nn_classes`
  whose forward raises;
- the probe machine (tfscratch.specs.vm._Guard), in every thread, in the kernel's checks and in
  the grader alike: the `aten` operators and the torch `python` functions (paths under `torch`);
- the grader's static scan (tfsgrade.scan), in the submitted source: the `leaves` (the last part
  of a dotted path, wherever it starts, or `roots` only), `tensor_methods`, the `modules` a path
  may pass through, names only flagged for `review`, and a `call_rule` (a call that is the
  shortcut only with a keyword).

`label` is what the student reads from each of them. Pure data: imports nothing."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    label: str
    # the kernel's guard
    names: frozenset = frozenset()
    nn_classes: tuple = ()
    # the probe machine
    aten: tuple = ()
    python: tuple = ()
    # the static scan
    leaves: frozenset = frozenset()
    tensor_methods: frozenset = frozenset()
    review: frozenset = frozenset()
    roots: tuple = ()
    modules: frozenset = frozenset()
    call_rule: str = ""

    def scan_key(self) -> tuple:
        """Two groups with the same scan columns are one rule for the scan (no double finding)."""
        return (self.leaves, self.tensor_methods, self.review, self.roots, self.modules, self.call_rule)


# -- the columns, spelled once ------------------------------------------------------------
# The aten operators that each group ends in, whatever the spelling: torch.softmax,
# F.softmin(-x), torch.log_softmax(x).exp(), getattr(torch, "soft" + "max"),
# torch.ops.aten._softmax, Categorical(logits=x).probs, flex_attention, a function
# torch.compile'd earlier (run eagerly while the guard is on) all reach one of them, in any
# thread (tests/test_vm_guard.py checks each spelling, and that honest code reaches none).
# Composite operators (softmax.int, layer_norm, rms_norm...) are listed too: below them their
# decomposition is plain arithmetic, as an honest solution's is.
_SOFTMAX_OPS = ("softmax", "log_softmax", "special_softmax", "special_log_softmax", "_softmax",
                "_log_softmax", "_safe_softmax", "_masked_softmax", "_sparse_softmax",
                "_sparse_log_softmax")
_ATTENTION_OPS = ("scaled_dot_product_attention", "_fused_sdp_choice",
                  "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu",
                  "_safe_softmax", "_native_multi_head_attention",
                  # the fused backward passes with a CPU-side kernel: an honest blockwise forward
                  # that saves O and the log-sum-exp could hand its backward to them
                  "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "_scaled_dot_product_fused_attention_overrideable_backward")
_LAYER_NORM_OPS = ("layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "rms_norm",
                   "_fused_rms_norm")
_BATCH_NORM_OPS = ("batch_norm", "instance_norm", "_batch_norm_impl_index", "native_batch_norm",
                   "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                   "_native_batch_norm_legit_functional", "_batch_norm_with_update",
                   "_batch_norm_with_update_functional", "_batch_norm_no_update")
# Python functions of torch that compute the same from basic operators (so no operator above
# sees them), as paths under `torch`: nn.MultiheadAttention's own math, the Transformer classes,
# torch._refs. The probe machine adds the decompositions of the operators (torch._decomp).
_MHA_PY = ("nn.functional.multi_head_attention_forward", "nn.MultiheadAttention.forward")
_SOFTMAX_PY = ("_refs.softmax", "_refs.log_softmax", "_refs.special.softmax",
               "_refs.special.log_softmax", "_refs.nn.functional.softmax",
               "_refs.nn.functional.softmin", "_refs.nn.functional.log_softmax")
_NORM_PY = ("_refs.nn.functional.layer_norm", "_refs.nn.functional.group_norm")
_TRANSFORMER_CLASSES = ("Transformer", "TransformerEncoder", "TransformerDecoder",
                        "TransformerEncoderLayer", "TransformerDecoderLayer")
# The kernel's guard: function names it refuses in the student's thread.
_SOFTMAX_NAMES = frozenset({"softmax", "_softmax", "special_softmax", "log_softmax", "_log_softmax",
                            "softmin", "_safe_softmax", "_masked_softmax", "_sparse_softmax",
                            "_sparse_log_softmax"})
_SDPA_NAMES = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                         "_scaled_dot_product_flash_attention_for_cpu"})
# The scan: leaf names that count as the built-in wherever the path starts (torch, torch._C,
# torch.ops.aten, scipy, the course's own package...).
_SOFTMAX_SCAN = dict(
    leaves=frozenset({"softmax", "_softmax", "special_softmax", "log_softmax", "_log_softmax",
                      "softmin", "Softmax", "Softmax2d", "LogSoftmax", "Softmin", "_safe_softmax",
                      "_masked_softmax", "_sparse_softmax", "_sparse_log_softmax"}),
    tensor_methods=frozenset({"softmax", "log_softmax"}),
    review=frozenset({"gumbel_softmax", "Categorical", "OneHotCategorical", "logits_to_probs",
                      "RelaxedOneHotCategorical"}))
_ATTENTION_SCAN = dict(leaves=frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable", "_fused_sdp_choice",
    "flex_attention", "_flash_attention_forward", "_efficient_attention_forward",
    "multi_head_attention_forward", "_native_multi_head_attention",
    "MultiheadAttention", "flash_attn_func", "flash_attn_qkvpacked_func",
    "memory_efficient_attention", "_transformer_encoder_layer_fwd",
    # their backward passes (FlashAttention's backward is the exercise in 10)
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward", "_flash_attention_backward",
    "_efficient_attention_backward"}))

# A softmax is also what PyTorch's fused attention computes inside: softmax(x) is attention with
# q = x, k = v = the identity and scale 1 (proc_sdpa_softmax, tests/hostile/trust_process.py).
# A softmax exercise may not reach the fused attention either.
_SOFTMAX_ALL = dict(names=_SOFTMAX_NAMES | _SDPA_NAMES, aten=tuple(dict.fromkeys(_SOFTMAX_OPS + _ATTENTION_OPS)),
                    python=_SOFTMAX_PY + _MHA_PY, leaves=_SOFTMAX_SCAN["leaves"] | _ATTENTION_SCAN["leaves"],
                    tensor_methods=_SOFTMAX_SCAN["tensor_methods"], review=_SOFTMAX_SCAN["review"])

GROUPS: dict[str, Group] = {
    "softmax": Group(
        "torch.softmax / F.softmax / Tensor.softmax / nn.Softmax", **_SOFTMAX_ALL),
    # notebook 10: the online softmax may not call a softmax either
    "online_softmax": Group(
        "torch.softmax / F.softmax / Tensor.softmax / F.log_softmax", **_SOFTMAX_ALL),
    "attention": Group(
        "F.scaled_dot_product_attention",
        names=_SDPA_NAMES, aten=_ATTENTION_OPS, python=_MHA_PY, **_ATTENTION_SCAN),
    "multihead": Group(
        "nn.MultiheadAttention / F.multi_head_attention_forward / F.scaled_dot_product_attention",
        names=frozenset({"multi_head_attention_forward", "_native_multi_head_attention",
                         "scaled_dot_product_attention"}),
        nn_classes=("MultiheadAttention",), aten=_ATTENTION_OPS, python=_MHA_PY, **_ATTENTION_SCAN),
    # notebook 10: blockwise attention may not call PyTorch's fused attention (softmax on a
    # block is fine there)
    "flash_attention": Group(
        "F.scaled_dot_product_attention",
        names=_SDPA_NAMES | {"multi_head_attention_forward"},
        aten=_ATTENTION_OPS, python=_MHA_PY, **_ATTENTION_SCAN),
    "layer_norm": Group(
        "F.layer_norm / nn.LayerNorm / torch.layer_norm / F.rms_norm / nn.RMSNorm",
        names=frozenset({"layer_norm", "native_layer_norm", "group_norm", "rms_norm"}),
        aten=_LAYER_NORM_OPS, python=_NORM_PY,
        leaves=frozenset({"layer_norm", "native_layer_norm", "LayerNorm", "group_norm",
                          "native_group_norm", "GroupNorm", "rms_norm", "_fused_rms_norm", "RMSNorm",
                          "instance_norm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"})),
    "batch_norm": Group(
        "F.batch_norm / nn.BatchNorm1d / torch.batch_norm",
        names=frozenset({"batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                         "instance_norm"}),
        aten=_BATCH_NORM_OPS,
        leaves=frozenset({
            "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
            "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
            "_batch_norm_impl_index", "_batch_norm_with_update", "_batch_norm_no_update",
            "cudnn_batch_norm", "miopen_batch_norm", "batch_norm_stats", "batch_norm_elemt",
            "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts",
            "batch_norm_update_stats", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
            "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "SyncBatchNorm",
            "instance_norm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
            "_BatchNorm", "_NormBase", "_InstanceNorm", "_LazyNormBase"})),
    # 09: RMSNorm from scratch (LayerNorm counts too: it is RMSNorm plus centring)
    "rms_norm": Group(
        "F.rms_norm / nn.RMSNorm / F.layer_norm / nn.LayerNorm",
        names=frozenset({"rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm"}),
        nn_classes=("RMSNorm", "LayerNorm"),
        aten=("rms_norm", "_fused_rms_norm", "layer_norm", "native_layer_norm"), python=_NORM_PY,
        leaves=frozenset({"rms_norm", "_fused_rms_norm", "RMSNorm", "layer_norm", "native_layer_norm",
                          "LayerNorm"})),
    # 07: label smoothing is built from log-probabilities, not F.cross_entropy (the scan is
    # certain only of a call with label_smoothing=)
    "cross_entropy": Group(
        "F.cross_entropy / nn.CrossEntropyLoss",
        names=frozenset({"cross_entropy", "cross_entropy_loss"}), aten=("cross_entropy_loss",),
        call_rule="label_smoothing"),
    "transformer": Group(
        "PyTorch's nn.Transformer* classes",
        nn_classes=_TRANSFORMER_CLASSES, aten=("_transformer_encoder_layer_fwd",),
        python=tuple(f"nn.{c}.forward" for c in _TRANSFORMER_CLASSES),
        leaves=frozenset(_TRANSFORMER_CLASSES + ("_transformer_encoder_layer_fwd",))),
    # 12's exercises share their names with PyTorch's (a student's own class `AdamW`, a function
    # `clip_grad_norm`): the scan counts only paths that start at one of the `roots`.
    "adamw": Group(
        "torch.optim.AdamW / torch.optim.Adam",
        aten=("_fused_adamw_", "_fused_adam_"), python=("optim.Adam.step",),   # AdamW's step is Adam's
        leaves=frozenset({"AdamW", "Adam", "adamw", "adam", "_single_tensor_adamw",
                          "_multi_tensor_adamw", "_fused_adamw", "_fused_adamw_",
                          "_single_tensor_adam", "_multi_tensor_adam", "_fused_adam", "_fused_adam_",
                          "SparseAdam", "Adamax", "NAdam", "RAdam"}),
        roots=("torch",)),
    "clip_grad_norm": Group(
        "torch.nn.utils.clip_grad_norm_ / get_total_norm",
        python=("nn.utils.clip_grad_norm_", "nn.utils.get_total_norm", "nn.utils.clip_grads_with_norm_"),
        leaves=frozenset({"clip_grad_norm_", "clip_grad_norm", "clip_grads_with_norm_",
                          "_clip_grads_with_norm_", "get_total_norm", "_get_total_norm"}),
        roots=("torch",)),
    "lr_scheduler": Group(
        "torch.optim.lr_scheduler",
        python=("optim.lr_scheduler.LRScheduler.__init__",),
        leaves=frozenset({"lr_scheduler", "LambdaLR", "CosineAnnealingLR",
                          "CosineAnnealingWarmRestarts", "LinearLR", "SequentialLR", "OneCycleLR",
                          "MultiplicativeLR", "LRScheduler", "ChainedScheduler", "PolynomialLR"}),
        modules=frozenset({"lr_scheduler"}), roots=("torch",)),
}


def scan_groups(groups) -> tuple[str, ...]:
    """The groups the scan checks for an exercise forbidding `groups`: one per distinct set of
    scan columns (attention and multihead are one rule there), in order."""
    seen, out = set(), []
    for g in groups:
        key = GROUPS[g].scan_key()
        if key not in seen:
            seen.add(key)
            out.append(g)
    return tuple(out)


def plan_rows(groups) -> dict:
    """The rows a probe plan carries into the student's kernel (the probe machine imports
    nothing of the course package): {group: [label, aten operators, Python functions]}."""
    return {g: [GROUPS[g].label, list(GROUPS[g].aten), list(GROUPS[g].python)] for g in groups}
