"""The metrics server under load: many scrapes at once, idle and trickling clients.

The server runs sandboxed in its own process (healthprobe.py `serve`: the real
`installer.agent.metrics.server` over a fixed 8-GPU snapshot, on 127.0.0.1 only); the
test's clients are bounded (one request each, socket timeouts), and the server's threads
are counted from outside, in /proc/<pid>/task. Read timeout and connection deadline are
passed shorter than the agent's (1 s, 2 s) so each case stays short.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from adversarial.harness import assert_untouched
from adversarial.sandboxed import SmallArena, small_arena, started
from installer.agent.metrics import server
from installer.agent.metrics.snapshot import Snapshot

READ_TIMEOUT_S, DEADLINE_S = 1.0, 2.0
SCRAPES = 200
BASE_THREADS = 3  # the probe's main thread, the accept loop, the deadline reaper


@dataclass
class Served:
    port: int
    pid: int
    max_threads: int

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))


@contextmanager
def serving(tmp_path: Path) -> Iterator[Served]:
    arena: SmallArena = small_arena(tmp_path / "arena")
    before = arena.listing()
    with started(arena, "serve", str(READ_TIMEOUT_S), str(DEADLINE_S)) as process:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("{"), process.stderr.read() if process.stderr else ""
        info = json.loads(line)
        yield Served(info["port"], info["pid"], info["max_threads"])
    assert_untouched(before, arena.listing())


def scrape(port: int, path: str = "/metrics") -> tuple[str, float]:
    """One request; (status line, seconds from connect to the end of the answer)."""
    started_at = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0].decode(), time.monotonic() - started_at


class Peak:
    """The most threads the server process had while the block ran (sampled every 5 ms)."""

    def __init__(self, served: Served) -> None:
        self.served, self.most, self._stop = served, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.most = max(self.most, self.served.threads())

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_the_limits_are_the_agents() -> None:
    assert server.LISTEN_BACKLOG >= 128 and server.MAX_THREADS == 16
    assert server.READ_TIMEOUT_S == 5.0 and server.CONNECTION_DEADLINE_S == 30.0


@pytest.mark.timeout(60)
def test_two_hundred_concurrent_scrapes_are_all_answered(tmp_path: Path) -> None:
    with serving(tmp_path) as served:
        results: list[tuple[str, float]] = []
        failures: list[BaseException] = []
        gate = threading.Barrier(SCRAPES)

        def client() -> None:
            try:
                gate.wait(timeout=20)
                results.append(scrape(served.port))
            except BaseException as exc:
                failures.append(exc)

        clients = [threading.Thread(target=client) for _ in range(SCRAPES)]
        with Peak(served) as peak:
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join(timeout=40)
        assert failures == [] and len(results) == SCRAPES
        assert {status for status, _ in results} == {"HTTP/1.0 200 OK"}
        slowest = max(seconds for _, seconds in results)
        assert slowest < 10, f"a client waited {slowest:.1f} s (SYN retries: a full backlog)"
        assert peak.most <= served.max_threads + BASE_THREADS, peak.most
        print(f"200 scrapes: slowest {slowest:.2f} s, at most {peak.most} server threads")


def test_an_idle_connection_is_closed_after_the_read_timeout(tmp_path: Path) -> None:
    with serving(tmp_path) as served, socket.create_connection(
            ("127.0.0.1", served.port), timeout=10) as idle:
        opened = time.monotonic()
        assert idle.recv(1024) == b""  # closed by the server, no answer
        waited = time.monotonic() - opened
        assert READ_TIMEOUT_S * 0.5 <= waited < READ_TIMEOUT_S + 3, waited
        assert scrape(served.port)[0] == "HTTP/1.0 200 OK"  # the server is fine


def test_a_trickling_client_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    with serving(tmp_path) as served, socket.create_connection(
            ("127.0.0.1", served.port), timeout=10) as slow:
        opened, closed = time.monotonic(), None
        for byte in b"GET /metrics HTTP/1.0":  # one byte per half read timeout
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                closed = time.monotonic()
                break
            time.sleep(READ_TIMEOUT_S / 2)
            if not _open(slow):
                closed = time.monotonic()
                break
        assert closed is not None, "a trickling client was served for 10 s"
        assert closed - opened < DEADLINE_S + 3


def _open(conn: socket.socket) -> bool:
    """Whether the server still holds the connection (no end-of-file waiting)."""
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        conn.setblocking(True)


def test_idle_connections_hold_no_more_than_the_thread_bound(tmp_path: Path) -> None:
    with serving(tmp_path) as served, Peak(served) as peak:
        idle = [socket.create_connection(("127.0.0.1", served.port), timeout=10)
                for _ in range(3 * served.max_threads)]
        try:
            status, seconds = scrape(served.port)  # queued behind them, then served
            assert status == "HTTP/1.0 200 OK"
            assert seconds < 3 * READ_TIMEOUT_S + 3, seconds
        finally:
            for conn in idle:
                conn.close()
    assert peak.most <= served.max_threads + BASE_THREADS, peak.most


def test_a_shutdown_does_not_wait_for_busy_slots() -> None:
    """Every slot held by an idle client, more queued: the agent's exit is not held up."""
    app = server.make_app(lambda: Snapshot(taken_at=time.time()), 5, None)
    httpd, thread = server.serve("127.0.0.1", 0, app, read_timeout_s=30, deadline_s=60)
    port = httpd.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10)
            for _ in range(server.MAX_THREADS + 4)]
    try:
        time.sleep(0.5)  # the accept loop now waits for a slot
        began = time.monotonic()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
        assert not thread.is_alive() and time.monotonic() - began < 3
    finally:
        for conn in idle:
            conn.close()
