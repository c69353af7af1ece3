"""How long the evaluation will take: one log line per section, and an estimate of the rest.

The test-set pass comes first; its seconds per input (every predictor on it) times the inputs
still planned (``planned``: OOD loaders, rotation angles x test inputs, CIFAR-10-C corruptions x
severities x images) is the estimate, logged once after the test pass and handed to ``on_eta``
after every section. Sections whose cost is not such a pass (the generated OOD sets, FGSM, the
toy contours) are timed but not predicted; the line names them.

    evaluation: test set in 41 s (10000 inputs); about 9 min 10 s for the rest (ood: 30000 inputs,
    rotation: 130000 inputs; not estimated: adversarial)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

from laplace_lab.io.eta import format_duration

log = logging.getLogger(__name__)


class EvalTimer:
    """Args:
        planned: ``{section: inputs it will predict}`` for the estimated sections.
        unestimated: names of the sections that run but are not estimated.
        on_eta: receives the estimated seconds left after the test pass and after each section.
        clock: seconds (monotonic); tests pass a fake one.
    """

    def __init__(self, planned: dict[str, int], unestimated: list[str] | None = None,
                 on_eta: Callable[[float | None], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.planned = {k: int(v) for k, v in planned.items() if v}
        self.unestimated = list(unestimated or [])
        self.on_eta, self.clock = on_eta, clock
        self.per_input: float | None = None

    def left_s(self) -> float | None:
        """Estimated seconds of the planned sections not yet done (None before the test pass)."""
        return None if self.per_input is None else self.per_input * sum(self.planned.values())

    def test_done(self, seconds: float, n_inputs: int) -> None:
        self.per_input = seconds / max(n_inputs, 1)
        parts = ", ".join(f"{k}: {v} inputs" for k, v in self.planned.items())
        if self.unestimated:
            parts += ("; " if parts else "") + "not estimated: " + ", ".join(self.unestimated)
        rest = f"about {format_duration(self.left_s())} for the rest" if self.planned else "nothing else estimated"
        log.info("evaluation: test set in %s (%d inputs); %s%s", format_duration(seconds), n_inputs, rest,
                 f" ({parts})" if parts else "")
        if self.on_eta is not None:
            self.on_eta(self.left_s())

    @contextmanager
    def section(self, name: str):
        """Time the section ``name``; afterwards log it and hand the new estimate to ``on_eta``."""
        start = self.clock()
        yield
        seconds = self.clock() - start
        ran = name in self.planned or name in self.unestimated
        self.planned.pop(name, None)
        if name in self.unestimated:
            self.unestimated.remove(name)
        if ran and seconds >= 0.05:
            left = self.left_s()
            tail = f"; about {format_duration(left)} left" if left and self.planned else ""
            log.info("evaluation: %s in %s%s", name, format_duration(seconds), tail)
        if self.on_eta is not None:
            self.on_eta(self.left_s())
