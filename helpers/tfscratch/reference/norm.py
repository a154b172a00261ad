"""Reference LayerNorm and BatchNorm, feature axis last (notebook 04)."""
import torch
from torch import nn

__all__ = ["layer_norm", "batch_norm", "LayerNorm", "BatchNorm", "rms_norm"]


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Normalise each token over its features: biased variance, eps inside the root."""
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Like F.batch_norm, but the feature axis is the LAST one: statistics per feature over
    every other axis. In training, running statistics are updated in place (running_var with
    the unbiased variance, as PyTorch does)."""
    D = x.shape[-1]
    dims = tuple(range(x.dim() - 1))
    if training:
        mean = x.mean(dim=dims)
        var = x.var(dim=dims, unbiased=False)
        n = x.numel() // D
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
        if running_var is not None:
            with torch.no_grad():
                unbiased = var.detach() * n / max(n - 1, 1)
                running_var.mul_(1 - momentum).add_(momentum * unbiased)
    else:
        mean, var = running_mean, running_var
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rms_norm(x, weight=None, eps=1e-6):
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


class LayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


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
                          self.training, self.momentum, self.eps)
