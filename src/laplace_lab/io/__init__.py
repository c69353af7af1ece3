"""Helpers shared by every layer: ``atomic`` (write-then-rename for files other processes read) and
``fields`` (typed options: each declares its type, default and allowed values once)."""
