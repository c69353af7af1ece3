"""``map_grid``: the MAP prior precision (the weight decay, ``delta = weight_decay * N``) chosen from a
grid by the validation NLL, each grid point trained from the same seed (``training.fit.train_map``)
in its own subfolder ``grid_<delta>``; with ``map_grid_refit`` the chosen value is trained once more
on all training rows (``refit``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from laplace_lab.config.load import replaced
from laplace_lab.config.schema import RunConfig
from laplace_lab.data.registry import required_class
from laplace_lab.training.fit import train_map
from laplace_lab.training.loops import TrainingLoop
from laplace_lab.training.module import MAPCore
from laplace_lab.training.validation_nll import validation_nll

REFIT_NAME = "refit"  # the folder of map_grid_refit's last training


def grid_point_name(delta: float) -> str:
    """The folder (under the run's) of the ``map_grid`` training with prior precision ``delta``."""
    return f"grid_{delta:g}"


def grid_point_config(run: RunConfig, delta: float, name: str) -> RunConfig:
    """The config of one training of ``map_grid``, in the subfolder ``name`` of the run's: prior
    precision ``delta``, no grid (so it shares the MAP cache with a plain run of that prior
    precision), and an explicit ``checkpoint.dirpath`` narrowed to ``<dirpath>/<name>`` so that
    the grid's trainings neither overwrite nor resume each other's checkpoints."""
    changes = {"prior.prior_precision": float(delta), "map_grid": None, "map_grid_refit": False}
    if run.checkpoint.dirpath:
        changes["checkpoint.dirpath"] = str(Path(run.checkpoint.dirpath) / name)
    return replaced(run, changes)


def refit_config(run: RunConfig, delta: float) -> RunConfig:
    """The config of ``map_grid_refit``'s last training (named ``refit``): a grid point of ``delta``
    with the validation rows given back to training: the option the data module declares as its
    ``validation_option`` (``data.val_fraction``, ``data.n_val``) set to 0."""
    point = grid_point_config(run, delta, REFIT_NAME)
    return replaced(point, {f"data.{required_class(point.data).validation_option}": 0})


def loader_rmse(module: MAPCore, loader) -> float:
    """Root mean squared error of the MAP network over ``loader``'s rows (standardised units)."""
    module.eval()
    with torch.no_grad():
        err = [(module(x) - y.reshape(len(y), -1)).pow(2) for x, y in loader]
    return float(torch.cat(err).mean().sqrt())


def train_map_grid(run: RunConfig, output_dir: Path, loggers, loop: TrainingLoop | None = None):
    """Train every grid point and keep the one with the lowest validation NLL.

    ``map_grid_refit=false``: the chosen grid network is the MAP; for regression its noise std is
    its validation RMSE. ``map_grid_refit=true`` (the heteroscedastic-nn authors' MAP-CV): the MAP
    is trained once more, from the same seed, with the chosen delta on all training rows
    (validation rows included); for regression its noise std is its training RMSE (the maximum-
    likelihood noise given the network). ``val/nll`` is the chosen grid point's either way."""
    best, grid_metrics, total_time, resumed = None, {}, 0.0, 0.0
    for delta in run.map_grid:
        name = grid_point_name(delta)
        datamodule, module, trainer, metrics = train_map(grid_point_config(run, delta, name), output_dir / name,
                                                         loggers=[], loop=loop)
        metrics["val/nll"] = validation_nll(module, datamodule)
        grid_metrics[f"grid/prior_{delta:g}/val_nll"] = metrics["val/nll"]
        total_time += metrics["time/fit_s"]
        resumed += metrics.get("checkpoint/resumed_fit_s", 0.0)
        if best is None or metrics["val/nll"] < best[4]["val/nll"]:
            best = (delta, datamodule, module, trainer, metrics)
    best_delta, datamodule, module, trainer, metrics = best
    val_nll = metrics["val/nll"]
    if run.map_grid_refit:  # the grid's own value, not the module's copy of it (float32 for a float32 model)
        datamodule, module, trainer, metrics = train_map(refit_config(run, best_delta), output_dir / REFIT_NAME,
                                                         loggers=loggers, loop=loop)
        total_time += metrics["time/fit_s"]
        resumed += metrics.get("checkpoint/resumed_fit_s", 0.0)
        noise_rows = datamodule.train_eval_dataloader()
    else:
        noise_rows = datamodule.val_dataloader()
    if module.likelihood == "regression":
        module.set_sigma_noise(loader_rmse(module, noise_rows))
    metrics = {**metrics, **grid_metrics, "val/nll": val_nll, "time/fit_s": total_time,
               "hparams/prior_precision": float(module.prior_precision.mean())}
    metrics.pop("checkpoint/resumed_fit_s", None)
    if resumed:  # every training's seconds before the checkpoints it resumed
        metrics["checkpoint/resumed_fit_s"] = resumed
    return datamodule, module, trainer, metrics
