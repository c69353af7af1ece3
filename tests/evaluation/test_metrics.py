"""Each metric against a hand-computed case; ECE/MCE against an independent computation."""

import math

import pytest
import torch

from laplace_lab.evaluation import metrics as M

PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.3, 0.6, 0.1], [0.2, 0.2, 0.6], [0.5, 0.4, 0.1]])
Y = torch.tensor([0, 0, 2, 1])  # correct, wrong, correct, wrong


def test_accuracy_nll_brier_confidence_entropy_by_hand():
    assert M.accuracy(PROBS, Y) == pytest.approx(0.5)
    assert M.nll(PROBS, Y) == pytest.approx(-(math.log(0.7) + math.log(0.3) + math.log(0.6) + math.log(0.4)) / 4)
    brier = [
        0.3**2 + 0.2**2 + 0.1**2,
        0.7**2 + 0.6**2 + 0.1**2,
        0.2**2 + 0.2**2 + 0.4**2,
        0.5**2 + 0.6**2 + 0.1**2,
    ]
    assert M.brier(PROBS, Y) == pytest.approx(sum(brier) / 4)
    assert M.mean_confidence(PROBS) == pytest.approx((0.7 + 0.6 + 0.6 + 0.5) / 4)
    h = lambda ps: -sum(p * math.log(p) for p in ps)  # noqa: E731
    assert M.mean_entropy(PROBS) == pytest.approx(sum(h(r) for r in PROBS.tolist()) / 4)


def test_nll_of_zero_probability_is_finite():
    probs = torch.tensor([[1.0, 0.0]])
    assert M.nll(probs, torch.tensor([1])) == pytest.approx(-math.log(1e-12))


def test_ece_mce_by_hand():
    # 2 bins: [0, .5) gets nothing; [.5, 1] gets all four points: mean conf .6, accuracy .5
    assert M.ece(PROBS, Y, n_bins=2) == pytest.approx(0.1, abs=1e-6)
    assert M.mce(PROBS, Y, n_bins=2) == pytest.approx(0.1, abs=1e-6)
    # 10 bins: [.5,.6): conf .5 acc 0; [.6,.7): confs .6 .6 acc .5; [.7,.8): conf .7 acc 1
    ece = (1 * 0.5 + 2 * 0.1 + 1 * 0.3) / 4
    assert M.ece(PROBS, Y, n_bins=10) == pytest.approx(ece, abs=1e-6)
    assert M.mce(PROBS, Y, n_bins=10) == pytest.approx(0.5, abs=1e-6)


def _reference_ece_mce(probs, y, n_bins):
    """Independent loop over bins [lo, hi) (top bin closed), float64."""
    conf, pred = probs.double().max(1)
    correct = (pred == y).double()
    ece, mce, n = 0.0, 0.0, len(y)
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        m = (conf >= lo) & ((conf < hi) if b < n_bins - 1 else (conf <= 1.0))
        if m.sum() == 0:
            continue
        gap = abs(correct[m].mean().item() - conf[m].mean().item())
        ece += m.sum().item() / n * gap
        mce = max(mce, gap)
    return ece, mce


@pytest.mark.parametrize("n_bins", [10, 15, 100])
def test_ece_mce_match_independent_binning(n_bins):
    g = torch.Generator().manual_seed(n_bins)
    logits = 3 * torch.randn(2000, 5, generator=g)
    probs = torch.softmax(logits, -1)
    y = torch.randint(0, 5, (2000,), generator=g)
    y[:1200] = probs[:1200].argmax(1)  # mostly right, so bins differ in accuracy
    ref_ece, ref_mce = _reference_ece_mce(probs, y, n_bins)
    assert M.ece(probs, y, n_bins) == pytest.approx(ref_ece, abs=1e-5)
    assert M.mce(probs, y, n_bins) == pytest.approx(ref_mce, abs=1e-5)
    # our own binning (reliability diagrams) gives the same ECE / MCE
    b = M.calibration_bins(probs, y, n_bins)
    assert b["count"].sum() == 2000
    gaps = (b["accuracy"] - b["confidence"]).abs()
    assert (b["count"] / 2000 * gaps).sum().item() == pytest.approx(ref_ece, abs=1e-5)
    assert gaps[b["count"] > 0].max().item() == pytest.approx(ref_mce, abs=1e-5)


def test_confidence_one_lands_in_top_bin():
    # torchmetrics alone would give exact-1.0 confidences a bin of their own (ECE 0.25 here)
    probs = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.95, 0.05], [0.95, 0.05]])
    y = torch.tensor([0, 1, 0, 0])
    conf = (1.0 + 1.0 + 0.95 + 0.95) / 4
    assert M.ece(probs, y, n_bins=10) == pytest.approx(abs(0.75 - conf), abs=1e-6)


def test_classification_metrics_keys():
    m = M.classification_metrics(PROBS, Y, 10)
    assert set(m) == {"acc", "nll", "brier", "ece", "mce", "conf", "entropy"}


def test_auroc_separated_and_identical():
    assert M.auroc(torch.tensor([0.9, 0.8, 0.95]), torch.tensor([0.1, 0.5, 0.3])) == pytest.approx(1.0)
    assert M.auroc(torch.full((5,), 0.7), torch.full((7,), 0.7)) == pytest.approx(0.5)
    assert M.auroc(torch.tensor([0.1, 0.2]), torch.tensor([0.8, 0.9])) == pytest.approx(0.0)


def test_fpr95_hand_case():
    s_in = torch.arange(1, 21).double() / 20  # 0.05 .. 1.0; 95% TPR keeps the top 19 -> t = 0.10
    s_out = torch.tensor([0.02, 0.06, 0.10, 0.5, 0.99])  # 0.10, 0.5, 0.99 >= t
    assert M.fpr_at_tpr(s_in, s_out) == pytest.approx(3 / 5)
    assert M.fpr_at_tpr(torch.tensor([0.9, 0.8]), torch.tensor([0.1, 0.2])) == 0.0
    assert M.fpr_at_tpr(torch.full((4,), 0.5), torch.full((3,), 0.5)) == 1.0


def test_fpr95_agrees_with_roc_curve():
    from torchmetrics.functional.classification import binary_roc

    g = torch.Generator().manual_seed(3)
    s_in, s_out = torch.rand(300, generator=g) + 0.3, torch.rand(200, generator=g)
    fpr, tpr, _ = binary_roc(torch.cat([s_in, s_out]), torch.cat([torch.ones(300), torch.zeros(200)]).long())
    expected = fpr[tpr >= 0.95].min().item()
    assert M.fpr_at_tpr(s_in, s_out) == pytest.approx(expected)


def test_ood_metrics():
    p_in = torch.tensor([[0.9, 0.1], [0.8, 0.2]])
    p_out = torch.tensor([[0.5, 0.5], [0.6, 0.4]])
    m = M.ood_metrics(p_in, p_out)
    assert m["conf"] == pytest.approx(0.55)
    assert m["auroc"] == pytest.approx(1.0)
    assert m["fpr95"] == 0.0


def test_regression_metrics_by_hand():
    # standardised predictions; target_mean 10, target_std 2
    mean = torch.zeros(4, 1)
    var = torch.ones(4, 1)
    y = torch.tensor([[0.0], [0.5], [-1.0], [2.0]])
    m = M.regression_metrics(mean, var, y, 10.0, 2.0, levels=(0.5, 0.9, 0.95))
    # original units: mean 10, sd 2, y = 10, 11, 8, 14
    ll = sum(-0.5 * math.log(2 * math.pi * 4) - 0.5 * e**2 / 4 for e in [0, 1, -2, 4]) / 4
    assert m["ll"] == pytest.approx(ll)
    assert m["rmse"] == pytest.approx(math.sqrt((0 + 1 + 4 + 16) / 4))
    # |z| = 0, .5, 1, 2 against 0.674 / 1.645 / 1.960
    assert m["cov_50"] == pytest.approx(2 / 4)
    assert m["cov_90"] == pytest.approx(3 / 4)
    assert m["cov_95"] == pytest.approx(3 / 4)


def test_regression_metrics_multi_output_and_unstandardised_targets():
    mean = torch.tensor([[0.0, 1.0]])
    var = torch.tensor([[1.0, 4.0]])
    tm, ts = torch.tensor([1.0, -1.0]), torch.tensor([1.0, 10.0])
    y_orig = torch.tensor([[1.0, 9.0]])  # at the means in original units
    m = M.regression_metrics(mean, var, y_orig, tm, ts, levels=(0.5,), y_standardised=False)
    ll = -0.5 * math.log(2 * math.pi * 1) - 0.5 * math.log(2 * math.pi * 400)
    assert m["ll"] == pytest.approx(ll)
    assert m["rmse"] == pytest.approx(0.0)
    assert m["cov_50"] == 1.0


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="shape"):
        M.accuracy(torch.rand(3), torch.zeros(3))
    with pytest.raises(ValueError, match="positive"):
        M.regression_metrics(torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1))


def test_ece_redux_leaves_out_confidences_from_0_99_and_bins_in_hundredths():
    probs = torch.tensor([[0.995, 0.005], [0.5, 0.5], [0.7, 0.3], [0.705, 0.295], [0.2, 0.8]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0, 1])
    # kept: 0.5 (pred 0, wrong), 0.7 (wrong) and 0.705 (right) share the bin [0.70, 0.71), 0.8 (right)
    want = (abs(0.5 - 0) + abs(0.7 + 0.705 - 1) + abs(0.8 - 1)) / 4
    assert M.ece_redux(probs, y) == pytest.approx(want, rel=1e-12)
    assert math.isnan(M.ece_redux(torch.tensor([[0.999, 0.001]]), torch.tensor([0])))


def test_ece_redux_equals_numpy_digitize_over_the_first_hundred_indices():
    """Reference: numpy's histogram edges and ``digitize`` indices, the predictions whose index is
    below 100 (the bins a loop over range(100) visits), weights over those predictions."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(4000, 10, generator=g, dtype=torch.float64) * 4, -1)
    y = torch.randint(0, 10, (4000,), generator=g)
    conf, pred = probs.max(-1)
    conf, correct = conf.numpy(), (pred == y).numpy()
    idx = np.digitize(conf, np.histogram(conf, 100, range=(0, 1))[1])
    kept = idx < 100
    assert 0 < kept.sum() < len(conf)
    gaps = [abs(conf[kept & (idx == i)].sum() - correct[kept & (idx == i)].sum()) for i in range(100)]
    assert M.ece_redux(probs, y) == pytest.approx(sum(gaps) / kept.sum(), rel=1e-9)
