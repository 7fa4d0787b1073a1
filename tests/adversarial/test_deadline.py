"""The download deadline holds against every slow part of a GET.

A mirror that trickles (one byte a second, never tripping a per-recv read timeout), in the
response headers, the index, the manifest or a file's body, small or large, with or without
a Content-Length; a resolver that never answers; a TLS handshake never answered: each run
ends within the deadline plus one second. The bound is asserted twice: on the fetch stage's
own duration (its log event), and on the whole process's wall time less the CLI's start-up
(a sandboxed `detect` measured in the same test, the time before the deadline's clock
starts). Each case also asserts the exit code, the one line, and that nothing outside the
installer's work area changed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from e2e import FAKENODE
from httpserver import Fault, MirrorServer

from adversarial.harness import SANDBOX, SANDBOX_FAILED, Arena, Result, assert_refused
from adversarial.mirrorkit import (
    CACHE,
    LIB,
    PKG,
    add_file,
    assert_only,
    copy_repo,
    edit_manifest,
    fetch,
)

DEADLINE = 4.0
READ_TIMEOUT = 3.0
SMALL = "etc/gni-small.conf"
SMALL_SIZE = 300
LIMITS = ("--download-deadline", f"{DEADLINE:g}", "--read-timeout", f"{READ_TIMEOUT:g}")


@pytest.fixture
def slow(arena: Arena) -> Iterator[MirrorServer]:
    """The repository, plus a 300-byte file in the package, served over plain http."""
    repo = copy_repo(arena, "slow")
    data = b"# a small config file\n".ljust(SMALL_SIZE, b"#")
    (repo / PKG / SMALL).parent.mkdir(parents=True, exist_ok=True)
    (repo / PKG / SMALL).write_bytes(data)
    edit_manifest(repo, lambda doc: add_file(doc, SMALL, data))
    with MirrorServer(repo) as server:
        yield server


def startup(arena: Arena) -> float:
    """Wall time of the sandboxed CLI doing everything a fetch does before its deadline
    starts (interpreter, imports, settings, node facts): a `detect`."""
    started = time.monotonic()
    done = arena.run("detect", *arena.args())
    assert done.code == 0, done.stderr[-2000:]
    return time.monotonic() - started


def fetch_seconds(result: Result) -> float:
    """How long the fetch stage ran, from its own log event."""
    [failed] = [e for e in result.events if e.get("event") == "stage failed"]
    assert failed["stage"] == "fetch", failed
    return float(str(failed["duration_ms"])) / 1000


def assert_within_deadline(result: Result, took: float, start: float) -> None:
    stage = fetch_seconds(result)
    print(f"fetch stage {stage:.2f} s, process {took:.2f} s, start-up {start:.2f} s")
    assert stage <= DEADLINE + 1, stage
    assert took - start <= DEADLINE + 1, (took, start)


TRICKLES = {
    # where: (path, fault)
    "300-byte file, Content-Length": (f"/{PKG}/{SMALL}", Fault("trickle", seconds=1.0, times=0)),
    "300-byte file, no Content-Length": (
        f"/{PKG}/{SMALL}", Fault("trickle", seconds=1.0, times=0, length=False)),
    "large file, no Content-Length": (
        f"/{LIB}", Fault("trickle", after=4096, seconds=1.0, times=0, length=False)),
    "file headers": (f"/{LIB}", Fault("slow_headers", seconds=1.0, times=0)),
    "index headers": ("/index.json", Fault("slow_headers", seconds=1.0, times=0)),
    "index body, no Content-Length": (
        "/index.json", Fault("trickle", after=10, seconds=1.0, times=0, length=False)),
    "manifest body, no Content-Length": (
        f"/{PKG}/manifest.json", Fault("trickle", seconds=1.0, times=0, length=False)),
    "manifest headers": (f"/{PKG}/manifest.json", Fault("slow_headers", seconds=1.0, times=0)),
}


@pytest.mark.parametrize("where", list(TRICKLES))
def test_a_trickle_anywhere_in_a_get_ends_at_the_deadline(
        arena: Arena, slow: MirrorServer, where: str) -> None:
    path, fault = TRICKLES[where]
    slow.fault(path, fault)
    start = startup(arena)
    before = arena.snapshot()
    started = time.monotonic()
    done = fetch(arena, slow.url, extra=("--allow-http", *LIMITS), timeout=60)
    took = time.monotonic() - started
    assert_refused(done, 6, f"download deadline of {DEADLINE:g} s", f"{slow.url}{path}")
    assert_within_deadline(done, took, start)
    assert slow.requests_for(path), "the slow part was never asked for"
    assert_only(before, arena.snapshot(), CACHE)  # files that came whole are cached


# ---------------------------------------------------------------- the connection itself


def test_a_tls_handshake_never_answered_ends_at_the_deadline(arena: Arena) -> None:
    """A listener that never accepts: TCP connects (the kernel's backlog), the ClientHello
    is never answered; no per-recv timeout (30 s here) may outlast the deadline."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        start = startup(arena)
        before = arena.snapshot()
        started = time.monotonic()
        done = fetch(arena, url, extra=("--download-deadline", f"{DEADLINE:g}",
                                        "--connect-timeout", "30", "--read-timeout", "30"))
        took = time.monotonic() - started
    assert_refused(done, 6, f"download deadline of {DEADLINE:g} s", f"{url}/index.json",
                   "no connection yet")
    assert_within_deadline(done, took, start)
    assert_only(before, arena.snapshot())


# A resolver that never answers: in a network namespace of its own (only loopback), a UDP
# socket on 127.0.0.1:53 that reads nothing, named by a resolv.conf bound over
# /etc/resolv.conf in the sandbox's private mount namespace. It exits when the CLI does.
SILENT_RESOLVER = """
import os, socket, sys, time
parent = os.getppid()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 53))
open(sys.argv[1], "w").close()
while os.getppid() == parent:
    time.sleep(0.1)
"""
OFFLINE = f"""
conf=$1; ready=$2; shift 2
ip link set lo up || exit {SANDBOX_FAILED}
mount --bind "$conf" /etc/resolv.conf || exit {SANDBOX_FAILED}
"$1" -c '{SILENT_RESOLVER}' "$ready" </dev/null >/dev/null 2>&1 &
for _ in $(seq 100); do [ -e "$ready" ] && break; sleep 0.05; done
[ -e "$ready" ] || exit {SANDBOX_FAILED}
exec "$@"
"""


def run_with_silent_resolver(arena: Arena, *args: str) -> tuple[Result, float]:
    """Like `Arena.run` (same sandbox), in its own network namespace whose resolver never
    answers; returns the result and the process's wall time."""
    conf, ready = arena.scene.work / "resolv.conf", arena.scene.work / "resolver-ready"
    conf.write_text("nameserver 127.0.0.1\noptions timeout:30 attempts:3\n")
    (arena.scene.work / "tmp").mkdir(parents=True, exist_ok=True)
    command = ["unshare", "-m", "-n", "--propagation", "private", "sh", "-c", SANDBOX,
               "sandbox", str(arena.base), "sh", "-c", OFFLINE, "offline", str(conf),
               str(ready), sys.executable, str(FAKENODE), *args]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False,
                          env={**arena.env, "TMPDIR": str(arena.scene.work / "tmp")},
                          errors="replace")
    took = time.monotonic() - started
    assert done.returncode != SANDBOX_FAILED, f"sandbox not set up: {done.stderr[-500:]}"
    return Result(done.returncode, done.stdout, done.stderr), took


def test_a_resolver_that_never_answers_is_bounded_by_the_deadline(arena: Arena) -> None:
    url = "http://mirror.gni-test.internal:8080"
    baseline, start = run_with_silent_resolver(arena, "detect", *arena.args())
    assert baseline.code == 0, baseline.stderr[-2000:]
    before = arena.snapshot()
    done, took = run_with_silent_resolver(
        arena, "fetch", *arena.args("--mirror", url, "--allow-http", "--connect-timeout", "30",
                                    *LIMITS))
    assert_refused(done, 6, f"download deadline of {DEADLINE:g} s", f"{url}/index.json",
                   "no connection yet (name lookup")
    assert_within_deadline(done, took, start)
    assert_only(before, arena.snapshot())


def test_a_resolver_slower_than_the_connect_timeout_is_retried_then_named(
        arena: Arena) -> None:
    """Within a longer deadline, each lookup is cut at --connect-timeout and retried; the
    line then says that no connection came within it (not "the mirror trickles")."""
    url = "http://mirror.gni-test.internal:8080"
    done, took = run_with_silent_resolver(
        arena, "fetch", *arena.args("--mirror", url, "--allow-http", "--connect-timeout", "1",
                                    "--download-retries", "2", "--download-deadline", "60"))
    assert_refused(done, 6, url, "no connection within 1 s (--connect-timeout)")
    assert took < 30, took
