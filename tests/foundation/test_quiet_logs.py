"""``laplace_lab.io.quiet_logs``: the listed third-party lines are dropped, everything else shows."""

from __future__ import annotations

import logging
import warnings

from laplace_lab.io import quiet_logs


def test_listed_warnings_are_ignored_and_others_show():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_logs.install()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("The number of training batches (8) is smaller than the logging interval Trainer(...)", stacklevel=1)
        warnings.warn("Total length of `DataLoader` across ranks is zero. Please make sure ...", stacklevel=1)
        warnings.warn("The 'val_dataloader' does not have many workers which may be a bottleneck.", stacklevel=1)
        warnings.warn("a warning of our own", stacklevel=1)
    assert [str(w.message) for w in caught] == ["a warning of our own"]


def test_lightning_tips_and_chatter_are_dropped(caplog):
    quiet_logs.install()
    rank_zero = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    with caplog.at_level(logging.INFO):
        rank_zero.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        rank_zero.info("GPU available: False, used: False")
        rank_zero.info("`Trainer(limit_train_batches=1.0)` was configured so 100% of the batches per epoch will be used..")
        rank_zero.info("`Trainer.fit` stopped: `max_epochs=20` reached.")
        logging.getLogger("lightning_fabric.utilities.seed").info("Seed set to 0")
        rank_zero.info("Restoring states from the checkpoint path at last.ckpt")  # not listed: shows
        rank_zero.warning("a warning Lightning gives")
    assert [r.getMessage() for r in caplog.records] == ["Restoring states from the checkpoint path at last.ckpt",
                                                        "a warning Lightning gives"]


def test_install_is_idempotent():
    quiet_logs.install()
    quiet_logs.install()
    assert len(logging.getLogger("pytorch_lightning.utilities.rank_zero").filters) == 1


def test_every_entry_says_why():
    assert all(why.strip() for _, why in quiet_logs.WARNINGS)
    assert all(patterns for patterns in quiet_logs.LOG_LINES.values())


def test_wandb_anonymous_is_dropped_before_init():
    class FakeWandbLogger:
        _wandb_init = {"project": "p", "anonymous": None, "mode": "offline"}

    logger = FakeWandbLogger()
    quiet_logs.drop_wandb_anonymous(logger)
    assert logger._wandb_init == {"project": "p", "mode": "offline"}
    logger._wandb_init["anonymous"] = "allow"  # set on purpose: kept
    quiet_logs.drop_wandb_anonymous(logger)
    assert logger._wandb_init["anonymous"] == "allow"
    quiet_logs.drop_wandb_anonymous(object())  # a logger without pending init arguments: nothing to do
