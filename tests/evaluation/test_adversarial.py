"""FGSM and the confidence-maximising attack."""

import pytest
import torch
from eval_helpers import IMG, TemperedSoftmax, make_mlp
from torch import nn

from laplace_lab.evaluation.adversarial import (
    NotDifferentiableError,
    ProgressBar,
    confidence_max_attack,
    fgsm,
    fgsm_direction,
    fgsm_sweep,
    log_probs_fn,
)


def _per_sample_ce(model, x, y):
    return nn.functional.cross_entropy(model(x), y, reduction="none")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fgsm_never_lowers_loss_at_small_eps(seed, image_data):
    train, test = image_data
    model = make_mlp(seed, train if seed == 0 else None).double()  # a trained and two random MLPs
    x, y = test.tensors
    x = x.double()
    loss = _per_sample_ce(model, x, y)
    for eps in (1e-4, 1e-3):
        x_adv = fgsm(model, x, y, eps, input_range=(0.0, 1.0))
        assert (x_adv - x).abs().max() <= eps + 1e-12
        assert x_adv.min() >= 0 and x_adv.max() <= 1
        loss_adv = _per_sample_ce(model, x_adv, y)
        assert (loss_adv >= loss - 1e-12).all()
        assert loss_adv.sum() > loss.sum()


def test_fgsm_lowers_accuracy_at_large_eps(trained_mlp, image_data):
    x, y = image_data[1].tensors
    acc = (trained_mlp(x).argmax(1) == y).float().mean()
    x_adv = fgsm(trained_mlp, x, y, 0.3)
    acc_adv = (trained_mlp(x_adv).argmax(1) == y).float().mean()
    assert acc > 0.9 and acc_adv < acc - 0.2


def test_logits_and_probs_give_same_direction(trained_mlp, image_data):
    x, y = image_data[1].tensors
    d_logits = fgsm_direction(log_probs_fn(trained_mlp, "auto"), x, y)
    probs_predictor = lambda z: torch.softmax(trained_mlp(z), -1)  # noqa: E731
    d_probs = fgsm_direction(log_probs_fn(probs_predictor, "auto"), x, y)
    agree = (d_logits == d_probs).float().mean()
    assert agree > 0.99  # equal up to float round-off at near-zero gradients


def test_fgsm_sweep_evaluates_all_predictors_on_same_inputs(trained_mlp, image_data):
    x, y = image_data[1].tensors
    preds = {"map": lambda z: torch.softmax(trained_mlp(z), -1), "la": TemperedSoftmax(trained_mlp)}
    probs, ys = fgsm_sweep(trained_mlp, "logits", preds, [(x[:50], y[:50]), (x[50:], y[50:])],
                           [0.0, 0.1], bar=ProgressBar(show=False))
    assert torch.equal(ys, y)
    assert probs[0.0]["map"].shape == (len(y), 3)
    x_adv = fgsm(trained_mlp, x, y, 0.1)
    assert torch.allclose(probs[0.1]["la"], preds["la"](x_adv), atol=1e-6)
    assert torch.allclose(probs[0.0]["map"], preds["map"](x), atol=1e-6)


def test_non_differentiable_predictor_raises():
    model = make_mlp(0)

    def detached(x):
        with torch.no_grad():
            return torch.softmax(model(x), -1)

    x, y = torch.rand(4, *IMG), torch.zeros(4, dtype=torch.long)
    with pytest.raises(NotDifferentiableError):
        fgsm(detached, x, y, 0.1)


def test_confidence_max_attack_raises_confidence_within_ball(trained_mlp):
    g = torch.Generator().manual_seed(0)
    x0 = torch.rand(64, *IMG, generator=g)
    conf = lambda z: torch.softmax(trained_mlp(z), -1).max(1).values  # noqa: E731
    eps = 0.1
    x = confidence_max_attack(trained_mlp, x0, eps, steps=10)
    assert (x - x0).abs().max() <= eps + 1e-6
    assert x.min() >= 0 and x.max() <= 1
    assert conf(x).mean() > conf(x0).mean() + 0.01
    assert torch.equal(confidence_max_attack(trained_mlp, x0, 0.0), x0)
