"""``watchcache sim``: a writable in-memory Kubernetes API for demos, tests and load tests.

It sits on top of the product (it reuses the cache, the server and the process lifecycle);
nothing in the product imports it but the command line, which dispatches ``watchcache sim``
and ``watchcache serve --simulated`` to ``sim.wiring``.
"""
