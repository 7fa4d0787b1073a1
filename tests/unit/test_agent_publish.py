"""The agent's API write queue: never blocks the caller, coalesces to the latest state,
retries with backoff, bounds the Events it keeps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from installer.agent import publish
from installer.agent.publish import ApiQueue


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "BACKOFF_BASE_S", 0.01)
    monkeypatch.setattr(publish, "BACKOFF_CAP_S", 0.05)


def test_put_never_waits_on_a_hung_write() -> None:
    queue, release = ApiQueue(Log()), threading.Event()
    queue.put("condition", "hang", lambda: release.wait(5))
    start = time.monotonic()
    for n in range(100):
        queue.put("label", "label", lambda: None)
        queue.event(f"event {n}", lambda: None)
    assert time.monotonic() - start < 1.0  # 200 puts behind a write that hangs
    release.set()
    assert queue.close(5)


def test_coalesces_to_the_latest_state_per_key() -> None:
    queue, release, sent = ApiQueue(Log()), threading.Event(), []
    queue.put("xid", "first", lambda: release.wait(5))
    for state in ("not-ready", "ready", "not-ready", "ready"):
        queue.put("label", "label", lambda s=state: sent.append(s))  # type: ignore[misc]
    release.set()
    assert queue.drain(5)
    assert sent == ["ready"]


def test_a_failed_write_is_retried_until_it_lands() -> None:
    log, tries = Log(), []

    def flaky() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise OSError("connection refused")

    queue = ApiQueue(log)
    queue.put("condition", "set the node condition", flaky)
    assert queue.drain(5)
    assert len(tries) == 3
    assert [w[0] for w in log.warnings] == ["could not set the node condition"] * 2


def test_a_newer_state_replaces_a_failed_one() -> None:
    sent: list[str] = []
    gate = threading.Event()

    def fails() -> None:
        gate.wait(5)
        raise OSError("timeout")

    queue = ApiQueue(Log())
    queue.put("label", "label", fails)
    time.sleep(0.05)  # the failing write is in flight
    queue.put("label", "label", lambda: sent.append("newer"))
    gate.set()
    assert queue.drain(5)
    assert sent == ["newer"]


def test_events_are_bounded_and_given_up_after_their_tries() -> None:
    log, release = Log(), threading.Event()
    queue = ApiQueue(log)
    queue.put("condition", "hang", lambda: release.wait(5))
    time.sleep(0.05)
    for n in range(publish.MAX_EVENTS + 5):
        queue.event(f"event {n}", lambda: None)
    assert len([k for k in queue.pending() if k.startswith("event:")]) == publish.MAX_EVENTS
    assert sum(w[0].startswith("Event dropped") for w in log.warnings) == 5
    release.set()
    assert queue.drain(5)
    failing = ApiQueue(log)
    calls: list[int] = []
    failing.event("post an Event", lambda: calls.append(1) or 1 / 0)  # type: ignore[func-returns-value]
    assert failing.drain(5)
    assert len(calls) == publish.EVENT_TRIES


def test_close_bounds_a_hung_write() -> None:
    queue, release = ApiQueue(Log()), threading.Event()
    queue.put("condition", "hang", lambda: release.wait(10))
    start = time.monotonic()
    assert queue.close(0.2) is False
    assert time.monotonic() - start < 1.0
    release.set()
