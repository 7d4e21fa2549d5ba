"""The Gate end to end against the simulated cluster's review endpoints (in-process), and its flags."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from tests.support.authfakes import Clock, info_of, request
from watchcache.apierrors import StatusError
from watchcache.auth.authn import CertAuthenticator, UserInfo
from watchcache.auth.gate import AuthOptions, Gate
from watchcache.auth.options import add_auth_flags, auth_options
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.policy import load_policy

EXAMPLE = Path(__file__).parents[2] / "watchcache" / "sim" / "policy-example.yaml"


@pytest.fixture
def client() -> LocalReviewClient:
    return LocalReviewClient(load_policy(EXAMPLE))


def check(gate: Gate, target: str, token: str | None = None, **kw: Any) -> UserInfo:
    req = request(target, token=token)
    user: UserInfo = asyncio.run(gate.check(req, info_of(req), **kw))
    return user


def refused(gate: Gate, target: str, token: str | None = None) -> StatusError:
    with pytest.raises(StatusError) as err:
        check(gate, target, token)
    return err.value


def test_an_allowed_read_returns_the_user(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    user = check(gate, "/api/v1/namespaces/ns-1/pods", "alice-token")
    assert user == UserInfo("alice", "uid-alice", ("system:authenticated",))
    assert (gate.allowed, gate.denied) == (1, 0)
    assert client.requests == 2  # one TokenReview, one SubjectAccessReview


def test_a_denied_read_is_kubes_403(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    err = refused(gate, "/api/v1/namespaces/ns-2/pods?watch=true", "bob-token")
    assert (err.code, err.reason) == (403, "Forbidden")
    assert err.message == (
        'pods is forbidden: User "bob" cannot watch resource "pods" in API group "" in the namespace "ns-2"'
    )
    assert gate.denied == 1


def test_resource_names_through_the_field_selector(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    cm1 = "/api/v1/namespaces/ns-1/configmaps?watch=true&fieldSelector=metadata.name%3Dcm-1"
    assert check(gate, cm1, "carol-token").username == "carol"
    assert check(gate, "/api/v1/namespaces/ns-1/configmaps/cm-1", "carol-token").username == "carol"
    err = refused(gate, "/api/v1/namespaces/ns-1/configmaps", "carol-token")
    assert err.message == (
        'configmaps is forbidden: User "carol" cannot list resource "configmaps" in API group "" '
        'in the namespace "ns-1"'
    )
    err = refused(gate, "/api/v1/namespaces/ns-1/configmaps?fieldSelector=metadata.name%3Dcm-2", "carol-token")
    assert err.message.startswith('configmaps "cm-2" is forbidden: User "carol" cannot list resource')


def test_no_credentials_are_anonymous_then_authorized(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    err = refused(gate, "/api/v1/pods")
    assert err.message == (
        'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" at the cluster scope'
    )
    assert (gate.anonymous, gate.denied, gate.unauthenticated) == (1, 1, 0)


def test_without_anonymous_no_credentials_is_401(client: LocalReviewClient) -> None:
    gate = Gate.build(client, AuthOptions(anonymous=False))
    err = refused(gate, "/api/v1/pods")
    assert (err.code, err.message) == (401, "Unauthorized")
    assert client.requests == 0
    assert gate.unauthenticated == 1


def test_a_bad_token_is_401_even_with_anonymous_on(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    err = refused(gate, "/api/v1/pods", "nobody-token")
    assert (err.code, err.reason) == (401, "Unauthorized")
    assert (gate.unauthenticated, gate.anonymous) == (1, 0)


def test_system_masters_skip_the_access_review(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    assert check(gate, "/apis/apps/v1/deployments", "admin-token").username == "admin"
    assert client.requests == 1  # the TokenReview only
    gate = Gate.build(client, AuthOptions(always_allow_groups=()))
    assert check(gate, "/apis/apps/v1/deployments", "admin-token").username == "admin"
    assert client.requests == 3  # reviewed this time, and the policy allows it


def test_a_verified_certificate_comes_before_the_token(client: LocalReviewClient) -> None:
    gate = Gate.build(client, certs=CertAuthenticator())
    cert = {"subject": ((("commonName", "alice"),),)}
    user = check(gate, "/api/v1/pods", "dave-token", peercert=cert)
    assert user.username == "alice"
    assert client.requests == 1  # no TokenReview for dave's token


def test_cached_decisions_and_counters(client: LocalReviewClient) -> None:
    clock = Clock()
    gate = Gate.build(client, clock=clock)
    for _ in range(3):
        check(gate, "/api/v1/namespaces/ns-1/pods", "alice-token")
    with pytest.raises(StatusError):
        check(gate, "/api/v1/pods", "dave-token")
    assert client.requests == 4
    assert gate.stats() == {
        "allowed": 3,
        "denied": 1,
        "unauthenticated": 0,
        "anonymous": 0,
        "failed": 0,
        "access_reviews": 2,
        "access_cache_hits": 2,
        "access_joined": 0,
        "access_failures": 0,
        "token_reviews": 2,
        "token_cache_hits": 2,
        "token_joined": 0,
        "token_failures": 0,
    }
    assert (gate.reviews_sent, gate.cache_hits) == (4, 4)
    clock.now += 10.0
    check(gate, "/api/v1/namespaces/ns-1/pods", "alice-token")
    assert client.requests == 6  # both answers expired


def test_review_failures_fail_closed() -> None:
    class Down:
        async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            raise OSError("connection refused")

    class TokensOnly(LocalReviewClient):
        async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            if "subjectaccessreviews" in path:
                raise OSError("connection refused")
            return await super().post(path, body)

    gate = Gate.build(Down())
    assert refused(gate, "/api/v1/pods", "alice-token").code == 401
    gate = Gate.build(TokensOnly(load_policy(EXAMPLE)))
    err = refused(gate, "/api/v1/pods", "alice-token")
    assert (err.code, err.reason, err.retry_after) == (500, "InternalError", 1)
    assert gate.failed == 1


# ------------------------------------------------------------------ flags


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_auth_flags(parser)
    return parser.parse_args(list(argv))


def test_authentication_defaults_to_delegated_for_a_tls_upstream_and_none_for_plain_http() -> None:
    assert auth_options(parse(), upstream_is_tls=True) == AuthOptions()
    assert auth_options(parse(), upstream_is_tls=False) is None
    assert auth_options(parse("--authentication", "none"), upstream_is_tls=True) is None
    assert auth_options(parse("--authentication", "delegated"), upstream_is_tls=False) == AuthOptions()


def test_flags_build_the_options() -> None:
    options = auth_options(
        parse(
            "--authentication=delegated",
            "--no-anonymous-auth",
            "--authentication-token-webhook-cache-ttl=30",
            "--authentication-token-webhook-cache-unauthorized-ttl=1",
            "--authorization-webhook-cache-authorized-ttl=20",
            "--authorization-webhook-cache-unauthorized-ttl=0",
            "--authorization-always-allow-groups=system:masters, ops",
        )
    )
    assert options == AuthOptions(
        anonymous=False,
        token_allow_ttl=30.0,
        token_deny_ttl=1.0,
        access_allow_ttl=20.0,
        access_deny_ttl=0.0,
        always_allow_groups=("system:masters", "ops"),
    )
    assert auth_options(parse("--authentication=delegated")) == AuthOptions()
    empty = auth_options(parse("--authentication=delegated", "--authorization-always-allow-groups="))
    assert empty is not None and empty.always_allow_groups == ()


def test_negative_ttls_are_refused_when_parsed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("--authentication=delegated", "--authorization-webhook-cache-authorized-ttl=-1")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --authorization-webhook-cache-authorized-ttl: must be at least 0, got -1" in err


# ------------------------------------------------------------------ the intended wiring, on the real read path


def test_reference_wiring_in_front_of_cached_reads(client: LocalReviewClient) -> None:
    """What the lead wires into ApiHandler: the gate before the cached read, its StatusError rendered."""
    from tests.support.factories import FakeResponse
    from tests.support.handlers import Harness

    async def go() -> list[tuple[int | None, bytes]]:
        harness = Harness()
        gate = Gate.build(client)

        async def handler(req: Any, resp: FakeResponse) -> None:
            try:
                await gate.check(req, info_of(req))  # raises before any cached byte is written
                await harness.handler(req, cast(Any, resp))
            except StatusError as e:
                resp.send(e.code, e.body())

        out = []
        for token in ("alice-token", "dave-token", "bob-token", "wrong"):
            resp = FakeResponse()
            await handler(request("/api/v1/namespaces/default/pods", token=token), resp)
            out.append((resp.status, resp.body))
        return out

    (ok, okbody), (dave, davebody), (bob, bobbody), (bad, badbody) = asyncio.run(go())
    assert ok == 200 and b'"name":"p0"' in okbody
    assert dave == 403 and b"p0" not in davebody
    assert orjson.loads(davebody)["message"] == (
        'pods is forbidden: User "dave" cannot list resource "pods" in API group "" in the namespace "default"'
    )
    assert bob == 403 and b"p0" not in bobbody
    assert (bad, orjson.loads(badbody)["message"]) == (401, "Unauthorized")


def check_path(gate: Gate, path: str, token: str | None = None, method: str = "GET") -> UserInfo:
    req = request(path, token=token)
    req.method = method
    user: UserInfo = asyncio.run(gate.check_path(req))
    return user


def test_own_paths_are_authorized_as_non_resource_requests(client: LocalReviewClient) -> None:
    gate = Gate.build(client)
    assert check_path(gate, "/metrics", "prometheus-token").username == "prometheus"
    assert check_path(gate, "/debug/cache", "prometheus-token").username == "prometheus"
    with pytest.raises(StatusError) as err:
        check_path(gate, "/metrics", "dave-token")
    assert (err.value.code, err.value.message) == (403, 'forbidden: User "dave" cannot get path "/metrics"')
    with pytest.raises(StatusError) as err:
        check_path(gate, "/metrics", "prometheus-token", method="POST")  # the verb is the method
    assert err.value.message == 'forbidden: User "prometheus" cannot post path "/metrics"'
    with pytest.raises(StatusError) as err:
        check_path(gate, "/metrics")
    assert err.value.message == 'forbidden: User "system:anonymous" cannot get path "/metrics"'
    with pytest.raises(StatusError) as err:
        check_path(gate, "/metrics", "not-a-token")
    assert err.value.code == 401
    assert check_path(gate, "/metrics", "admin-token").username == "admin"  # system:masters, no review


@pytest.mark.parametrize(
    ("version", "token", "closes"),
    [
        pytest.param("2", None, True, id="h2-anonymous"),
        pytest.param("2", "nobody-token", True, id="h2-401"),
        pytest.param("2", "admin-token", False, id="h2-authenticated"),
        pytest.param("1.1", None, False, id="http1-anonymous"),
    ],
)
def test_an_unauthenticated_http2_request_is_its_connections_last(
    client: LocalReviewClient, version: str, token: str | None, closes: bool
) -> None:
    """kube's UnauthenticatedHTTP2DOSMitigation: anonymous or 401 on HTTP/2 -> GOAWAY after the answer."""
    gate = Gate.build(client)
    req = request("/api/v1/namespaces/ns-1/pods", token=token)
    req.http_version = version
    with contextlib.suppress(StatusError):
        asyncio.run(gate.authenticate(req))
    assert req.close_connection is closes


def test_a_token_reviewed_and_allowed_is_known_at_once_anything_else_is_awaited(client: LocalReviewClient) -> None:
    clock = Clock()
    gate = Gate.build(client, AuthOptions(token_allow_ttl=10, token_deny_ttl=2), clock=clock)
    alice, bad = request("/api/v1/pods", token="alice-token"), request("/api/v1/pods", token="no-such-token")
    assert gate.authenticated_now(alice) is None  # not reviewed yet
    assert asyncio.run(gate.authenticate(alice)).username == "alice"
    assert gate.tokens is not None and (gate.tokens.cache.hits, client.requests) == (0, 1)
    assert gate.authenticated_now(alice) == UserInfo("alice", "uid-alice", ("system:authenticated",))
    assert (gate.tokens.cache.hits, client.requests) == (1, 1)  # a hit, as authenticate's would be
    # A refusal, even cached, is authenticate's to answer (and count): never known at once.
    with pytest.raises(StatusError):
        asyncio.run(gate.authenticate(bad))
    assert gate.authenticated_now(bad) is None and gate.tokens.cache.hits == 1
    with pytest.raises(StatusError):
        asyncio.run(gate.authenticate(bad))
    assert (gate.unauthenticated, gate.tokens.cache.hits, client.requests) == (2, 2, 2)
    # Past the TTL: awaited again (a new review).
    clock.now += 11
    assert gate.authenticated_now(alice) is None
    # Without a token, or with a certificate (which comes first): awaited.
    assert gate.authenticated_now(request("/api/v1/pods")) is None
    certified = Gate.build(client, certs=CertAuthenticator())
    asyncio.run(certified.authenticate(alice))
    assert certified.authenticated_now(alice, {"subject": ((("commonName", "carol"),),)}) is None
    assert certified.authenticated_now(alice) is not None
