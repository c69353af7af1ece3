"""What a structure's memory plan is made of (``Structure.memory_plan``): the model's shape as a plan
reads it (``ModelShape``, one ``LayerShape`` per subset entry), the plan itself (``MemoryPlan``, in
bytes) and the terms every structure shares: what a batch backend keeps per fit batch
(``backend_batch_bytes``) and what the glm predictive needs per test input (``glm_bytes_per_input``).
``laplace.plan`` probes the model, asks the structures and checks the budget; the structures import
this module, so neither imports the other's caller.

Conventions as in ``laplace.plan``: bytes; ``K`` = output factors, ``N`` = fit batch, ``C`` = network
outputs, ``P`` = parameters in the subset, ``b`` = bytes per element of the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laplace_lab.laplace.backends.capture import FACTOR_BUDGET, STREAM_BUDGET


@dataclass(frozen=True)
class LayerShape:
    """One subset entry (a module and its parameters in the subset)."""

    kfac: bool  # a Linear / Conv2d (KFAC factors ``G (x) A``)
    d_in: int  # ``A`` side: in_features, or C_in / groups * kh * kw
    d_out: int  # ``G`` side: out_features / out_channels
    positions: int  # output positions per input ``S`` (1 for a Linear on ``[N, D]``)
    numel: int  # parameters of the entry in the subset
    out_numel: int  # module output elements per input


@dataclass(frozen=True)
class ModelShape:
    """What a plan needs of a model and a subset (``shape_of`` of a ``probe_model`` result)."""

    subset: str
    layers: tuple[LayerShape, ...]
    n_outputs: int  # C
    activations: int  # input + every leaf module's output elements, per input
    widest: int  # the largest leaf output (or input) per input
    itemsize: int  # bytes per element of the model's dtype
    chain: bool  # the graph-free chain backend runs this model (no streaming of output factors)

    @property
    def n_params(self) -> int:
        return sum(lay.numel for lay in self.layers)

    @property
    def recorded(self) -> int:
        """Output elements per input of the subset's modules (their gradients are kept per factor)."""
        return sum(lay.out_numel for lay in self.layers)


@dataclass
class MemoryPlan:
    """Bytes of one structure on one model (``Structure.memory_plan``). ``fit`` is the peak of
    ``fit`` including ``state``; the predictive of ``n`` inputs needs ``predict_fixed +
    n * predict_per_input`` beside the state, ``sample(n)`` ``sample_fixed + n * sample_per_draw``."""

    state: int
    fit: int
    predict_fixed: int
    predict_per_input: int
    sample_fixed: int
    sample_per_draw: int
    parts: dict[str, int] = field(default_factory=dict)  # named terms of ``fit`` (messages, tables)

    def predict(self, n_inputs: int) -> int:
        return self.predict_fixed + n_inputs * self.predict_per_input

    def sample(self, n_draws: int) -> int:
        return self.sample_fixed + n_draws * self.sample_per_draw


# ---- what every batch backend keeps ----------------------------------------------------------------
def backend_batch_bytes(shape: ModelShape, batch: int, n_factors: int, factor_chunks: bool) -> dict[str, int]:
    """Bytes a batch backend keeps for one fit batch of ``batch`` inputs, by part: the forward
    (``activations``: all-weights keeps every leaf output, last-layer runs without a graph and holds
    about two at a time), the ``K`` output factors ``V`` and the network output, the output
    gradients of the recorded modules (``K N`` rows each; streamed one factor at a time by the
    capture backend when they exceed ``backends.capture.FACTOR_BUDGET`` elements and the structure
    has ``factor_chunks``) and the cotangent in flight through the widest layer."""
    b, N, K, C = shape.itemsize, batch, n_factors, shape.n_outputs
    last = shape.subset == "last_layer"
    grads = K * N * shape.recorded
    if not last and not shape.chain and factor_chunks and grads > FACTOR_BUDGET:
        grads = N * shape.recorded + STREAM_BUDGET
    return {"activations": b * N * (2 * shape.widest if last else shape.activations),
            # the exact classification GGN's factors (K = C - 1, curvature._classification_ggn_sqrt)
            # pass through two more [N, C, C] tensors before the kept [K, N, C]
            "output_factors": b * N * C * (2 * K + 2 if K == C - 1 and C > 1 else K + 2),
            "output_gradients": b * grads,
            # autograd's cotangent of the widest layer (the chain back-propagates into the kept gradients)
            "cotangent": 0 if last or shape.chain else b * K * N * shape.widest}


def glm_bytes_per_input(shape: ModelShape) -> int:
    """Predictive bytes per test input common to every structure (``functional_variance``): the
    forward, the ``C`` unit directions' gradients of the recorded modules, their rotated copies and
    the ``[C, C]`` output covariance."""
    C, b = shape.n_outputs, shape.itemsize
    forward = 2 * shape.widest if shape.subset == "last_layer" else shape.activations
    return b * (forward + 2 * C * shape.recorded + 2 * C * C)
