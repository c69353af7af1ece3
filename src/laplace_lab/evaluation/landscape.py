"""Loss landscapes around the MAP beside the Laplace Gaussian (``evaluation.landscape``).

A slice moves the weights of the Laplace's subset (all weights, or the last layer; the others stay
at the MAP) along directions ``d_i``: ``theta(a) = theta_hat + sum_i a_i d_i``, as 1-D slices
along every direction and the 2-D slice spanned by ``d_1, d_2``; ``a`` is in units of each
direction (``a = 1`` is ``theta_hat + d``).

Loss: the negative log posterior that the run's Laplace approximates (the engine's conventions,
``docs/architecture.md``)::

    E(theta) = c sum_n nll_n(theta) + norm + 0.5 (theta - mu0)^T diag(prior) (theta - mu0)

with ``c = 1 / (sigma^2 T)`` (``1 / T`` unless regression), ``nll`` the likelihood's unit-noise NLL
(``laplace.likelihoods``), ``norm`` the Gaussian normaliser of regression, the sum over the ``N``
rows the Laplace was fitted on (estimated as ``N / n`` times the sum over ``n_train`` rows) and
the prior over the subset, so ``E(theta_hat) = -laplace/log_lik + 0.5 laplace/scatter``. The
figures show the per-datum loss ``E / N`` (classification: mean NLL / T + prior / N, the MAP
training objective); the likelihood slice is ``exp(-(E(theta) - E(theta_hat)))``.

Laplace Gaussian on the same slice: with ``w = sum_i a_i d_i``,
``log q(w) - log q(0) = -1/2 a^T Q a + a^T r``, ``Q_ij = d_i^T P d_j``, ``r_i = d_i^T P (mu - theta_hat)``
(``r = 0`` unless ``marglik.evidence_point=linear_mode`` moved the mean ``mu``), ``P = c H +
diag(prior)`` the posterior precision. ``Q`` and ``r`` come from the structure's ``square_norm``
alone (polarisation: ``u^T P v = (|u + v|_P^2 - |u - v|_P^2) / 4``), so every structure (full,
kron, diag, lowrank; last-layer subsets) works without forming a ``P x P`` matrix.

Directions (``directions``):
- ``random``: filter-normalised (Li et al. 2018, "Visualizing the loss landscape of neural nets"):
  a standard normal draw per tensor, each filter (a slice along dim 0 of a tensor with >= 2 dims:
  a conv output channel, a linear output unit) rescaled to the norm of the same filter of
  ``theta_hat``; 1-D tensors (biases, normalisation scales) zero (``biases=zero``, their
  ``ignore=biasbn``) or ``theta_hat`` itself (``biases=weights``, their default).
- ``eigen``: the top eigenvectors of the curvature ``H`` (``Structure.curvature_top_eigenvectors``:
  full, per-layer KFAC eigenbases, lowrank), the posterior's sharpest directions, each scaled to the
  norm of ``theta_hat`` over the subset.

Grids (``grid_points`` per axis in 2-D, ``grid_points_1d`` in 1-D): loss and test metric on
``[-extent, extent]`` per axis; likelihood vs Gaussian on
``+- posterior_extent``, or ``+- posterior_n_std / sqrt(Q_ii)`` (that many standard deviations of
the Gaussian's slice along ``d_i``): at the full-data scale the posterior is about ``sqrt(N)``
times narrower than the loss landscape. Cost: one loss per grid point, each a forward pass over
the ``n_train`` rows (plus the ``n_test`` rows on the loss grid). When the subset is one
``nn.Linear`` whose output is the model's output (the last-layer Laplace; checked on a batch), its
inputs are computed once and each grid point is a matrix product.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from laplace_lab.evaluation.options import LandscapeConfig
from laplace_lab.evaluation.predict import eval_mode

log = logging.getLogger(__name__)

# ============================================================================== directions
def filter_normalized_direction(params: list[Tensor], generator: torch.Generator, biases: str = "zero") -> Tensor:
    """``[P]`` one random direction over ``params`` (flat, in their order), Li et al.'s filter
    normalisation: per filter (dim-0 slice of a tensor with >= 2 dims) the norm of the weights'
    filter; 1-D tensors zero (``biases="zero"``) or equal to the weights (``"weights"``)."""
    parts = []
    for p in params:
        w = p.detach()
        if w.ndim <= 1:
            parts.append(torch.zeros_like(w).reshape(-1) if biases == "zero" else w.reshape(-1).clone())
            continue
        d = torch.randn(w.shape, generator=generator, dtype=w.dtype).to(w.device).reshape(w.shape[0], -1)
        rows = w.reshape(w.shape[0], -1)
        d = d * (rows.norm(dim=1, keepdim=True) / d.norm(dim=1, keepdim=True).clamp_min(1e-30))
        parts.append(d.reshape(-1))
    return torch.cat(parts)


def landscape_directions(la, cfg: LandscapeConfig) -> tuple[Tensor, list[str]]:
    """``(D [k, P], labels)``: the ``cfg.n_directions`` directions over ``la``'s subset."""
    k = cfg.n_directions
    if cfg.directions == "random":
        g = torch.Generator().manual_seed(cfg.seed)
        D = torch.stack([filter_normalized_direction(la.params, g, cfg.biases) for _ in range(k)])
        if not bool(D.ne(0).any()):
            raise ValueError("evaluation.landscape.biases='zero' leaves every random direction zero: the Laplace's "
                             "weights are all 1-D tensors; use evaluation.landscape.biases='weights'")
        return D, [f"random {i + 1}" for i in range(k)]
    lam, U = la.structure.curvature_top_eigenvectors(k)
    if lam.numel() < k:
        raise ValueError(f"evaluation.landscape.n_directions={k} but hessian_structure={la.hessian_structure!r} "
                         f"has {lam.numel()} non-zero curvature eigenvectors; lower n_directions")
    scale = torch.cat([p.detach().reshape(-1) for p in la.params]).norm()
    return (U.T * scale).to(la.dtype), [f"eigvec {i + 1} (lambda={v:.3g})" for i, v in enumerate(lam.tolist())]


# ===================================================================== the Gaussian's slice
def slice_precision(structure, c, prior, D: Tensor, offset: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(Q [k, k], r [k])`` in float64: ``Q_ij = d_i^T P d_j``, ``r_i = d_i^T P offset`` (zeros for no
    offset), through ``structure.square_norm`` only (polarisation identity)."""

    def sq(v):
        return float(structure.square_norm(v, c, prior))

    def inner(u, v):
        return (sq(u + v) - sq(u - v)) / 4

    k = D.shape[0]
    Q = torch.zeros(k, k, dtype=torch.float64)
    for i in range(k):
        Q[i, i] = sq(D[i])
        for j in range(i):
            Q[i, j] = Q[j, i] = inner(D[i], D[j])
    r = torch.zeros(k, dtype=torch.float64)
    if offset is not None and bool(offset.ne(0).any()):
        r = torch.tensor([inner(D[i], offset) for i in range(k)], dtype=torch.float64)
    return Q, r


def gaussian_log_slice(Q: Tensor, r: Tensor, A: Tensor) -> Tensor:
    """``[M]``: ``-1/2 a^T Q a + a^T r`` for the rows ``a`` of ``A`` ``[M, k]`` (float64)."""
    A = A.to(torch.float64)
    return -0.5 * ((A @ Q) * A).sum(1) + A @ r


# ================================================================================ the loss
def sample_rows(dataset: Dataset, n: int | None, seed: int, batch_size: int) -> list[tuple[Tensor, Tensor]]:
    """Batches of ``n`` rows of ``dataset`` drawn without replacement by ``seed`` (all rows, in order,
    for ``n=None`` or ``n >= len``), held in memory."""
    size = len(dataset)
    if n is not None and n < size:
        idx = torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:n]
        dataset = Subset(dataset, sorted(idx.tolist()))
    return [(x, y) for x, y in DataLoader(dataset, batch_size=batch_size)]


def _head_module(model: nn.Module, entries, x: Tensor) -> nn.Linear | None:
    """The subset's one ``nn.Linear`` if the model's output is its output (called once), else ``None``."""
    if len(entries) != 1 or not isinstance(entries[0].module, nn.Linear):
        return None
    module, outputs = entries[0].module, []
    handle = module.register_forward_hook(lambda m, a, o: outputs.append(o))
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        handle.remove()
    return module if len(outputs) == 1 and out is outputs[0] else None


def _features(model: nn.Module, module: nn.Module, batches):
    """``[(input of module, y)]`` per batch (one forward of the model each)."""
    feats = []

    def keep(m, args):
        feats.append(args[0].detach())

    handle = module.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            for x, _ in batches:
                model(x)
    finally:
        handle.remove()
    return [(phi, y) for phi, (_, y) in zip(feats, batches)]


def _merge(batches: list[tuple[Tensor, Tensor]], rows: int = 16384) -> list[tuple[Tensor, Tensor]]:
    """Consecutive batches concatenated into chunks of about ``rows`` rows (fewer, larger products)."""
    out, group, size = [], [], 0
    for x, y in batches:
        group.append((x, y))
        size += len(y)
        if size >= rows:
            out.append((torch.cat([g[0] for g in group]), torch.cat([g[1] for g in group])))
            group, size = [], 0
    if group:
        out.append((torch.cat([g[0] for g in group]), torch.cat([g[1] for g in group])))
    return out


class SliceLoss:
    """``E(theta_hat + w)`` (float) and the test metric there, for ``w`` ``[P]`` over ``la``'s subset
    (see the module docstring for ``E``). ``head``: the last-layer shortcut is in use (where it
    applies, unless ``shortcut=False``)."""

    def __init__(self, la, train: list, test: list, device, shortcut: bool = True):
        self.la, self.model, self.lik = la, la.model, la.lik
        names = {id(p): n for n, p in la.model.named_parameters()}
        self.names = [names[id(p)] for p in la.params]
        self.shapes = [p.shape for p in la.params]
        self.theta = torch.cat([p.detach().reshape(-1) for p in la.params])
        self.n_rows = sum(len(y) for _, y in train)
        self.n_data = int(la.n_data)
        self.scale = self.n_data / self.n_rows
        self.c = float(la.H_factor)
        self.prior = la.prior_precision_diag.detach().double()
        self.prior_mean = la.prior_mean.detach().double().expand(self.theta.numel())
        self.norm = 0.0
        if la.likelihood == "regression":
            self.norm = la.n_data * la.n_outputs * math.log(float(la.sigma_noise) * math.sqrt(2 * math.pi))
        to_dev = [(x.to(device), y.to(device)) for x, y in train]
        test_dev = [(x.to(device), y.to(device)) for x, y in test]
        head = _head_module(self.model, la.entries, to_dev[0][0]) if shortcut else None
        self.head = head is not None
        if head is not None:
            self.head_names = la.entries[0].names
            self.head_module = head
            to_dev, test_dev = (_merge(_features(self.model, head, b)) for b in (to_dev, test_dev))
        self.train, self.test = to_dev, test_dev

    def _params(self, w: Tensor) -> dict[str, Tensor]:
        flat = self.theta + w.to(self.theta)
        return dict(zip(self.names, (t.reshape(s) for t, s in zip(flat.split([s.numel() for s in self.shapes]),
                                                                 self.shapes))))

    def _forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        if self.head:
            local = dict(zip(self.head_names, params.values()))
            bias = local.get("bias", self.head_module.bias)
            return F.linear(x, local.get("weight", self.head_module.weight), bias)
        return torch.func.functional_call(self.model, params, (x,))

    def energy(self, w: Tensor) -> float:
        """``E(theta_hat + w)``: the summed tempered NLL (scaled to ``N`` rows), normaliser and prior."""
        params = self._params(w)
        total = 0.0
        with torch.no_grad():
            for x, y in self.train:
                f, yy = self.lik.prepare(self._forward(params, x), y)
                total += float(self.lik.nll(f, yy).double())
        d = self.theta.double() + w.double() - self.prior_mean
        return self.c * self.scale * total + self.norm + 0.5 * float((self.prior * d * d).sum())

    def metric(self, w: Tensor) -> float:
        """Test accuracy (classification) or test RMSE of the mean in the data's (standardised) units."""
        params = self._params(w)
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in self.test:
                f, yy = self.lik.prepare(self._forward(params, x), y)
                if self.la.likelihood == "classification":
                    total, count = total + float((f.argmax(-1) == yy).sum()), count + len(yy)
                else:
                    mean = f if self.la.likelihood == "regression" else self.lik.mean_var(f)[0]
                    total, count = total + float((mean - yy).double().square().sum()), count + yy.numel()
        return total / count if self.la.likelihood == "classification" else math.sqrt(total / count)


# ================================================================================== slices
@dataclass
class Grid:
    """One grid's axes (direction units) and values, float64 numpy arrays."""

    axes: list[np.ndarray]
    values: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Landscape:
    """Every slice of one run: ``one_d[i]`` / ``post_one_d[i]`` along direction ``i`` (values
    ``loss``, ``metric``; ``delta`` = ``E - E(theta_hat)``, ``log_gauss``), ``two_d`` /
    ``post_two_d`` over the first two directions; per-datum loss ``loss = E / N``.

    Probes one standard deviation ``s_i = 1 / sqrt(Q_ii)`` of the Gaussian's slice either side of the
    MAP along ``d_i``: ``curvature_ratio`` = ``delta(+s_i) + delta(-s_i)``, the loss's second difference
    over the Gaussian's curvature ``Q_ii`` (1 where the two agree); ``offset_std`` =
    ``-(delta(+s_i) - delta(-s_i)) / 2``, minus the loss's slope in units of ``1 / s_i`` (0 at a mode of
    the slice; a quadratic loss of curvature ``Q_ii`` peaks that many standard deviations away)."""

    labels: list[str]
    kind: str
    Q: np.ndarray
    r: np.ndarray
    energy_map: float
    metric_map: float
    n_data: int
    n_rows: int
    n_test: int
    metric_name: str
    structure: str
    curvature: str
    subset: str
    posterior_grid: str  # how the likelihood grids' extent was chosen
    curvature_ratio: list[float]  # per direction: delta(+1 std) + delta(-1 std); 1 where the Gaussian fits
    offset_std: list[float]  # per direction: -(delta(+1 std) - delta(-1 std)) / 2; 0 at the slice's mode
    one_d: list[Grid]
    post_one_d: list[Grid]
    two_d: Grid
    post_two_d: Grid

    def total_variation(self) -> float:
        """Total variation between ``exp(-delta)`` and the Gaussian on the 2-D likelihood grid, each
        normalised over the grid's points (in [0, 1]; 0: the same shape there)."""
        log_lik, log_gauss = -self.post_two_d.values["delta"], self.post_two_d.values["log_gauss"]
        lik, gauss = np.exp(log_lik - log_lik.max()), np.exp(log_gauss - log_gauss.max())
        return float(0.5 * np.abs(lik / lik.sum() - gauss / gauss.sum()).sum())


def _axis(half: float, n: int) -> np.ndarray:
    return np.linspace(-half, half, n)


def _posterior_halves(cfg: LandscapeConfig, Q: Tensor) -> list[float]:
    if cfg.posterior_extent is not None:
        return [cfg.posterior_extent] * Q.shape[0]
    return [cfg.posterior_n_std / math.sqrt(float(Q[i, i])) for i in range(Q.shape[0])]


def compute_landscape(la, inputs_train: Dataset, inputs_test: Dataset, cfg: LandscapeConfig,
                      chunk_size: int = 256, progress: bool = False) -> Landscape:
    """Every slice of ``cfg`` around ``la``'s MAP (``la`` fitted; its model's weights are the MAP)."""
    la.check_fitted()
    with eval_mode(la.model):
        return _compute(la, inputs_train, inputs_test, cfg, chunk_size, progress)


def _compute(la, inputs_train, inputs_test, cfg, chunk_size, progress) -> Landscape:
    device = la.device
    D, labels = landscape_directions(la, cfg)
    D = D.to(device)
    loss_fn = SliceLoss(la, sample_rows(inputs_train, cfg.n_train, cfg.seed, chunk_size),
                        sample_rows(inputs_test, cfg.n_test, cfg.seed, chunk_size), device)
    offset = la.mean.detach() - loss_fn.theta
    Q, r = slice_precision(la.structure, la.H_factor, la.structure_prior, D, offset)
    k, G, G1 = D.shape[0], cfg.grid_points, cfg.grid_points_1d
    halves = _posterior_halves(cfg, Q)
    n_loss, n_post = k * G1 + G * G, k * G1 + G * G
    n_test = sum(len(y) for _, y in loss_fn.test)
    rows = f"{loss_fn.n_rows} training rows" + (f" (of {loss_fn.n_data}, loss scaled by N/n)"
                                                if loss_fn.n_rows != loss_fn.n_data else "")
    log.info("Loss landscape: %d %s directions over %d weights; %d loss-grid points x (%s + %d test rows) + "
             "%d likelihood-grid points x %s = %.3g row forward passes%s",
             k, cfg.directions, D.shape[1], n_loss, rows, n_test, n_post, rows,
             n_loss * (loss_fn.n_rows + n_test) + n_post * loss_fn.n_rows,
             " (last layer: its inputs computed once, each point a matrix product)" if loss_fn.head else "")
    start = time.perf_counter()
    bar = tqdm(total=n_loss + n_post, desc="landscape", disable=not progress)
    e0 = loss_fn.energy(torch.zeros_like(D[0]))
    probes = [[loss_fn.energy(sign * D[i] / math.sqrt(float(Q[i, i]))) - e0 for sign in (1.0, -1.0)]
              for i in range(k)]

    def evaluate(A: np.ndarray, with_metric: bool) -> tuple[np.ndarray, np.ndarray]:
        E, M = np.empty(len(A)), np.full(len(A), np.nan)
        W = torch.as_tensor(A, dtype=D.dtype, device=device) @ D
        for m, w in enumerate(W):
            E[m] = loss_fn.energy(w)
            if with_metric:
                M[m] = loss_fn.metric(w)
            bar.update()
        return E, M

    def grid(axes: list[np.ndarray], dims: list[int], with_metric: bool) -> Grid:
        mesh = np.meshgrid(*axes, indexing="ij")
        A = np.zeros((mesh[0].size, k))
        for ax_values, dim in zip(mesh, dims):
            A[:, dim] = ax_values.ravel()
        E, M = evaluate(A, with_metric)
        shape = mesh[0].shape
        out = Grid(axes, {"loss": (E / loss_fn.n_data).reshape(shape), "delta": (E - e0).reshape(shape),
                          "log_gauss": gaussian_log_slice(Q, r, torch.as_tensor(A)).numpy().reshape(shape)})
        if with_metric:
            out.values["metric"] = M.reshape(shape)
        return out

    try:
        one_d = [grid([_axis(cfg.extent, G1)], [i], True) for i in range(k)]
        two_d = grid([_axis(cfg.extent, G), _axis(cfg.extent, G)], [0, 1], True)
        post_one_d = [grid([_axis(halves[i], G1)], [i], False) for i in range(k)]
        post_two_d = grid([_axis(halves[0], G), _axis(halves[1], G)], [0, 1], False)
    finally:
        bar.close()
    log.info("Loss landscape: %d grid points in %.1f s", n_loss + n_post + 1 + 2 * k, time.perf_counter() - start)
    metric_name = "accuracy" if la.likelihood == "classification" else "RMSE (standardised)"
    return Landscape(labels=labels, kind=cfg.directions, Q=Q.numpy(), r=r.numpy(), energy_map=e0,
                     metric_map=loss_fn.metric(torch.zeros_like(D[0])), n_data=loss_fn.n_data,
                     n_rows=loss_fn.n_rows, n_test=n_test, metric_name=metric_name,
                     structure=la.hessian_structure, curvature=la.curvature, subset=la.subset_of_weights,
                     posterior_grid=(f"+-{cfg.posterior_extent:g} per axis" if cfg.posterior_extent is not None
                                     else f"+-{cfg.posterior_n_std:g} std of the Gaussian along each direction"),
                     curvature_ratio=[p + m for p, m in probes], offset_std=[-(p - m) / 2 for p, m in probes],
                     one_d=one_d, post_one_d=post_one_d, two_d=two_d, post_two_d=post_two_d)


def metric_keys(ls: Landscape) -> dict[str, float]:
    """Scalars for ``eval_metrics.json``: ``landscape/map/loss`` (``E / N`` at the MAP),
    ``landscape/map/acc`` or ``/rmse`` (on the test rows), ``landscape/la/tv``
    (``Landscape.total_variation``) and per direction ``landscape/d<i>/la/curvature_ratio`` and
    ``landscape/d<i>/la/offset_std`` (``Landscape``'s probes)."""
    short = "acc" if ls.metric_name == "accuracy" else "rmse"
    out = {"landscape/map/loss": ls.energy_map / ls.n_data, f"landscape/map/{short}": ls.metric_map,
           "landscape/la/tv": ls.total_variation()}
    for i, (ratio, offset) in enumerate(zip(ls.curvature_ratio, ls.offset_std)):
        out |= {f"landscape/d{i + 1}/la/curvature_ratio": ratio, f"landscape/d{i + 1}/la/offset_std": offset}
    return out


def tables(ls: Landscape) -> dict[str, pd.DataFrame]:
    """Long tables of every grid: ``landscape_1d`` (``grid`` loss | likelihood, ``direction``, ``a``)
    and ``landscape_2d`` (``grid``, ``a1``, ``a2``), with ``loss`` (``E / N``), ``delta``
    (``E - E_MAP``), ``log_gauss`` and ``metric`` (loss grids only)."""
    rows_1d, rows_2d = [], []
    for name, grids in (("loss", ls.one_d), ("likelihood", ls.post_one_d)):
        for i, g in enumerate(grids):
            frame = pd.DataFrame({"grid": name, "direction": i + 1, "a": g.axes[0],
                                  **{k: v for k, v in g.values.items()}})
            rows_1d.append(frame)
    for name, g in (("loss", ls.two_d), ("likelihood", ls.post_two_d)):
        A, B = np.meshgrid(*g.axes, indexing="ij")
        rows_2d.append(pd.DataFrame({"grid": name, "a1": A.ravel(), "a2": B.ravel(),
                                     **{k: v.ravel() for k, v in g.values.items()}}))
    return {"landscape_1d": pd.concat(rows_1d, ignore_index=True),
            "landscape_2d": pd.concat(rows_2d, ignore_index=True)}


def progress_enabled(requested: bool) -> bool:
    """A progress bar only when asked for and stderr is a terminal."""
    return requested and sys.stderr.isatty()
