"""What every network of the ``model`` config group declares on its class.

A network is an ``nn.Module`` that also subclasses ``LabModel`` (a ``io.declare.Declared``): its
``Options``, a frozen dataclass of ``fields.option`` fields, is the one declaration of its options
(type, default, range or choices). The ``model`` config group is checked against it before any data
loads (``models.registry.check_model``), and the constructor takes ``(input_shape, num_outputs)``
(completed from the data module), then its options, positional in the order of ``Options`` or by
keyword, read by ``bind_options`` (the same messages: ``model.<option>`` and the allowed values).
"""

from __future__ import annotations

from laplace_lab.io.declare import Declared


class LabModel(Declared):
    """Mixin of the networks: ``Options`` and ``bind_options`` (see the module docstring)."""

    option_group = "model"
