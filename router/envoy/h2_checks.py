"""What RFC 9113 makes a connection error of before a frame's content is read: its kind
on the wrong stream, a fixed-size frame of another size, a frame on a stream the client
never opened. For the lean gRPC server (router/envoy/h2.py)."""

from __future__ import annotations

from router.envoy import h2_frames as f


class ProtocolError(Exception):
    """A connection error: the connection ends with a GOAWAY carrying `code`."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


_CONNECTION_ONLY = {f.SETTINGS: "SETTINGS", f.PING: "PING", f.GOAWAY: "GOAWAY"}
_STREAM_ONLY = {
    f.DATA: "DATA",
    f.HEADERS: "HEADERS",
    f.PRIORITY: "PRIORITY",
    f.RST_STREAM: "RST_STREAM",
    f.CONTINUATION: "CONTINUATION",
}
_FIXED_SIZE = {f.PING: 8, f.RST_STREAM: 4, f.WINDOW_UPDATE: 4, f.PRIORITY: 5}
_NAMES = {**_CONNECTION_ONLY, **_STREAM_ONLY, f.WINDOW_UPDATE: "WINDOW_UPDATE"}


def misplaced(kind: int, flags: int, stream_id: int, size: int, last_stream: int) -> None:
    """Raise the connection error RFC 9113 makes of a frame on the wrong stream, of the
    wrong size, or on a stream the client never opened (idle: only HEADERS and PRIORITY
    may come there; a CONTINUATION is checked against its HEADERS)."""
    name = _NAMES.get(kind)
    if name is None:
        return  # unknown frame types are ignored
    if kind in _CONNECTION_ONLY and stream_id != 0:
        raise ProtocolError(f.PROTOCOL_ERROR, f"{name} on stream {stream_id}")
    if kind in _STREAM_ONLY and stream_id == 0:
        raise ProtocolError(f.PROTOCOL_ERROR, f"{name} on stream 0")
    expected = _FIXED_SIZE.get(kind)
    if expected is not None and size != expected:
        raise ProtocolError(f.FRAME_SIZE_ERROR, f"{name} of {size} bytes, not {expected}")
    if kind == f.SETTINGS and (size % 6 or (flags & f.ACK and size)):
        raise ProtocolError(f.FRAME_SIZE_ERROR, f"SETTINGS of {size} bytes")
    if kind in (f.DATA, f.RST_STREAM, f.WINDOW_UPDATE) and stream_id > last_stream:
        raise ProtocolError(f.PROTOCOL_ERROR, f"{name} on idle stream {stream_id}")
