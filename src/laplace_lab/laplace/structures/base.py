"""The posterior-structure protocol and the registry of structures.

Notation: ``P`` = number of parameters in the subset, ``L`` = number of parameter tensors,
``c = 1 / (sigma^2 T)`` the curvature scale, ``prior``: ``[1]``, ``[L]`` or ``[P]`` precisions.
The posterior precision is ``c H + diag(prior)``.

A structure is a subclass of ``Structure`` decorated with ``@register``: ``Laplace(hessian_structure=
name)``, config validation (``spec.LaplaceSpec``) and every caller then find it through ``STRUCTURES``;
nothing outside the structure branches on its name. Required: ``reset``, ``accumulate`` (or
``self_fitting`` + ``fit``), ``logdet``, ``sample``, ``functional_variance``, ``posterior_variance``,
``precision``, ``dense_precision``, ``state_dict`` / ``load_state_dict`` and the ``H`` property.
Optional (defaults here): ``finalize``, ``covariance``, ``square_norm``, ``curvature_eigenvalues``
(fast marglik), ``cholesky`` (dense fast marglik), ``preconditioner`` (linear-mode CG),
``posterior_view`` (the glm predictive; default: dense per-input Jacobians),
``curvature_top_eigenvectors`` (the loss-landscape slices along the posterior's eigen-directions).
Class attributes declare its ``label`` (the name readers see), the ``prior_structures`` and
``curvature_types`` it supports, its own options (``Options``: a frozen dataclass of ``io.fields.option``
fields, each option's type, default and allowed values once; ``options`` lists their names) and
whether ``chain.Chain`` may hand it modules in any block order. A module of ``laplace.structures`` is
imported with the package (``structures.discover``), so a new structure is its file and its
``conf/curvature/<name>.yaml``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from laplace_lab.io.fields import check, defaults
from laplace_lab.laplace.capture import Record
from laplace_lab.laplace.registry import registrar
from laplace_lab.laplace.subset import Entry

STRUCTURES: dict[str, type[Structure]] = {}


register = registrar(STRUCTURES, "hessian_structure")


class Structure:
    name = ""
    label = ""  # its name for readers (figure titles, the console summary), e.g. "KFAC"; "": ``name``
    prior_structures: tuple[str, ...] = ("scalar", "layerwise", "diagonal")
    curvature_types: tuple[str, ...] = ("ggn", "ef", "mc_fisher")

    @dataclass(frozen=True)
    class Options:
        """The structure's own options (keywords of its constructor and of ``Laplace``, keys of the
        ``curvature`` config group): ``option(default, kind, low=, choices=, ...)`` fields. None here."""

    options: tuple[str, ...] = ()  # the names of ``Options``' fields (set for each subclass; not to be set)
    self_fitting = False  # True: ``fit(la, data) -> (loss, n_data, n_outputs)`` replaces the batch loop
    any_block_order = False  # True: ``accumulate`` does not rely on records arriving in subset order
    supports_fused = False  # True: ``fused.FusedCurvature`` can fill it from the training step's backward
    # True: ``accumulate(records, inputs=...)`` is additive over the K output factors and over groups of
    # calls (records holding some calls, the others empty), at a cost proportional to the calls given,
    # with ``inputs=False`` skipping what depends on the inputs alone (the capture backend then streams
    # a large batch, ``capture.Streamed``)
    factor_chunks = False
    # How a fit across processes (``laplace.distributed``) combines the ranks' shards: "sum" (the
    # tensors of ``shard_sums`` add over disjoint shards; the engine sums them before ``finalize``),
    # "operator" (a self-fitting structure that sums each product of its operator during ``fit``) or
    # None (cannot be reduced: a distributed fit raises, naming the structure, before any data pass)
    shard_reduction: str | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "options" in vars(cls):
            raise TypeError(f"{cls.__name__}: declare the structure's options as fields of its Options dataclass "
                            "(options lists their names), not as a tuple")
        cls.options = tuple(f.name for f in dataclasses.fields(cls.Options))

    @classmethod
    def check_options(cls, options: Mapping[str, Any], key=str) -> Any:
        """``cls.Options`` from ``options`` (``{name: value}``, a ``str`` enum read as its value; an
        option not given takes its declared default; keys that are no option are the caller's to
        refuse); ``ValueError`` naming ``key(name)`` and the allowed values for a bad value."""
        given = {}
        for f in dataclasses.fields(cls.Options):
            if f.name in options:
                value = options[f.name]
                given[f.name] = check(key(f.name), value.value if isinstance(value, Enum) else value, f.metadata["spec"])
        return cls.Options(**given)

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """``{option: its declared default}``."""
        return defaults(cls.Options)

    def __init__(self, entries: list[Entry], device, dtype):
        self.entries = entries
        self.shapes = [p.shape for e in entries for p in e.params]
        self.sizes = [s.numel() for s in self.shapes]
        self.n_params = sum(self.sizes)
        self.device, self.dtype = device, dtype
        self.reset()

    # ---- fitting ---------------------------------------------------------------------------
    def reset(self) -> None:
        raise NotImplementedError

    def accumulate(self, records: list[Record]) -> None:
        """Add one batch; ``records[i]`` holds the calls of ``entries[i].module`` with grads. A structure
        with ``factor_chunks`` takes ``inputs: bool = True`` too (``False``: a further factor of the same
        batch; statistics of the inputs alone were counted with the first)."""
        raise NotImplementedError

    def fit(self, la, data) -> tuple[torch.Tensor, int, int]:
        """Self-fitting structures only: one pass of their own over ``data``."""
        raise NotImplementedError(f"{type(self).__name__} is fitted batch by batch (accumulate)")

    def load_layer_curvature(self, parts: list) -> None:
        """Replace the accumulated curvature by ``parts``, one per entry in this structure's
        accumulator format (between ``Laplace.fit_begin`` and ``fit_end``); for curvature computed
        outside the engine (e.g. ``differentiable_marglik``'s averaged-model factors)."""
        raise ValueError(f"hessian_structure={self.name!r} does not take per-layer curvature from outside "
                         "the engine")

    def shard_sums(self) -> dict[str, torch.Tensor]:
        """``shard_reduction == "sum"``: every accumulator as a tensor, by a name that is the same on
        every rank, whose sum over the ranks' shards is the accumulator of all the data. The engine
        sums them (in place) and hands them back to ``set_shard_sums`` before ``finalize``."""
        raise ValueError(f"hessian_structure={self.name!r} declares no reduction over processes "
                         f"(shard_reduction={self.shard_reduction!r})")

    def set_shard_sums(self, sums: dict[str, torch.Tensor]) -> None:
        """Take the summed ``shard_sums()`` back (default: nothing to do, they were summed in place)."""

    def finalize(self) -> None:
        """Called once after the data pass (decompositions that queries reuse)."""

    @property
    def H(self):
        """The curvature in the structure's native form (``None`` before fitting where lazy)."""
        raise NotImplementedError

    # ---- queries ---------------------------------------------------------------------------
    def logdet(self, c: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
        """``log det (c H + diag(prior))``, differentiable in ``c`` and ``prior``."""
        raise NotImplementedError

    def logdet_by_tensor(self, c: torch.Tensor, prior: torch.Tensor) -> torch.Tensor | None:
        """``[L]``: ``logdet`` split by parameter tensor (they sum to it) where the posterior precision
        is block-diagonal over the tensors; ``None`` where it couples them (the default)."""
        return None

    def sample(self, n: int, c, prior, generator=None) -> torch.Tensor:
        """``[n, P]`` zero-mean draws from ``N(0, (c H + diag(prior))^{-1})``."""
        raise NotImplementedError

    def functional_variance(self, Js: torch.Tensor, c, prior) -> torch.Tensor:
        """``J Sigma J^T`` for ``Js`` ``[N, C, P]`` -> ``[N, C, C]``."""
        raise NotImplementedError

    def posterior_variance(self, c, prior) -> torch.Tensor:
        """``[P]`` marginal variances (diagonal of the covariance)."""
        raise NotImplementedError

    def covariance(self, c, prior) -> torch.Tensor:
        """``Laplace.posterior_covariance``: ``[P, P]`` where cheap (full), else ``[P]`` marginal variances."""
        return self.posterior_variance(c, prior)

    def precision(self, c, prior):
        """The posterior precision in the structure's own form (full: [P, P]; diag: [P]; kron: a view)."""
        raise NotImplementedError

    def dense_precision(self, c, prior) -> torch.Tensor:
        """``[P, P]`` posterior precision as a dense matrix (small models / tests only)."""
        raise NotImplementedError

    def square_norm(self, v: torch.Tensor, c, prior) -> torch.Tensor:
        """``v^T (c H + diag(prior)) v`` for ``v`` ``[P]`` (default: the dense precision; small models)."""
        return v @ (self.dense_precision(c, prior) @ v)

    def curvature_eigenvalues(self) -> torch.Tensor | None:
        """``[P]`` eigenvalues of ``H`` (parameter order, no grad) in an eigenbasis in which every prior
        the structure supports is diagonal (``eigen_marglik.EigenMarglik``), or ``None`` when there is none."""
        return None

    def curvature_top_eigenvectors(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lam [k'], U [P, k'])``: the ``k' <= k`` largest eigenvalues of ``H`` (descending) and
        unit eigenvectors as columns, in parameter order. Optional: a structure offers it by overriding
        it (``offers_eigenvectors``); the default raises ``ValueError``."""
        raise ValueError(f"hessian_structure={self.name!r} offers no eigenvectors of its curvature; structures "
                         f"that do: {[n for n, c in STRUCTURES.items() if offers_eigenvectors(c)]}")

    dense_cholesky = False  # True: ``cholesky(c, prior)`` factorises a dense precision (``FullMarglik``)

    def cholesky(self, c, prior) -> torch.Tensor:
        """Lower Cholesky factor ``L`` (float64) of the dense posterior precision; only where
        ``dense_cholesky`` is True."""
        raise NotImplementedError(f"{type(self).__name__} holds no dense precision (dense_cholesky=False)")

    def preconditioner(self, c, prior):
        """A callable ``R [P, n] -> ~P^{-1} R`` (linear-mode CG preconditioner). Default: the marginal
        posterior variances (Jacobi); structures with a cheap exact or blockwise inverse override it."""
        var = self.posterior_variance(c, prior).detach()
        return lambda R: var[:, None] * R

    def posterior_view(self, la):
        """Per-call precomputation for the glm predictive: a callable ``view(la, records, V, diag,
        budget) -> f_var``. Default: dense per-input Jacobians and ``functional_variance`` (any structure;
        memory ``B C P``)."""
        from laplace_lab.laplace.functional_variance import JacobianView

        return JacobianView(la)

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, sd: dict) -> None:
        raise NotImplementedError

    # ---- memory plan (laplace.plan) --------------------------------------------------------
    @classmethod
    def memory_plan(cls, shape, batch: int, n_factors: int, options: dict):
        """This structure's ``plan_terms.MemoryPlan`` in bytes for a model ``shape`` (``plan_terms.ModelShape``),
        fit batches of ``batch`` inputs and ``n_factors`` output factors, with its ``options``: what it
        keeps (``state``), the fit's peak (``plan_terms.backend_batch_bytes`` plus its own accumulation and
        finalisation), the glm predictive's and sampling's fixed and per-item bytes. ``None`` (this
        default): no plan declared, so ``Laplace.fit`` runs without a memory check."""
        return None

    # ---- helpers ---------------------------------------------------------------------------
    def randn(self, *shape, generator=None):
        """``[*shape]`` standard normals on the structure's device and dtype (``sample`` draws through it)."""
        return torch.randn(*shape, generator=generator, device=self.device, dtype=self.dtype)


def offers_eigenvectors(cls: type[Structure]) -> bool:
    """Whether structure class ``cls`` implements ``curvature_top_eigenvectors``."""
    return cls.curvature_top_eigenvectors is not Structure.curvature_top_eigenvectors
