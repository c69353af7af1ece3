"""``conv_factors.conv_A_rows`` equals the patch Gram ``X^T X`` (im2col) exactly (float64)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from laplace_lab.laplace.conv_factors import conv_A_rows, rows_cheaper
from laplace_lab.laplace.modules import conv_A


def _im2col_A(m: nn.Conv2d, a: torch.Tensor):
    X = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)  # [N, D, S]
    X = X.transpose(1, 2).reshape(-1, X.shape[1])
    return X.T @ X, X.shape[0]


@pytest.mark.parametrize("cfg", [
    dict(c_in=1, k=5, hw=(28, 28)),                                   # LeNet conv1
    dict(c_in=6, k=5, hw=(12, 12)),                                   # LeNet conv2
    dict(c_in=3, k=(3, 5), hw=(13, 11), stride=2, padding=1),
    dict(c_in=3, k=(3, 5), hw=(13, 11), dilation=2),
    dict(c_in=2, k=(3, 2), hw=(9, 10), stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
    dict(c_in=4, k=1, hw=(5, 7)),
    dict(c_in=2, k=3, hw=(3, 3)),                                     # one output position
])
@pytest.mark.parametrize("n", [1, 5])
def test_conv_A_rows_equals_im2col(cfg, n):
    torch.manual_seed(0)
    kw = {k: v for k, v in cfg.items() if k not in ("c_in", "k", "hw")}
    m = nn.Conv2d(cfg["c_in"], 3, cfg["k"], **kw).double()
    a = torch.randn(n, cfg["c_in"], *cfg["hw"], dtype=torch.float64)
    A, rows = conv_A_rows(m, a)
    A_ref, rows_ref = _im2col_A(m, a)
    assert rows == rows_ref
    torch.testing.assert_close(A, A_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(conv_A(m, a)[0], A_ref, rtol=1e-12, atol=1e-12)  # whichever kernel it picks


def test_rows_cheaper_picks_small_images_only():
    lenet1, lenet2 = nn.Conv2d(1, 6, 5), nn.Conv2d(6, 16, 5)
    assert rows_cheaper(lenet1, torch.zeros(2, 1, 28, 28)) and rows_cheaper(lenet2, torch.zeros(2, 6, 12, 12))
    assert not rows_cheaper(nn.Conv2d(16, 16, 3, padding=1), torch.zeros(2, 16, 32, 32))  # ResNet-like, wide
    assert not rows_cheaper(nn.Conv2d(512, 512, 3, padding=1), torch.zeros(2, 512, 8, 8))  # too much memory
