"""laplace-torch names over the engine, for users switching by one import.

``Laplace(model, likelihood, subset_of_weights, hessian_structure, ...)`` returns one of
``FullLaplace``, ``KronLaplace``, ``DiagLaplace``, ``LowRankLaplace`` (all weights) and
``FullLLLaplace``, ``KronLLLaplace``, ``DiagLLLaplace`` (last layer) are ``Laplace`` with
``subset_of_weights`` / ``hessian_structure`` fixed; every other keyword is ``Engine``'s.
``Engine`` is the engine's ``Laplace`` with laplace-torch's further constructor keywords, translated
into the engine's arguments here (``backend`` as a curvature name or marker class,
``backend_kwargs``, ``asdl_fisher_kwargs``, ``enable_backprop``, ``feature_reduction``,
``dict_key_x``, ``dict_key_y``): the engine's own signature has none of them.
The backend classes (``CurvlinopsGGN``, ``AsdlEF``, ...) are markers for ``Laplace(backend=...)``:
each names the curvature (``ggn`` | ``ef``) the engine computes itself; they run no third-party code.
laplace-torch's views of a flavour object: ``la.backend`` (``jacobians``, ``last_layer_jacobians``),
``la.H`` before ``fit`` (zeros: ``[P, P]`` full, ``[P]`` diag, a ``Kron`` of zero factors for kron; built
when read, nothing is allocated at construction) and, for kron after ``fit``, the curvature alone as a
``KronDecomposed`` (= the engine's ``KronPrecision`` view) with ``to_matrix()``; ``_init_H()`` empties
the curvature; ``functional_variance_fast(X)`` the diagonal GLM functional variance. Utilities:
``FeatureExtractor``, ``Kron``, ``KronDecomposed``.
Deliberate deviations from laplace-torch are listed in ``docs/laplace_torch_compat.md``.
"""

from __future__ import annotations

import contextlib

import torch

from laplace_lab.laplace import checks, predictive
from laplace_lab.laplace.backends import backend_names
from laplace_lab.laplace.compat_features import FeatureExtractor, last_module_run
from laplace_lab.laplace.compat_matrix import Kron
from laplace_lab.laplace.laplace import Laplace as _Laplace
from laplace_lab.laplace.options import FeatureReduction, check_choice
from laplace_lab.laplace.output_factors import CURVATURE_TYPES
from laplace_lab.laplace.structures import STRUCTURES
from laplace_lab.laplace.structures.kron import KronPrecision as KronDecomposed


def resolve_backend(backend, curvature: str) -> tuple[str, str]:
    """``(curvature, backend)`` for the engine from laplace-torch's ``backend`` and ``curvature``:
    ``backend`` is a collection backend name (``backends.backend_names()``: "auto", "chain", "capture",
    "lanczos"), or laplace-torch's meaning: a curvature name or a class / object with a ``curvature``
    attribute such as ``CurvlinopsGGN`` (sets the curvature, backend "auto"); ``None`` is "auto"."""
    curvature = check_choice("curvature", curvature, CURVATURE_TYPES)
    if backend is None or (isinstance(backend, str) and backend in backend_names()):
        return curvature, backend or "auto"
    name = getattr(backend, "curvature", backend)
    if not isinstance(name, str):
        raise ValueError(f"backend must be one of {list(backend_names())}, a curvature name {CURVATURE_TYPES} or a "
                         f"laplace_lab.laplace.compat backend class (e.g. CurvlinopsGGN); got {backend!r}")
    name = check_choice("backend", name, backend_names() + CURVATURE_TYPES)
    if curvature != "ggn" and curvature != name:
        raise ValueError(f"backend={backend!r} (curvature {name!r}) contradicts curvature={curvature!r}")
    return name, "auto"


def compat_structure_options(backend, asdl_fisher_kwargs: dict | None, structure_options: dict | None,
                             declared: tuple[str, ...]) -> dict:
    """Structure options implied by laplace-torch's keywords, merged under ``structure_options``
    (explicit values win): a marker's convention for the options the structure ``declared``
    (``BackPackGGN`` with kron: ``kfac_approx="backpack"``) and ``asdl_fisher_kwargs={"kfac_approx": ...}``
    (laplace-torch passes it to the curvlinops KFAC). Any other ``asdl_fisher_kwargs`` key raises
    (third-party backend options)."""
    implied = {k: v for k, v in (getattr(backend, "structure_options", None) or {}).items() if k in declared}
    kw = dict(asdl_fisher_kwargs or {})
    if set(kw) - {"kfac_approx"}:
        raise ValueError(f"asdl_fisher_kwargs are options of laplace-torch's third-party backends; this engine "
                         f"computes curvature itself and takes only 'kfac_approx' (got {sorted(kw)})")
    return implied | kw | dict(structure_options or {})


class Engine(_Laplace):
    """The engine's ``Laplace`` (same positional arguments) with laplace-torch's further keywords:

    - ``backend``: a collection backend name, or laplace-torch's curvature name / marker class
      (``CurvlinopsGGN``, ...), which sets ``curvature`` and keeps "auto"; ``BackPackGGN`` /
      ``BackPackEF`` also set kron's ``kfac_approx="backpack"`` (BackPack's conv factors);
    - ``asdl_fisher_kwargs={"kfac_approx": ...}``: the structure option (explicit
      ``structure_options`` and option keywords win); ``backend_kwargs``: refused unless empty;
    - ``enable_backprop``, ``feature_reduction`` (``FeatureReduction``; checked), ``dict_key_x``:
      kept as attributes, as laplace-torch shows them; ``dict_key_y``: where a dict batch holds its
      targets (the engine's ``unpack_batch``).
    """

    def __init__(self, model, likelihood, subset_of_weights="last_layer", hessian_structure="kron", curvature="ggn",
                 *args, backend=None, backend_kwargs: dict | None = None, asdl_fisher_kwargs: dict | None = None,
                 enable_backprop: bool = False, feature_reduction: str | None = None, dict_key_x: str = "input_ids",
                 dict_key_y: str = "labels", structure_options: dict | None = None, **kwargs):
        curvature, engine_backend = resolve_backend(backend, curvature)
        if backend_kwargs:
            raise ValueError(f"backend_kwargs are options of laplace-torch's third-party backends; this engine "
                             f"computes curvature itself and takes none (got {sorted(backend_kwargs)})")
        if feature_reduction is not None:
            feature_reduction = check_choice("feature_reduction", feature_reduction, FeatureReduction.values())
        self.feature_reduction, self.enable_backprop = feature_reduction, bool(enable_backprop)
        self.dict_key_x, self.dict_key_y = dict_key_x, dict_key_y
        struct = STRUCTURES.get(str(getattr(hessian_structure, "value", hessian_structure)))
        declared = struct.options if struct is not None else ()
        explicit = {k: kwargs.pop(k) for k in declared if k in kwargs} | dict(structure_options or {})
        options = compat_structure_options(backend, asdl_fisher_kwargs, explicit, declared)
        super().__init__(model, likelihood, subset_of_weights, hessian_structure, curvature, *args,
                         backend=engine_backend, structure_options=options or None, **kwargs)


class BackendView:
    """laplace-torch's ``la.backend`` Jacobian methods, computed by the engine (dense ``torch.func``,
    for small models): ``(Js [B, C, P], f [B, C])`` w.r.t. the Laplace object's weights."""

    def __init__(self, la: _Laplace):
        self.la = la

    def jacobians(self, x, enable_backprop: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        Js, f = self.la.jacobians(x)
        if enable_backprop:
            with torch.enable_grad():
                f = self.la.model(x).reshape(Js.shape[0], -1)
            return Js, f
        return Js.detach(), f.detach()

    def last_layer_jacobians(self, x, enable_backprop: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        if self.la.subset_of_weights != "last_layer":
            raise ValueError("last_layer_jacobians needs subset_of_weights='last_layer'; use jacobians(x)")
        return self.jacobians(x, enable_backprop)


class _Flavour(Engine):
    subset_of_weights_default = "all"
    hessian_structure_default = "full"

    def __init__(self, model, likelihood, **kwargs):
        for key in ("subset_of_weights", "hessian_structure"):
            if key in kwargs:
                raise TypeError(f"{type(self).__name__} fixes {key}; use Laplace(...) to choose it")
        self.__dict__["_reward"] = likelihood == "reward_modeling"
        if self.__dict__["_reward"]:  # fit (and marglik, gridsearch) as classification, predict as regression
            likelihood = "classification"
        if self.subset_of_weights_default == "last_layer" and kwargs.get("last_layer_name") is None:
            self._defer(model, likelihood, kwargs)
            return
        super().__init__(model, likelihood, subset_of_weights=self.subset_of_weights_default,
                         hessian_structure=self.hessian_structure_default, **kwargs)

    # ---- laplace-torch's lazy last layer: found by the first forward of fit ------------------------------
    def _defer(self, model, likelihood, kwargs: dict) -> None:
        """No last layer yet: keep the options (``prior_mean`` / ``prior_precision`` unchecked until
        ``fit``, as laplace-torch); ``mean``, ``H``, ``n_params``, ``n_layers`` are ``None``."""
        self.__dict__["_deferred"] = (likelihood, dict(kwargs))
        self.model, self.likelihood = model, likelihood
        self.mean = self.n_params = self.n_layers = None
        self.temperature = checks.temperature(kwargs.get("temperature", 1.0))
        self._prior_precision = kwargs.get("prior_precision", 1.0)
        self._prior_mean = kwargs.get("prior_mean", 0.0)
        self._sigma_noise = kwargs.get("sigma_noise", 1.0)
        self.dict_key_x, self.dict_key_y = kwargs.get("dict_key_x", "input_ids"), kwargs.get("dict_key_y", "labels")
        self.enable_backprop = bool(kwargs.get("enable_backprop", False))
        self.feature_reduction = kwargs.get("feature_reduction")

    def __getattr__(self, name):  # only reached for attributes that do not exist
        if "_deferred" in self.__dict__ and self.__dict__["_deferred"] is not None:
            raise AttributeError(f"{name!r} is not available before fit(): the last layer is found by the first "
                                 "forward of fit (pass last_layer_name to construct it eagerly)")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _resolve(self, last_layer_name: str) -> None:
        """Construct the engine object now that the last layer is known."""
        likelihood, kwargs = self.__dict__["_deferred"]
        self.__dict__["_deferred"] = None
        super().__init__(self.model, likelihood, subset_of_weights=self.subset_of_weights_default,
                         hessian_structure=self.hessian_structure_default,
                         **{**kwargs, "last_layer_name": last_layer_name})

    def fit(self, train_loader, override: bool = True, progress_bar: bool = False) -> None:
        if self.__dict__.get("_deferred") is not None:
            X, _ = self.unpack_batch(checks.first_batch(train_loader))
            was_training = self.model.training
            self.model.eval()
            try:
                with torch.no_grad():
                    name = last_module_run(self.model, X)[0]
            finally:
                self.model.train(was_training)
            self._resolve(name)
        super().fit(train_loader, override=override, progress_bar=progress_bar)

    def state_dict(self) -> dict:
        """The engine's flat dict; last-layer flavours add ``last_layer_name`` (the module's name)."""
        sd = super().state_dict()
        if self.subset_of_weights == "last_layer":
            names = {id(m): n for n, m in self.model.named_modules()}
            sd["last_layer_name"] = names[id(self.entries[0].module)]
        return sd

    def load_state_dict(self, sd: dict) -> None:
        """The engine's; a last-layer flavour still searching its last layer takes the saved name, one
        constructed with another ``last_layer_name`` raises ``ValueError``."""
        saved = sd.get("last_layer_name")
        if self.__dict__.get("_deferred") is not None:
            if saved is None:
                raise ValueError("state_dict has no last_layer_name: fit first or pass last_layer_name")
            self._resolve(saved)
        elif saved is not None and self.subset_of_weights == "last_layer":
            mine = {id(m): n for n, m in self.model.named_modules()}[id(self.entries[0].module)]
            if mine != saved:
                raise ValueError(f"state_dict is for last_layer_name={saved!r}; this object uses {mine!r}")
        super().load_state_dict({k: v for k, v in sd.items() if k != "last_layer_name"})

    # ---- laplace-torch's reward modelling: a classification fit, a regression predictive ----------------
    @property
    def reward_modeling(self) -> bool:
        """Constructed with ``likelihood="reward_modeling"`` (``likelihood`` then reads "classification",
        the likelihood of the fit; ``la(x)`` is the regression predictive unless ``fitting=True``)."""
        return bool(self.__dict__.get("_reward"))

    @contextlib.contextmanager
    def _predicting_as(self, likelihood: str):
        kept = self.likelihood
        self.likelihood = likelihood
        try:
            yield
        finally:
            self.likelihood = kept

    def __call__(self, x, pred_type="glm", joint=False, link_approx="probit", n_samples=100, diagonal_output=False,
                 generator=None, fitting=False, **kwargs):
        if not self.reward_modeling or fitting or self.__dict__.get("_tuning"):
            return super().__call__(x, pred_type, joint, link_approx, n_samples, diagonal_output, generator,
                                    fitting and not self.reward_modeling, **kwargs)
        with self._predicting_as("regression"):
            return super().__call__(x, pred_type, joint, link_approx, n_samples, diagonal_output, generator, **kwargs)

    def predictive_samples(self, x, *args, **kwargs) -> torch.Tensor:
        if not self.reward_modeling:
            return super().predictive_samples(x, *args, **kwargs)
        with self._predicting_as("regression"):
            return super().predictive_samples(x, *args, **kwargs)

    def optimize_prior_precision(self, *args, **kwargs) -> None:
        """The engine's; with reward modelling the grid search scores the classification predictive."""
        self.__dict__["_tuning"] = True
        try:
            super().optimize_prior_precision(*args, **kwargs)
        finally:
            self.__dict__["_tuning"] = False

    @property
    def H(self):
        """The engine's ``H``; ``None`` while the last layer is not known (laplace-torch)."""
        return None if self.__dict__.get("_deferred") is not None else _Laplace.H.fget(self)

    @property
    def backend(self) -> BackendView:
        """laplace-torch's curvature-backend object: here its Jacobian methods (``BackendView``)."""
        return BackendView(self)

    def _init_H(self) -> None:
        """laplace-torch's internal: empty the curvature (and loss, ``n_data``); not fitted afterwards."""
        self.reset_accumulators()

    def functional_variance_fast(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """``(f_mu [B, C], f_var [B, C])``: the GLM functional variance's diagonal (every structure;
        laplace-torch has it for last-layer full and diag)."""
        return predictive.glm_moments(self, X, diag=True)


class _FullH:
    @property
    def H(self) -> torch.Tensor | None:
        """``[P, P]``; zeros before ``fit`` (allocated when read, as laplace-torch shows it); ``None``
        while the last layer is not known."""
        if self.__dict__.get("_deferred") is not None:
            return None
        H = _Laplace.H.fget(self)
        return H if H is not None else torch.zeros(self.n_params, self.n_params, device=self.device, dtype=self.dtype)


class _KronH:
    @property
    def H(self):
        """Before ``fit``: a ``Kron`` of zero factors; after: the curvature alone (no prior, scale 1) as
        a ``KronDecomposed`` view with ``to_matrix()`` / ``logdet()`` (laplace-torch's types); ``None``
        while the last layer is not known."""
        if self.__dict__.get("_deferred") is not None:
            return None
        if not self.fitted:
            return Kron.zeros_like_params(self.params)
        one = torch.ones((), device=self.device, dtype=self.dtype)
        return self.structure.precision(one, torch.zeros(1, device=self.device, dtype=self.dtype))


_H_VIEWS = {"full": (_FullH,), "kron": (_KronH,)}


def _flavour(name: str, subset: str, structure: str) -> type:
    return type(name, (*_H_VIEWS.get(structure, ()), _Flavour),
                {"subset_of_weights_default": subset, "hessian_structure_default": structure,
                 "__doc__": f"``Laplace(subset_of_weights={subset!r}, hessian_structure={structure!r})``."})


FullLaplace = _flavour("FullLaplace", "all", "full")
KronLaplace = _flavour("KronLaplace", "all", "kron")
DiagLaplace = _flavour("DiagLaplace", "all", "diag")
LowRankLaplace = _flavour("LowRankLaplace", "all", "lowrank")
FullLLLaplace = _flavour("FullLLLaplace", "last_layer", "full")
KronLLLaplace = _flavour("KronLLLaplace", "last_layer", "kron")
DiagLLLaplace = _flavour("DiagLLLaplace", "last_layer", "diag")
ParametricLaplace = BaseLaplace = LLLaplace = _Flavour
_FLAVOURS = {(f.subset_of_weights_default, f.hessian_structure_default): f
             for f in (FullLaplace, KronLaplace, DiagLaplace, LowRankLaplace, FullLLLaplace, KronLLLaplace,
                       DiagLLLaplace)}


def Laplace(model, likelihood, subset_of_weights="last_layer", hessian_structure="kron", **kwargs) -> _Flavour:
    """laplace-torch's factory: the flavour class of ``(subset_of_weights, hessian_structure)``."""
    key = (str(subset_of_weights), str(hessian_structure))
    if key not in _FLAVOURS:
        raise ValueError(f"(subset_of_weights, hessian_structure) must be one of {sorted(_FLAVOURS)}; got {key}")
    return _FLAVOURS[key](model, likelihood, **kwargs)


class CurvatureBackend:
    """Marker for ``Laplace(backend=...)``: ``curvature`` is the engine's curvature name,
    ``structure_options`` the library's conventions (used where the structure declares them)."""

    curvature = ""
    structure_options: dict = {}


def _backend(name: str, curvature: str, **structure_options) -> type:
    return type(name, (CurvatureBackend,), {"curvature": curvature, "structure_options": structure_options,
                                            "__doc__": f"Marker: ``curvature={curvature!r}``"
                                                       f"{', ' + str(structure_options) if structure_options else ''}."})


CurvlinopsGGN, CurvlinopsEF = _backend("CurvlinopsGGN", "ggn"), _backend("CurvlinopsEF", "ef")
AsdlGGN, AsdlEF = _backend("AsdlGGN", "ggn"), _backend("AsdlEF", "ef")
# BackPack's KFLR / KFAC factors of Conv2d layers differ from curvlinops' (options.KfacApprox)
BackPackGGN = _backend("BackPackGGN", "ggn", kfac_approx="backpack")
BackPackEF = _backend("BackPackEF", "ef", kfac_approx="backpack")

__all__ = ["Laplace", "Engine", "BaseLaplace", "ParametricLaplace", "LLLaplace", "FullLaplace", "KronLaplace",
           "DiagLaplace", "LowRankLaplace", "FullLLLaplace", "KronLLLaplace", "DiagLLLaplace",
           "CurvatureBackend", "CurvlinopsGGN", "CurvlinopsEF", "AsdlGGN", "AsdlEF", "BackPackGGN", "BackPackEF",
           "BackendView", "FeatureExtractor", "Kron", "KronDecomposed"]

from laplace_lab.laplace.options import (  # noqa: E402  (laplace-torch exposes its enums here too)
    HessianStructure,
    Likelihood,
    LinkApprox,
    PredType,
    PriorStructure,
    SubsetOfWeights,
    TuningMethod,
)

__all__ += ["FeatureReduction", "HessianStructure", "Likelihood", "LinkApprox", "PredType", "PriorStructure",
            "SubsetOfWeights", "TuningMethod"]
