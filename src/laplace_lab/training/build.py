"""The data module and the training module of a run, built from its config (no training yet).

Used by the entry point (``laplace_lab.train``) and by analyses of finished jobs
(``training.job_laplace``), which rebuild a job from its ``config_resolved.yaml``.
"""

from __future__ import annotations

from omegaconf import DictConfig

from laplace_lab.config.instantiate import instantiate
from laplace_lab.data.base import LabDataModule
from laplace_lab.training.module import MAPCore


def resolve_likelihood(cfg: DictConfig, datamodule: LabDataModule) -> str:
    """``likelihood: auto`` follows the data module's task; an explicit value must fit it."""
    if cfg.likelihood == "auto":
        return datamodule.task
    expected = "classification" if cfg.likelihood == "classification" else "regression"
    if datamodule.task != expected:
        raise ValueError(f"likelihood={cfg.likelihood!r} does not fit a {datamodule.task} dataset")
    return cfg.likelihood


def uses_augmentation(cfg: DictConfig) -> bool:
    """An ``augmentation`` group other than mode ``none`` (its module imports Lightning)."""
    aug = cfg.get("augmentation")
    return aug is not None and aug.get("mode") != "none"


def build(cfg: DictConfig, loop: str = "lightning") -> tuple[LabDataModule, MAPCore]:
    """Instantiate the data module and the training module (no training yet): a ``MAPModule``
    (LightningModule) for ``loop="lightning"``, a ``MAPCore`` for the plain loop."""
    if loop == "lightning":  # imported before the data module, which is then a LightningDataModule (data.base)
        from laplace_lab.training.module import MAPModule as module_class
    else:
        module_class = MAPCore
    datamodule: LabDataModule = instantiate(cfg.data)
    likelihood = resolve_likelihood(cfg, datamodule)
    n_out = datamodule.num_outputs * (2 if likelihood == "heteroscedastic_regression" else 1)
    model = instantiate(cfg.model)(input_shape=datamodule.input_shape, num_outputs=n_out)
    if uses_augmentation(cfg):  # augmentation/: logits averaged over transforms
        from laplace_lab.training.augmentation import wrap_model

        model = wrap_model(cfg.get("augmentation"), model)
    scheduler = instantiate(cfg.lr_scheduler) if cfg.get("lr_scheduler") else None
    module = module_class(
        model=model,
        likelihood=likelihood,
        n_data=datamodule.n_train,
        optimizer=instantiate(cfg.optimizer),
        lr_scheduler=scheduler,
        prior_precision=cfg.prior.prior_precision,
        sigma_noise=cfg.sigma_noise,
        temperature=cfg.temperature,
        prior_in_loss=cfg.prior_in_map_loss,
        on_nonfinite_loss=cfg.on_nonfinite_loss,
        loss_scale=cfg.map_loss_scale,
    )
    return datamodule, module
