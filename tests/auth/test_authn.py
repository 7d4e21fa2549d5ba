"""TokenAuthenticator (TokenReview, TTL cache, single flight, hashing, fail closed) and CertAuthenticator."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import orjson
import pytest

from tests.support.authfakes import Clock, FakeReviews, request, token_answer
from watchcache.apierrors import StatusError
from watchcache.auth.authn import ANONYMOUS, CertAuthenticator, TokenAuthenticator, UserInfo, bearer_token
from watchcache.auth.review import TOKEN_REVIEW_PATH, ReviewError

ALICE = {"username": "alice", "uid": "u-1", "groups": ["devs"], "extra": {"scopes": ["a", "b"]}}
UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def authenticator(users: dict[str, dict[str, Any]] | None = None, **kw: Any) -> tuple[TokenAuthenticator, FakeReviews]:
    fake = FakeReviews(token_answer(users if users is not None else {"alice-token": ALICE}))
    return TokenAuthenticator(fake, **kw), fake


def unauthorized(coro: Any) -> StatusError:
    with pytest.raises(StatusError) as err:
        run(coro)
    assert orjson.loads(err.value.body()) == UNAUTHORIZED
    return err.value


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER abc", "abc"),
        ("  Bearer abc  ", "abc"),
        ("Bearer abc extra words", "abc"),
        ("Bearer  abc", None),  # kube: the token is the 2nd space-separated word, here empty
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic YWxpY2U6cHc=", None),
        ("", None),
    ],
)
def test_bearer_token_is_parsed_as_kube_does(header: str, token: str | None) -> None:
    assert bearer_token({"authorization": header}) == token


def test_no_token_is_anonymous_and_sends_no_review() -> None:
    auth, fake = authenticator()
    assert run(auth.authenticate(request())) is None
    assert run(auth.authenticate(request(authorization="Basic YWxpY2U6cHc="))) is None
    assert fake.calls == []


def test_a_valid_token_is_reviewed_and_the_user_gains_system_authenticated() -> None:
    auth, fake = authenticator()
    user = run(auth.authenticate(request(token="alice-token")))
    assert user == UserInfo("alice", "u-1", ("devs", "system:authenticated"), {"scopes": ("a", "b")})
    assert fake.calls == [
        (
            TOKEN_REVIEW_PATH,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "alice-token"}},
        )
    ]


def test_groups_already_marked_are_left_alone() -> None:
    auth, _ = authenticator({"t": {"username": "x", "groups": ["system:authenticated", "g"]}})
    assert run(auth.authenticate_token("t")).groups == ("system:authenticated", "g")


def test_an_invalid_token_is_kubes_401_never_anonymous() -> None:
    auth, fake = authenticator()
    unauthorized(auth.authenticate(request(token="wrong")))
    assert len(fake.calls) == 1


def test_allowed_answers_are_cached_for_the_allow_ttl() -> None:
    clock = Clock()
    auth, fake = authenticator(clock=clock)

    async def go() -> None:
        await auth.authenticate_token("alice-token")
        clock.now += 9.9
        await auth.authenticate_token("alice-token")
        assert len(fake.calls) == 1
        clock.now += 0.1
        await auth.authenticate_token("alice-token")
        assert len(fake.calls) == 2

    run(go())
    assert auth.cache.hits == 1
    assert auth.cache.reviews == 2


def test_denied_answers_are_cached_for_the_deny_ttl() -> None:
    clock = Clock()
    auth, fake = authenticator(clock=clock)

    async def attempt() -> None:
        with pytest.raises(StatusError) as err:
            await auth.authenticate_token("wrong")
        assert err.value.code == 401

    async def go() -> None:
        await attempt()
        clock.now += 1.9
        await attempt()
        assert len(fake.calls) == 1
        clock.now += 0.1
        await attempt()
        assert len(fake.calls) == 2

    run(go())


def test_ttls_are_configurable() -> None:
    clock = Clock()
    auth, fake = authenticator(clock=clock, allow_ttl=60.0, deny_ttl=0.0)

    async def go() -> None:
        await auth.authenticate_token("alice-token")
        clock.now += 59.0
        await auth.authenticate_token("alice-token")
        for _ in range(2):
            with pytest.raises(StatusError):
                await auth.authenticate_token("wrong")

    run(go())
    # one review for alice (cached a minute); every attempt with the bad token reviewed (deny TTL 0)
    assert [body["spec"]["token"] for _, body in fake.calls] == ["alice-token", "wrong", "wrong"]


def test_concurrent_requests_for_one_token_share_one_review() -> None:
    auth, fake = authenticator()

    async def go() -> list[Any]:
        fake.hold()
        tasks = [asyncio.ensure_future(auth.authenticate_token("alice-token")) for _ in range(20)]
        other = asyncio.ensure_future(auth.authenticate_token("other"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert len(fake.calls) == 2  # one per distinct token, both held
        fake.release()
        results = await asyncio.gather(*tasks)
        with pytest.raises(StatusError):
            await other
        return results

    results = run(go())
    assert {u.username for u in results} == {"alice"}
    assert auth.cache.reviews == 2
    assert auth.cache.joined == 19


def test_a_cancelled_waiter_does_not_cancel_the_shared_review() -> None:
    auth, fake = authenticator()

    async def go() -> UserInfo:
        fake.hold()
        first = asyncio.ensure_future(auth.authenticate_token("alice-token"))
        second = asyncio.ensure_future(auth.authenticate_token("alice-token"))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        fake.release()
        user: UserInfo = await second
        assert first.cancelled()
        return user

    assert run(go()).username == "alice"
    assert len(fake.calls) == 1
    assert len(auth.cache) == 1  # the review completed and was cached


def test_an_unreachable_upstream_fails_closed_with_401_and_is_not_cached() -> None:
    fake = FakeReviews(lambda path, body: ReviewError("POST: ClientConnectorError: refused"))
    auth = TokenAuthenticator(fake)

    async def go() -> None:
        fake.hold()
        waiters = [asyncio.ensure_future(auth.authenticate_token("alice-token")) for _ in range(3)]
        await asyncio.sleep(0)
        fake.release()
        for w in waiters:
            with pytest.raises(StatusError) as err:
                await w
            assert orjson.loads(err.value.body()) == UNAUTHORIZED

    run(go())
    assert len(fake.calls) == 1  # the failure was shared...
    unauthorized(auth.authenticate_token("alice-token"))
    assert len(fake.calls) == 2  # ...but not cached
    assert auth.failures == 4
    assert len(auth.cache) == 0


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"status": "yes"},
        {"status": {"authenticated": True}},
        {"status": {"authenticated": True, "user": {"username": ""}}},
        {"status": {"authenticated": True, "user": {"username": "x", "groups": "g"}}},
        {"status": {"authenticated": True, "user": {"username": "x", "extra": {"k": "v"}}}},
    ],
)
def test_a_malformed_answer_fails_closed(answer: dict[str, Any]) -> None:
    auth = TokenAuthenticator(FakeReviews(lambda path, body: answer))
    unauthorized(auth.authenticate_token("t"))
    assert auth.failures == 1


def test_authenticated_is_only_true_when_it_says_true() -> None:
    auth = TokenAuthenticator(FakeReviews(lambda p, b: {"status": {"authenticated": "true", "user": ALICE}}))
    unauthorized(auth.authenticate_token("t"))
    assert auth.failures == 0  # a plain "not authenticated", not a failure


def test_audiences_are_requested_and_must_intersect() -> None:
    def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
        auds = ["other"] if body["spec"]["token"] == "wrong-aud" else body["spec"]["audiences"]
        return {"status": {"authenticated": True, "user": ALICE, "audiences": auds}}

    fake = FakeReviews(answer)
    auth = TokenAuthenticator(fake, audiences=("watchcache",))
    assert run(auth.authenticate_token("ok")).username == "alice"
    assert fake.calls[0][1]["spec"] == {"token": "ok", "audiences": ["watchcache"]}
    unauthorized(auth.authenticate_token("wrong-aud"))


def test_the_cache_is_keyed_by_a_mac_never_the_token() -> None:
    token = "s3cr3t-token-value"
    auth, _ = authenticator({token: ALICE})
    run(auth.authenticate_token(token))
    keys = auth.cache.keys()
    assert keys == [auth.token_key(token)]
    for key in keys:
        assert isinstance(key, bytes) and len(key) == 32
        assert token.encode() not in key and token not in repr(key)
        # not even a plain digest of it (a keyed MAC with a per-process random key)
        assert key != hashlib.sha256(token.encode()).digest()
        assert key != hashlib.blake2b(token.encode(), digest_size=32).digest()
    other, _ = authenticator({token: ALICE})
    assert other.token_key(token) != auth.token_key(token)
    # Keyed BLAKE2b under the authenticator's key (RFC 7693's MAC mode), whichever call computes it.
    assert auth.token_key(token) == hashlib.blake2b(token.encode(), key=auth._key, digest_size=32).digest()


def test_tokens_never_reach_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    good, bad, failing = "good-TOKEN-1", "bad-TOKEN-2", "failing-TOKEN-3"

    def answer(path: str, body: dict[str, Any]) -> Any:
        token = body["spec"]["token"]
        if token == failing:  # an upstream error message that quotes the token
            return ReviewError(f"HTTP 400: BadRequest: token {token!r} is malformed")
        return token_answer({good: ALICE})(path, body)

    auth = TokenAuthenticator(FakeReviews(answer))
    caplog.set_level(logging.DEBUG)
    run(auth.authenticate_token(good))
    for token in (bad, failing):
        with pytest.raises(StatusError):
            run(auth.authenticate_token(token))
    assert any("token review failed" in r.getMessage() for r in caplog.records)
    assert any("authenticated alice" in r.getMessage() for r in caplog.records)
    text = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    for token in (good, bad, failing):
        assert token not in text


def test_the_cache_is_bounded() -> None:
    users = {f"t{i}": {"username": f"u{i}"} for i in range(5)}
    auth, fake = authenticator(users, max_entries=3)

    async def go() -> None:
        for i in range(5):
            await auth.authenticate_token(f"t{i}")
        assert len(auth.cache) == 3
        await auth.authenticate_token("t4")  # newest: still cached
        assert len(fake.calls) == 5
        await auth.authenticate_token("t0")  # oldest: evicted, reviewed again
        assert len(fake.calls) == 6

    run(go())


def test_anonymous_user_is_kubes() -> None:
    assert UserInfo("system:anonymous", "", ("system:unauthenticated",), {}) == ANONYMOUS


# ------------------------------------------------------------------ client certificates

ALICE_CERT = {
    "subject": (
        (("countryName", "US"),),
        (("organizationName", "devs"),),
        (("organizationName", "ops"),),
        (("commonName", "alice"),),
    ),
    "issuer": ((("commonName", "cluster-ca"),),),
    "notAfter": "Jan  1 00:00:00 2030 GMT",
}


def test_a_certificate_maps_cn_to_user_and_o_to_groups() -> None:
    user = CertAuthenticator().authenticate(ALICE_CERT)
    assert user == UserInfo("alice", "", ("devs", "ops", "system:authenticated"))


def test_a_certificate_in_system_masters() -> None:
    cert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kubernetes-admin"),))}
    user = CertAuthenticator().authenticate(cert)
    assert user is not None and user.groups == ("system:masters", "system:authenticated")


@pytest.mark.parametrize(
    "cert",
    [None, {}, {"subject": ((("organizationName", "devs"),),)}, {"subject": ((("commonName", ""),),)}],
)
def test_no_verified_certificate_or_no_common_name_authenticates_nobody(cert: Any) -> None:
    assert CertAuthenticator().authenticate(cert) is None


def test_of_several_common_names_the_last_wins_as_in_go() -> None:
    cert = {"subject": ((("commonName", "first"),), (("commonName", "second"),))}
    user = CertAuthenticator().authenticate(cert)
    assert user is not None and user.username == "second"
