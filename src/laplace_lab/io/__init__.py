"""Helpers shared by every layer, the engine included (so: pure Python, nothing imported from the
layers above, neither Lightning nor Hydra): ``atomic`` (write-then-rename for files other processes
read), ``fields`` (typed options: each declares its type, default and allowed values once) and
``declare`` (classes that declare their options, found by their ``_target_``)."""
