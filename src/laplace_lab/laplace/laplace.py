"""The ``Laplace`` object: options, fit (begin / per-batch accumulate / end), marginal likelihood,
prior optimisation, sampling and (de)serialisation. Pure PyTorch.

Conventions (laplace-torch's): ``P = c H + P0`` with ``c = 1 / (sigma^2 T)`` for regression and
``1 / T`` otherwise (``H`` computed with unit noise);
``log p(D | theta) - 1/2 (log det P - log det P0 + (theta - mu0)^T P0 (theta - mu0))``;
classification log likelihood = ``-sum CE / T``; regression = ``-0.5 sum (f - y)^2 c - N C log(sigma sqrt(2 pi))``;
heteroscedastic = ``-sum NLL / T``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from laplace_lab.laplace import predictive
from laplace_lab.laplace.capture import Capture, has_inplace_modules
from laplace_lab.laplace.chain import Chain
from laplace_lab.laplace.curvature import CURVATURES, output_factors
from laplace_lab.laplace.likelihoods import LIKELIHOODS, get_likelihood
from laplace_lab.laplace.matrix_free.lowrank import LowRankStructure
from laplace_lab.laplace.normgroups import n_groups as count_groups
from laplace_lab.laplace.normgroups import normgroups
from laplace_lab.laplace.priors import (
    PRIOR_STRUCTURES,
    expand_groups,
    infer_structure,
    to_diag,
    to_vector,
)
from laplace_lab.laplace.structures import STRUCTURES
from laplace_lab.laplace.subset import SUBSETS, select

_STRUCTURES = {**STRUCTURES, "lowrank": LowRankStructure}  # lowrank: matrix-free (issue 10)

_CONFIG_KEYS = ("likelihood", "subset_of_weights", "hessian_structure", "curvature",
                "prior_structure", "n_mc_samples")


def _check_choice(option: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{option} must be one of {tuple(allowed)}; got {value!r}")


class Laplace:
    """Laplace approximation around the current weights of ``model``.

    Args:
        model: the network; its current parameters are the MAP estimate.
        likelihood: "classification" | "regression" | "heteroscedastic_regression".
        subset_of_weights: "all" | "last_layer" (the model's last ``nn.Linear``, or ``last_layer_name``).
        hessian_structure: "full" | "diag" | "kron" | "lowrank" (top ``n_eigs`` GGN eigenpairs by
            Lanczos, fitted matrix-free; see ``matrix_free.lowrank``; curvature "ggn" | "ef").
        curvature: "ggn" | "ef" | "mc_fisher" (``n_mc_samples`` sampled labels per datum).
        prior_precision: float or 1-d tensor ([1], [n_layers] or [n_params]).
        prior_structure: "scalar" | "layerwise" | "diagonal" | "normgroups"; ``None`` infers it from
            ``prior_precision``'s shape. kron supports scalar, layerwise and normgroups only.
            "normgroups" (Antoran et al. 2022): one precision per group of tensors that a
            normalisation layer makes scale invariant, plus one for the rest (``prior_groups``
            ``[n_layers]`` group index per tensor; default ``normgroups.normgroups(model, params,
            example_input)``, ``example_input`` ``[B, ...]`` a model input to trace the detection on);
            ``prior_precision`` is then ``[n_groups]`` and the structures see its per-tensor
            expansion ``_structure_prior``.
        prior_mean: float or [n_params] tensor.
        sigma_noise: observation noise std (regression only; must be 1 otherwise).
        temperature: posterior temperature T.
        generator / seed: randomness for ``mc_fisher`` and ``sample``.

    Attributes after ``fit``: ``mean`` [P], ``n_data``, ``n_outputs``, ``loss`` (summed NLL, unit
    noise), ``prior_precision`` ([1] / [n_layers] / [P]), ``sigma_noise`` (0-dim),
    ``n_params``, ``n_layers``, ``H`` (full: [P, P]; diag: [P]; kron: list of blocks, see
    ``structures.kron``), ``posterior_precision`` (full: [P, P]; diag: [P]; kron: the
    ``KronStructure`` whose ``blocks`` hold eigenbases / eigenvalues), ``posterior_covariance``
    (full: [P, P]; diag: [P] variances; kron: use ``functional_variance`` / ``posterior_variance``).
    """

    def __init__(
        self,
        model: nn.Module,
        likelihood: str,
        subset_of_weights: str = "last_layer",
        hessian_structure: str = "kron",
        curvature: str = "ggn",
        prior_precision: float | torch.Tensor = 1.0,
        prior_structure: str | None = None,
        prior_mean: float | torch.Tensor = 0.0,
        sigma_noise: float | torch.Tensor = 1.0,
        temperature: float = 1.0,
        n_mc_samples: int = 1,
        last_layer_name: str | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        n_eigs: int = 100,
        prior_groups: torch.Tensor | None = None,
        example_input: torch.Tensor | None = None,
    ):
        _check_choice("likelihood", likelihood, LIKELIHOODS)
        _check_choice("subset_of_weights", subset_of_weights, SUBSETS)
        _check_choice("hessian_structure", hessian_structure, tuple(_STRUCTURES))
        _check_choice("curvature", curvature, CURVATURES)
        if not (isinstance(n_mc_samples, int) and n_mc_samples >= 1):
            raise ValueError(f"n_mc_samples must be a positive int; got {n_mc_samples!r}")
        if not float(temperature) > 0:
            raise ValueError(f"temperature must be > 0; got {temperature!r}")
        self.model = model
        self.likelihood = likelihood
        self.subset_of_weights = subset_of_weights
        self.hessian_structure = hessian_structure
        self.curvature = curvature
        self.n_mc_samples = n_mc_samples
        self.temperature = float(temperature)
        self._lik = get_likelihood(likelihood)

        p0 = next(model.parameters())
        self._device, self._dtype = p0.device, p0.dtype
        self.entries = select(model, subset_of_weights, last_layer_name)
        self.params = [p for e in self.entries for p in e.params]
        self.n_layers = len(self.params)
        self.n_params = sum(p.numel() for p in self.params)
        self._sizes = [p.numel() for p in self.params]

        if prior_structure is None:
            prior_structure = infer_structure(prior_precision, self.n_layers, self.n_params)
        _check_choice("prior_structure", prior_structure, PRIOR_STRUCTURES)
        struct_cls = _STRUCTURES[hessian_structure]
        self.prior_groups, self.n_groups = None, None
        if prior_structure == "normgroups":  # structures see the per-tensor (layerwise) expansion
            groups = prior_groups if prior_groups is not None else normgroups(model, self.params, example_input)
            groups = torch.as_tensor(groups, dtype=torch.long).reshape(-1)
            if groups.numel() != self.n_layers or bool((groups < 0).any()):
                raise ValueError(f"prior_groups must hold one non-negative group index per parameter tensor "
                                 f"(n_layers={self.n_layers}); got shape {tuple(groups.shape)}")
            self.prior_groups, self.n_groups = groups.to(self._device), count_groups(groups)
        if (prior_structure if prior_structure != "normgroups" else "layerwise") not in struct_cls.prior_structures:
            raise ValueError(
                f"prior_structure={prior_structure!r} is not supported with "
                f"hessian_structure={hessian_structure!r}; allowed: {struct_cls.prior_structures}"
            )
        self.prior_structure = prior_structure
        self.prior_precision = prior_precision
        self.prior_mean = prior_mean
        if likelihood != "regression" and float(torch.as_tensor(sigma_noise).detach().reshape(-1)[0]) != 1.0:
            raise ValueError(f"sigma_noise must be 1 for likelihood={likelihood!r}; got {sigma_noise!r}")
        self.sigma_noise = sigma_noise

        if generator is None and seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(seed)
        self.generator = generator
        self._structure = struct_cls(self.entries, self._device, self._dtype,
                                     **({"n_eigs": n_eigs} if hessian_structure == "lowrank" else {}))
        self.mean = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.linear_offset = None  # [P] theta* - theta_hat once linear_mode.fit_linear_mode ran
        self.loss = torch.zeros((), device=self._device, dtype=self._dtype)
        self.n_data = 0
        self.n_outputs = None
        self._fitted = False
        self._use_chain = True  # False: always the autograd (Capture) backward (tests compare both)
        self._chain = None

    # ---- hyperparameters ------------------------------------------------------------------------
    @property
    def prior_precision(self) -> torch.Tensor:
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value) -> None:
        self._prior_precision = to_vector(value, self.prior_structure, self.n_layers, self.n_params,
                                          device=self._device, dtype=self._dtype, n_groups=self.n_groups)

    @property
    def _structure_prior(self) -> torch.Tensor:
        """The prior as the structures take it: ``prior_precision``, or for "normgroups" its
        ``[n_layers]`` per-tensor expansion (graph preserved)."""
        if self.prior_structure == "normgroups":
            return expand_groups(self.prior_precision, self.prior_groups)
        return self.prior_precision

    @property
    def prior_precision_diag(self) -> torch.Tensor:
        """``[P]`` per-parameter prior precision."""
        return to_diag(self._structure_prior, self._sizes)

    @property
    def prior_mean(self) -> torch.Tensor:
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value) -> None:
        t = torch.as_tensor(value, dtype=self._dtype).to(device=self._device).reshape(-1)
        if t.numel() not in (1, self.n_params):
            raise ValueError(f"prior_mean must be a float or have n_params={self.n_params} entries")
        self._prior_mean = t

    @property
    def sigma_noise(self) -> torch.Tensor:
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value) -> None:
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=self._dtype)
        if t.numel() != 1:
            raise ValueError("sigma_noise must be a scalar (homoscedastic noise)")
        self._sigma_noise = t.to(device=self._device, dtype=self._dtype).reshape(())

    @property
    def _H_factor(self) -> torch.Tensor:
        """Curvature scale ``c = 1 / (sigma^2 T)`` (``1 / T`` unless regression)."""
        if self.likelihood == "regression":
            return 1.0 / (self.sigma_noise.square() * self.temperature)
        return torch.as_tensor(1.0 / self.temperature, device=self._device, dtype=self._dtype)

    # ---- fitting ----------------------------------------------------------------------------------
    def fit(self, train_loader: Iterable, override: bool = True) -> None:
        """One pass over ``train_loader`` (yields ``(X, y)``): ``fit_begin``, ``fit_batch``, ``fit_end``."""
        if self.hessian_structure == "lowrank":  # matrix-free: loss pass + Lanczos (matrix_free.lowrank)
            if not override:
                raise ValueError("override=False is not supported with hessian_structure='lowrank'")
            self.fit_begin()
            self.loss, self.n_data, self.n_outputs = self._structure.fit(self, train_loader)
            return self.fit_end()
        self.fit_begin(override=override)
        for X, y in train_loader:
            self.fit_batch(X, y)
        self.fit_end()

    def fit_begin(self, override: bool = True) -> None:
        """Reset the accumulators (``override``), switch the model to eval mode, store the mean."""
        if override:
            self._structure.reset()
            self.loss = torch.zeros((), device=self._device, dtype=self._dtype)
            self.n_data = 0
        self._was_training = self.model.training
        self.model.eval()
        self.mean = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.linear_offset = None
        # plain sequential networks: graph-free forward and one batched backward of the K factors
        # (chain.py); for a last-layer subset only its faster forward matters
        self._chain = None
        if self._use_chain:
            self._chain = Chain.build(self.model, [e.module for e in self.entries],
                                      block_order_ok=self.hessian_structure == "kron")

    def fit_batch(self, X, y) -> None:
        """Accumulate curvature and loss of one batch (one forward, one batched backward)."""
        X = X.to(self._device) if isinstance(X, torch.Tensor) else X
        y = y.to(self._device)
        chain = getattr(self, "_chain", None)
        if chain is not None and isinstance(X, torch.Tensor):
            out, records = chain.forward(X)
            f, yy = self._lik.prepare(out, y)
            V = output_factors(self._lik, self.curvature, f, yy, self.n_mc_samples, self.generator)
            chain.backward(V.reshape(V.shape[0], *out.shape))
            with torch.no_grad():
                self.loss = self.loss + self._lik.nll(f, yy)
                self._structure.accumulate(records)
            self.n_data += f.shape[0]
            self.n_outputs = f.shape[1]
            return
        modules = [e.module for e in self.entries]
        last_layer = self.subset_of_weights == "last_layer"
        protect = not last_layer and has_inplace_modules(self.model)
        with Capture(modules, protect_inplace=protect) as cap:
            with torch.no_grad() if last_layer else torch.enable_grad():
                out = self.model(X)
        if not last_layer and cap.modified_inplace():  # a functional in-place op: redo protected
            with Capture(modules, protect_inplace=True) as cap, torch.enable_grad():
                out = self.model(X)
        rec = cap.records[0]
        if last_layer and not (len(rec.calls) == 1 and rec.calls[0].output is out):
            # something follows the last layer: redo the forward with a graph
            with Capture(modules) as cap, torch.enable_grad():
                out = self.model(X)
        f, yy = self._lik.prepare(out, y)
        V = output_factors(self._lik, self.curvature, f, yy, self.n_mc_samples, self.generator)
        cap.backward(out, V.reshape(V.shape[0], *out.shape))
        with torch.no_grad():
            self.loss = self.loss + self._lik.nll(f.detach(), yy)
            self._structure.accumulate(cap.records)
        self.n_data += f.shape[0]
        self.n_outputs = f.shape[1]

    def fit_end(self) -> None:
        """Finalise (e.g. KFAC eigendecompositions) and restore the model's train/eval mode."""
        self._structure.finalize()
        self._fitted = True
        if getattr(self, "_was_training", False):
            self.model.train()

    def _check_fitted(self) -> None:
        if not self._fitted:
            raise RuntimeError("Laplace is not fitted: call fit(train_loader) first")

    # ---- marginal likelihood -------------------------------------------------------------------------
    @property
    def log_likelihood(self) -> torch.Tensor:
        c = self._H_factor
        if self.likelihood == "regression":
            norm = self.n_data * self.n_outputs * torch.log(self.sigma_noise * math.sqrt(2 * math.pi))
            return -c * self.loss - norm
        return -c * self.loss

    @property
    def scatter(self) -> torch.Tensor:
        d = self.mean - self.prior_mean
        return (d * self.prior_precision_diag) @ d

    @property
    def log_det_prior_precision(self) -> torch.Tensor:
        return self.prior_precision_diag.log().sum()

    @property
    def log_det_posterior_precision(self) -> torch.Tensor:
        self._check_fitted()
        return self._structure.logdet(self._H_factor, self._structure_prior)

    def log_marginal_likelihood(self, prior_precision=None, sigma_noise=None) -> torch.Tensor:
        """0-dim Laplace evidence; setting ``prior_precision`` / ``sigma_noise`` (kept as
        attributes, graph preserved) makes it differentiable in them. No data pass."""
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            if self.likelihood != "regression":
                raise ValueError("sigma_noise can only be set for likelihood='regression'")
            self.sigma_noise = sigma_noise
        log_det_ratio = self.log_det_posterior_precision - self.log_det_prior_precision
        return self.log_likelihood - 0.5 * (log_det_ratio + self.scatter)

    # ---- posterior ------------------------------------------------------------------------------------
    @property
    def H(self):
        s = self._structure
        return {"full": lambda: s.H, "diag": lambda: s.h, "kron": lambda: s.blocks,
                "lowrank": lambda: (s.U, s.eigvals)}[s.name]()

    @property
    def posterior_precision(self):
        """full: [P, P]; diag: [P]; kron: the ``KronStructure`` (eigen-blocks; ``.dense_precision``)."""
        self._check_fitted()
        s = self._structure
        if s.name == "kron":
            return s
        return s.precision(self._H_factor, self._structure_prior)

    @property
    def posterior_covariance(self) -> torch.Tensor:
        """full: [P, P] covariance; diag: [P] variances; kron: [P] marginal variances."""
        self._check_fitted()
        if self._structure.name == "full":
            return self._structure.covariance(self._H_factor, self._structure_prior)
        return self.posterior_variance

    @property
    def posterior_variance(self) -> torch.Tensor:
        """[P] marginal posterior variances for every structure."""
        self._check_fitted()
        return self._structure.posterior_variance(self._H_factor, self._structure_prior)

    def functional_variance(self, Js: torch.Tensor) -> torch.Tensor:
        """``J Sigma J^T``: Jacobians ``[N, C, P]`` -> ``[N, C, C]`` (for the GLM predictive)."""
        self._check_fitted()
        return self._structure.functional_variance(Js, self._H_factor, self._structure_prior)

    def sample(self, n_samples: int = 100, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n_samples, P]`` draws from ``N(mean, P^{-1})``."""
        self._check_fitted()
        gen = generator if generator is not None else self.generator
        with torch.no_grad():
            z = self._structure.sample(n_samples, self._H_factor, self._structure_prior, gen)
        return self.mean + z

    def __call__(self, x, pred_type: str = "glm", link_approx: str | None = None, n_samples: int = 100,
                 joint: bool = False, chunk_size: int | None = 256, return_parts: bool = False,
                 generator: torch.Generator | None = None):
        """Predictive at ``x`` ``[B, ...]``: classification -> probabilities ``[B, C]``; regression ->
        ``(mean, var)`` ``[B, O]`` (``joint``: var ``[B, O, O]``; ``return_parts``: a
        ``RegressionPredictive(mean, var, aleatoric, epistemic)``). ``pred_type`` "glm" | "nn" |
        "map"; ``link_approx`` "probit" (default for glm) | "mc" | "bridge" | "bridge_norm".
        See ``laplace_lab.laplace.predictive`` for conventions and differentiability."""
        return predictive.predict(self, x, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples,
                                  joint=joint, chunk_size=chunk_size, return_parts=return_parts,
                                  generator=generator)

    # ---- prior optimisation ---------------------------------------------------------------------------
    def optimize_prior_precision(
        self,
        method: str = "marglik",
        n_steps: int = 100,
        lr: float = 0.1,
        init_prior_prec: float | torch.Tensor | None = None,
        tune_sigma_noise: bool = False,
        val_loader: Iterable | None = None,
        grid: Iterable[float] | None = None,
        pred_type: str = "nn",
        n_samples: int = 100,
    ) -> None:
        """``marglik``: Adam on log prior precision (and log sigma if ``tune_sigma_noise``) for
        ``n_steps`` steps. ``gridsearch``: scalar values in ``grid`` (default ``logspace(-4, 4, 21)``)
        minimising the validation NLL of the predictive on ``val_loader``."""
        self._check_fitted()
        _check_choice("method", method, ("marglik", "gridsearch"))
        if init_prior_prec is not None:
            self.prior_precision = init_prior_prec
        if method == "marglik":
            log_pp = self.prior_precision.detach().clone().log().requires_grad_(True)
            params = [log_pp]
            if tune_sigma_noise:
                if self.likelihood != "regression":
                    raise ValueError("tune_sigma_noise needs likelihood='regression'")
                log_sigma = self.sigma_noise.detach().clone().log().requires_grad_(True)
                params.append(log_sigma)
            opt = torch.optim.Adam(params, lr=lr)
            for _ in range(n_steps):
                opt.zero_grad()
                sigma = log_sigma.exp() if tune_sigma_noise else None
                loss = -self.log_marginal_likelihood(log_pp.exp(), sigma)
                loss.backward()
                opt.step()
            self.prior_precision = log_pp.detach().exp()
            if tune_sigma_noise:
                self.sigma_noise = log_sigma.detach().exp()
            return
        if val_loader is None:
            raise ValueError("method='gridsearch' needs val_loader")
        _check_choice("pred_type", pred_type, ("glm", "nn"))
        grid = list(grid) if grid is not None else torch.logspace(-4, 4, 21).tolist()
        best, best_nll = None, math.inf
        for value in grid:
            self.prior_precision = value
            nll = self._validation_nll(val_loader, pred_type, n_samples)
            if nll < best_nll:
                best, best_nll = value, nll
        self.prior_precision = best

    @torch.no_grad()
    def _validation_nll(self, loader, pred_type: str, n_samples: int) -> float:
        gen = torch.Generator(device=self._device).manual_seed(0)
        total, count = 0.0, 0
        for X, y in loader:
            X, y = X.to(self._device), y.to(self._device)
            if pred_type == "nn":
                out = self._nn_samples(X, n_samples, gen)  # [S, N, ...]
                total += float(self._predictive_nll(out, y, pred_type))
            else:
                out = self(X, pred_type=pred_type, n_samples=n_samples, generator=gen)
                total += float(predictive.predictive_nll(self.likelihood, out, y))
            count += X.shape[0]
        return total / count

    def _nn_samples(self, X, n_samples: int, generator) -> torch.Tensor:
        """Network outputs ``[S, N, C]`` under ``S`` parameter samples (sampled "nn" predictive)."""
        return predictive.nn_samples(self, X, n_samples, generator)

    def _predictive_nll(self, out: torch.Tensor, y: torch.Tensor, pred_type: str) -> torch.Tensor:
        if pred_type != "nn":
            return predictive.predictive_nll(self.likelihood, out, y)
        S = out.shape[0]
        f = out.reshape(S, out.shape[1], -1)
        if self.likelihood == "classification":
            logp = f.log_softmax(-1).gather(-1, y.reshape(1, -1, 1).expand(S, -1, 1).long())[..., 0]
            return -(torch.logsumexp(logp, 0) - math.log(S)).sum()
        if self.likelihood == "regression":
            m, v = f, self.sigma_noise.square().expand_as(f)
        else:
            m, v = torch.vmap(self._lik.mean_var)(f)
        y = y.reshape(1, f.shape[1], -1).to(m.dtype)
        logp = (-0.5 * (y - m).square() / v - 0.5 * torch.log(2 * math.pi * v)).sum(-1)
        return -(torch.logsumexp(logp, 0) - math.log(S)).sum()

    # ---- serialisation ----------------------------------------------------------------------------------
    def _config(self) -> dict:
        return {k: getattr(self, k) for k in _CONFIG_KEYS} | {"n_params": self.n_params}

    def state_dict(self) -> dict:
        self._check_fitted()
        return {
            "config": self._config(),
            "mean": self.mean,
            "prior_precision": self.prior_precision.detach(),
            "prior_mean": self.prior_mean,
            "sigma_noise": self.sigma_noise.detach(),
            "temperature": self.temperature,
            "loss": self.loss,
            "n_data": self.n_data,
            "n_outputs": self.n_outputs,
            "structure": self._structure.state_dict(),
            "linear_offset": self.linear_offset,
        }

    def load_state_dict(self, sd: dict) -> None:
        mine = self._config()
        if sd["config"] != mine:
            diff = {k: (sd["config"].get(k), v) for k, v in mine.items() if sd["config"].get(k) != v}
            raise ValueError(f"state_dict does not match this Laplace object (saved, current): {diff}")
        self.mean = sd["mean"].to(self._device, self._dtype)
        self.prior_precision = sd["prior_precision"]
        self.prior_mean = sd["prior_mean"]
        self.sigma_noise = sd["sigma_noise"]
        self.temperature = sd["temperature"]
        self.loss = sd["loss"].to(self._device, self._dtype)
        self.n_data, self.n_outputs = sd["n_data"], sd["n_outputs"]
        self._structure.load_state_dict(sd["structure"])  # kron re-runs its eigendecompositions
        off = sd.get("linear_offset")
        self.linear_offset = None if off is None else off.to(self._device, self._dtype)
        self._fitted = True
