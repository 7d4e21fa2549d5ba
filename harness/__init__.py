"""The harness: what the tests (``tests/``) and the benchmarks and campaigns (``loadtest/``) both use.

One home, written once and imported by both, as etcd's ``tests/framework`` serves its e2e and
integration tests:

- ``processes``: start a real process, wait for its ready line, stop it by its pid (``proxygroup``: a
  worker group restarted on its port; ``proxylog``: what a proxy's log says about relists);
- ``waiting``: wait for a condition, never for a length of time;
- ``doubles``: the test doubles of the product's seams (the ``WatchSink``);
- ``reflector``: client-go's reflector, one flavor per kind of client (typed, metadata, WatchList),
  over ``metaclient``'s raw HTTP; ``fleet``: the campaigns' asynchronous informers that record every
  event for ``checker`` (watch guarantees) and ``linearizability`` (consistent reads);
- ``relay``: a TCP relay with a slowness toggle between a proxy and its upstream;
- ``pki``, ``tools``: certificates for tests; the external tools (kubectl) and whether CI must have them;
- ``kube``: the reference kube-apiserver kit as the tests and the benchmarks drive it.

Why a top-level package beside ``tests/`` and ``loadtest/``, not inside either: a benchmark that
imported ``tests/`` would depend on the suite's own layout, which changes with the tests, and the
dependency would run the wrong way; ``tests/`` imports ``loadtest/`` only to test it. Both import
``harness``, which imports neither (import-linter contracts in pyproject.toml). It is importable as
``tests`` and ``loadtest`` are: from the repository's root, which pytest puts on ``sys.path`` (``tests``
is a package under the rootdir) and ``python -m loadtest…`` runs from; the benchmarks' children get it
through ``PYTHONPATH`` (``loadtest/bench/lib.child_env``). ``pip install`` ships ``watchcache`` only.
"""
