"""Mistake and valid-variant catalogues for 04_normalization (COURSE_SPEC section 5).

Mistakes come from the seeds (the tutorial LayerNorm: x.std() unbiased, eps added to the std,
eps=1e-6, parameters a_2/b_2, the `featuers` typo), from common BatchNorm write-ups (reversed
momentum, biased running variance, rebinding instead of updating in place, batch statistics in
eval mode) and from numerics (E[x^2] - E[x]^2)."""
from . import Mistake, Variant

ASSIGNMENT = "04_normalization"
EXERCISES = ["layer_norm", "batch_norm", "LayerNorm", "BatchNorm", "rms_norm"]

MISTAKES = [
    # ---------------------------------------------------------------- layer_norm
    Mistake("layer_norm", "the seeds' formula: x.std() (unbiased) and eps added to the std",
            r"seeds' LayerNorm", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)
    y = (x - mean) / (std + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "x.var() with its default unbiased correction", r"unbiased", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "biased std but eps added outside the square root",
            r"eps was added to the standard deviation", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, unbiased=False, keepdim=True)
    y = (x - mean) / (std + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "statistics over dim=0 (that is BatchNorm)", r"dim=0.*BatchNorm", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(0, keepdim=True)
    var = x.var(0, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "mean and variance without keepdim=True", r"keepdim", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1)
    var = x.var(-1, unbiased=False)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "weight and bias swapped", r"swapped", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if bias is not None:
        y = y * bias
    if weight is not None:
        y = y + weight
    return y
"""),
    Mistake("layer_norm", "no eps at all: 0/0 on a constant row", r"NaN.*eps|eps out", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "hard-codes eps=1e-5 and ignores the argument", r"eps argument was ignored", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + 1e-5)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "variance as E[x^2] - E[x]^2 (catastrophic cancellation in float32)",
            r"E\[x\^2\] - E\[x\]\^2", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x ** 2).mean(-1, keepdim=True) - mean ** 2
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "detaches the statistics (wrong gradient)", r"detach", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True).detach()
    var = x.var(-1, unbiased=False, keepdim=True).detach()
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "`if weight:` on a tensor", r"is not None", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight:
        y = y * weight
    if bias:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "one mean and variance for all positions and features",
            r"last TWO axes|whole tensor", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    dims = tuple(range(1, x.dim())) if x.dim() > 1 else (0,)
    mean = x.mean(dims, keepdim=True)
    var = x.var(dims, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("layer_norm", "calls F.layer_norm", r"shortcut", """
import torch.nn.functional as F
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
"""),
    # ---------------------------------------------------------------- batch_norm
    Mistake("batch_norm", "statistics over the last axis (LayerNorm's axes)", r"that is LayerNorm", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if training:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "normalises the batch with the unbiased variance", r"unbiased", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var)
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "stores the biased variance in running_var", r"BIASED batch variance", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var)
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "momentum reversed (optimizer convention)", r"reversed", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        n = x.numel() // x.shape[-1]
        with torch.no_grad():
            running_mean.mul_(momentum).add_((1 - momentum) * mean)
            running_var.mul_(momentum).add_((1 - momentum) * var * n / (n - 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "rebinds running_mean/var instead of updating in place", r"in place", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        n = x.numel() // x.shape[-1]
        running_mean = (1 - momentum) * running_mean + momentum * mean.detach()
        running_var = (1 - momentum) * running_var + momentum * var.detach() * n / (n - 1)
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "ignores `training`: batch statistics in eval mode too", r"eval mode", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    mean = x.mean(dims)
    var = x.var(dims, unbiased=False)
    n = x.numel() // x.shape[-1]
    if training:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "(B, L, D) statistics over the batch axis only: one per position",
            r"batch axis only|per position", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if training:
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        n = x.shape[0]
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean.reshape(-1, x.shape[-1]).mean(0))
            running_var.mul_(1 - momentum).add_(momentum * var.reshape(-1, x.shape[-1]).mean(0) * n / (n - 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "unbiased correction with n = batch size, not B * L", r"wrong n", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        n = x.shape[0]
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var * n / max(n - 1, 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "updates the running statistics inside the autograd graph",
            r"autograd graph", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        n = x.numel() // x.shape[-1]
        running_mean.mul_(1 - momentum).add_(momentum * mean)
        running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "detaches the batch statistics it normalises with", r"detach", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims).detach()
        var = x.var(dims, unbiased=False).detach()
        n = x.numel() // x.shape[-1]
        running_mean.mul_(1 - momentum).add_(momentum * mean)
        running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "eps added to the standard deviation", r"inside the root", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        n = x.numel() // x.shape[-1]
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / (torch.sqrt(var) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "running_var tracks the standard deviation", r"standard deviation", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dims)
        var = x.var(dims, unbiased=False)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean)
            running_var.mul_(1 - momentum).add_(momentum * x.std(dims))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "updates the running statistics in eval mode as well", r"changed in eval mode", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    dims = tuple(range(x.dim() - 1))
    mean_b = x.mean(dims)
    var_b = x.var(dims, unbiased=False)
    n = x.numel() // x.shape[-1]
    if training:
        mean, var = mean_b, var_b
    else:
        mean, var = running_mean.clone(), running_var.clone()
    with torch.no_grad():
        running_mean.mul_(1 - momentum).add_(momentum * mean_b)
        running_var.mul_(1 - momentum).add_(momentum * var_b * n / max(n - 1, 1))
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
"""),
    Mistake("batch_norm", "calls F.batch_norm on the transposed input", r"shortcut", """
import torch.nn.functional as F
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    xt = x.movedim(-1, 1) if x.dim() > 2 else x
    y = F.batch_norm(xt, running_mean, running_var, weight, bias, training, momentum, eps)
    return y.movedim(1, -1) if x.dim() > 2 else y
"""),
    # ---------------------------------------------------------------- LayerNorm
    Mistake("LayerNorm", "the seeds' module verbatim, `featuers` typo included",
            r"is not defined", """
class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(featuers))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2
"""),
    Mistake("LayerNorm", "the seeds' module with the typo fixed: parameters a_2 and b_2",
            r"a_2.*weight.*bias|call them `weight` and `bias`", """
class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2
"""),
    Mistake("LayerNorm", "the seeds' maths under PyTorch's names", r"seeds' LayerNorm", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.weight * (x - mean) / (std + self.eps) + self.bias
"""),
    Mistake("LayerNorm", "weight and bias as plain tensors, not nn.Parameter", r"nn\.Parameter", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = torch.ones(d)
        self.bias = torch.zeros(d)
        self.eps = eps

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)
"""),
    Mistake("LayerNorm", "the tutorial's default eps=1e-6", r"default must be eps=1e-5", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)
"""),
    Mistake("LayerNorm", "forward ignores self.eps", r"ignores its eps", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias)
"""),
    Mistake("LayerNorm", "normalises over dim=1 (right for 2-D input only)", r"dim=1", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(1, keepdim=True)
        var = x.var(1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
"""),
    Mistake("LayerNorm", "only a scale parameter, no bias", r"no parameter named `bias`", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return layer_norm(x, self.weight, None, self.eps)
"""),
    Mistake("LayerNorm", "wraps nn.LayerNorm", r"shortcut", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.ln = nn.LayerNorm(d, eps=eps)
        self.weight = self.ln.weight
        self.bias = self.ln.bias

    def forward(self, x):
        return self.ln(x)
"""),
    # ---------------------------------------------------------------- BatchNorm
    Mistake("BatchNorm", "forward always passes training=True", r"eval mode.*self\.training|after model\.eval\(\)", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=True, momentum=self.momentum, eps=self.eps)
"""),
    Mistake("BatchNorm", "a training flag of its own, set once in __init__",
            r"eval|self\.training", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.is_training = True
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=self.is_training, momentum=self.momentum, eps=self.eps)
"""),
    Mistake("BatchNorm", "running statistics as nn.Parameter", r"is an nn\.Parameter", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.running_mean = nn.Parameter(torch.zeros(d), requires_grad=False)
        self.running_var = nn.Parameter(torch.ones(d), requires_grad=False)

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=self.training, momentum=self.momentum, eps=self.eps)
"""),
    Mistake("BatchNorm", "running statistics as plain tensor attributes", r"register_buffer", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.running_mean = torch.zeros(d)
        self.running_var = torch.ones(d)

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=self.training, momentum=self.momentum, eps=self.eps)
"""),
    Mistake("BatchNorm", "running_var initialised to zeros", r"starts at ONES", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.zeros(d))

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=self.training, momentum=self.momentum, eps=self.eps)
"""),
    Mistake("BatchNorm", "eps and momentum passed positionally in the wrong order", r"swapped", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          self.training, self.eps, self.momentum)
"""),
    Mistake("BatchNorm", "forward ignores self.momentum", r"ignores its momentum", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          training=self.training, eps=self.eps)
"""),
    Mistake("BatchNorm", "own forward with x.mean(0): per-position statistics for (B, L, D)",
            r"batch axis only|per position", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        if self.training:
            mean = x.mean(0)
            var = x.var(0, unbiased=False)
            n = x.shape[0]
            with torch.no_grad():
                flat_m = mean.reshape(-1, x.shape[-1]).mean(0)
                flat_v = var.reshape(-1, x.shape[-1]).mean(0)
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * flat_m)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * flat_v * n / (n - 1))
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
"""),
    Mistake("BatchNorm", "wraps nn.BatchNorm1d", r"shortcut", """
class BatchNorm(nn.BatchNorm1d):
    def forward(self, x):
        if x.dim() == 3:
            return super().forward(x.transpose(1, 2)).transpose(1, 2)
        return super().forward(x)
"""),
    # ---------------------------------------------------------------- rms_norm
    Mistake("rms_norm", "subtracts the mean (that is LayerNorm)", r"subtracted the mean", """
def rms_norm(x, weight=None, eps=1e-6):
    x = x - x.mean(-1, keepdim=True)
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "divides by the L2 norm instead of the RMS", r"L2 norm", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "eps outside the square root", r"outside the square root", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "forgets the square root", r"square root", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / (x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "divides by the standard deviation", r"standard deviation", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.var(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "one mean square for the whole tensor", r"whole tensor", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.pow(2).mean() + eps)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "ignores the weight", r"weight was not applied", """
def rms_norm(x, weight=None, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
"""),
    Mistake("rms_norm", "hard-codes eps=1e-6", r"eps argument was ignored", """
def rms_norm(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return y * weight if weight is not None else y
"""),
    Mistake("rms_norm", "calls F.rms_norm", r"shortcut", """
import torch.nn.functional as F
def rms_norm(x, weight=None, eps=1e-6):
    return F.rms_norm(x, x.shape[-1:], weight, eps)
"""),
]

VARIANTS = [
    # ---------------------------------------------------------------- layer_norm
    Variant("layer_norm", "torch.var_mean with correction=0 and rsqrt", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    var, mean = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y
"""),
    Variant("layer_norm", "float64 inside, cast back", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    z = x.double()
    z = z - z.mean(-1, keepdim=True)
    y = z / (z.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
"""),
    Variant("layer_norm", "means as matrix products with a ones vector", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    D = x.shape[-1]
    ones = torch.ones(D, 1, dtype=x.dtype) / D
    mean = x @ ones                                  # (..., 1)
    centred = x - mean
    var = (centred * centred) @ ones
    y = centred / torch.sqrt(var + eps)
    if weight is not None:
        y = torch.einsum("...d,d->...d", y, weight)
    if bias is not None:
        y = y + bias
    return y
"""),
    Variant("layer_norm", "biased std, then eps inside via std**2", """
def layer_norm(x, weight=None, bias=None, eps=1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    sd = x.std(dim=-1, unbiased=False, keepdim=True)
    out = (x - mu) / (sd ** 2 + eps) ** 0.5
    out = out * (weight if weight is not None else 1.0)
    out = out + (bias if bias is not None else 0.0)
    return out
"""),
    # ---------------------------------------------------------------- batch_norm
    Variant("batch_norm", "flatten to (n, D), var_mean, lerp_ update", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    shape = x.shape
    flat = x.reshape(-1, shape[-1])                     # (n, D)
    if training:
        var, mean = torch.var_mean(flat, dim=0, correction=0)
        n = flat.shape[0]
        with torch.no_grad():
            running_mean.lerp_(mean, momentum)
            running_var.lerp_(var * n / (n - 1), momentum)
    else:
        mean, var = running_mean, running_var
    y = (flat - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.reshape(shape)
"""),
    Variant("batch_norm", "float64 inside, copy_ of detached values", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    z = x.double()
    dims = list(range(z.dim() - 1))
    if training:
        mean = z.mean(dims)
        var = ((z - mean) ** 2).mean(dims)
        n = z.numel() // z.shape[-1]
        running_mean.copy_((1 - momentum) * running_mean.double() + momentum * mean.detach())
        running_var.copy_((1 - momentum) * running_var.double() + momentum * var.detach() * n / (n - 1))
    else:
        mean, var = running_mean.double(), running_var.double()
    y = (z - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
"""),
    Variant("batch_norm", "unbiased var computed first, rescaled for the batch; slice assignment", """
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    D = x.shape[-1]
    xt = x.movedim(-1, 0).reshape(D, -1)                # (D, n): one row per feature
    if training:
        n = xt.shape[1]
        mean = xt.mean(1)
        var_u = xt.var(1, unbiased=True)
        var = var_u * (n - 1) / n
        with torch.no_grad():
            running_mean[:] = (1 - momentum) * running_mean + momentum * mean
            running_var[:] = (1 - momentum) * running_var + momentum * var_u
    else:
        mean, var = running_mean, running_var
    scale = 1.0 / torch.sqrt(var + eps)
    shift = -mean * scale
    if weight is not None:
        scale, shift = scale * weight, shift * weight
    if bias is not None:
        shift = shift + bias
    return x * scale + shift
"""),
    # ---------------------------------------------------------------- LayerNorm
    Variant("LayerNorm", "forward written out, with register_parameter and extra attributes", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.normalized_shape = (d,)
        self.eps = eps
        self.register_parameter("weight", nn.Parameter(torch.ones(d)))
        self.register_parameter("bias", nn.Parameter(torch.zeros(d)))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"
"""),
    Variant("LayerNorm", "float64 inside the module", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        z = x.double()
        z = (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + self.eps)
        return (z * self.weight.double() + self.bias.double()).to(x.dtype)
"""),
    Variant("LayerNorm", "torch.empty + reset_parameters, calls layer_norm", """
class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(d))
        self.bias = nn.Parameter(torch.empty(d))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x):
        return layer_norm(x, weight=self.weight, bias=self.bias, eps=self.eps)
"""),
    # ---------------------------------------------------------------- BatchNorm
    Variant("BatchNorm", "keeps num_batches_tracked too", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.num_features, self.eps, self.momentum = d, eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.num_batches_tracked += 1
        return batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          self.training, self.momentum, self.eps)
"""),
    Variant("BatchNorm", "own forward that REPLACES the buffers (self.running_mean = ...)", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        B_flat = x.reshape(-1, x.shape[-1])              # (n, d)
        if self.training:
            mean = B_flat.mean(0)
            var = B_flat.var(0, unbiased=False)
            n = B_flat.shape[0]
            m = self.momentum
            self.running_mean = (1 - m) * self.running_mean + m * mean.detach()
            self.running_var = (1 - m) * self.running_var + m * var.detach() * n / (n - 1)
        else:
            mean, var = self.running_mean, self.running_var
        y = (B_flat - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
        return y.reshape(x.shape)
"""),
    Variant("BatchNorm", "float64 statistics, lerp_ update in its own forward", """
class BatchNorm(nn.Module):
    def __init__(self, d, eps=1e-5, momentum=0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("running_var", torch.ones(d))

    def forward(self, x):
        dims = tuple(range(x.dim() - 1))
        if self.training:
            var, mean = torch.var_mean(x.double(), dim=dims, correction=0)
            n = x.numel() // x.shape[-1]
            with torch.no_grad():
                self.running_mean.lerp_(mean.float(), self.momentum)
                self.running_var.lerp_((var * n / (n - 1)).float(), self.momentum)
        else:
            mean, var = self.running_mean.double(), self.running_var.double()
        y = (x.double() - mean) / (var + self.eps).sqrt()
        return (y * self.weight + self.bias).float()
"""),
    # ---------------------------------------------------------------- rms_norm
    Variant("rms_norm", "rsqrt of the mean of squares", """
def rms_norm(x, weight=None, eps=1e-6):
    out = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    return out
"""),
    Variant("rms_norm", "the L2 norm divided by sqrt(D), eps inside", """
def rms_norm(x, weight=None, eps=1e-6):
    D = x.shape[-1]
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    y = x / torch.sqrt(norm ** 2 / D + eps)
    return y if weight is None else y * weight
"""),
    Variant("rms_norm", "float64 inside", """
def rms_norm(x, weight=None, eps=1e-6):
    z = x.double()
    z = z / torch.sqrt(torch.mean(z * z, dim=-1, keepdim=True) + eps)
    if weight is not None:
        z = z * weight.double()
    return z.to(x.dtype)
"""),
]
