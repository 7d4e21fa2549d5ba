"""The ``h2`` library's connection state machine, as :mod:`watchcache.http.h2protocol` uses it.

``h2`` does the framing, HPACK and flow-control bookkeeping; where it would end a whole
connection for what Go's net/http2 treats as one stream's error (too many streams, a body that
does not match its Content-Length), its checks are turned off here and
:class:`~watchcache.http.h2protocol.H2Protocol` makes them itself, per stream.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.settings
import h2.stream

from watchcache.http.limits import H2Limits, HttpLimits

__all__ = ["server_connection"]


class _Stream(h2.stream.H2Stream):
    """``h2``'s stream without its Content-Length checks, which end the whole connection: this
    module checks the header and the body's length itself, as stream errors (Go's net/http2)."""

    def _initialize_content_length(self, headers: Any) -> None:
        self._expected_content_length = None

    def _track_content_length(self, length: int, end_stream: bool) -> None:
        pass


class _Connection(h2.connection.H2Connection):
    """``h2``'s connection, but the stream limit is enforced by ``H2Protocol`` (a stream error, as
    Go's, where ``h2`` ends the connection) and Content-Length by it too (:class:`_Stream`)."""

    @property
    def open_inbound_streams(self) -> int:
        super().open_inbound_streams  # noqa: B018 -- h2 forgets closed streams while it counts
        return 0

    def _begin_new_stream(self, stream_id: int, allowed_ids: Any) -> h2.stream.H2Stream:
        stream = super()._begin_new_stream(stream_id, allowed_ids)
        stream.__class__ = _Stream
        return stream


def server_connection(limits: HttpLimits, h2limits: H2Limits) -> h2.connection.H2Connection:
    """A server connection's state machine with our SETTINGS: the stream limit, the stream window
    (the most a request body may send before it is read), the header list size, no push."""
    config = h2.config.H2Configuration(
        client_side=False,
        header_encoding=None,
        # Validated here instead: h2 would end the whole connection where Go answers one stream.
        validate_inbound_headers=False,
        normalize_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )
    conn = _Connection(config)
    sc = h2.settings.SettingCodes
    conn.local_settings = h2.settings.Settings(
        client=False,
        initial_values={
            sc.MAX_CONCURRENT_STREAMS: h2limits.max_concurrent_streams,
            sc.INITIAL_WINDOW_SIZE: h2limits.initial_window_size,
            sc.MAX_HEADER_LIST_SIZE: limits.max_header_bytes,
            sc.ENABLE_PUSH: 0,
        },
    )
    # Over the advertised size a stream gets 431 (Go); over twice that, decoding stops (HPACK bomb).
    conn.decoder.max_header_list_size = 2 * limits.max_header_bytes
    return conn
