"""MAP training (LightningModule) and the online marginal-likelihood callback."""

from laplace_lab.training.module import MAPModule

__all__ = ["MAPModule"]
