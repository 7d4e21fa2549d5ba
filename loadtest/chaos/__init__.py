"""The reliability campaign (docs/reliability.md): ``python -m loadtest.chaos.campaign --duration 300``
(``make chaos``).

``stack`` starts the processes under test, ``harness.relay`` (``python -m harness.relay``) sits between the proxy and
the simulated cluster to slow the network down; the watch-stream checker is harness/checker.py.
"""
