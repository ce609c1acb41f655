import torch

RTOL = 1e-9
ATOL = 1e-12


def t(values, **kwargs):
    """A float64 tensor: hand-computed tests work in double precision."""
    return torch.tensor(values, dtype=torch.float64, **kwargs)


def close(actual, expected, rtol=RTOL, atol=ATOL):
    expected = expected if isinstance(expected, torch.Tensor) else t(expected)
    torch.testing.assert_close(actual, expected.to(actual.dtype), rtol=rtol, atol=atol)


def prefix_mask(lengths, width):
    """(B, width) mask with the first lengths[b] entries of row b set."""
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(torch.float64)
