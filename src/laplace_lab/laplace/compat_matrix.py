"""laplace-torch's un-decomposed Kronecker curvature ``Kron`` as a plain list of factors.

``Kron([[G, A], [G_b], [h], ...])``: one entry per parameter tensor, ``[G, A]`` (``H ~= G (x) A``,
a weight of a Linear / Conv layer), ``[B]`` (a dense ``[n, n]`` block, e.g. a bias) or ``[h]`` (a
``[n]`` diagonal block). ``kfacs`` is the list itself (laplace-torch's attribute name),
``to_matrix()`` the dense block-diagonal ``[P, P]``, ``clone()`` a copy. The engine's own kron
structure keeps eigendecomposed blocks; ``Laplace.H_facs`` returns this view of its raw factors.
"""

from __future__ import annotations

import torch


def _block(facs: list[torch.Tensor]) -> torch.Tensor:
    if len(facs) == 2:
        return torch.kron(facs[0], facs[1])
    return facs[0] if facs[0].ndim == 2 else torch.diag(facs[0])


class Kron(list):
    """List of per-tensor factor lists (see the module docstring)."""

    @property
    def kfacs(self) -> Kron:
        return self

    def to_matrix(self) -> torch.Tensor:
        """Dense block-diagonal ``[P, P]``."""
        return torch.block_diag(*[_block(f) for f in self])

    def clone(self) -> Kron:
        return Kron([[t.clone() for t in f] for f in self])

    @classmethod
    def zeros_like_params(cls, params) -> Kron:
        """laplace-torch's initial ``H`` of a kron posterior: ``[0_{out x out}, 0_{in x in}]`` per weight
        (``in`` = the other dimensions flattened), ``[0_{n x n}]`` per 1-d parameter."""
        out = cls()
        for p in params:
            z = dict(device=p.device, dtype=p.dtype)
            if p.ndim >= 2:
                n_out = p.shape[0]
                out.append([torch.zeros(n_out, n_out, **z), torch.zeros(p.numel() // n_out, p.numel() // n_out, **z)])
            else:
                out.append([torch.zeros(p.numel(), p.numel(), **z)])
        return out


__all__ = ["Kron"]
