"""The harness: what the tests (``tests/``) and the benchmarks and campaigns (``loadtest/``) both use.

One home, written once and imported by both (as etcd's ``tests/framework`` serves its e2e and
integration tests): starting a real process and waiting for its ready line (``processes``), waiting
for a condition instead of a length of time (``waiting``), the test doubles of the product's protocol
seams (``doubles``), the client-go-style reflectors (``reflector`` for the reference tier's flavors,
``informers`` for the campaigns' recording fleet), the reference kube-apiserver kit (``kube``) and the
linearizability checker the campaigns and the reliability tests share (``checking``).

Why a top-level package beside ``tests/`` and ``loadtest/`` and not inside either: ``loadtest/`` must
not import ``tests/`` (a benchmark would run the test suite's conftest machinery and its fixtures'
assumptions), and ``tests/`` imports ``loadtest/`` only to test it. Both import ``harness``; it imports
neither (import-linter contracts in pyproject.toml). It is importable the way ``tests`` and
``loadtest`` are: from the repository root, which pytest puts on ``sys.path`` (rootdir, ``tests`` is a
package) and ``python -m loadtest…`` runs from; the benchmarks' children get it through ``PYTHONPATH``
(``loadtest/bench/lib.child_env``). It is not installed with the product (``pip install`` ships
``watchcache`` only).
"""
