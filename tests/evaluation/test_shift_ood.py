"""Rotated views, CIFAR-10-C loading and generated OOD inputs."""

import pytest
import torch
from eval_helpers import write_fake_cifar10c

from laplace_lab.evaluation.ood import far_away, uniform_noise
from laplace_lab.evaluation.shift import cifar10c_status, load_cifar10c, rotate_images


def test_rotate_90_and_180_match_rot90():
    x = torch.rand(2, 1, 6, 6)
    assert torch.equal(rotate_images(x, 0), x)
    assert torch.equal(rotate_images(x, 90), torch.rot90(x, 1, dims=(2, 3)))  # counter-clockwise
    assert torch.equal(rotate_images(x, 180), torch.rot90(x, 2, dims=(2, 3)))
    with pytest.raises(ValueError, match="image batches"):
        rotate_images(torch.rand(3, 2), 15)


def test_cifar10c_loader_and_status(tmp_path):
    present, reason = cifar10c_status(tmp_path)
    assert present == [] and "CIFAR-10-C" in reason and "labels.npy" in reason
    write_fake_cifar10c(tmp_path)
    present, reason = cifar10c_status(tmp_path)
    assert present == ["snow", "fog"] and reason == ""  # standard order
    present, reason = cifar10c_status(tmp_path, ["fog", "frost"])
    assert present == ["fog"] and "frost" in reason
    with pytest.raises(ValueError, match="corruptions"):
        cifar10c_status(tmp_path, ["not_a_corruption"])
    ds = load_cifar10c(tmp_path, "fog", 3)
    x, y = ds.tensors
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    assert 0 <= x.min() and x.max() <= 1
    assert torch.allclose(x[:, 0, 0, 0], torch.full((4,), 2 / 255))  # the severity-3 block
    assert y.tolist() == [0, 1, 2, 3]
    assert len(load_cifar10c(tmp_path, "fog", 1, max_items=2)) == 2


def test_generated_ood_inputs():
    g = torch.Generator().manual_seed(0)
    x = uniform_noise(10, (1, 4, 4), (0.0, 1.0), g)
    assert x.shape == (10, 1, 4, 4) and x.min() >= 0 and x.max() <= 1 and x.std() > 0.2
    assert torch.equal(far_away(x, 100.0), 100 * x)
