"""API Priority and Fairness (KEP-1040) for the requests this server handles: classify, queue, dispatch.

Named ``fairness``, not ``flowcontrol``: ``watchcache/http/flowcontrol.py`` is HTTP write
back-pressure (send windows), a different concept, and kube's own package for this is
``util/flowcontrol`` only because it has no HTTP flow control beside it. The core here
(``config``, ``classify``, ``shuffle``, ``queueset``) does no I/O: it decides who waits, where,
and who goes next; ``controller`` holds one worker's levels and the asyncio futures of the
requests waiting in them, and ``defaults`` is kube's bootstrap configuration.
"""
