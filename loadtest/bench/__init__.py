"""The hot-path benchmarks: ``python -m loadtest.bench.NAME [--quick]``, each printing a table and a ``BENCH {json}``
line (docs/performance.md). ``lib`` is the orchestrator's library; ``watch_reader``, ``raw_fanout``, ``raw_list``,
``list_client``, ``busy_writer`` and ``flood`` (among others) are the load-side processes the benchmarks
start (``python -m loadtest.bench.watch_reader`` …).
"""
