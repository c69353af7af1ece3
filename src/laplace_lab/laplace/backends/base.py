"""Curvature-collection backends: how ``Laplace.fit`` turns a batch into the per-layer statistics
its structure accumulates.

Every backend hands the structure the same normalised form: one ``capture.Record`` per subset entry
(module), each call with its inputs ``args`` and ``grad`` ``[K, *output.shape]``, the ``K`` output
factors ``V`` (``output_factors.output_factors``: ``H = sum_k J^T v_k v_k^T J``) back-propagated to the
call's output; plus the batch's prepared outputs ``f`` ``[N, C]`` and targets for the loss.

A backend is a subclass of ``Backend`` registered with ``@register``; ``Laplace(backend=name)`` then
selects it (``"auto"``: the first registered backend whose ``supports`` accepts the model, in
``AUTO_ORDER``). Adding a backend touches one file.
"""

from __future__ import annotations

import torch

from laplace_lab.laplace.registry import registrar

BACKENDS: dict[str, type[Backend]] = {}
AUTO_ORDER = ("chain", "capture")  # "auto" tries these in order (today's choice: the chain when it can)


register = registrar(BACKENDS, "backend")


class Backend:
    """One way of collecting curvature for ``la`` (a ``Laplace``), built once per ``fit_begin``."""

    name = ""
    batchwise = True  # False: the structure's own data pass (``Structure.self_fitting``) does the work

    @classmethod
    def supports(cls, la) -> str | None:
        """``None`` if this backend can collect curvature for ``la``, else the reason (a sentence)."""
        return None

    def __init__(self, la):
        self.la = la

    def batch(self, X, y) -> tuple[torch.Tensor, torch.Tensor, list]:
        """One forward and one backward of the ``K`` output factors of ``(X, y)``; returns
        ``(f [N, C] detached, prepared targets, records)`` for ``Laplace.add_batch``."""
        raise NotImplementedError


def check_structure(la, name: str) -> None:
    """``ValueError`` unless backend ``name`` fits ``la``'s structure: self-fitting structures (lowrank)
    take "auto" | "lanczos" only, the others any batch backend."""
    if la.structure.self_fitting and name not in ("auto", "lanczos"):
        raise ValueError(f"backend={name!r} cannot fit hessian_structure={la.hessian_structure!r}, which "
                         "makes its own data pass; allowed: ['auto', 'lanczos']")
    if not la.structure.self_fitting and name == "lanczos":
        raise ValueError(f"backend='lanczos' (matrix-free) needs a self-fitting structure such as "
                         f"hessian_structure='lowrank'; got {la.hessian_structure!r}")


def choose(la, name: str) -> Backend | None:
    """The backend ``name`` for ``la`` (``"auto"``: the first of ``AUTO_ORDER`` that supports it;
    ``None`` for self-fitting structures); ``ValueError`` if a named backend does not support ``la``
    (checked with the model in the mode the fit runs it: eval)."""
    check_structure(la, name)
    if la.structure.self_fitting:
        return None
    if name == "auto":
        for n in AUTO_ORDER:
            if BACKENDS[n].supports(la) is None:
                backend = BACKENDS[n](la)
                if hasattr(backend, "fallback"):  # e.g. the chain hands dict batches to the next in line
                    backend.fallback = choose_after(la, n)
                return backend
        raise ValueError(f"no curvature backend supports this model (tried {list(AUTO_ORDER)})")
    reason = BACKENDS[name].supports(la)
    if reason is not None:
        raise ValueError(f"backend={name!r} does not support this model: {reason}")
    return BACKENDS[name](la)


def choose_after(la, name: str) -> Backend | None:
    """The first backend after ``name`` in ``AUTO_ORDER`` that supports ``la`` (or ``None``)."""
    for n in AUTO_ORDER[AUTO_ORDER.index(name) + 1:]:
        if BACKENDS[n].supports(la) is None:
            return BACKENDS[n](la)
    return None


def backend_names() -> tuple[str, ...]:
    """Allowed values of ``Laplace(backend=...)``."""
    return ("auto", *BACKENDS, "lanczos")
