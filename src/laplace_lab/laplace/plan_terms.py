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

from laplace_lab.laplace.backends.capture import STREAM_BUDGET, stream_factors


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
    # the capture backend streams the output factors' gradients (``plan.fit_plan`` decides it with
    # ``backends.capture.stream_factors`` on a budget device); None: ``stream_factors``' constant rule
    stream: bool | None = None

    @property
    def n_params(self) -> int:
        return sum(lay.numel for lay in self.layers)

    @property
    def recorded(self) -> int:
        """Output elements per input of the subset's modules (their gradients are kept per factor)."""
        return sum(lay.out_numel for lay in self.layers)

    def can_stream(self, factor_chunks: bool) -> bool:
        """Whether the capture backend can stream a fit of a structure with ``factor_chunks`` on this
        shape (all weights, not the graph-free chain's model)."""
        return self.subset != "last_layer" and not self.chain and factor_chunks

    def streams(self, batch: int, n_factors: int, factor_chunks: bool) -> bool:
        """Whether a fit batch of ``batch`` inputs is planned streamed: ``stream`` where decided, else
        ``backends.capture.stream_factors``' constant rule on ``K N`` times ``recorded`` elements."""
        if not self.can_stream(factor_chunks):
            return False
        return self.stream if self.stream is not None else stream_factors(n_factors * batch * self.recorded)


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
    stream: bool = False  # the capture backend streams the fit's output factors (``plan.fit_plan``)

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
    capture backend as ``ModelShape.streams`` says: ``backends.capture.stream_factors``, the
    backend's own rule) and the cotangent in flight through the widest layer."""
    b, N, K, C = shape.itemsize, batch, n_factors, shape.n_outputs
    last = shape.subset == "last_layer"
    grads = K * N * shape.recorded
    if shape.streams(batch, n_factors, factor_chunks):  # one factor's arriving beside STREAM_BUDGET held
        grads = min(grads, N * shape.recorded + STREAM_BUDGET)
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
