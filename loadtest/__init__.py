"""Load tests and benchmarks of watchcache, three programs run with ``python -m`` from the repository's root:

* ``loadtest.bench``: the hot-path benchmarks (``python -m loadtest.bench.fanout`` …), their library
  (``lib``) and their load-side helper processes (``watch_reader``, ``raw_fanout``, ``raw_list``,
  ``list_client``), one module each;
* ``loadtest.locust``: the locust scenarios (``locustfile.py``) and their runner (``python -m loadtest.locust.run``);
* ``loadtest.chaos``: the reliability campaign (``python -m loadtest.chaos.campaign``), its stack and relay.
"""
