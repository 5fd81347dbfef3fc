"""A lean HTTP/2 server connection for gRPC calls with one request message: enough of
RFC 9113 for gRPC clients (Envoy, grpcio), on the router's event loop, with no thread.

A stream's request (headers, then its DATA up to END_STREAM) is handed to the `Calls`
(router/envoy/lean_server.py) as one message; the answer goes back through `respond`
(unary), or `send_message` and `finish` (server streaming, health Watch). Flow control
both ways; SETTINGS, PING, WINDOW_UPDATE, RST_STREAM and GOAWAY as the RFC says;
PRIORITY not followed; a peer's protocol error closes the connection with a GOAWAY
(a frame on the wrong stream, of the wrong size, on an idle stream, a window overflow),
and a stream error resets its stream.

The connection goes away (GOAWAY, then closed after a grace) when told to: at the
server's stop, and at GRPC_MAX_CONNECTION_AGE (its grace: GRPC_MAX_CONNECTION_AGE_GRACE).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from router.envoy import h2_frames as f
from router.envoy.h2_checks import ProtocolError, misplaced
from router.envoy.hpack import Decoder, HpackError


class Calls(Protocol):
    def call(
        self, connection: H2Connection, stream_id: int, path: bytes, message: bytes
    ) -> asyncio.Task[None] | None: ...


def _unpadded(payload: bytes) -> tuple[int, int]:
    """Where a PADDED DATA or HEADERS payload is, its padding left out: start > end when
    the padding does not fit (a connection error)."""
    if not payload:
        return 1, 0
    return 1, len(payload) - payload[0]


class Stream:
    __slots__ = ("body", "encoding", "headers_sent", "out", "path", "task", "trailers", "window")

    def __init__(self, path: bytes, encoding: bytes, window: int) -> None:
        self.path = path
        self.encoding = encoding
        self.body = bytearray()
        self.window = window  # what this server may still send on it
        self.out = bytearray()  # DATA waiting for window
        self.trailers: bytes | None = None  # sent once `out` is
        self.headers_sent = False
        self.task: asyncio.Task[None] | None = None


class _Answers(asyncio.Protocol):
    """The answering side of a connection: streams' answers under flow control, and
    going away."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.send_window = f.DEFAULT_WINDOW
        self.peer_window = f.DEFAULT_WINDOW  # its SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.going_away = False
        self.pending: list[bytes] = []  # frames not written yet (see _write)
        self.close_when_flushed = False
        self.blocked: set[int] = set()  # streams whose answer waits for window
        self.timers: list[asyncio.Handle] = []
        self.held = 0  # bytes of request bodies the open streams hold

    # going away

    def go_away(self, grace_s: float) -> None:
        """No new streams; closed once those open are answered, or after `grace_s`."""
        if self.going_away or self.transport is None:
            return
        self.going_away = True
        self.pending.append(f.goaway(self.last_stream, f.NO_ERROR))
        self.close_when_flushed = not self.streams
        self._flush()
        if self.streams:
            loop = asyncio.get_running_loop()
            self.timers.append(loop.call_later(grace_s, self.abort))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # answers

    def respond(self, stream_id: int, message: bytes) -> None:
        """A unary answer: headers, the message, status OK."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.trailers is not None:
            return
        size = len(message) + 5
        if (
            not stream.headers_sent
            and size <= self.send_window
            and size <= stream.window
            and size <= self.peer_max_frame
        ):  # the usual answer, whole at once: its three frames made in one piece
            self.send_window -= size
            self._closed(stream_id)
            self._write([f.unary_answer(stream_id, message)])
            return
        stream.out += f.grpc_message(message)
        stream.trailers = f.OK_TRAILERS
        self._write(self._pump(stream_id, stream))

    def send_message(self, stream_id: int, message: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None and stream.trailers is None:
            stream.out += f.grpc_message(message)
            self._write(self._pump(stream_id, stream))

    def finish(self, stream_id: int, code: int, message: str = "") -> None:
        """The call's status (after its messages; alone: a trailers-only answer)."""
        stream = self.streams.get(stream_id)
        if stream is not None and stream.trailers is None:
            stream.trailers = f.status_trailers(code, message)
            self._write(self._pump(stream_id, stream))

    def _pump(self, stream_id: int, stream: Stream) -> list[bytes]:
        """The frames of a stream's answer that may go now."""
        out: list[bytes] = []
        if not stream.out and stream.trailers is None:
            return out  # nothing to answer yet (the headers go with the first message)
        if not stream.headers_sent:
            stream.headers_sent = True
            if not stream.out and stream.trailers is not None:  # trailers only
                block = f.RESPONSE_HEADERS + stream.trailers
                self._closed(stream_id)
                return [f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, block)]
            out.append(f.frame(f.HEADERS, f.END_HEADERS, stream_id, f.RESPONSE_HEADERS))
        while stream.out:
            size = min(len(stream.out), self.send_window, stream.window, self.peer_max_frame)
            if size <= 0:
                self.blocked.add(stream_id)  # until a WINDOW_UPDATE or SETTINGS
                return out
            out.append(f.frame(f.DATA, 0, stream_id, bytes(stream.out[:size])))
            del stream.out[:size]
            self.send_window -= size
            stream.window -= size
        if stream.trailers is not None:
            out.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, stream_id, stream.trailers))
            self._closed(stream_id)
        return out

    def _reset(self, stream_id: int, code: int) -> None:
        """A stream error: the stream is reset, its call (if running) cancelled."""
        self.pending.append(f.rst_stream(stream_id, code))
        self._dropped(stream_id)

    def _dropped(self, stream_id: int) -> None:
        """The stream is closed without an answer (reset either way): its call cancelled."""
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._closed(stream_id)
            if stream.task is not None:
                stream.task.cancel()

    def _closed(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self.held -= len(stream.body)
        if self.going_away and not self.streams:
            self.close_when_flushed = True  # once the answer being made is written

    def _write(self, chunks: list[bytes]) -> None:
        """Frames to send, with those pending, in one write. (Deferring the write to the
        end of the event loop's turn, to share it among the answers of a node batch,
        cost more than it saved at 500 and 1000 calls a second: bench/README.md.)"""
        if chunks:
            self.pending.extend(chunks)
            self._flush()

    def _flush(self) -> None:
        transport = self.transport
        if transport is None:
            return
        if self.pending:
            pending, self.pending = self.pending, []
            transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
        if self.close_when_flushed:
            transport.close()


class H2Connection(_Answers):
    def __init__(self, calls: Calls, on_close: Callable[[H2Connection], None]) -> None:
        super().__init__()
        self.calls = calls
        self.on_close = on_close
        self.decoder = Decoder()
        self.buffer = bytearray()
        self.preface = False
        self.continuing: tuple[int, list[bytes], bool] | None = None
        self.unacked = 0  # received on the connection, not yet given back

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        settings = f.settings_frame(
            {
                f.SETTINGS_INITIAL_WINDOW_SIZE: f.RECEIVE_WINDOW,
                f.SETTINGS_MAX_CONCURRENT_STREAMS: f.MAX_STREAMS,
            }
        )
        raise_window = f.window_update(0, f.RECEIVE_WINDOW - f.DEFAULT_WINDOW)
        self.transport.write(settings + raise_window)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        for timer in self.timers:
            timer.cancel()
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self.streams.clear()
        self.on_close(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            self._frames()
        except (ProtocolError, HpackError) as exc:
            code = exc.code if isinstance(exc, ProtocolError) else f.COMPRESSION_ERROR
            self.pending.append(f.goaway(self.last_stream, code, str(exc).encode()[:200]))
            self.close_when_flushed = True
            self._flush()
            return
        self._flush()

    # reading

    def _frames(self) -> None:
        buffer = self.buffer
        at = 0
        if not self.preface:
            if len(buffer) < len(f.PREFACE):
                if not f.PREFACE.startswith(bytes(buffer)):
                    raise ProtocolError(f.PROTOCOL_ERROR, "not HTTP/2")
                return
            if buffer[: len(f.PREFACE)] != f.PREFACE:
                raise ProtocolError(f.PROTOCOL_ERROR, "not HTTP/2")
            self.preface = True
            at = len(f.PREFACE)
        end = len(buffer)
        while end - at >= 9:
            length = int.from_bytes(buffer[at : at + 3], "big")
            if length > f.DEFAULT_MAX_FRAME:
                raise ProtocolError(f.FRAME_SIZE_ERROR, "frame over SETTINGS_MAX_FRAME_SIZE")
            if end - at < 9 + length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream_id = int.from_bytes(buffer[at + 5 : at + 9], "big") & 0x7FFFFFFF
            payload = bytes(buffer[at + 9 : at + 9 + length])
            at += 9 + length
            if self.continuing is not None and kind != f.CONTINUATION:
                raise ProtocolError(f.PROTOCOL_ERROR, "expected CONTINUATION")
            misplaced(kind, flags, stream_id, length, self.last_stream)
            self._frame(kind, flags, stream_id, payload)
        del buffer[:at]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == f.DATA:
            self._data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == f.CONTINUATION:
            if self.continuing is None or self.continuing[0] != stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
            self.continuing[1].append(payload)
            if sum(map(len, self.continuing[1])) > f.MAX_HEADER_BLOCK:
                raise ProtocolError(f.ENHANCE_YOUR_CALM, "header block too large")
            if flags & f.END_HEADERS:
                _, parts, ended = self.continuing
                self.continuing = None
                self._header_block(stream_id, b"".join(parts), ended)
        elif kind == f.SETTINGS:
            if not flags & f.ACK:
                self._settings(payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == f.PING:
            if not flags & f.ACK:
                self.pending.append(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.RST_STREAM:
            self._dropped(stream_id)
        elif kind == f.GOAWAY:
            self.going_away = True
            self.close_when_flushed = not self.streams
        elif kind == f.PUSH_PROMISE:
            raise ProtocolError(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        elif kind == f.PRIORITY:
            self._priority(stream_id, payload)
        # Unknown frame types are ignored.

    def _priority(self, stream_id: int, fields: bytes) -> None:
        """Priorities are not followed; a stream made to depend on itself is a stream
        error (RFC 9113 5.3.1)."""
        if int.from_bytes(fields[:4], "big") & 0x7FFFFFFF == stream_id:
            self._reset(stream_id, f.PROTOCOL_ERROR)

    def _settings(self, payload: bytes) -> None:
        for at in range(0, len(payload) - len(payload) % 6, 6):
            key = int.from_bytes(payload[at : at + 2], "big")
            value = int.from_bytes(payload[at + 2 : at + 6], "big")
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ProtocolError(f.FLOW_CONTROL_ERROR, "initial window too large")
                for stream in self.streams.values():
                    stream.window += value - self.peer_window
                self.peer_window = value
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = max(f.DEFAULT_MAX_FRAME, min(value, 2**24 - 1))
        self.pending.append(f.frame(f.SETTINGS, f.ACK, 0))
        self._pump_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolError(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            if self.send_window + increment > f.MAX_WINDOW:
                raise ProtocolError(f.FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self.send_window += increment
            self._pump_all()
        elif (stream := self.streams.get(stream_id)) is not None:
            if increment == 0 or stream.window + increment > f.MAX_WINDOW:
                zero = increment == 0
                self._reset(stream_id, f.PROTOCOL_ERROR if zero else f.FLOW_CONTROL_ERROR)
                return
            stream.window += increment
            self.pending.extend(self._pump(stream_id, stream))

    def _pump_all(self) -> None:
        """The answers waiting for window, as far as it now goes."""
        blocked, self.blocked = self.blocked, set()
        for stream_id in sorted(blocked):
            stream = self.streams.get(stream_id)
            if stream is not None:
                self.pending.extend(self._pump(stream_id, stream))

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise ProtocolError(f.PROTOCOL_ERROR, "HEADERS on a server stream id")
        start, end = _unpadded(payload) if flags & f.PADDED else (0, len(payload))
        if flags & f.PRIORITY_FLAG:
            if int.from_bytes(payload[start : start + 4], "big") & 0x7FFFFFFF == stream_id:
                raise ProtocolError(f.PROTOCOL_ERROR, f"stream {stream_id} depends on itself")
            start += 5
        if start > end:
            raise ProtocolError(f.PROTOCOL_ERROR, "bad padding")
        ended = bool(flags & f.END_STREAM)
        if flags & f.END_HEADERS:
            self._header_block(stream_id, payload[start:end], ended)
        else:
            self.continuing = (stream_id, [payload[start:end]], ended)

    def _header_block(self, stream_id: int, block: bytes, ended: bool) -> None:
        headers = self.decoder.decode(block)  # always: the table must follow the peer
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id <= self.last_stream:
                return  # trailers of a stream already answered
            self.last_stream = stream_id
            if self.going_away or len(self.streams) >= f.MAX_STREAMS:
                self.pending.append(f.rst_stream(stream_id, f.REFUSED_STREAM))
                return
            path = encoding = b""
            for name, value in headers:
                if name == b":path":
                    path = value
                elif name == b"grpc-encoding":
                    encoding = value
            stream = self.streams[stream_id] = Stream(path, encoding, self.peer_window)
        if ended:
            self._ended(stream_id, stream, self._taken(stream))

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.unacked += len(payload)
        if self.unacked >= f.RECEIVE_WINDOW // 2:
            self.pending.append(f.window_update(0, self.unacked))
            self.unacked = 0
        start, end = _unpadded(payload) if flags & f.PADDED else (0, len(payload))
        if start > end:
            raise ProtocolError(f.PROTOCOL_ERROR, "bad padding")
        stream = self.streams.get(stream_id)
        if stream is None or stream.task is not None or stream.trailers is not None:
            return  # closed, or answered already (too large)
        if flags == f.END_STREAM and not stream.body:  # the request in one unpadded frame
            self._ended(stream_id, stream, payload)
            return
        stream.body += payload[start:end]
        self.held += end - start
        if self.held > f.MAX_HELD:
            raise ProtocolError(f.ENHANCE_YOUR_CALM, "request bodies over the limit")
        if len(stream.body) > f.MAX_MESSAGE + 5:
            text = f"Received message larger than max ({len(stream.body) - 5} vs. {f.MAX_MESSAGE})"
            self.finish(stream_id, f.GRPC_RESOURCE_EXHAUSTED, text)
            if not flags & f.END_STREAM:  # answered early: the rest need not come
                self.pending.append(f.rst_stream(stream_id, f.NO_ERROR))
            return
        if flags & f.END_STREAM:
            self._ended(stream_id, stream, self._taken(stream))
        elif len(stream.body) >= f.RECEIVE_WINDOW // 2:
            self.pending.append(f.window_update(stream_id, len(payload)))

    def _taken(self, stream: Stream) -> bytes:
        """The DATA a stream holds, handed on: not held while the call runs."""
        body, stream.body = bytes(stream.body), bytearray()
        self.held -= len(body)
        return body

    def _ended(self, stream_id: int, stream: Stream, body: bytes) -> None:
        """The request is complete (`body`, all its DATA): its one message to the calls."""
        if stream.trailers is not None:
            return
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            self.finish(stream_id, f.GRPC_INTERNAL, "Expected exactly one request message")
            return
        if body[0]:
            text = f"Compressed messages are not supported (grpc-encoding {stream.encoding!r})"
            self.finish(stream_id, f.GRPC_UNIMPLEMENTED, text)
            return
        stream.task = self.calls.call(self, stream_id, stream.path, body[5:])
