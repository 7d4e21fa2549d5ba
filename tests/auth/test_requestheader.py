"""The request-header convention as the simulated cluster believes it, and certificate users' issuers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness.pki import Pki
from tests.support.authfakes import info_of, request
from watchcache.apierrors import StatusError
from watchcache.auth.authn import CREDENTIAL_ID, CertAuthenticator, UserInfo
from watchcache.auth.gate import Gate
from watchcache.auth.requestheader import RequestHeaderAuthenticator, RequestHeaderNames, ca_subjects
from watchcache.sim.auth import LocalReviewClient
from watchcache.sim.gate import ApiserverGate
from watchcache.sim.policy import load_policy

EXAMPLE = Path(__file__).parents[2] / "watchcache" / "sim" / "policy-example.yaml"
CLIENT_CA = ((("commonName", "test-ca"),),)
FRONT_PROXY_CA = ((("commonName", "test-front-proxy-ca"),),)


def cert(cn: str, issuer: tuple, *orgs: str) -> dict:
    subject = ((("commonName", cn),), *((("organizationName", o),) for o in orgs))
    return {"subject": subject, "issuer": issuer}


FRONT_PROXY = cert("front-proxy-client", FRONT_PROXY_CA)
HEADERS = {
    "x-remote-user": "alice",
    "x-remote-group": "g1, g2",
    "x-remote-extra-scopes": "a, b",
    "x-remote-extra-authentication.kubernetes.io%2fcredential-id": "X509SHA256=00",
}


def test_headers_name_the_user_as_kube_reads_them() -> None:
    user = RequestHeaderNames().user_from(HEADERS)
    assert user == UserInfo(
        "alice",
        "",
        ("g1", "g2", "system:authenticated"),
        {"scopes": ("a", "b"), CREDENTIAL_ID: ("X509SHA256=00",)},
    )
    assert RequestHeaderNames().user_from({"x-remote-group": "g"}) is None
    names = RequestHeaderNames(("X-A", "X-B"), (), (), ("X-Uid",))
    assert names.user_from({"x-b": "bob", "x-uid": "u1"}) == UserInfo("bob", "u1", ("system:authenticated",))


def test_headers_are_believed_only_from_an_allowed_front_proxy_certificate() -> None:
    auth = RequestHeaderAuthenticator([FRONT_PROXY_CA], ["front-proxy-client"], RequestHeaderNames())
    assert auth.authenticate(HEADERS, FRONT_PROXY) is not None
    assert auth.authenticate(HEADERS, cert("front-proxy-client", CLIENT_CA)) is None  # the wrong CA
    assert auth.authenticate(HEADERS, cert("rogue", FRONT_PROXY_CA)) is None  # not an allowed name
    assert auth.authenticate(HEADERS, None) is None
    anyone = RequestHeaderAuthenticator([FRONT_PROXY_CA], [], RequestHeaderNames())
    assert anyone.authenticate(HEADERS, cert("rogue", FRONT_PROXY_CA)) is not None


def test_certificate_users_carry_kubes_credential_id_and_may_be_limited_to_a_ca() -> None:
    peer = {**cert("cert-user", CLIENT_CA, "cert-group"), "x509sha256": "ff" * 32}
    user = CertAuthenticator().authenticate(peer)
    assert user == UserInfo(
        "cert-user", "", ("cert-group", "system:authenticated"), {CREDENTIAL_ID: ("X509SHA256=" + "ff" * 32,)}
    )
    assert CertAuthenticator([CLIENT_CA]).authenticate(peer) == user
    assert CertAuthenticator([CLIENT_CA]).authenticate(FRONT_PROXY) is None


def test_ca_subjects_reads_a_bundle(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.ca("one", "/CN=one")
    pki.ca("two", "/O=org/CN=two")
    bundle = tmp_path / "bundle.crt"
    bundle.write_text((tmp_path / "one.crt").read_text() + (tmp_path / "two.crt").read_text())
    assert sorted(ca_subjects(str(bundle))) == [
        ((("commonName", "one"),),),
        ((("organizationName", "org"),), (("commonName", "two"),)),
    ]


# --- the simulated cluster's gate: request header first, then impersonation ---------------------


@pytest.fixture
def gate() -> ApiserverGate:
    g = ApiserverGate.build(LocalReviewClient(load_policy(EXAMPLE)), certs=CertAuthenticator([CLIENT_CA]))
    g.requestheader = RequestHeaderAuthenticator([FRONT_PROXY_CA], ["front-proxy-client"], RequestHeaderNames())
    return g


def who(gate: Gate, peercert: dict | None = None, token: str | None = None, **headers: str) -> UserInfo:
    req = request(token=token, **headers)
    user: UserInfo = asyncio.run(gate.authenticate(req, peercert))
    return user


def test_the_front_proxy_names_the_user_before_certificates_and_tokens(gate: Gate) -> None:
    assert who(gate, FRONT_PROXY, "alice-token", x_remote_user="bob").username == "bob"
    # A front-proxy certificate without the header authenticates nobody by itself: the token decides.
    assert who(gate, FRONT_PROXY, "alice-token").username == "alice"
    assert who(gate, FRONT_PROXY).username == "system:anonymous"
    # Headers over a user's certificate are not believed.
    assert who(gate, cert("cert-user", CLIENT_CA), x_remote_user="admin").username == "cert-user"


def test_impersonation_is_authorized_against_the_requester(gate: Gate) -> None:
    assert who(gate, token="admin-token", impersonate_user="alice") == UserInfo(
        "alice", "", ("system:authenticated",), {}
    )
    sa = who(gate, token="admin-token", impersonate_user="system:serviceaccount:ns1:sa1")
    assert sa.groups == ("system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated")
    anon = who(gate, token="admin-token", impersonate_user="system:anonymous", impersonate_group="g")
    assert anon.groups == ("g", "system:unauthenticated")
    with pytest.raises(StatusError) as err:
        who(gate, token="alice-token", impersonate_user="bob")
    assert err.value.message == (
        'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" '
        "at the cluster scope"
    )
    with pytest.raises(StatusError) as err:
        who(gate, token="admin-token", impersonate_group="g")
    assert err.value.code == 400


def test_an_impersonated_read_is_authorized_for_the_impersonated_user(gate: Gate) -> None:
    req = request("/api/v1/nodes", token="admin-token", impersonate_user="alice")
    with pytest.raises(StatusError) as err:
        asyncio.run(gate.check(req, info_of(req)))
    assert 'User "alice" cannot list resource "nodes"' in err.value.message


def test_identity_headers_are_recognised_by_lower_case_name_exact_or_by_prefix() -> None:
    names = RequestHeaderNames(("X-User", "X-Other-User"), ("X-Grp",), ("X-Ext-", "X-More-"), ("X-Uid",))
    for name in ("x-user", "x-other-user", "x-grp", "x-uid", "x-ext-scopes", "x-more-a", "x-ext-"):
        assert names.is_identity_header(name), name
    # x-remote-* whatever the configuration: no client has a reason to send one.
    assert names.is_identity_header("x-remote-user") and names.is_identity_header("x-remote-anything")
    for name in ("x-users", "x-user-", "x-grp2", "authorization", "x-ext", "user-agent", "impersonate-user"):
        assert not names.is_identity_header(name), name
    merged = RequestHeaderNames().merged(names)
    assert merged.is_identity_header("x-user") and merged.is_identity_header("x-remote-group")
    assert merged.is_identity_header("x-more-b") and not merged.is_identity_header("x-users")
    # What is derived from the names is no part of equality.
    assert RequestHeaderNames() == RequestHeaderNames() and hash(RequestHeaderNames()) == hash(RequestHeaderNames())
