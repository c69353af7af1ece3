"""Name registries of the engine's plug-ins (posterior structures, curvature backends)."""

from __future__ import annotations


def registrar(table: dict, option: str):
    """A class decorator filing a class under its ``name`` in ``table``, so that ``option=name`` selects it."""

    def register(cls):
        if not cls.name:
            raise ValueError(f"{cls.__name__}.name must be a non-empty string to register it as a {option}")
        table[cls.name] = cls
        return cls

    register.__doc__ = f"Class decorator: make ``cls`` available as ``{option}=cls.name``."
    return register
