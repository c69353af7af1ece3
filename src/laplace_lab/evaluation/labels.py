"""Names a reader understands, for figure titles and the console summary: the data set of a run
(``dataset_label``), its Laplace predictive (``laplace_label``), both with the seed and a sweep
job's swept values (``run_label``) and the predictors (``PREDICTORS``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# evaluation keys -> names on figures and in the summary
PREDICTORS = {"map": "MAP", "la": "Laplace", "de": "deep ensemble", "mola": "MoLA"}
LINKS = {"probit": "probit", "mc": "MC", "bridge": "Laplace bridge", "bridge_norm": "Laplace bridge (normalised)"}


def structure_label(name: Any) -> str:
    """A posterior structure's name for readers (its class's ``label``: ``kron`` -> ``KFAC``);
    a name no structure has, unchanged."""
    from laplace_lab.laplace.spec import hessian_structures, structure_class

    return (structure_class(name).label or name) if name in hessian_structures() else str(name)


def predictor_label(name: str) -> str:
    """``la`` -> ``Laplace``; unknown names unchanged."""
    return PREDICTORS.get(name, name)


def dataset_label(data: Mapping[str, Any]) -> str:
    """The run's data set from its ``data`` config: ``mnist``, ``uci yacht (split 3)``,
    ``toy2d moons``, ``sinusoid`` (the data module's class name, less ``DataModule``, otherwise)."""
    target = str(data.get("_target_", "")).rsplit(".", 1)[-1]
    if data.get("name"):
        label = str(data["name"])
        if data.get("split") is not None:  # (a UCI set: its split)
            label = f"uci {label} (split {data.get('split')})"
        transform = data.get("transform")
        return label if transform in (None, "none") else f"{label} {transform}"
    if data.get("kind"):
        return f"toy2d {data['kind']}"
    return target.removesuffix("DataModule").lower() or "data"


def laplace_label(cfg: Mapping[str, Any], likelihood: str = "classification") -> str:
    """``last-layer KFAC-GGN, GLM predictive (MC)`` from the ``curvature`` and ``predictive`` groups
    (Gaussian regression's GLM predictive: ``closed form``, see ``training.predictors``)."""
    curvature, predictive = cfg.get("curvature") or {}, cfg.get("predictive") or {}
    subset = "last-layer" if curvature.get("subset_of_weights") == "last_layer" else "all-weights"
    structure = structure_label(curvature.get("hessian_structure"))
    kind = str(curvature.get("type", "")).upper().replace("MC_FISHER", "MC-Fisher")
    pred = str(predictive.get("pred_type", "")).upper().replace("NN", "sampled-network")
    link = LINKS.get(predictive.get("link_approx"), predictive.get("link_approx"))
    if likelihood == "regression" and predictive.get("pred_type") == "glm":
        link = "closed form"
    return f"{subset} {structure}-{kind}, {pred} predictive ({link})"


def run_label(cfg: Mapping[str, Any], likelihood: str, with_laplace: bool, swept: Sequence[str] = ()) -> str:
    """``toy2d moons, seed 0; job: data.kind=moons; Laplace: last-layer KFAC-GGN, GLM predictive
    (MC)``, written on every figure, from a run's resolved config (``with_laplace``: a post-hoc
    Laplace is fitted; ``swept``: the ``key=value`` overrides of a multirun job, which name its
    folder, the seed left out as it is named anyway; none: no "job" part)."""
    seed = f", seed {cfg['seed']}" if cfg.get("seed") is not None else ""
    values = [s for s in swept if s.split("=", 1)[0].lstrip("+~") != "seed"]
    parts = [f"{dataset_label(cfg.get('data') or {})}{seed}"]
    if values:
        parts.append("job: " + ", ".join(values))
    if with_laplace:
        parts.append(f"Laplace: {laplace_label(cfg, likelihood)}")
    return "; ".join(parts)
