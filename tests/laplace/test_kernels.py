"""Hand-written curvature kernels against direct (im2col) formulas, float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from laplace_lab.laplace.capture import Call
from laplace_lab.laplace.modules import _conv_psg_sq, conv_A
from laplace_lab.laplace.output_factors import _classification_ggn_sqrt


@pytest.mark.parametrize("k,stride,padding,dilation", [
    (5, 1, 0, 1), (3, 2, 1, 1), ((2, 3), (1, 2), (1, 0), 1), (3, 1, 2, 2), ((3, 2), 2, 1, (2, 1)),
])
def test_conv_A_and_diag_match_unfold(k, stride, padding, dilation):
    torch.manual_seed(0)
    m = nn.Conv2d(3, 4, k, stride=stride, padding=padding, dilation=dilation).double()
    a = torch.randn(5, 3, 11, 10, dtype=torch.float64)
    x = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)  # [N, D, S]
    A, rows = conv_A(m, a)
    torch.testing.assert_close(A, torch.einsum("nds,nes->de", x, x), rtol=1e-12, atol=1e-12)
    assert rows == x.shape[0] * x.shape[2]
    out = m(a)
    grads = [torch.randn_like(out) for _ in range(3)]
    d = _conv_psg_sq(m, ["weight", "bias"], a, grads)
    psg = torch.stack([torch.einsum("nos,nds->nod", g.flatten(2), x) for g in grads])
    torch.testing.assert_close(d["weight"], psg.square().sum((0, 1)).reshape(m.weight.shape))
    torch.testing.assert_close(d["bias"], sum(g.flatten(2).sum(2).square().sum(0) for g in grads))
    c = Call((a,), {}, out)
    c.grads = grads
    torch.testing.assert_close(c.grad, torch.stack(grads))


def test_classification_ggn_sqrt_has_c_minus_1_factors():
    f = torch.randn(7, 5, dtype=torch.float64) * 4
    f[0] = torch.tensor([40.0, 0, 0, 0, 0], dtype=torch.float64)  # saturated softmax
    V = _classification_ggn_sqrt(f)
    assert V.shape == (4, 7, 5)
    p = f.softmax(-1)
    H = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    torch.testing.assert_close(torch.einsum("kno,knq->noq", V, V), H, rtol=0, atol=1e-14)
