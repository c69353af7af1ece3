"""The ``Laplace`` object: options, fit (begin / per-batch accumulate / end), marginal likelihood,
prior optimisation, sampling and (de)serialisation. Pure PyTorch.

Conventions (laplace-torch's): ``P = c H + P0`` with ``c = 1 / (sigma^2 T)`` for regression and
``1 / T`` otherwise (``H`` computed with unit noise);
``log p(D | theta) - 1/2 (log det P - log det P0 + (theta - mu0)^T P0 (theta - mu0))``;
classification log likelihood = ``-sum CE / T``; regression = ``-0.5 sum (f - y)^2 c - N C log(sigma sqrt(2 pi))``;
heteroscedastic = ``-sum NLL / T``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, MutableMapping

import torch
from torch import nn

from laplace_lab.laplace import backends, checks, distributed, predictive
from laplace_lab.laplace.backends import backend_names
from laplace_lab.laplace.capture import Streamed
from laplace_lab.laplace.compat_matrix import Kron
from laplace_lab.laplace.hyper import MarglikOptimizer
from laplace_lab.laplace.likelihoods import LIKELIHOODS, get_likelihood
from laplace_lab.laplace.matrix_free import lowrank as _lowrank  # noqa: F401  (registers "lowrank")
from laplace_lab.laplace.options import PRIOR_STRUCTURE_ALIASES, TuningMethod, check_choice
from laplace_lab.laplace.output_factors import CURVATURE_TYPES
from laplace_lab.laplace.plan import (
    DEFAULT_MEMORY_BUDGET,
    check_budget,
    check_fit,
    factor_streaming,
)
from laplace_lab.laplace.precision import engine_numerics
from laplace_lab.laplace.priors import (
    PRIOR_STRUCTURES,
    Prior,
    infer_structure,
    logdet_diag_by_tensor,
)
from laplace_lab.laplace.structures import STRUCTURES, Structure
from laplace_lab.laplace.subset import SUBSETS, select

_CONFIG_KEYS = ("likelihood", "subset_of_weights", "hessian_structure", "curvature",
                "prior_structure", "n_mc_samples")


_check_choice = check_choice


def structure_kwargs(struct_cls, options: dict) -> dict:
    """The constructor keywords of a structure: its declared ``options`` taken from ``options``."""
    unknown = sorted(set(options) - set(struct_cls.options))
    if unknown:
        raise ValueError(f"structure_options {unknown} are not options of hessian_structure={struct_cls.name!r}; "
                         f"allowed: {list(struct_cls.options)}")
    return {k: options[k] for k in struct_cls.options if k in options}


def real_tensor(option: str, value, dtype) -> torch.Tensor:
    """``value`` (a real number or a 0-/1-d real tensor) as a tensor; anything else is a ``ValueError``
    naming ``option`` (laplace-torch's rule: ``[1, 1]`` or strings are rejected)."""
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        t = torch.as_tensor(value, dtype=dtype)
    else:
        raise ValueError(f"{option} must be a real number or a 0-/1-d tensor; got {type(value).__name__}")
    if t.ndim > 1 or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{option} must be a real number or a 0-/1-d tensor; got shape {tuple(t.shape)}")
    return t


def check_backend(backend) -> str:
    """The curvature-collection backend: one of ``backends.backend_names()`` ("auto", "chain",
    "capture", "lanczos"); ``None`` is "auto". laplace-torch's values (a curvature name, a marker
    class such as ``CurvlinopsGGN``) are translated by ``compat.Engine`` and the compat flavours."""
    if backend is None:
        return "auto"
    if not (isinstance(backend, str) and backend in backend_names()):
        raise ValueError(f"backend must be one of {backend_names()}; got {backend!r} (laplace-torch's backend "
                         "values, a curvature name or a marker class such as CurvlinopsGGN, are taken by "
                         "laplace_lab.laplace.compat)")
    return backend


class _BoundKwargs:
    """Swaps ``la.model`` for a module calling it with fixed keyword arguments, for one predictive call."""

    def __init__(self, la, kwargs: dict):
        self.la, self.kwargs = la, kwargs

    def __enter__(self):
        if self.kwargs:
            self.model = self.la.model
            self.la.model = _WithKwargs(self.model, self.kwargs)

    def __exit__(self, *exc):
        if self.kwargs:
            self.la.model = self.model


class _WithKwargs(nn.Module):
    def __init__(self, model: nn.Module, kwargs: dict):
        super().__init__()
        self.inner, self.kwargs = model, kwargs

    def forward(self, x):
        return self.inner(x, **self.kwargs)


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
        backend: curvature collection (``backends``): "auto" (default; the graph-free chain for plain
            sequential nets, else "capture"), "chain", "capture", "lanczos" (lowrank).
        structure_options: the structure's declared options (the fields of its ``Options``, with
            their defaults and allowed values), e.g. kron's ``kfac_approx`` (``options.KfacApprox``).
        memory_budget: fraction in (0, 1] of the available memory (``plan.available_memory``: free
            CUDA memory, or ``MemAvailable``) that ``fit`` and the glm predictive may plan to use
            (default ``plan.DEFAULT_MEMORY_BUDGET`` = 0.9); ``fit`` raises ``plan.MemoryPlanError``
            before allocating when the structure's planned peak (``laplace.plan``) exceeds it, naming
            the alternatives that fit, and the predictive lowers ``chunk_size`` to what fits. On CUDA
            the capture backend streams the output factors only when holding them all would exceed
            it (``factor_streaming``; on the CPU by a fixed size, ``backends.capture.stream_factors``).
            ``None``: no plan, no check, the fixed streaming rule.
        process_group: fit across processes (``laplace.distributed``): "auto" (default) sums every
            rank's shard once ``torch.distributed`` is initialised with more than one process; ``None``
            fits this process's data alone; or a ``torch.distributed.ProcessGroup``.
        **options: the structure's declared ``options`` as keywords too, e.g. lowrank's
            ``n_eigs=`` (``structure_options`` wins); a keyword no argument and no option of the
            structure takes is a ``TypeError``.

    Attributes after ``fit``: ``mean`` [P], ``n_data``, ``n_outputs``, ``loss`` (summed NLL, unit
    noise), ``prior_precision`` ([1] / [n_layers] / [P]), ``sigma_noise`` (0-dim),
    ``n_params``, ``n_layers``, ``H`` (full: [P, P]; diag: [P]; kron: list of blocks, see
    ``structures.kron``), ``posterior_precision`` (full: [P, P]; diag: [P]; kron: the
    ``KronStructure`` whose ``blocks`` hold eigenbases / eigenvalues), ``posterior_covariance``
    (full: [P, P]; diag: [P] variances; kron: use ``functional_variance`` / ``posterior_variance``).
    """

    dict_key_y = "labels"  # where a dict batch holds its targets (``unpack_batch``; compat.Engine sets it)

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
        structure_options: dict | None = None,
        prior_groups: torch.Tensor | None = None,
        example_input: torch.Tensor | None = None,
        backend: str | None = None,
        memory_budget: float | None = DEFAULT_MEMORY_BUDGET,
        process_group="auto",
        **options,
    ):
        likelihood = _check_choice("likelihood", likelihood, LIKELIHOODS)
        curvature = _check_choice("curvature", curvature, CURVATURE_TYPES)
        self.backend_name = check_backend(backend)
        self.process_group = distributed.check_process_group(process_group)
        self.memory_budget = check_budget(memory_budget)
        self.memory_plan = None  # plan.MemoryPlan of the last fit's check
        # the capture backend streams this fit's output factors (plan.factor_streaming: decided from the
        # plan of the first batch on CUDA with a memory_budget); None: backends.capture's constant rule
        self.factor_streaming = None
        self._streaming_decided = False
        subset_of_weights = _check_choice("subset_of_weights", subset_of_weights, SUBSETS)
        hessian_structure = _check_choice("hessian_structure", hessian_structure, tuple(STRUCTURES))
        declared = STRUCTURES[hessian_structure].options
        if set(options) - set(declared):
            raise TypeError(f"Laplace() got unexpected keyword arguments {sorted(set(options) - set(declared))}; "
                            f"the options of hessian_structure={hessian_structure!r}: {list(declared)} "
                            "(laplace-torch's further keywords: laplace_lab.laplace.compat.Engine)")
        structure_options = {**options, **(structure_options or {})}
        STRUCTURES[hessian_structure].check_options(structure_options)
        if not (isinstance(n_mc_samples, int) and n_mc_samples >= 1):
            raise ValueError(f"n_mc_samples must be a positive int; got {n_mc_samples!r}")
        temperature = checks.temperature(temperature)
        self.model = model
        self.likelihood = likelihood  # also sets the likelihood object ``lik``
        self.subset_of_weights = subset_of_weights
        self.hessian_structure = hessian_structure
        self.curvature = curvature
        self.n_mc_samples = n_mc_samples
        self.temperature = float(temperature)

        p0 = checks.first_parameter(model)
        self._device, self._dtype = p0.device, p0.dtype
        self.entries = select(model, subset_of_weights, last_layer_name)
        self.params = [p for e in self.entries for p in e.params]
        self.n_layers = len(self.params)
        self.n_params = sum(p.numel() for p in self.params)
        self._sizes = [p.numel() for p in self.params]

        prior_precision = real_tensor("prior_precision", prior_precision, self._dtype)
        if prior_structure is not None:
            prior_structure = PRIOR_STRUCTURE_ALIASES.get(prior_structure, prior_structure)
        if prior_structure is None:
            prior_structure = infer_structure(prior_precision, self.n_layers, self.n_params)
        _check_choice("prior_structure", prior_structure, PRIOR_STRUCTURES)
        struct_cls = STRUCTURES[hessian_structure]
        if prior_groups is not None:
            prior_groups = torch.as_tensor(prior_groups, dtype=torch.long).to(self._device)
        self.prior = Prior.for_model(prior_structure, model, self.params, prior_groups, example_input)  # priors.Prior
        if self.prior.expanded_structure not in struct_cls.prior_structures:
            raise ValueError(
                f"prior_structure={prior_structure!r} is not supported with "
                f"hessian_structure={hessian_structure!r}; allowed: {struct_cls.prior_structures}"
            )
        self.prior_precision = prior_precision
        self.prior_mean = prior_mean
        if likelihood != "regression" and float(real_tensor("sigma_noise", sigma_noise, self._dtype).detach().reshape(-1)[0]) != 1.0:
            raise ValueError(f"sigma_noise must be 1 for likelihood={likelihood!r}; got {sigma_noise!r}")
        self.sigma_noise = sigma_noise

        if generator is None and seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(seed)
        self.generator = generator
        self._structure = struct_cls(self.entries, self._device, self._dtype,
                                     **structure_kwargs(struct_cls, structure_options or {}))
        self.mean = self.prior_mean.expand(self.n_params).clone()  # laplace-torch: the prior mean until fit
        self.linear_offset = None  # [P] theta* - theta_hat once linear_mode.fit_linear_mode ran
        self.loss = torch.zeros((), device=self._device, dtype=self._dtype)
        self.n_data = 0
        self.n_outputs = None
        self._fitted = False
        self._backend = None  # the backends.Backend the last fit_begin chose
        self.batch_checks = checks.BatchChecks()
        backends.check_structure(self, self.backend_name)  # the model itself is checked by fit_begin (eval mode)

    # ---- hyperparameters ------------------------------------------------------------------------
    @property
    def likelihood(self) -> str:
        return self._likelihood

    @likelihood.setter
    def likelihood(self, value: str) -> None:
        """Settable after ``fit`` as in laplace-torch (the curvature is kept; ``sigma_noise`` scales it)."""
        value = _check_choice("likelihood", value, LIKELIHOODS)
        self._likelihood, self._lik = value, get_likelihood(value)

    @property
    def prior_precision(self) -> torch.Tensor:
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value) -> None:
        value = real_tensor("prior_precision", value, self._dtype)
        self._prior_precision = self.prior.vector(value, device=self._device, dtype=self._dtype)
        checks.positive_finite("prior_precision", self._prior_precision)

    @property
    def prior_structure(self) -> str:
        return self.prior.structure

    @prior_structure.setter
    def prior_structure(self, value: str) -> None:
        """Switch the prior's structure (normgroups keeps its groups); set ``prior_precision`` next."""
        groups = self.prior.groups if value == "normgroups" else None
        self.prior = Prior(value, self._sizes, groups)

    @property
    def prior_groups(self) -> torch.Tensor | None:
        """normgroups: ``[n_layers]`` group index of every parameter tensor; else ``None``."""
        return self.prior.groups

    @property
    def n_groups(self) -> int | None:
        return self.prior.n_groups

    # ---- read-only views for other modules (no one reads the underscored attributes) --------------------
    @property
    def structure(self):
        """The posterior-structure object (``structures.base`` protocol)."""
        return self._structure

    @property
    def backend(self) -> str:
        """The curvature-collection backend option (``backend_name``: "auto", "chain", ...). The
        laplace-torch flavour classes of ``compat`` show their Jacobian view under this name instead;
        the engine itself reads ``backend_name``."""
        return self.backend_name

    @property
    def lik(self):
        """The likelihood object (``likelihoods``)."""
        return self._lik

    @property
    def sizes(self) -> list[int]:
        """Numel of every parameter tensor of the subset, in subset order."""
        return list(self._sizes)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def fitted(self) -> bool:
        return self._fitted

    @property
    def chain(self):
        """The ``chain.Chain`` of the last ``fit_begin`` (``None``: another backend collects curvature)."""
        return getattr(self._backend, "chain", None)

    def check_fitted(self) -> None:
        """``RuntimeError`` unless ``fit`` (or ``load_state_dict``) ran."""
        self._check_fitted()

    @property
    def structure_prior(self) -> torch.Tensor:
        return self._structure_prior

    @property
    def _structure_prior(self) -> torch.Tensor:
        """The prior as the structures take it: ``prior_precision``, or for "normgroups" its
        ``[n_layers]`` per-tensor expansion (graph preserved)."""
        return self.prior.structure_form(self.prior_precision)

    @property
    def prior_precision_diag(self) -> torch.Tensor:
        """``[P]`` per-parameter prior precision."""
        return self.prior.per_parameter(self.prior_precision)

    @property
    def prior_mean(self) -> torch.Tensor:
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, value) -> None:
        t = real_tensor("prior_mean", value, self._dtype).to(device=self._device, dtype=self._dtype).reshape(-1)
        if t.numel() not in (1, self.n_params):
            raise ValueError(f"prior_mean must be a float or have n_params={self.n_params} entries")
        self._prior_mean = checks.finite("prior_mean", t)

    @property
    def sigma_noise(self) -> torch.Tensor:
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value) -> None:
        t = real_tensor("sigma_noise", value, self._dtype)
        if t.numel() != 1:
            raise ValueError("sigma_noise must be a scalar (homoscedastic noise)")
        self._sigma_noise = checks.positive_finite("sigma_noise", t.to(device=self._device, dtype=self._dtype).reshape(()))

    @property
    def H_factor(self) -> torch.Tensor:
        """Curvature scale ``c = 1 / (sigma^2 T)`` (``sigma_noise`` is 1 unless the likelihood was
        constructed as regression; as laplace-torch, a likelihood changed after ``fit`` keeps it)."""
        return 1.0 / (self.sigma_noise.square() * self.temperature)

    _H_factor = H_factor  # the name used inside the engine

    # ---- fitting ----------------------------------------------------------------------------------
    @engine_numerics
    def fit(self, train_loader: Iterable, override: bool = True, progress_bar: bool = False) -> None:
        """One pass over ``train_loader`` (yields ``(X, y)`` or a dict batch with ``dict_key_y`` holding the
        targets, the whole dict being the model input): ``fit_begin``, ``fit_batch``, ``fit_end``."""
        if distributed.fit_group(self) is not None:
            distributed.check_shard_loader(train_loader)
        total = len(train_loader) if hasattr(train_loader, "__len__") else None
        train_loader = self._check_memory(train_loader)
        if progress_bar:
            from tqdm.auto import tqdm
            train_loader = tqdm(train_loader, desc="Laplace fit", total=total)
        if self._structure.self_fitting:  # e.g. lowrank: loss pass + Lanczos (matrix_free.lowrank)
            if not override:
                raise ValueError(f"override=False is not supported with hessian_structure={self.hessian_structure!r}")
            self.fit_begin()
            group = distributed.fit_group(self)
            if group is not None:  # before the structure's first collective (its operator's products)
                distributed.check_agreement(self, group)
            self.loss, self.n_data, self.n_outputs = self._structure.fit(self, train_loader)
            checks.data_seen(self)
            return self.fit_end()
        self.fit_begin(override=override)
        if self.memory_plan is not None and self.memory_budget is not None:  # _check_memory's plan of batch 1
            self.factor_streaming, self._streaming_decided = factor_streaming(self, memory_plan=self.memory_plan), True
        for batch in train_loader:
            self.fit_batch(*self.unpack_batch(batch))
        checks.data_seen(self)
        self.fit_end()

    def _check_memory(self, train_loader: Iterable) -> Iterable:
        """``plan.check_fit`` on the loader's first batch (``memory_budget``; ``MemoryPlanError`` before
        any allocation); returns an iterable that still yields every batch once (a one-shot iterator is
        chained behind its first batch; a re-iterable loader is left as it is)."""
        if self.memory_budget is None:
            return train_loader
        it = iter(train_loader)
        try:
            first = next(it)
        except StopIteration:
            return train_loader
        if it is train_loader or not self._structure.self_fitting:
            train_loader = itertools.chain([first], it)
        X, _ = self.unpack_batch(first)
        self.memory_plan = check_fit(self, X, self.memory_budget)
        return train_loader

    def unpack_batch(self, batch) -> tuple:
        """``(X, y)`` of a loader batch: a pair, or a mapping (model input = the mapping, targets =
        ``batch[dict_key_y]``, Hugging Face style)."""
        if isinstance(batch, MutableMapping):
            if self.dict_key_y not in batch:
                raise KeyError(f"dict batch has no targets under dict_key_y={self.dict_key_y!r}; "
                                 f"keys: {sorted(batch)}")
            return batch, batch[self.dict_key_y]
        X, y = batch
        return X, y

    def reset_accumulators(self) -> None:
        """Empty curvature, loss and ``n_data``; the object counts as not fitted until ``fit_end``.
        (Used by ``fit_begin`` and by the fused training-step hooks, which leave the model's mode alone.)"""
        self._structure.reset()
        self.loss = torch.zeros((), device=self._device, dtype=self._dtype)
        self.n_data = 0
        self._fitted = False
        self.batch_checks = checks.BatchChecks()  # per-batch NaN / target counts, read once by fit_end

    def fit_begin(self, override: bool = True) -> None:
        """Reset the accumulators (``override``), switch the model to eval mode, store the mean."""
        distributed.check_reducible(self)
        if not override and distributed.fit_group(self) is not None:
            raise ValueError("override=False with a process group would add the earlier (already summed) fit "
                             "once per rank; fit all shards in one fit, or pass process_group=None")
        if override:
            self.reset_accumulators()
        self._was_training = self.model.training
        self.model.eval()
        self.mean = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.linear_offset = None
        self.factor_streaming, self._streaming_decided = None, False  # decided on the first batch
        # the curvature-collection backend (backends/: "auto" = the chain for plain sequential nets, else
        # the autograd capture); self-fitting structures make their own data pass
        try:
            self._backend = backends.choose(self, self.backend_name)
        except ValueError:
            self.model.train(self._was_training)
            raise

    @engine_numerics
    def fit_batch(self, X, y) -> None:
        """Accumulate curvature and loss of one batch (one forward, one batched backward)."""
        if self._backend is None:
            if self._structure.self_fitting:
                raise ValueError(f"hessian_structure={self.hessian_structure!r} makes its own data pass: call "
                                 "fit(train_loader); fit_begin/fit_batch/fit_end are not supported")
            self._backend = backends.choose(self, self.backend_name)  # fit_batch without fit_begin, as before
        X = X.to(self._device) if isinstance(X, torch.Tensor) else X
        self.batch_checks.inputs(X)
        if not self._streaming_decided:
            self.factor_streaming, self._streaming_decided = factor_streaming(self, X), True
        f, yy, records = self._backend.batch(X, y.to(self._device))
        self.add_batch(f, yy, records)

    def add_batch(self, f: torch.Tensor, y: torch.Tensor, records=None) -> None:
        """Add one batch collected by a backend (or by ``fused.FusedCurvature``): outputs ``f`` ``[N, C]``
        and prepared targets ``y`` (the loss and counts), and, unless ``None``, the per-entry
        ``records`` with output gradients (the structure's curvature), or a ``capture.Streamed`` batch
        (accumulated group by group during its backward)."""
        self.batch_checks.outputs(f, y)
        with torch.no_grad():
            self.loss = self.loss + self._lik.nll(f.detach(), y).to(self._dtype)
            if isinstance(records, Streamed):  # accumulated during the backward, the inputs counted once
                records.run(lambda part, first: self._structure.accumulate(part, inputs=first))
            elif records is not None:
                self._structure.accumulate(records)
        self.n_data += f.shape[0]
        self.n_outputs = f.shape[1]

    def check_targets(self, out: torch.Tensor, y: torch.Tensor) -> None:
        """Regression targets must have the network output's shape (laplace-torch: ``[N]`` targets for
        ``[N, 1]`` outputs are rejected, not broadcast); classification targets must be class indices ``[N]``."""
        checks.model_output(out)
        if self.likelihood == "classification":
            self.batch_checks.class_targets(out, y)
        if self.likelihood == "regression" and tuple(y.shape) != tuple(out.shape):
            raise ValueError(f"regression targets y must have the shape of the model output; got y "
                             f"{tuple(y.shape)} for output {tuple(out.shape)} (reshape y, e.g. y[:, None])")

    @engine_numerics
    def fit_end(self) -> None:
        """Across processes (``process_group``), sum the ranks' shards (``distributed.reduce_fit``);
        finalise (e.g. KFAC eigendecompositions) and restore the model's train/eval mode. ``ValueError``
        (``checks.fit_complete``) for an empty fit, non-finite inputs / outputs / targets / curvature
        (after the reduction: every rank judges the summed fit)."""
        group = distributed.fit_group(self)
        if group is not None:
            try:
                distributed.check_reducible(self)
                distributed.reduce_fit(self, group)
            except Exception:
                self.model.train(getattr(self, "_was_training", self.model.training))
                raise
        checks.fit_complete(self)
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

    @property
    def log_det_ratio(self) -> torch.Tensor:
        """log|posterior precision| - log|prior precision| (the Occam factor's determinant; laplace-torch's name)."""
        return self.log_det_posterior_precision - self.log_det_prior_precision

    def log_det_ratio_by_tensor(self) -> dict[str, torch.Tensor]:
        """``log_det_ratio`` split by parameter tensor: ``{parameter name: 0-dim}``, summing to it, for
        structures whose posterior precision is block-diagonal over the tensors (kron, diag): which
        layers carry the Occam term."""
        self._check_fitted()
        parts = self._structure.logdet_by_tensor(self._H_factor, self._structure_prior)
        if parts is None:
            split = [n for n, cls in STRUCTURES.items() if cls.logdet_by_tensor is not Structure.logdet_by_tensor]
            raise ValueError(f"hessian_structure={self.hessian_structure!r} couples the parameter tensors, so its "
                             f"log det does not split by tensor; structures that split: {split}")
        prior = logdet_diag_by_tensor(self.prior_precision_diag, self._structure.sizes)
        names = {id(p): n for n, p in self.model.named_parameters()}
        return {names[id(p)]: v for p, v in zip(self.params, parts - prior)}  # self.params: the structure's order

    def log_marginal_likelihood(self, prior_precision=None, sigma_noise=None) -> torch.Tensor:
        """0-dim Laplace evidence; setting ``prior_precision`` / ``sigma_noise`` (kept as
        attributes, graph preserved) makes it differentiable in them. No data pass."""
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            if self.likelihood != "regression":
                raise ValueError("sigma_noise can only be set for likelihood='regression'")
            self.sigma_noise = sigma_noise
        return self.log_marginal_likelihood_from_terms(self.log_marginal_likelihood_terms())

    @staticmethod
    def log_marginal_likelihood_from_terms(terms: dict[str, torch.Tensor]) -> torch.Tensor:
        """The evidence from ``log_marginal_likelihood_terms()`` (for callers that record both: one log det)."""
        return terms["log_lik"] - 0.5 * (terms["log_det_ratio"] + terms["scatter"])

    def log_marginal_likelihood_terms(self) -> dict[str, torch.Tensor]:
        """The evidence's three 0-dim terms at the current prior and noise, with
        ``log marglik = log_lik - 0.5 * (log_det_ratio + scatter)``: ``log_lik`` the (tempered)
        training log likelihood at the mean, ``log_det_ratio`` = log|posterior precision| -
        log|prior precision| and ``scatter`` = (mean - prior_mean)^T prior precision (mean - prior_mean);
        -0.5 (log_det_ratio + scatter) is the Occam term that model selection trades against the fit."""
        return {"log_lik": self.log_likelihood,
                "log_det_ratio": self.log_det_ratio,
                "scatter": self.scatter}

    # ---- posterior ------------------------------------------------------------------------------------
    @property
    def H(self):
        """The curvature in the structure's form (full: [P, P]; diag: [P]; kron: typed blocks; lowrank: (U, eigvals))."""
        return self._structure.H

    @property
    def posterior_precision(self):
        """full: [P, P]; diag: [P]; kron: a ``KronPrecision`` view (``to_matrix(exponent)``, ``logdet()``)."""
        self._check_fitted()
        return self._structure.precision(self._H_factor, self._structure_prior)

    @property
    def posterior_covariance(self) -> torch.Tensor:
        """full: [P, P] covariance; diag: [P] variances; kron: [P] marginal variances."""
        self._check_fitted()
        return self._structure.covariance(self._H_factor, self._structure_prior)

    @property
    def posterior_variance(self) -> torch.Tensor:
        """[P] marginal posterior variances for every structure."""
        self._check_fitted()
        return self._structure.posterior_variance(self._H_factor, self._structure_prior)

    @engine_numerics
    def functional_variance(self, Js: torch.Tensor) -> torch.Tensor:
        """``J Sigma J^T``: Jacobians ``[N, C, P]`` -> ``[N, C, C]`` (for the GLM predictive)."""
        self._check_fitted()
        return self._structure.functional_variance(Js, self._H_factor, self._structure_prior)

    def functional_covariance(self, Js: torch.Tensor) -> torch.Tensor:
        """Joint ``J Sigma J^T`` across inputs and outputs: Jacobians ``[N, C, P]`` -> ``[N C, N C]``."""
        N, C, P = Js.shape
        return self.functional_variance(Js.reshape(1, N * C, P))[0]

    def jacobians(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense per-input Jacobians of the network outputs w.r.t. the subset: ``(Js [B, C, P], f [B, C])``
        (``torch.func``; memory ``B C P``, for small models and tests; the predictive never forms them)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        keys = [names[id(p)] for p in self.params]
        theta = tuple(p.detach() for p in self.params)

        def out(ps, xi):
            return torch.func.functional_call(self.model, dict(zip(keys, ps)), (xi[None],), strict=False).reshape(-1)

        was_training = self.model.training
        self.model.eval()
        try:
            jac = torch.func.vmap(torch.func.jacrev(out), in_dims=(None, 0))(theta, x)
            with torch.no_grad():
                f = self.model(x).reshape(x.shape[0], -1)
        finally:
            self.model.train(was_training)
        return torch.cat([j.reshape(*j.shape[:2], -1) for j in jac], -1), f

    @engine_numerics
    def functional_samples(self, x, pred_type: str = "glm", n_samples: int = 100, diagonal_output: bool = False,
                           generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n_samples, B, C]`` draws of the network output ``f(x)`` under the posterior: "glm" from
        ``N(f_mean, J Sigma J^T)`` (``diagonal_output``: independent outputs), "nn" the network at
        weight draws. No likelihood applied."""
        pred_type = _check_choice("pred_type", pred_type, ("glm", "nn"))
        gen = generator if generator is not None else self.generator
        if pred_type == "nn":
            return predictive.nn_samples(self, x, n_samples, gen)
        f, fvar = predictive.glm_moments(self, x, diag=diagonal_output)
        if diagonal_output:
            eps = torch.randn(n_samples, *f.shape, generator=gen, device=f.device, dtype=f.dtype)
            return f + fvar.sqrt() * eps
        return predictive.mvn_samples(f, fvar, n_samples, gen)

    @engine_numerics
    def predictive_samples(self, x, pred_type: str = "glm", n_samples: int = 100, diagonal_output: bool = False,
                           generator: torch.Generator | None = None) -> torch.Tensor:
        """``functional_samples`` with the inverse link applied: softmax probabilities ``[S, B, C]`` for
        classification, the network outputs otherwise."""
        fs = self.functional_samples(x, pred_type, n_samples, diagonal_output, generator)
        return torch.softmax(fs, -1) if self.likelihood == "classification" else fs

    def log_prob(self, value: torch.Tensor, normalized: bool = True) -> torch.Tensor:
        """Log density of the Gaussian posterior ``N(mean, P^{-1})`` at ``value`` ``[P]`` (0-dim);
        ``normalized=False`` drops the log det and ``2 pi`` terms. Before ``fit``: the prior
        ``N(prior_mean, diag(prior_precision)^{-1})`` (laplace-torch)."""
        if not self._fitted:
            p0 = self.prior_precision_diag
            out = -0.5 * ((value - self.prior_mean).square() * p0).sum()
            return out + 0.5 * (p0.log().sum() - self.n_params * math.log(2 * math.pi)) if normalized else out
        d = value - self.mean
        out = -0.5 * self._structure.square_norm(d, self._H_factor, self._structure_prior)
        if normalized:
            out = out + 0.5 * (self.log_det_posterior_precision - self.n_params * math.log(2 * math.pi))
        return out

    @property
    def H_facs(self):
        """kron: the un-decomposed curvature factors, per parameter tensor ``[G, A]`` (weights of Linear /
        Conv layers, ``H ~= G (x) A``), ``[G]`` (their biases) or ``[h]`` (diagonal blocks), as a
        ``compat_matrix.Kron`` list (laplace-torch's ``to_matrix()``, ``clone()``)."""
        return Kron(self._structure.factors)

    def sample(self, n_samples: int = 100, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[n_samples, P]`` draws from ``N(mean, P^{-1})``."""
        self._check_fitted()
        gen = generator if generator is not None else self.generator
        with torch.no_grad():
            z = self._structure.sample(n_samples, self._H_factor, self._structure_prior, gen)
        return self.mean + z

    @engine_numerics
    def __call__(self, x, pred_type: str = "glm", joint: bool = False, link_approx: str | None = "probit",
                 n_samples: int = 100, diagonal_output: bool = False, generator: torch.Generator | None = None,
                 fitting: bool = False, *, joint_outputs: bool = False, return_parts: bool = False,
                 chunk_size: int | None = 256, het_approx: str = "mean", **model_kwargs):
        """Predictive at ``x`` ``[B, ...]`` (laplace-torch's argument order and return conventions).

        - classification: probabilities ``[B, C]``.
        - regression: ``(f_mean [B, C], f_var)``, the *functional* (co)variance without the observation
          noise (add ``sigma_noise**2`` for the predictive of ``y``): ``[B, C, C]``, or ``[B, C]`` with
          ``diagonal_output`` (glm) or ``pred_type="nn"`` (sample variance).
        - heteroscedastic regression: ``(mean [B, D], var [B, D])`` of ``y`` (input-dependent noise included).
        - ``return_parts`` (regression likelihoods): ``RegressionPredictive(mean, var, aleatoric, epistemic)``
          with ``var = aleatoric + epistemic``, ``[B, D]`` or ``[B, D, D]`` with ``joint_outputs``.

        ``pred_type`` "glm" | "nn" | "map"; ``link_approx`` "probit" (default) | "mc" | "bridge" |
        "bridge_norm" (``None``: probit for "glm", mc for "nn"); "nn" samples the network, so as in
        laplace-torch it needs ``link_approx="mc"`` (the default "probit" raises). ``joint=True`` (regression glm): ``(f_mean [B C], covariance [B C, B C])`` across all
        inputs (dense Jacobians: small models).
        ``model_kwargs`` are passed to the model's forward. ``chunk_size``: inputs per forward/backward.
        ``het_approx`` (heteroscedastic glm): "mean" linearises the predictive mean in both natural
        parameters, "natural" eta1 alone with eta2 at the MAP (Immer et al. 2023's reported predictive).
        See ``laplace_lab.laplace.predictive`` for conventions and differentiability."""
        checks.finite_inputs("x", x)
        if joint:  # laplace-torch: the GP-like covariance across all inputs and outputs
            if self.likelihood != "regression" or pred_type != "glm" or return_parts:
                raise ValueError("joint=True (covariance across the inputs of x) needs likelihood='regression' "
                                 f"and pred_type='glm'; got {self.likelihood!r}, {pred_type!r}")
            with self._model_kwargs(model_kwargs):
                f = predictive.glm_moments(self, x, diag=True, chunk_size=chunk_size)[0]
                Js, _ = self.jacobians(x)
            return f.reshape(-1), self.functional_covariance(Js)
        predictive.check_nn_link(pred_type, link_approx)
        if fitting:
            raise ValueError("fitting=True is laplace-torch's reward-modelling switch; likelihood "
                             "'reward_modeling' is not supported")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator; got {type(generator).__name__}")
        plain_regression = self.likelihood == "regression" and not return_parts
        with self._model_kwargs(model_kwargs):
            out = predictive.predict(
                self, x, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples,
                joint=(joint_outputs or (plain_regression and not diagonal_output)) and pred_type != "nn",
                chunk_size=chunk_size, return_parts=return_parts or plain_regression, generator=generator,
                het_approx=het_approx)
        if plain_regression:
            return out.mean, out.epistemic
        return out

    def _model_kwargs(self, model_kwargs: dict):
        """Context: ``self.model`` called with ``model_kwargs`` (hooks on its modules stay in place)."""
        return _BoundKwargs(self, model_kwargs)

    # ---- prior optimisation ---------------------------------------------------------------------------
    def optimize_prior_precision(
        self,
        pred_type: str = "glm",
        method: str = "marglik",
        n_steps: int = 100,
        lr: float = 0.1,
        init_prior_prec: float | torch.Tensor | None = None,
        prior_structure: str | None = None,
        val_loader: Iterable | None = None,
        loss=None,
        log_prior_prec_min: float = -4,
        log_prior_prec_max: float = 4,
        grid_size: int = 100,
        link_approx: str | None = None,
        n_samples: int = 100,
        verbose: bool = False,
        progress_bar: bool = False,
        *,
        tune_sigma_noise: bool = False,
        grid: Iterable[float] | None = None,
    ) -> None:
        """laplace-torch's signature. ``marglik``: Adam on the log prior precision (and log sigma if
        ``tune_sigma_noise``) for ``n_steps`` steps. ``gridsearch``: scalar precisions ``grid`` (default
        ``logspace(log_prior_prec_min, log_prior_prec_max, grid_size)``) minimising the validation NLL of
        the ``pred_type`` predictive (``link_approx``, ``n_samples``) on ``val_loader``.
        ``init_prior_prec``: start value (default: the current prior precision, see
        docs/laplace_torch_compat.md); ``prior_structure``: switch the prior's shape first."""
        self._check_fitted()
        method = _check_choice("method", method, TuningMethod.values())
        pred_type = _check_choice("pred_type", pred_type, ("glm", "nn"))
        if loss is not None:
            raise ValueError("loss: only the default (validation NLL of the predictive) is supported; got "
                             f"{loss!r}")
        if not (isinstance(grid_size, int) and grid_size >= 1):
            raise ValueError(f"grid_size must be a positive int; got {grid_size!r}")
        if prior_structure is not None:
            self._switch_prior_structure(prior_structure)
        if init_prior_prec is not None:
            self.prior_precision = init_prior_prec
        steps = range(n_steps)
        if progress_bar:
            from tqdm.auto import trange
            steps = trange(n_steps, desc="prior precision")
        if method == "marglik":  # the one marglik optimiser (laplace.hyper), unbounded as laplace-torch's
            if tune_sigma_noise and self.likelihood != "regression":
                raise ValueError("tune_sigma_noise needs likelihood='regression'")
            hyper = MarglikOptimizer(self.prior_precision.detach().log(),
                                     self.sigma_noise.detach().log() if tune_sigma_noise else None, lr=lr)
            hyper.run(self, steps)
            self.prior_precision = hyper.log_prior.detach().exp()
            if tune_sigma_noise:
                self.sigma_noise = hyper.log_sigma.detach().exp()
            if verbose:
                print(f"optimize_prior_precision: prior precision {self.prior_precision.tolist()}")
            return
        if val_loader is None:
            raise ValueError("method='gridsearch' needs val_loader")
        if grid is None:
            grid = torch.logspace(log_prior_prec_min, log_prior_prec_max, grid_size).tolist()
        best, best_nll = None, math.inf
        for value in list(grid):
            self.prior_precision = value
            nll = self._validation_nll(val_loader, pred_type, n_samples, link_approx)
            if verbose:
                print(f"optimize_prior_precision: prior precision {value:.4g} -> validation NLL {nll:.4f}")
            if nll < best_nll:
                best, best_nll = value, nll
        self.prior_precision = best

    def _switch_prior_structure(self, prior_structure: str) -> None:
        prior_structure = PRIOR_STRUCTURE_ALIASES.get(str(prior_structure), str(prior_structure))
        allowed = tuple(p for p in self._structure.prior_structures if p in PRIOR_STRUCTURES)
        if prior_structure == self.prior_structure:
            return
        _check_choice("prior_structure", prior_structure, allowed)
        value = self.prior_precision_diag if prior_structure == "diagonal" else self.prior_precision.mean()
        self.prior_structure = prior_structure
        self.prior_precision = value.detach()

    @torch.no_grad()
    def _validation_nll(self, loader, pred_type: str, n_samples: int, link_approx: str | None = None) -> float:
        gen = torch.Generator(device=self._device).manual_seed(0)
        total, count = 0.0, 0
        for X, y in loader:
            X, y = X.to(self._device), y.to(self._device)
            if pred_type == "nn":
                out = self._nn_samples(X, n_samples, gen)  # [S, N, ...]
                total += float(self._predictive_nll(out, y, pred_type))
            else:
                out = self(X, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples, generator=gen,
                           return_parts=self.likelihood != "classification")  # regression: var incl. noise
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
        """A flat dict (laplace-torch's convention: values are tensors, numbers, strings, lists or
        ``None``): the configuration keys, the fitted quantities and the structure's entries under
        ``"structure.<key>"``."""
        self._check_fitted()
        return {
            **self._config(),
            **{f"structure.{k}": v for k, v in self._structure.state_dict().items()},
            "mean": self.mean,
            "prior_precision": self.prior_precision.detach(),
            "prior_mean": self.prior_mean,
            "sigma_noise": self.sigma_noise.detach(),
            "temperature": self.temperature,
            "loss": self.loss,
            "n_data": self.n_data,
            "n_outputs": self.n_outputs,
            "linear_offset": self.linear_offset,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Loads ``state_dict()``'s flat dict (or the earlier nested one with ``"config"`` and
        ``"structure"`` sub-dicts)."""
        mine = self._config()
        saved = sd["config"] if "config" in sd else {k: sd.get(k) for k in mine}
        structure = sd["structure"] if "structure" in sd else {
            k[len("structure."):]: v for k, v in sd.items() if k.startswith("structure.")}
        if saved != mine:
            diff = {k: (saved.get(k), v) for k, v in mine.items() if saved.get(k) != v}
            raise ValueError(f"state_dict does not match this Laplace object (saved, current): {diff}")
        self.mean = sd["mean"].to(self._device, self._dtype)
        self.prior_precision = sd["prior_precision"]
        self.prior_mean = sd["prior_mean"]
        self.sigma_noise = sd["sigma_noise"]
        self.temperature = sd["temperature"]
        self.loss = sd["loss"].to(self._device, self._dtype)
        self.n_data, self.n_outputs = sd["n_data"], sd["n_outputs"]
        self._structure.load_state_dict(structure)  # kron re-runs its eigendecompositions
        off = sd.get("linear_offset")
        self.linear_offset = None if off is None else off.to(self._device, self._dtype)
        self._fitted = True
