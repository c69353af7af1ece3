"""The Laplace fit across processes (``torch.distributed``): every rank passes over its own shard of
the data, then the ranks sum what their structures hold, once, at the end of the fit.

When a process group is in use (``Laplace(process_group="auto")``, the default: the default group
once ``torch.distributed`` is initialised with more than one process; ``None``: never; or a
``ProcessGroup``), ``Laplace.fit`` accumulates over this rank's shard (a ``DistributedSampler``
loader or one the user shards: the shards must partition the data) and ``Laplace.fit_end``

1. checks that the ranks agree (``fingerprint``: structure and its options, likelihood,
   curvature, subset, parameter sizes, dtype, a hash of the model's state and of the
   hyperparameters, and the names / shapes of what will be summed), by one ``all_gather_object``;
   a disagreement is a ``DistributedMismatchError`` on every rank naming the field and each rank's
   value, instead of a collective on mismatched buffers (a hang or garbage);
2. sums over the ranks, in place, what the structure declares (``Structure.shard_reduction``):
   ``"sum"``: the accumulators of ``Structure.shard_sums()`` (kron's factor sums and row counts,
   diag's diagonal, full's float64 matrix; last-layer subsets alike); ``"operator"``: the structure
   sums each product of its own operator during its fit (lowrank: every Lanczos product, so every
   rank runs the same Lanczos iteration from the same seeded start vector); ``None``: it cannot be
   reduced and the fit raises before the data pass;
3. sums the loss and the number of data points.

Every rank then holds the same posterior: the marginal likelihood, prior / noise optimisation and
sampling (same ``generator`` seed) run identically on every rank without further communication.
The predictive of a sharded test loader is gathered in data order by ``gather_ordered``.

Timeouts: the engine adds no clock of its own; every collective here is bounded by the process
group's timeout (``init_process_group(..., timeout=timedelta(...))``; torch's default is 30
minutes for gloo, 10 for NCCL). A rank that died or never reaches the collective makes the others
raise ``DistributedFitError`` (naming the step, the rank and the timeout) within that time, or at
once when the dead rank's connection closes (gloo). On NCCL the timeout needs
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (on by default in torch >= 2.2), and object collectives use the
current CUDA device (``torch.cuda.set_device(local_rank)`` first).
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

AUTO = "auto"


class DistributedFitError(RuntimeError):
    """A collective of the distributed fit failed (a rank died, or timed out)."""


class DistributedMismatchError(ValueError):
    """The ranks of a distributed fit disagree on something that must be the same everywhere."""


def check_process_group(value):
    """``value`` if it is ``"auto"``, ``None`` or a ``torch.distributed.ProcessGroup``; else ``ValueError``."""
    if value is None or value == AUTO:
        return value
    if dist.is_available() and isinstance(value, dist.ProcessGroup):
        return value
    raise ValueError(f"process_group must be 'auto', None or a torch.distributed.ProcessGroup; got {value!r}")


def fit_group(la):
    """The process group ``la`` fits across, or ``None`` (one process: nothing to reduce).

    ``la.process_group`` "auto": the default group when ``torch.distributed`` is initialised with a
    world size above 1; a ``ProcessGroup``: that group if it has more than one rank; ``None``: none."""
    option = la.process_group
    if option is None or not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.group.WORLD if option == AUTO else option
    return group if dist.get_world_size(group) > 1 else None


def group_timeout(group) -> str:
    """The process group's collective timeout as text (``"unknown"`` where torch does not expose it)."""
    try:
        device = torch.device("cuda") if dist.get_backend(group) == "nccl" else torch.device("cpu")
        return str(group._get_backend(device).options._timeout)
    except Exception:  # private API: the message is still useful without it
        return "unknown"


def _collective(what: str, group, fn):
    """Run the collective ``fn()``; a failure becomes a ``DistributedFitError`` naming ``what``."""
    try:
        return fn()
    except RuntimeError as e:  # DistBackendError (timeout, peer closed) subclasses RuntimeError
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        raise DistributedFitError(
            f"Laplace distributed fit: {what} failed on rank {rank} of {world}: another rank exited or did "
            f"not reach it within the process group timeout ({group_timeout(group)}): {e}") from e


def all_reduce_sum(t: torch.Tensor, group, what: str) -> torch.Tensor:
    """``t`` summed over the ranks of ``group``, in place (and returned)."""
    _collective(what, group, lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group))
    return t


def _hash(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().reshape(-1).contiguous().cpu()
        h.update(str((t.dtype, t.numel())).encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def fingerprint(la, layout: dict | None = None) -> dict:
    """What every rank must share: the configuration, a hash of the model's parameters and buffers
    (the MAP weights), a hash of the hyperparameters and ``layout`` (names -> shapes / dtypes of the
    tensors to be summed)."""
    s = la.structure
    return {
        "hessian_structure": la.hessian_structure,
        "structure_options": {k: str(getattr(s, k, None)) for k in s.options},
        "likelihood": la.likelihood,
        "curvature": la.curvature,
        "subset_of_weights": la.subset_of_weights,
        "n_params": la.n_params,
        "sizes": la.sizes,
        "dtype": str(la.dtype),
        "model_hash": _hash(la.model.state_dict().values()),
        "hyper_hash": _hash([la.prior_precision, la.prior_mean, la.sigma_noise,
                             torch.tensor(la.temperature)]),
        "shard_sums": layout,
    }


def check_agreement(la, group, layout: dict | None = None) -> list:
    """Gather every rank's ``fingerprint`` (and its ``n_outputs``, ``None`` where its shard was
    empty) and raise ``DistributedMismatchError`` (on every rank) for the first field where they
    differ; returns the ranks' ``n_outputs``."""
    mine = fingerprint(la, layout)
    world = dist.get_world_size(group)
    everyone = [None] * world
    _collective("the agreement check (all_gather_object)", group,
                lambda: dist.all_gather_object(everyone, (mine, la.n_outputs), group=group))
    outputs = [o for _, o in everyone]
    everyone = [fp for fp, _ in everyone]
    for key in mine:
        values = [fp[key] for fp in everyone]
        if any(v != values[0] for v in values):
            per_rank = "; ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            hint = " (a rank with an empty shard holds no factors of some layers)" if key == "shard_sums" else ""
            raise DistributedMismatchError(
                f"Laplace distributed fit over {world} processes: the ranks disagree on {key}{hint}; {per_rank}. "
                "Every rank must fit the same model (same weights), options and hyperparameters on its own shard.")
    if len({o for o in outputs if o is not None}) > 1:
        raise DistributedMismatchError(f"Laplace distributed fit: the ranks' network outputs differ (n_outputs per "
                                       f"rank: {outputs})")
    return outputs


def check_reducible(la) -> None:
    """``ValueError`` before any work when ``la`` would fit across processes with a structure that
    declares no reduction (``Structure.shard_reduction is None``)."""
    if fit_group(la) is None or la.structure.shard_reduction is not None:
        return
    from laplace_lab.laplace.structures import STRUCTURES

    able = [n for n, c in STRUCTURES.items() if c.shard_reduction is not None]
    raise ValueError(
        f"hessian_structure={la.hessian_structure!r} declares no reduction over processes (shard_reduction=None), "
        f"but torch.distributed is initialised with {dist.get_world_size(fit_group(la))} processes; structures "
        f"that reduce: {able}; or pass process_group=None to fit every rank on its own data")


def check_shard_loader(loader) -> None:
    """``ValueError`` for a loader whose ``DistributedSampler`` pads its shards (``drop_last=False``
    and a data set size not divisible by the number of replicas): the padding repeats samples, which
    a summed fit would count twice."""
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, torch.utils.data.DistributedSampler) or sampler.drop_last:
        return
    n, world = len(sampler.dataset), sampler.num_replicas
    if n % world:
        raise ValueError(
            f"the fit loader's DistributedSampler pads {n} samples to {sampler.total_size} over {world} processes, so "
            f"{sampler.total_size - n} samples would be counted twice in the summed fit; use a data set size divisible "
            f"by {world}, or DistributedSampler(..., drop_last=True) (drops {n % world} samples)")


class ShardBatches:
    """Rank ``rank``'s share of ``loader``'s batches: batches ``rank``, ``rank + world``, ... (a
    partition of the data whatever the loader's batching, for a loader in fixed order). Every rank
    still iterates (loads) all batches and skips the others': cheap for in-memory tensors, a
    loading cost otherwise; a ``DistributedSampler`` avoids it where the loader can be rebuilt."""

    def __init__(self, loader, world: int, rank: int):
        if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
            raise ValueError(f"ShardBatches needs 0 <= rank < world; got rank={rank!r}, world={world!r}")
        self.loader, self.world, self.rank = loader, world, rank

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i % self.world == self.rank:
                yield batch


def reduce_fit(la, group) -> None:
    """Check agreement, then sum the structure's shard sums (``"sum"`` structures), the loss and
    ``n_data`` over ``group``; ``n_outputs`` becomes the ranks' common value."""
    s = la.structure
    sums = s.shard_sums() if s.shard_reduction == "sum" else {}
    layout = [(k, tuple(v.shape), str(v.dtype)) for k, v in sums.items()]  # a list: the order must agree too
    outputs = check_agreement(la, group, layout)
    totals = {"loss": la.loss.detach().clone(), "n_data": torch.tensor([la.n_data], device=la.device)}
    sum_coalesced(sums | totals, group, f"the sum of the {s.name} accumulators")
    if sums:
        s.set_shard_sums(sums)
    la.loss = totals["loss"]
    la.n_data = int(totals["n_data"].item())
    la.n_outputs = next((o for o in outputs if o is not None), None)


def sum_coalesced(tensors: dict[str, torch.Tensor], group, what: str) -> None:
    """Sum every tensor of ``tensors`` over ``group`` in place, with one all-reduce per (dtype,
    device): several tensors are concatenated into one buffer first (memory: their total size once
    more), a tensor alone is reduced where it is (full's ``[P, P]`` matrix is not copied)."""
    by_kind: dict = {}
    for k, t in tensors.items():
        by_kind.setdefault((t.dtype, t.device), []).append(k)
    for (dtype, _), keys in by_kind.items():
        if len(keys) == 1:
            all_reduce_sum(tensors[keys[0]], group, f"{what} ({keys[0]})")
            continue
        flat = all_reduce_sum(torch.cat([tensors[k].reshape(-1) for k in keys]), group, f"{what} ({dtype})")
        for k, part in zip(keys, flat.split([tensors[k].numel() for k in keys])):
            tensors[k].copy_(part.view_as(tensors[k]))


def gather_ordered(values: torch.Tensor, indices, group=None) -> torch.Tensor:
    """Every rank's ``values`` ``[n_r, ...]`` (e.g. predictions of its shard) gathered into
    ``[N, ...]`` ordered by their data-set ``indices`` ``[n_r]`` (e.g. ``list(DistributedSampler)``).
    An index seen more than once (``DistributedSampler`` pads the last shard by repeating indices)
    is kept once; the result has every index in ``0..N-1`` exactly once or it raises ``ValueError``.
    ``group``: default the default group. One ``all_gather_object`` (values travel through the CPU)."""
    indices = torch.as_tensor(list(indices) if not isinstance(indices, torch.Tensor) else indices).reshape(-1)
    if indices.numel() != values.shape[0]:
        raise ValueError(f"gather_ordered: {indices.numel()} indices for {values.shape[0]} values")
    group = dist.group.WORLD if group is None else group
    parts = [None] * dist.get_world_size(group)
    _collective("gather_ordered (all_gather_object)", group,
                lambda: dist.all_gather_object(parts, (values.detach().cpu(), indices.cpu()), group=group))
    allv = torch.cat([v for v, _ in parts])
    alli = torch.cat([i for _, i in parts]).long()
    uniq, first = _first_occurrence(alli)
    if not torch.equal(uniq, torch.arange(uniq.numel())):
        raise ValueError(f"gather_ordered: the ranks' indices do not cover 0..{uniq.numel() - 1} (max index "
                         f"{int(alli.max())}, {uniq.numel()} distinct)")
    return allv[first].to(values.device)


def _first_occurrence(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted distinct values, position of the first occurrence of each in idx)``."""
    uniq, inverse = torch.unique(idx, return_inverse=True)
    pos = torch.full((uniq.numel(),), idx.numel(), dtype=torch.long)
    pos.scatter_reduce_(0, inverse, torch.arange(idx.numel()), reduce="amin")
    return uniq, pos
