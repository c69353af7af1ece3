"""The data module and the training module of a run, built from its typed config (no training yet).

Every ``_target_`` of the config is checked against the allowlist first (``config.targets``). The
training module's class is the config's ``module._target_`` (``conf/train.yaml``: ``MAPCore``);
under Lightning's Trainer its LightningModule twin (``lightning_classes.lightning_twin``) runs. Used
by the entry point and by analyses of finished jobs (``training.job_laplace``), which rebuild a job
from its ``config_resolved.yaml``.
"""

from __future__ import annotations

import torch
from hydra.utils import get_class

from laplace_lab.config.instantiate import instantiate
from laplace_lab.config.schema import RunConfig
from laplace_lab.config.targets import check_targets
from laplace_lab.data.base import LabDataModule
from laplace_lab.data.split_checks import check_nonempty
from laplace_lab.training.loops import LIGHTNING, TrainingLoop
from laplace_lab.training.module import MAPCore, MAPOptimisation


def resolve_likelihood(likelihood: str, datamodule: LabDataModule) -> str:
    """``likelihood: auto`` follows the data module's task; an explicit value must fit it."""
    if likelihood == "auto":
        return datamodule.task
    expected = "classification" if likelihood == "classification" else "regression"
    if datamodule.task != expected:
        raise ValueError(f"likelihood={likelihood!r} does not fit a {datamodule.task} dataset")
    return likelihood


def ood_sets_used(run: RunConfig) -> list[str] | None:
    """The data config's OOD sets (``data.ood``) that the evaluation will read: none when
    ``evaluation.enabled`` or ``evaluation.ood.enabled`` is false, those named in
    ``evaluation.ood.datasets`` when it is set; ``None`` when the data config has no ``ood``."""
    listed = run.data.get("ood")
    if listed is None:
        return None
    ood = run.evaluation.ood
    if not (run.evaluation.enabled and ood.enabled):
        return []
    return [name for name in listed if ood.datasets is None or name in ood.datasets]


def build(run: RunConfig, loop: TrainingLoop = LIGHTNING) -> tuple[LabDataModule, MAPCore]:
    """Instantiate the data module and the training module: the class ``loop`` runs for
    ``module._target_`` (itself for ``PLAIN``, its LightningModule twin for ``LIGHTNING``)."""
    check_targets(run.raw)  # callers rebuild jobs from their config_resolved.yaml through here
    module_class = loop.training_class(get_class(run.module["_target_"]))  # Lightning first: data.base
    ood = ood_sets_used(run)  # the others are not looked for on disk (no warning about them)
    datamodule: LabDataModule = instantiate(run.data) if ood is None else instantiate(run.data, ood=ood)
    likelihood = resolve_likelihood(run.likelihood, datamodule)
    n_out = datamodule.num_outputs * (2 if likelihood == "heteroscedastic_regression" else 1)
    model = instantiate(run.model)(input_shape=datamodule.input_shape, num_outputs=n_out)
    if likelihood == "heteroscedastic_regression":  # het_head: the link of the noise precision
        from laplace_lab.models.het_head import with_het_head

        model = with_het_head(model, run.het_head)
    dtype = getattr(datamodule, "dtype", torch.float32)
    if dtype != torch.float32:  # data.dtype=float64: the network computes in the data's precision
        model = model.to(dtype)
    if run.augmentation.wraps_model:  # augmentation/: logits averaged over transforms (imports Lightning)
        from laplace_lab.training.invariance_marglik import wrap_model

        model = wrap_model(run.augmentation, model)
    scheduler = instantiate(run.lr_scheduler) if run.lr_scheduler else None
    module = module_class(
        model=model,
        likelihood=likelihood,
        n_data=datamodule.n_train,
        optimisation=MAPOptimisation(optimizer=instantiate(run.optimizer), lr_scheduler=scheduler,
                                     loss_scale=run.map_loss_scale, on_nonfinite_loss=run.on_nonfinite_loss),
        prior_precision=run.prior.prior_precision,
        sigma_noise=run.sigma_noise,
        temperature=run.temperature,
        prior_in_loss=run.prior_in_map_loss,
    )
    check_nonempty(datamodule, f"data {run.data.get('_target_')}")  # set up by n_train above; before any training
    return datamodule, module
