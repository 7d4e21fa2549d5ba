"""Locust load tests of watchcache: the scenarios (``locustfile.py``), the runner (``python -m loadtest.locust.run``),
reports.

Modules that locust does not need (``continuity``, ``latency``, ``report``, ``stack``) import
neither gevent nor locust, so the test suite can use them without gevent's monkey patching.
"""
