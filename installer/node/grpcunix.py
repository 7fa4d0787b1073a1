"""One unary gRPC call over HTTP/2 on a unix socket, without grpcio.

The agent calls one gRPC method (the kubelet's PodResources `List`) every few seconds. grpcio
would cost it about 20 MB of RSS (a 17 MB extension and gRPC core's threads), a third of its
60 MB budget; the call needs only what the gRPC-over-HTTP/2 protocol asks of a client: a
request's headers and one length-prefixed message, then the answer's headers, one message and
its trailers (`grpc-status`, `grpc-message`). `h2` (pure Python; the agent's RSS grows about
3 MB with it) does the HTTP/2 framing, HPACK and flow control. The tests call a real grpcio
server with it (tests/podresources.py).
"""

from __future__ import annotations

import socket as sockets
import struct
import time
from pathlib import Path
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions

# gRPC status codes by number (grpc/doc/statuscodes.md)
STATUS = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
          "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
          "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
          "UNAUTHENTICATED")
READ = 65536


class GrpcError(Exception):
    """The call failed: `status` is a gRPC status name, `details` says why."""

    def __init__(self, status: str, details: str) -> None:
        super().__init__(f"{status}: {details}")
        self.status, self.details = status, details


def unary_call(path: Path, method: str, request: bytes, *, timeout_s: float,
               max_message: int) -> bytes:
    """Call `method` (`/package.Service/Method`) with one serialized request message on the
    unix socket at `path`; the one answer message, or GrpcError."""
    deadline = time.monotonic() + timeout_s
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as conn:
        try:
            conn.settimeout(timeout_s)
            conn.connect(str(path))
            return _exchange(conn, method, request, deadline, timeout_s, max_message)
        except TimeoutError:
            raise GrpcError("DEADLINE_EXCEEDED", f"no answer within {timeout_s:g} s") from None
        except OSError as exc:
            raise GrpcError("UNAVAILABLE", f"{exc.strerror or exc}") from None
        except (h2.exceptions.H2Error, ValueError) as exc:
            raise GrpcError("UNAVAILABLE", f"not a gRPC answer: {exc!r}") from None


def _exchange(conn: sockets.socket, method: str, request: bytes, deadline: float,
              timeout_s: float, max_message: int) -> bytes:
    http = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, header_encoding="utf-8"))
    http.initiate_connection()
    stream = http.get_next_available_stream_id()
    http.send_headers(stream, [
        (":method", "POST"), (":scheme", "http"), (":path", method),
        (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
        ("grpc-timeout", f"{max(1, int(timeout_s * 1000))}m")])
    http.send_data(stream, struct.pack(">?I", False, len(request)) + request, end_stream=True)
    conn.sendall(http.data_to_send())
    answer = _Answer(max_message)
    while not answer.ended:
        conn.settimeout(max(0.001, deadline - time.monotonic()))
        data = conn.recv(READ)
        if not data:
            raise GrpcError("UNAVAILABLE", "the server closed the connection mid-call")
        for event in http.receive_data(data):
            answer.take(event, http)
        conn.sendall(http.data_to_send())
    return answer.message()


class _Answer:
    """What came back on the one stream: headers, body, trailers."""

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.ended = False

    def take(self, event: h2.events.Event, http: h2.connection.H2Connection) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            self.headers.update((str(k), str(v)) for k, v in event.headers or ())
        elif isinstance(event, h2.events.DataReceived):
            self.body += event.data or b""
            if len(self.body) > self.max_message + 5:
                raise GrpcError("RESOURCE_EXHAUSTED", f"answer over {self.max_message} bytes")
            http.acknowledge_received_data(event.flow_controlled_length or 0,
                                           event.stream_id or 0)
        elif isinstance(event, h2.events.StreamReset):
            raise GrpcError("UNAVAILABLE", f"stream reset (HTTP/2 error {event.error_code})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            raise GrpcError("UNAVAILABLE", f"connection closed (HTTP/2 {event.error_code})")
        if isinstance(event, h2.events.StreamEnded):
            self.ended = True

    def message(self) -> bytes:
        """The answer's one message, once its status says OK."""
        if self.headers.get(":status") != "200":
            raise GrpcError("UNKNOWN", f"HTTP status {self.headers.get(':status')}")
        code = self.headers.get("grpc-status", "")
        if not code.isdigit():
            raise GrpcError("UNKNOWN", "the answer has no grpc-status")
        if int(code) != 0:
            name = STATUS[int(code)] if int(code) < len(STATUS) else f"status {code}"
            raise GrpcError(name, unquote(self.headers.get("grpc-message", "")))
        if len(self.body) < 5:
            raise GrpcError("INTERNAL", "an OK answer without a message")
        compressed, size = struct.unpack(">?I", bytes(self.body[:5]))
        if compressed or size != len(self.body) - 5:
            raise GrpcError("INTERNAL", "not one uncompressed message")
        return bytes(self.body[5:])
