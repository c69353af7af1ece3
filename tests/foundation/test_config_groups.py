"""Every option of every config group composes; those with a target instantiate."""

from __future__ import annotations

import hydra
import pytest
import pytorch_lightning as pl
import torch
from omegaconf import OmegaConf

from laplace_lab.config.instantiate import instantiate
from laplace_lab.config.load import load_run_config
from laplace_lab.reporting.run_loggers import build_loggers
from laplace_lab.reporting.sweep_table import validate_aggregate
from laplace_lab.training.schedules import scheduler_interval
from tests.conftest import CONF_DIR, compose_config, run_config

# hydra/launcher options need the optional launcher plugins; they are tested in their own module.
# data_recipe/ is chosen by the data option (train.yaml: `optional data_recipe: ${data}`), tested below.
GROUPS = sorted(
    p.name for p in CONF_DIR.iterdir()
    if p.is_dir() and p.name not in ("hydra", "experiment", "data_recipe") and any(p.glob("*.yaml"))
)
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))]
LOCAL_DATA = {"toy2d", "sinusoid", "fake_data"}
SHARED_DATA = {"mnist", "fashion_mnist", "vision_base", "uci"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes(group, option):
    # a diagonal prior needs a non-KFAC structure (the default curvature is kron); an augmentation
    # needs images, a non-GLM predictive and (learned) online marglik
    extra = ["curvature=diag"] if (group, option) == ("prior", "diagonal") else []
    if group == "augmentation" and option != "none":
        extra = ["data=mnist", "model=lenet", "method=online_kron", "predictive=map"]
    cfg = compose_config([f"{group}={option}", *extra])
    OmegaConf.resolve(cfg)
    load_run_config(cfg)
    if group == "method":  # global presets: they name a table row
        assert cfg.method_name == option
    else:
        assert group in cfg


@pytest.mark.parametrize("recipe", sorted(f.stem for f in (CONF_DIR / "data_recipe").glob("*.yaml")))
def test_data_recipes_follow_their_data_option(recipe):
    """A recipe applies with its data option; presets and the command line override it."""
    assert (CONF_DIR / "data" / f"{recipe}.yaml").is_file()
    root, cfg = compose_config(["data=mnist"]), compose_config([f"data={recipe}"])
    assert (cfg.optimizer.lr, cfg.trainer.max_epochs) != (root.optimizer.lr, root.trainer.max_epochs)
    assert compose_config([f"data={recipe}", "trainer.max_epochs=3"]).trainer.max_epochs == 3


def test_experiment_presets_compose():
    presets = sorted((CONF_DIR.parent / "experiments").glob("*/preset.yaml"))
    assert presets
    for preset in presets:
        name = preset.parent.name
        cfg = compose_config([f"experiment={name}"])
        OmegaConf.resolve(cfg)
        load_run_config(cfg)
        assert cfg.experiment_name == name and cfg.aggregate.name == name
        assert cfg.logger.wandb.enabled, f"{name}: every preset logs to an offline W&B run"
        validate_aggregate(OmegaConf.to_container(cfg.aggregate))


@pytest.mark.parametrize("option", sorted(f.stem for f in (CONF_DIR / "model").glob("*.yaml")))
def test_model_instantiates(option):
    cfg = compose_config([f"model={option}"])
    shape = (2,) if option == "mlp" else (3, 32, 32)
    model = hydra.utils.instantiate(cfg.model)(input_shape=shape, num_outputs=5)
    assert model(torch.zeros(2, *shape)).shape == (2, 5)


@pytest.mark.parametrize("option", sorted(f.stem for f in (CONF_DIR / "data").glob("*.yaml")))
def test_data_instantiates(option, tmp_path, request):
    if option in LOCAL_DATA:
        overrides = [f"data={option}"]
    elif option in SHARED_DATA:
        overrides = [f"data={option}", f"paths.data_dir={request.getfixturevalue('data_dir')}"]
    else:  # not available offline here: building it must fail early with the expected files
        cfg = compose_config([f"data={option}", f"paths.data_dir={tmp_path}", "data.download=false"])
        with pytest.raises(FileNotFoundError, match="Expected files"):
            instantiate(cfg.data)
        return
    cfg = compose_config(overrides)
    dm = hydra.utils.instantiate(cfg.data)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape[1:] == tuple(dm.input_shape)
    assert len(x) == len(y) <= dm.batch_size


@pytest.mark.parametrize("group", ["optimizer", "lr_scheduler"])
def test_optimizer_and_scheduler_instantiate(group):
    for f in sorted((CONF_DIR / group).glob("*.yaml")):
        cfg = compose_config([f"{group}={f.stem}"])
        params = [torch.nn.Parameter(torch.zeros(3))]
        opt = hydra.utils.instantiate(cfg.optimizer)(params)
        if group == "lr_scheduler" and cfg.lr_scheduler:
            factory = hydra.utils.instantiate(cfg.lr_scheduler)
            factory(opt, 100) if scheduler_interval(factory) == "step" else factory(opt)


def test_trainer_and_logger_instantiate(tmp_path):
    for f in sorted((CONF_DIR / "trainer").glob("*.yaml")):
        cfg = run_config([f"trainer={f.stem}", "trainer.accelerator=cpu"])
        pl.Trainer(**cfg.trainer.lightning_kwargs(), logger=False, enable_checkpointing=False)
    for f in sorted((CONF_DIR / "logger").glob("*.yaml")):
        cfg = run_config([f"logger={f.stem}", "logger.wandb.enabled=false"] if f.stem == "default" else [f"logger={f.stem}"])
        assert build_loggers(cfg, tmp_path)
