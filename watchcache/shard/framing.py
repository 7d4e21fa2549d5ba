"""Length-prefixed protobuf frames for the follow stream between workers.

Each frame is a 4-byte big-endian length and a serialized message. The stream runs on a
plain unix socket rather than a gRPC stream so that the owner can write a change in the
same synchronous step in which its cache applies it (``transport.write``), and the
follower can apply it in the callback in which its bytes arrive: a gRPC message costs
each of the two busy event loops several passes, and a pass is a flush of all their
watchers.
"""

from __future__ import annotations

import struct

from google.protobuf.message import Message

_LEN = struct.Struct(">I")
# A frame longer than this is a broken stream, not a message (one relist of a huge resource
# can reach hundreds of MB; 1 GiB is far beyond any cache this process could hold).
MAX_FRAME = 1 << 30


class FramingError(ValueError):
    pass


def encode_frame(msg: Message) -> bytes:
    payload = msg.SerializeToString()
    return _LEN.pack(len(payload)) + payload


class FrameDecoder:
    """Splits a byte stream into frame payloads; keeps an incomplete tail for the next feed."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if size > MAX_FRAME:
                raise FramingError(f"frame of {size} bytes")
            if n - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out
