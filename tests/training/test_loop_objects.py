"""The training loop as an object, and the trainer and loggers built from their ``_target_`` nodes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from laplace_lab.config import targets
from laplace_lab.config.load import load_run_config, resolved
from laplace_lab.config.schema import CsvLoggerConfig, TrainerConfig, WandbConfig
from laplace_lab.reporting.csv_metrics import CSVMetricsLogger
from laplace_lab.reporting.run_loggers import build_loggers
from laplace_lab.sweeps.status import config_fingerprint
from laplace_lab.training.loop_choice import choose_loop
from laplace_lab.training.loops import LIGHTNING, PLAIN
from laplace_lab.training.plain_loop import PlainTrainer
from tests.conftest import compose_config, run_config

SRC = Path(__file__).resolve().parents[2] / "src" / "laplace_lab"
SINUSOID = ["data=sinusoid", "logger=csv", "trainer.max_epochs=2"]


def test_loop_name_is_read_only_where_the_loop_is_picked():
    compared = re.compile(r"""\bloop\s*(==|!=|in\s*\()|(==|!=)\s*loop\b|["'](plain|lightning)["']\s*(==|!=)""")
    hits = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in SRC.rglob("*.py") if p.name != "loop_choice.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if compared.search(line)]
    assert not hits, hits


def test_choose_loop_returns_the_loop_object():
    assert choose_loop(run_config(SINUSOID)) is PLAIN
    assert choose_loop(run_config([*SINUSOID, "trainer.loop=lightning"])) is LIGHTNING
    assert str(PLAIN) == "plain" and str(LIGHTNING) == "lightning"


def test_each_loop_builds_its_trainer_from_the_same_options(tmp_path):
    run = run_config([*SINUSOID, "trainer.accelerator=cpu", "trainer.log_every_n_steps=3",
                      "+trainer.check_val_every_n_epoch=2"])
    plain = PLAIN.make_trainer(run, tmp_path, [], [])
    assert isinstance(plain, PlainTrainer) and plain.max_epochs == 2 and plain.check_val_every_n_epoch == 2
    lightning = LIGHTNING.make_trainer(run, tmp_path, [], [])
    import pytorch_lightning as pl

    assert type(lightning) is pl.Trainer  # the class trainer._target_ names
    assert lightning.max_epochs == 2 and lightning.log_every_n_steps == 3 and lightning.check_val_every_n_epoch == 2
    assert run.trainer.lightning_kwargs() == {
        "max_epochs": 2, "accelerator": "cpu", "devices": 1, "strategy": "auto", "num_nodes": 1, "deterministic": False,
        "log_every_n_steps": 3, "enable_progress_bar": True, "enable_model_summary": False, "gradient_clip_val": None,
        "limit_train_batches": 1.0, "limit_val_batches": 1.0, "check_val_every_n_epoch": 2}


def test_the_plain_loop_refuses_a_checkpoint_to_resume(tmp_path):
    with pytest.raises(ValueError, match="plain loop cannot resume.*trainer.loop=lightning"):
        PLAIN.fit(None, None, None, str(tmp_path / "last.ckpt"))


def test_loggers_are_the_classes_their_nodes_name(tmp_path):
    from pytorch_lightning.loggers import CSVLogger, WandbLogger

    run = run_config(["data=sinusoid", "logger.wandb.enabled=true", "logger.wandb.mode=offline", "logger.wandb.tags=[a]",
                      "logger.wandb.project=p"])
    csv, wandb = build_loggers(run, tmp_path)
    assert type(csv) is CSVLogger and Path(csv.log_dir) == tmp_path / "csv"
    assert type(wandb) is WandbLogger and wandb._project == "p" and wandb._wandb_init["tags"] == ["a"]
    assert wandb._wandb_init["config"]["logger.wandb.project"] == "p"  # the flattened run config
    (plain,) = build_loggers(run_config(SINUSOID), tmp_path, plain=True)
    assert type(plain) is CSVMetricsLogger and plain.path == tmp_path / "csv" / "metrics.csv"
    assert build_loggers(run_config([*SINUSOID, "logger.csv.enabled=false"]), tmp_path) == []
    with pytest.raises(ValueError, match=r"logger.wandb.mode='cloud' is not supported; allowed: \['offline'"):
        build_loggers(run_config(["data=sinusoid", "logger.wandb.enabled=true", "logger.wandb.mode=cloud"]), tmp_path)


@pytest.mark.parametrize("key,value", [
    ("trainer._target_", "os.system"),
    ("trainer._target_", "pytorch_lightning.loggers.CSVLogger"),
    ("logger.csv._target_", "pytorch_lightning.loggers.WandbLogger"),
    ("logger.wandb._target_", "builtins.eval"),
])
def test_trust_boundary_takes_only_the_listed_classes(key, value):
    slot = key.removesuffix("._target_")
    with pytest.raises(ValueError, match=rf"{re.escape(key)}='{re.escape(value)}' is not allowed; allowed: "
                                         rf"\['{re.escape(next(iter(targets.SLOTS[slot])))}'\]"):
        load_run_config(compose_config([*SINUSOID, f"{key}={value}"]))


def test_schema_targets_are_exactly_their_slots():
    for slot, cls in (("trainer", TrainerConfig), ("logger.csv", CsvLoggerConfig), ("logger.wandb", WandbConfig)):
        assert targets.SLOTS[slot] == {cls._target_}, slot


def test_bad_logger_and_trainer_values_name_the_option():
    with pytest.raises(ValueError, match=r"logger.csv.enabled='yes' has the wrong type: got a str; allowed: a bool"):
        load_run_config(compose_config([*SINUSOID, "logger.csv.enabled=yes"]))
    with pytest.raises(ValueError, match=r"trainer.loop='fast' is not supported; allowed: \['auto', 'lightning', 'plain'\]"):
        load_run_config(compose_config([*SINUSOID, "trainer.loop=fast"]))


def test_a_config_written_before_reads_logger_csv_as_a_switch():
    data = resolved(compose_config(SINUSOID))
    data["logger"] = {"csv": False, "wandb": {"enabled": False}}
    del data["trainer"]["_target_"]
    run = load_run_config(data)
    assert run.logger.csv.enabled is False and run.trainer._target_ == TrainerConfig._target_


def test_the_trainer_target_leaves_the_sweep_hash_as_before():
    data = resolved(compose_config(SINUSOID))
    before = {**data, "trainer": {k: v for k, v in data["trainer"].items() if k != "_target_"}}
    assert config_fingerprint(data) == config_fingerprint(before)
