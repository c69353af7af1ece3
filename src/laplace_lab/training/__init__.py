"""MAP training: ``MAPCore`` (plain ``nn.Module``), ``MAPModule`` (its LightningModule, loaded on first
use: importing Lightning costs seconds), the online marginal-likelihood callback and the loops."""

from laplace_lab import lazy_attributes
from laplace_lab.training.module import MAPCore, MAPOptimisation

__all__ = ["MAPCore", "MAPModule", "MAPOptimisation"]
__getattr__ = lazy_attributes(__name__, {"MAPModule": "laplace_lab.training.lightning_classes"})
