"""AffineAugmentation / AugmentedModel: identity at eta = 0, gradients reach eta, validation."""

import math

import pytest
import torch

from laplace_lab.models import LeNet
from laplace_lab.models.augmentation import TRANSFORMS, AffineAugmentation, AugmentedModel


def _model(S=5, init=None, learnable=TRANSFORMS, mode="bilinear"):
    torch.manual_seed(0)
    net = LeNet((1, 28, 28), 10, activation="tanh").double()
    return AugmentedModel(net, AffineAugmentation(S, init, learnable, mode).double())


def test_eta_zero_is_the_plain_network():
    m = _model()
    x = torch.rand(4, 1, 28, 28, dtype=torch.float64)
    torch.testing.assert_close(m(x), m.net(x), atol=1e-10, rtol=1e-10)


def test_rotation_by_pi_half_permutes_the_pixels():
    aug = AffineAugmentation(1, {"rotation": math.pi / 2}, ["rotation"]).double()
    x = torch.rand(1, 1, 9, 9, dtype=torch.float64)
    eps = torch.zeros(1, 1, 6, dtype=torch.float64)
    eps[..., 2] = 1.0  # rotate by +pi/2 (eta stored in float32: ~1e-7 off): pixel centres map to pixel centres
    out = aug(x, eps)[0, 0]
    assert min((out - torch.rot90(x[0, 0], k, (0, 1))).abs().max() for k in (1, -1)) < 1e-6
    assert not torch.allclose(out, x[0, 0], atol=1e-3)


def test_gradient_flows_to_learnable_eta_only():
    m = _model(init={"rotation": 0.3, "translate_x": 0.1}, learnable=["rotation"])
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    eta = m.augmentation.eta.clone().requires_grad_(True)
    m(x, eta=eta).square().sum().backward()
    assert eta.grad[TRANSFORMS.index("rotation")].abs() > 0
    others = [i for i, n in enumerate(TRANSFORMS) if n != "rotation"]
    assert torch.all(eta.grad[others] == 0)


def test_gradient_matches_finite_differences():
    # bicubic: C1 in the sampling coordinates (bilinear has kinks where FD is ~1% off)
    m = _model(S=3, init={"rotation": 0.4, "scale_x": 0.1, "shear": 0.05}, mode="bicubic")
    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    eps = m.augmentation.sample_eps(2)
    eta = m.augmentation.eta.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(m(x, eps, eta).sum(), eta)
    h = 1e-6
    for i in (2, 3, 5):
        e = torch.zeros(6, dtype=torch.float64)
        e[i] = h
        fd = (m(x, eps, eta.detach() + e).sum() - m(x, eps, eta.detach() - e).sum()) / (2 * h)
        torch.testing.assert_close(g[i], fd, rtol=1e-5, atol=1e-8)


def test_eta_is_not_a_parameter_and_bad_options_are_rejected():
    m = _model()
    assert all(p is not m.augmentation.eta for p in m.parameters())
    with pytest.raises(ValueError, match="augmentation.learnable"):
        AffineAugmentation(3, learnable=["zoom"])
    with pytest.raises(ValueError, match="augmentation.init"):
        AffineAugmentation(3, init={"zoom": 1.0})
    with pytest.raises(ValueError, match="n_samples"):
        AffineAugmentation(0)
    with pytest.raises(ValueError, match="augmentation.mode"):
        AffineAugmentation(3, mode="nearest")
    with pytest.raises(ValueError, match="images"):
        AffineAugmentation(2)(torch.zeros(2, 4))
