"""Load tests of watchcache: locust scenarios (``locustfile.py``), the runner (``run.py``), reports.

Modules that locust does not need (``continuity``, ``latency``, ``report``, ``stack``) import
neither gevent nor locust, so the test suite can use them without gevent's monkey patching.
"""
