"""Who a pass-through request goes out as: routes, identity headers, refusals, the upstream's names."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.pki import Pki
from tests.support.authfakes import request
from watchcache.apierrors import StatusError
from watchcache.auth.authn import CREDENTIAL_ID, CertAuthenticator
from watchcache.auth.requestheader import RequestHeaderNames, escape_extra_key
from watchcache.upstream.config import ClientCertificate
from watchcache.upstream.identity import (
    IdentityOptions,
    PassthroughIdentity,
    Route,
    names_from_configmap,
)

CERT_USER = {
    "subject": ((("commonName", "cert-user"),), (("organizationName", "cert-group"),)),
    "issuer": ((("commonName", "test-ca"),),),
    "x509sha256": "ab" * 32,
}
SPOOF = {"x-remote-user": "admin", "x-remote-group": "system:masters", "x-remote-extra-scopes": "all"}


def outgoing(identity: PassthroughIdentity, peercert: dict[str, Any] | None = None, **headers: str):
    req = request("/api/v1/namespaces/ns-1/configmaps", **headers)
    req.peercert = peercert
    return identity.outgoing(req, req.headers.items())


def front_proxy(**kw: Any) -> PassthroughIdentity:
    options = IdentityOptions("front-proxy", "fp.crt", "fp.key", **kw)
    return PassthroughIdentity(options, CertAuthenticator())


def test_a_token_goes_out_as_given_without_identity_headers() -> None:
    for identity in (PassthroughIdentity(), front_proxy()):
        route, lines = outgoing(identity, authorization="Bearer t", accept="application/json", **SPOOF)
        assert route is Route.CLIENT
        assert lines == [("authorization", "Bearer t"), ("accept", "application/json")]


def test_a_certificate_user_goes_out_through_the_front_proxy_certificate() -> None:
    identity = front_proxy()
    route, lines = outgoing(identity, CERT_USER, authorization="Bearer t", impersonate_user="alice", **SPOOF)
    assert route is Route.FRONT_PROXY
    assert lines == [
        ("impersonate-user", "alice"),  # kube authorizes it against cert-user
        ("X-Remote-User", "cert-user"),
        ("X-Remote-Group", "cert-group"),
        ("X-Remote-Group", "system:authenticated"),
        ("X-Remote-Extra-authentication.kubernetes.io%2Fcredential-id", "X509SHA256=" + "ab" * 32),
    ]
    assert identity.forwarded == {"front-proxy": 1}


def test_the_upstreams_names_are_stripped_and_sent() -> None:
    names = RequestHeaderNames(("X-Forwarded-User", "X-Remote-User"), ("X-Forwarded-Groups",), ("X-Forwarded-Extra-",))
    identity = front_proxy(names=names)
    headers = {"x-forwarded-user": "admin", "x-forwarded-groups": "system:masters", "x-forwarded-extra-a": "b"}
    route, lines = outgoing(identity, CERT_USER, **headers, **SPOOF)
    assert route is Route.FRONT_PROXY
    assert [k for k, _ in lines] == ["X-Forwarded-User", "X-Forwarded-Groups", "X-Forwarded-Groups",
                                     "X-Forwarded-Extra-authentication.kubernetes.io%2Fcredential-id"]  # fmt: skip
    assert lines[0] == ("X-Forwarded-User", "cert-user")


def test_without_a_way_to_present_it_a_certificate_user_is_refused() -> None:
    identity = PassthroughIdentity(IdentityOptions(), CertAuthenticator())
    with pytest.raises(StatusError) as err:
        outgoing(identity, CERT_USER)
    status = orjson.loads(err.value.body())
    assert (status["code"], status["reason"], status["details"]) == (403, "Forbidden", {})
    assert status["message"].startswith(
        'forbidden: User "cert-user" (authenticated by a client certificate) cannot be passed through to the upstream'
    )
    assert identity.refused == 1 and identity.forwarded == {}


def test_impersonate_mode_uses_the_proxys_identity_and_refuses_nesting() -> None:
    identity = PassthroughIdentity(IdentityOptions("impersonate"), CertAuthenticator())
    route, lines = outgoing(identity, CERT_USER, authorization="Bearer t", **SPOOF)
    assert route is Route.PROXY
    assert lines == [("Impersonate-User", "cert-user"), ("Impersonate-Group", "cert-group")]
    with pytest.raises(StatusError) as err:
        outgoing(identity, CERT_USER, impersonate_user="alice")
    assert err.value.code == 403 and "does not nest" in err.value.message


def test_a_certificate_without_a_certificate_authenticator_is_not_an_identity() -> None:
    route, lines = outgoing(PassthroughIdentity(), CERT_USER, **SPOOF)
    assert (route, lines) == (Route.CLIENT, [])


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="must be one of"):
        IdentityOptions("anonymous")
    with pytest.raises(ValueError, match="go together"):
        IdentityOptions("refuse", "fp.crt")
    with pytest.raises(ValueError, match="needs --proxy-client-cert-file"):
        IdentityOptions("front-proxy")


def test_extra_keys_are_escaped_as_client_go_does() -> None:
    assert escape_extra_key(CREDENTIAL_ID) == "authentication.kubernetes.io%2Fcredential-id"
    assert escape_extra_key("a%b c") == "a%25b%20c"
    assert escape_extra_key("é") == "%C3%A9"


# --- the upstream's published names --------------------------------------------------------------

# kube-apiserver v1.36's kube-system/extension-apiserver-authentication (data, CAs elided).
PUBLISHED = {
    "client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
    "requestheader-allowed-names": '["front-proxy-client"]',
    "requestheader-client-ca-file": "-----BEGIN CERTIFICATE-----\n...",
    "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    "requestheader-group-headers": '["X-Remote-Group"]',
    "requestheader-username-headers": '["X-Remote-User"]',
}


def test_names_from_the_configmap() -> None:
    assert names_from_configmap(PUBLISHED) == RequestHeaderNames()
    assert names_from_configmap({"client-ca-file": "..."}) is None
    with pytest.raises(ValueError):
        names_from_configmap({**PUBLISHED, "requestheader-group-headers": '"X-Remote-Group"'})


class FakeClient:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.paths: list[str] = []

    async def get_json(self, path: str, timeout: float = 30.0) -> Any:
        self.paths.append(path)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_learning_the_upstreams_names_adds_them_first() -> None:
    identity = front_proxy()
    published = {**PUBLISHED, "requestheader-username-headers": '["X-Forwarded-User"]'}
    client = FakeClient({"data": published})
    asyncio.run(identity.learn_upstream_names(client))  # type: ignore[arg-type]
    assert client.paths == ["/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"]
    assert identity.names.username == ("X-Forwarded-User", "X-Remote-User")
    _, lines = outgoing(identity, CERT_USER, x_forwarded_user="admin")
    assert lines[0] == ("X-Forwarded-User", "cert-user") and ("x-forwarded-user", "admin") not in lines


def test_an_unreadable_configmap_keeps_the_flags(caplog: pytest.LogCaptureFixture) -> None:
    identity = front_proxy()
    asyncio.run(identity.learn_upstream_names(FakeClient(OSError("403 forbidden"))))  # type: ignore[arg-type]
    assert identity.names == RequestHeaderNames()
    assert "extension-apiserver-authentication-reader" in caplog.text


# --- the front-proxy certificate rotates ---------------------------------------------------------


def test_the_front_proxy_certificate_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    ca = pki.ca("ca", "/CN=ca")
    first = pki.issue(ca, "first", "/CN=front-proxy-client")
    second = pki.issue(ca, "second", "/CN=front-proxy-client")
    cert, key = tmp_path / "fp.crt", tmp_path / "fp.key"
    cert.write_bytes(first.crt.read_bytes())
    key.write_bytes(first.key.read_bytes())
    holder = ClientCertificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), str(cert), str(key))
    assert not holder.reload_if_changed()
    cert.write_bytes(b"garbage")  # half-written: the previous certificate stays
    os.utime(cert, (1, 1))
    assert not holder.reload_if_changed()
    cert.write_bytes(second.crt.read_bytes())
    key.write_bytes(second.key.read_bytes())
    os.utime(cert, (2, 2))
    assert holder.reload_if_changed()


def test_a_refusal_of_a_credential_less_request_over_plain_http_says_why() -> None:
    identity = PassthroughIdentity()
    req = request("/api")
    assert identity.explain(req, 401) is None  # served over TLS: the upstream's answer as it is
    identity.plain_http = True
    err = identity.explain(req, 401)
    assert err is not None and (err.code, err.reason) == (401, "Unauthorized")
    assert "send no bearer token or client certificate to an http:// server" in err.message
    assert identity.explain(req, 403) is None
    assert identity.explain(request("/api", authorization="Bearer t"), 401) is None  # it had credentials


def test_flags() -> None:
    from watchcache.flags import build_parser
    from watchcache.upstream.identity_options import identity_options

    def options(*args: str) -> IdentityOptions:
        return identity_options(build_parser().parse_args(["serve", "--upstream", "https://x", *args]))

    assert options() == IdentityOptions("refuse")
    fp = options("--proxy-client-cert-file", "a.crt", "--proxy-client-key-file", "a.key")
    assert (fp.mode, fp.proxy_client_cert_file, fp.proxy_client_key_file) == ("front-proxy", "a.crt", "a.key")
    assert options("--client-cert-passthrough", "impersonate").mode == "impersonate"
    names = options("--requestheader-username-headers", " X-A , X-B", "--requestheader-group-headers", "X-G").names
    assert (names.username, names.group, names.extra_prefix) == (("X-A", "X-B"), ("X-G",), ("X-Remote-Extra-",))
    with pytest.raises(ValueError):
        options("--client-cert-passthrough", "front-proxy")
    with pytest.raises(ValueError):
        options("--requestheader-username-headers", "")
