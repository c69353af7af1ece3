"""Objects from config nodes (``_target_``) with our errors shown as they are.

``CONFIG_ERRORS`` are what validation and our constructors raise on bad input. Inside
``config_phase()`` they are marked as bad input (``err.config_error``), and ``instantiate`` unwraps
them from Hydra's ``InstantiationException``; ``train.main`` then prints the message alone instead of
a traceback (``HYDRA_FULL_ERROR=1``: the traceback).
"""

from __future__ import annotations

from contextlib import contextmanager

import hydra
from hydra.errors import InstantiationException

CONFIG_ERRORS = (ValueError, FileNotFoundError)


@contextmanager
def config_phase():
    """Mark ``ValueError`` / ``FileNotFoundError`` raised inside as bad input (``err.config_error``)."""
    try:
        yield
    except CONFIG_ERRORS as err:
        err.config_error = True
        raise


def instantiate(node, *args, **kwargs):
    """``hydra.utils.instantiate`` that re-raises our own errors unwrapped.

    Hydra wraps constructor errors in ``InstantiationException``; the original
    ``ValueError`` / ``FileNotFoundError`` names the option and the allowed values, so show it.
    """
    try:
        return hydra.utils.instantiate(node, *args, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, CONFIG_ERRORS):
            err.__cause__.config_error = True
            raise err.__cause__ from None
        raise

