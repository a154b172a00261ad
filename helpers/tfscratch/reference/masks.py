"""Reference masks (notebook 02). Boolean, True = may attend."""
import torch

__all__ = ["make_padding_mask", "make_causal_mask", "make_decoder_mask"]


def make_padding_mask(tokens: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """(B, L) token ids -> (B, 1, L): True where the key is a real token."""
    return (tokens != pad_id).unsqueeze(1)


def make_causal_mask(size: int, device=None) -> torch.Tensor:
    """(size, size), True on and below the diagonal: position i sees 0..i."""
    return torch.tril(torch.ones(size, size, dtype=torch.bool, device=device))


def make_decoder_mask(tokens: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
    """(B, L) -> (B, L, L): causal AND key padding (query rows at pads are left as they are)."""
    L = tokens.size(1)
    return make_padding_mask(tokens, pad_id) & make_causal_mask(L, device=tokens.device)
