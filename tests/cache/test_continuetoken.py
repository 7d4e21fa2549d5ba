import base64

import orjson
import pytest

from tests.support.continuetokens import KUBE_SAYS, UNSIGNED, raw
from watchcache.cache.continuetoken import ContinueCodec, InvalidContinueToken, UnverifiedContinueToken

codec = ContinueCodec(b"k" * 32)


def test_round_trip():
    assert codec.decode(codec.encode(42, "ns/p1\x00")) == (42, "ns/p1\x00")


def test_token_from_another_key_is_rejected():
    other = ContinueCodec(b"o" * 32).encode(42, "p1\x00")
    with pytest.raises(InvalidContinueToken, match="signature"):
        codec.decode(other)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: {**p, "rv": p["rv"] + 1},
        lambda p: {**p, "start": "zzz\x00"},
        lambda p: {**p, "v": "v2"},
        lambda p: {k: v for k, v in p.items() if k != "sig"},
    ],
    ids=["rv", "start", "version", "no-signature"],
)
def test_tampered_token_is_rejected(mutate):
    token = codec.encode(42, "p1\x00")
    payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    forged = raw(orjson.dumps(mutate(payload)))
    with pytest.raises(InvalidContinueToken):
        codec.decode(forged)


@pytest.mark.parametrize(
    "token",
    ["", "!!!", "bm90IGpzb24", base64.b64encode(b"[1]").decode()],
    ids=["empty", "not-base64", "not-json", "not-object"],
)
def test_garbage_is_rejected(token):
    with pytest.raises(InvalidContinueToken):
        codec.decode(token)


def test_path_traversal_in_start_key_is_rejected_even_if_signed():
    with pytest.raises(InvalidContinueToken, match="not valid"):
        codec.decode(codec.encode(42, "../other/x\x00"))


def test_the_size_of_a_group_at_the_rv_is_carried_signed_and_only_when_several_events_share_it():
    assert codec.encode(42, "p1\x00", 1) == codec.encode(42, "p1\x00")  # kube's payload, unchanged
    assert codec.decode_with_group(codec.encode(42, "p1\x00")) == (42, "p1\x00", 1)
    token = codec.encode(42, "p1\x00", 3)
    assert codec.decode_with_group(token) == (42, "p1\x00", 3)
    assert codec.decode(token) == (42, "p1\x00")
    payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    for forged in ({**payload, "n": 9}, {k: v for k, v in payload.items() if k != "n"}, {**payload, "n": "3"}):
        with pytest.raises(InvalidContinueToken):
            codec.decode(raw(orjson.dumps(forged)))


@pytest.mark.parametrize(("token", "message"), KUBE_SAYS, ids=[f"{i:02d}" for i in range(len(KUBE_SAYS))])
def test_a_token_kube_refuses_is_refused_in_kubes_words(token: str, message: str) -> None:
    with pytest.raises(InvalidContinueToken) as caught:
        codec.decode(token)
    assert not isinstance(caught.value, UnverifiedContinueToken)
    assert str(caught.value) == message


@pytest.mark.parametrize("token", [raw(p) for p, _ in UNSIGNED], ids=[name for _, name in UNSIGNED])
def test_a_token_kube_would_take_that_this_server_did_not_sign_is_unverified(token: str) -> None:
    """A proxy passes these to the upstream, which answers them itself (semantics, server/reads.py serve_list)."""
    with pytest.raises(UnverifiedContinueToken, match="signature mismatch"):
        codec.decode(token)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"[" * 10_001, "continue key is not valid: invalid character '[' exceeded max depth"),  # Go's limit
        # Go decodes it (then: "server does not recognize this encoded version "); Python's parser cannot:
        # kube's generic words, the one answer here that is not kube's exactly.
        (b'{"x":' + b"[" * 5_000 + b"]" * 5_000 + b"}", "continue key is not valid"),
    ],
    ids=["past-gos-limit", "past-pythons-limit"],
)
def test_deep_nesting_is_a_400_not_a_traceback(payload: bytes, message: str) -> None:
    with pytest.raises(InvalidContinueToken) as caught:
        codec.decode(raw(payload))
    assert str(caught.value) == message
