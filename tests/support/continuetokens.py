"""Garbage continue tokens and kube-apiserver's answers to them: one table for the codec's unit test
(tests/cache/test_continuetoken.py) and the differential tier (tests/reference/test_differential.py),
which checks every row against kube-apiserver itself and through the proxy."""

from __future__ import annotations

import base64


def raw(data: bytes) -> str:
    """base64.RawURLEncoding, as kube encodes a continue token."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# kube-apiserver v1.36's answers (the reference kit, GET configmaps?limit=1&continue=...), each
# ``400 BadRequest`` with ``invalid continue token: `` and this message; Python's decoders said e.g.
# "str is not valid UTF-8: surrogates not allowed".
KUBE_SAYS = [
    ("!!!", "continue key is not valid: illegal base64 data at input byte 0"),
    (  # padding: RawURLEncoding has none
        base64.urlsafe_b64encode(b'{"v":"meta.k8s.io/v1","rv":5,"start":"a"}').decode(),
        "continue key is not valid: illegal base64 data at input byte 55",
    ),
    ("QUJDR", "continue key is not valid: illegal base64 data at input byte 4"),  # a lone last character
    ("QUJDR\n", "continue key is not valid: illegal base64 data at input byte 5"),  # newlines skipped, counted
    ("YWJj+w", "continue key is not valid: illegal base64 data at input byte 4"),  # the standard alphabet's +
    (raw(b"not json"), "continue key is not valid: invalid character 'o' in literal null (expecting 'u')"),
    (raw(b"\xff\xfe\xfd"), "continue key is not valid: invalid character '\xff' looking for beginning of value"),
    (raw(b'{"v":"x",}'), "continue key is not valid: invalid character '}' looking for beginning of object key string"),
    (raw(b'{"v" "x"}'), "continue key is not valid: invalid character '\"' after object key"),
    (raw(b'{"v":"x" 1}'), "continue key is not valid: invalid character '1' after object key:value pair"),
    (raw(b'{"v":"\x01"}'), "continue key is not valid: invalid character '\\x01' in string literal"),
    (raw(b'{"v":"\\q"}'), "continue key is not valid: invalid character 'q' in string escape code"),
    (raw(b'{"v":"\\u12x4"}'), "continue key is not valid: invalid character 'x' in \\u hexadecimal character escape"),
    (raw(b'{"rv":1.}'), "continue key is not valid: invalid character '}' after decimal point in numeric literal"),
    (raw(b'{"rv":1e}'), "continue key is not valid: invalid character '}' in exponent of numeric literal"),
    (raw(b'{"rv":-x}'), "continue key is not valid: invalid character 'x' in numeric literal"),
    (raw(b'{"v":"x"} x'), "continue key is not valid: invalid character 'x' after top-level value"),
    (raw(b"[1 2]"), "continue key is not valid: invalid character '2' after array element"),
    (raw(b'{"v":"x"'), "continue key is not valid: unexpected end of JSON input"),
    (raw(b"[]"), "continue key is not valid: json: cannot unmarshal array into Go value of type storage.continueToken"),
    (
        raw(b'"x"'),
        "continue key is not valid: json: cannot unmarshal string into Go value of type storage.continueToken",
    ),
    (raw(b"null"), "continue key is not valid: server does not recognize this encoded version "),
    (
        raw(b'{"v":"meta.k8s.io/v2","rv":5,"start":"a"}'),
        "continue key is not valid: server does not recognize this encoded version meta.k8s.io/v2",
    ),
    (raw(b'{"rv":5,"start":"a"}'), "continue key is not valid: server does not recognize this encoded version "),
    (
        raw(b'{"v":"meta.k8s.io/v1","rv":0,"start":"a"}'),
        "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
    ),
    (
        raw(b'{"v":"meta.k8s.io/v1","rv":"5","start":"a"}'),
        "continue key is not valid: json: cannot unmarshal string into Go struct field continueToken.rv of type int64",
    ),
    (
        raw(b'{"v":"meta.k8s.io/v1","rv":5.5,"start":"a"}'),
        "continue key is not valid: json: cannot unmarshal number 5.5 into Go struct field continueToken.rv of "
        "type int64",
    ),
    (
        raw(b'{"v":"meta.k8s.io/v1","rv":99999999999999999999,"start":"a"}'),
        "continue key is not valid: json: cannot unmarshal number 99999999999999999999 into Go struct field "
        "continueToken.rv of type int64",
    ),
    (
        raw(b'{"v":"meta.k8s.io/v1","rv":5,"start":""}'),
        "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)",
    ),
    (raw(b'{"v":"meta.k8s.io/v1","rv":5,"start":"../secrets/x"}'), "continue key is not valid: ../secrets/x"),
    (raw(b'{"v":"meta.k8s.io/v1","rv":5,"start":"//x"}'), "continue key is not valid: //x"),
    (
        raw(b'{"v":"meta.k8s.io/v1","rv":5,"start":7}'),
        "continue key is not valid: json: cannot unmarshal number into Go struct field continueToken.start of "
        "type string",
    ),
    (
        raw(b'{"v":1,"rv":5,"start":"a"}'),
        "continue key is not valid: json: cannot unmarshal number into Go struct field continueToken.v of type string",
    ),
    (
        raw(b'{"v":true,"rv":{},"start":"a"}'),  # the first type error in document order
        "continue key is not valid: json: cannot unmarshal bool into Go struct field continueToken.v of type string",
    ),
]

# Tokens kube-apiserver decodes (and then answers with a list or a 410 of its own) that this server did
# not sign: (payload, case id).
UNSIGNED = [
    (b'{"v":"meta.k8s.io/v1","rv":5,"start":"a"}', "kubes-own"),  # the upstream's own token: no signature
    (b'{"v":"meta.k8s.io/v1","rv":-5,"start":"a"}', "negative-rv"),  # kube lists at it; never minted here
    (b'{"v":"meta.k8s.io/v1","rv":5,"start":"\xff"}', "non-utf8"),  # invalid UTF-8 in a string: U+FFFD for Go
    (b'{"v":"meta.k8s.io/v1","rv":5,"start":"\\ud800"}', "surrogate"),  # a lone surrogate escape: U+FFFD for Go
    (b'{"V":"meta.k8s.io/v1","RV":5,"Start":"a"}', "field-case"),  # Go matches field names without case
]
