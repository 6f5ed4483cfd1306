"""Offline tuning: ``kernelops tune``'s machinery.

- :mod:`~kernelops.tuning.specs`: call specs (shapes and flags, tensors built on demand) and the
  ``--shapes`` syntax;
- :mod:`~kernelops.tuning.presets`: named presets (``llm`` for flash_attention) and filters;
- :mod:`~kernelops.tuning.registry`: the ops that can be tuned offline;
- :mod:`~kernelops.tuning.compile`: parallel compile warm-up in worker processes;
- :mod:`~kernelops.tuning.runner`: tune specs, derive inference entries;
- :mod:`~kernelops.tuning.sinks`: where entries go (a shipped-format file or the disk cache);
- :mod:`~kernelops.tuning.report`: progress line and summary table.
"""
