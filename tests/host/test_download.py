"""installer.stages.fetch.download against a real HTTP server on 127.0.0.1 with injected faults."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from installer.errors import DownloadError, IntegrityError
from installer.stages.fetch.download import (
    ChecksumMismatch,
    Downloader,
    DownloadSettings,
    NotOnMirror,
    file_url,
)
from installer.stages.fetch.parallel import run_parallel
from tests.httpserver import Fault, MirrorServer, write_random

SIZE = 3 * 1024 * 1024 + 17
FAST = DownloadSettings(connect_timeout=2, read_timeout=2, deadline=60, attempts=6,
                        backoff_initial=0.01, backoff_max=0.05, allow_http=True)


class Recorder:
    """A structlog-shaped logger that keeps events for assertions."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = error = debug = info

    def bind(self, **_: Any) -> Recorder:
        return self

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "mirror"
    digest = write_random(root / "f.bin", SIZE, seed=3)
    return root, digest


def get(server: MirrorServer, dest: Path, digest: str, settings: DownloadSettings = FAST,
        size: int = SIZE) -> Recorder:
    log = Recorder()
    downloader = Downloader(settings, log)
    try:
        downloader.fetch_file(server.url + "/f.bin", dest, size=size, sha256=digest)
    finally:
        downloader.close()
    return log


def statuses(server: MirrorServer) -> list[int]:
    return [r.status for r in server.requests_for("/f.bin")]


def faulted(served: tuple[Path, str], dest: Path, fault: Fault,
            settings: DownloadSettings = FAST, **mirror: Any) -> tuple[Recorder, MirrorServer]:
    """`f.bin` fetched into `dest` from a mirror that answers with `fault`; the log and the
    (stopped) mirror, whose requests stay for the checks."""
    root, digest = served
    with MirrorServer(root, **mirror) as server:
        server.fault("/f.bin", fault)
        log = get(server, dest, digest, settings)
    return log, server


def assert_whole(dest: Path, digest: str) -> None:
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == digest


class TestHappyPaths:
    def test_plain(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server:
            get(server, tmp_path / "out", digest)
            assert statuses(server) == [200]
        assert_whole(tmp_path / "out", digest)

    def test_file_url(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        downloader = Downloader(FAST, Recorder())
        downloader.fetch_file(file_url(root / "f.bin"), tmp_path / "out", size=SIZE,
                              sha256=digest)
        assert (tmp_path / "out").stat().st_size == SIZE
        with pytest.raises(NotOnMirror):
            downloader.fetch_file(file_url(root / "missing"), tmp_path / "o2", size=1,
                                  sha256=digest)


class TestResume:
    """A drop resumes with Range/If-Range; a changed file restarts instead of splicing."""

    def test_drop_twice(self, served: tuple[Path, str], tmp_path: Path) -> None:
        log, server = faulted(served, tmp_path / "out", Fault("drop", after=1_000_000, times=2))
        requests = server.requests_for("/f.bin")
        assert [r.status for r in requests] == [200, 206, 206]
        assert [r.range for r in requests] == [None, "bytes=1000000-", "bytes=2000000-"]
        assert all(r.if_range for r in requests[1:])
        assert [e["offset"] for e in log.named("download resumed")] == [1_000_000, 2_000_000]
        assert_whole(tmp_path / "out", served[1])

    def test_drop_without_etag_validates_by_size(self, served: tuple[Path, str],
                                                 tmp_path: Path) -> None:
        log, server = faulted(served, tmp_path / "out", Fault("drop", after=500_000),
                              etags=False)
        assert statuses(server) == [200, 206]
        assert log.named("download resumed")

    def test_truncated_body_resumes(self, served: tuple[Path, str], tmp_path: Path) -> None:
        _, server = faulted(served, tmp_path / "out", Fault("truncate", after=4096))
        assert statuses(server) == [200, 206]

    def test_changed_file_restarts(self, served: tuple[Path, str], tmp_path: Path) -> None:
        log, server = faulted(served, tmp_path / "out",
                              Fault("change", after=300_000, other=b"x" * SIZE))
        requests = server.requests_for("/f.bin")
        assert [r.status for r in requests] == [200, 200]
        assert requests[1].range == "bytes=300000-" and requests[1].if_range
        assert log.named("download restarted")
        assert_whole(tmp_path / "out", served[1])

    def test_stall_past_read_timeout(self, served: tuple[Path, str], tmp_path: Path) -> None:
        log, server = faulted(served, tmp_path / "out", Fault("stall", after=200_000, seconds=3),
                              replace(FAST, read_timeout=0.5))
        assert statuses(server) == [200, 206]
        # Two clocks see the same stall: the socket's read timeout and the watchdog's
        # minimum-rate window (64 KiB per read_timeout); whichever fires first names it.
        reason = str(log.named("download retry")[0]["reason"])
        assert reason.endswith("sent nothing within the read timeout") or \
            "KiB arrived in" in reason, reason


class TestRetries:
    def test_503_then_ok(self, served: tuple[Path, str], tmp_path: Path) -> None:
        log, server = faulted(served, tmp_path / "out", Fault("status", status=503, times=2))
        assert statuses(server) == [503, 503, 200]
        assert [e["reason"] for e in log.named("download retry")] == ["HTTP 503"] * 2

    def test_429_honours_retry_after(self, served: tuple[Path, str], tmp_path: Path) -> None:
        log, server = faulted(served, tmp_path / "out", Fault("retry_after", retry_after=1))
        assert statuses(server) == [429, 200]
        assert log.named("download retry")[0]["sleep_s"] == 1.0

    def test_attempts_exhausted(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server:
            server.fault("/f.bin", Fault("status", status=502, times=0))
            with pytest.raises(DownloadError, match="failed after retries: HTTP 502") as caught:
                get(server, tmp_path / "out", digest, replace(FAST, attempts=3))
            assert statuses(server) == [502, 502, 502]
        assert caught.value.code == 6

    def test_deadline(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server:
            server.fault("/f.bin", Fault("retry_after", retry_after=30, times=0))
            with pytest.raises(DownloadError):
                get(server, tmp_path / "out", digest, replace(FAST, deadline=1.5))
            assert len(statuses(server)) <= 2

    def test_connection_refused(self, tmp_path: Path) -> None:
        port = _closed_port()
        downloader = Downloader(replace(FAST, attempts=2), Recorder())
        with pytest.raises(DownloadError) as caught:
            downloader.fetch_file(f"http://127.0.0.1:{port}/f.bin", tmp_path / "o", size=1,
                                  sha256="0" * 64)
        assert caught.value.message.endswith(
            f"failed after retries: connect: 127.0.0.1:{port} refused the connection "
            "(nothing listens there)")


class TestNetworkCauses:
    """What failed, said in our words: never urllib3's pools and retry counters."""

    def _fail(self, url: str, tmp_path: Path, **settings: Any) -> str:
        downloader = Downloader(replace(FAST, attempts=1, **settings), Recorder())
        with pytest.raises(DownloadError) as caught:
            downloader.fetch_file(url, tmp_path / "o", size=10, sha256="0" * 64)
        message = caught.value.message
        assert "Pool" not in message and "Max retries" not in message, message
        return message

    def test_a_name_that_does_not_resolve(self, tmp_path: Path) -> None:
        message = self._fail("http://mirror.example.invalid/f.bin", tmp_path)
        assert message.endswith("DNS: the name mirror.example.invalid does not resolve "
                                "(check the mirror's host name and the node's DNS)")

    def test_an_answer_that_breaks_off(self, tmp_path: Path) -> None:
        with _one_shot(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
                       ) as port:
            message = self._fail(f"http://127.0.0.1:{port}/f.bin", tmp_path)
        assert message.endswith(f"failed after retries: after 2 bytes of the answer: the "
                                f"connection to 127.0.0.1:{port} broke off mid-answer (reset "
                                "or closed)"), message

    def test_a_server_that_never_answers(self, tmp_path: Path) -> None:
        with _one_shot(None) as port:
            message = self._fail(f"http://127.0.0.1:{port}/f.bin", tmp_path, read_timeout=0.5)
        # the socket's read timeout and the watchdog's rate window see the same silence
        assert message.endswith((f"read: 127.0.0.1:{port} sent nothing within the read "
                                 "timeout", "less than 64 KiB arrived in 0.5 s "
                                 "(--read-timeout): the mirror stalls or trickles")), message


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def _one_shot(answer: bytes | None) -> Iterator[int]:
    """A real socket on 127.0.0.1 that reads a request and sends `answer` then closes, or
    (None) holds the connection without a word until the test ends."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        with suppress(OSError):
            client, _ = server.accept()
            held.append(client)
            client.recv(65536)
            if answer is not None:
                client.sendall(answer)
                client.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()
        for client in held:
            client.close()


class TestRefusals:
    def test_404(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server, pytest.raises(NotOnMirror) as caught:
            Downloader(FAST, Recorder()).fetch_file(server.url + "/nope", tmp_path / "o",
                                                    size=1, sha256=digest)
        assert caught.value.code == 5

    def test_403(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server:
            server.fault("/f.bin", Fault("status", status=403))
            with pytest.raises(NotOnMirror, match="403"):
                get(server, tmp_path / "out", digest)

    def test_wrong_bytes(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server:
            server.fault("/f.bin", Fault("corrupt", after=12345))
            with pytest.raises(ChecksumMismatch, match="sha256") as caught:
                get(server, tmp_path / "out", digest)
        assert caught.value.code == 7

    def test_longer_than_manifest(self, served: tuple[Path, str], tmp_path: Path) -> None:
        root, digest = served
        with MirrorServer(root) as server, pytest.raises(ChecksumMismatch, match="sent more"):
            get(server, tmp_path / "out", digest, size=1000)

    def test_small_document_limit(self, served: tuple[Path, str]) -> None:
        root, _ = served
        with MirrorServer(root) as server, pytest.raises(IntegrityError, match="larger than"):
            Downloader(FAST, Recorder()).fetch_bytes(server.url + "/f.bin", 1000)

    def test_missing_ca_bundle(self, tmp_path: Path) -> None:
        with pytest.raises(Exception, match="is not a file") as caught:
            Downloader(replace(FAST, ca_bundle=tmp_path / "nope.pem"), Recorder())
        assert getattr(caught.value, "code", None) == 2


class TestParallel:
    def test_results_in_order(self) -> None:
        assert run_parallel([lambda i=i: i * 2 for i in range(10)], 3) == list(range(0, 20, 2))

    def test_first_failure_raised(self) -> None:
        def boom() -> int:
            raise DownloadError("boom")

        with pytest.raises(DownloadError, match="boom"):
            run_parallel([boom, *[lambda: 1] * 20], 2)
