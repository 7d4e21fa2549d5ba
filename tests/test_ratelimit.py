"""The one token bucket (probes toward the upstream, HTTP/2 resets and control frames)."""

from watchcache.ratelimit import TokenBucket


def test_a_burst_then_the_rate_and_the_wait_until_the_next_take() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(100.0) == 0.5  # one token every 0.5 s
    assert bucket.take(100.25) == 0.25  # half a token came: a refused take costs none
    assert bucket.take(100.5) == 0.0
    assert bucket.take(110.0) == 0.0  # refilled, but never past the burst:
    assert [bucket.take(110.0) for _ in range(3)] == [0.0, 0.0, 0.5]
