"""MAP training: ``MAPCore`` (plain ``nn.Module``), ``MAPModule`` (its LightningModule, loaded on first
use: importing Lightning costs seconds), the online marginal-likelihood callback and the loops."""

from laplace_lab.training.module import MAPCore

__all__ = ["MAPCore", "MAPModule"]


def __getattr__(name: str):
    if name == "MAPModule":
        from laplace_lab.training.lightning_classes import MAPModule

        return MAPModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
