"""File helpers shared by every layer: ``atomic`` (write-then-rename for files other processes read)."""
