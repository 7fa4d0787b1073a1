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
        self.infos: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.warnings.append((event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.infos.append((event, fields))


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish, "BACKOFF_BASE_S", 0.01)
    monkeypatch.setattr(publish, "BACKOFF_CAP_S", 0.05)
    monkeypatch.setattr(publish, "RESYNC_S", 0.2)


class Refused(Exception):
    """A failure that carried an HTTP answer (as KubeError's `status`)."""

    status = 403


def wait_until(what: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < end, "not within the time"
        time.sleep(0.01)


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


def test_state_is_written_again_after_an_unanswered_write() -> None:
    """A hung server may apply an unanswered write after a newer one: once it answers
    again, the latest state of every key is sent again (Events are not)."""
    log, sent, calls = Log(), [], []

    def unanswered() -> None:
        calls.append("old")
        raise TimeoutError("no complete answer within 5.0 s")

    queue = ApiQueue(log)
    queue.put("label", "label the node", unanswered)
    queue.put("condition", "set the node condition", lambda: sent.append("condition"))
    queue.event("post an Event", lambda: sent.append("event"))
    wait_until(lambda: calls)
    queue.put("label", "label the node", lambda: sent.append("label"))
    assert queue.drain(5)
    wait_until(lambda: len(sent) == 5)  # the resync: both state keys once more
    time.sleep(publish.RESYNC_S * 2)
    assert sorted(sent) == ["condition", "condition", "event", "label", "label"]
    assert [event for event, _ in log.infos] == [
        "writing the node's state again: a write went unanswered and may have landed late"]
    assert queue.close(5)


def test_no_resync_after_refusals_or_when_all_went_through() -> None:
    log, sent = Log(), []

    def refused() -> None:
        sent.append("refused")
        raise Refused("HTTP 403")

    queue = ApiQueue(log)
    queue.put("condition", "set the node condition", lambda: sent.append("condition"))
    queue.put("label", "label the node", refused)
    wait_until(lambda: "refused" in sent)
    queue.put("label", "label the node", lambda: sent.append("label"))
    assert queue.drain(5)
    time.sleep(publish.RESYNC_S * 3)
    assert sent.count("condition") == 1 and sent.count("label") == 1
    assert log.infos == []
    assert queue.close(5)


def test_a_refused_write_never_holds_the_others() -> None:
    """A label the server keeps refusing (RBAC) is retried behind the condition and the
    Events queued after it, which still go out."""
    sent: list[str] = []

    def refused() -> None:
        sent.append("refused")
        raise Refused("HTTP 403: nodes is forbidden")

    queue = ApiQueue(Log())
    queue.put("label", "label the node", refused)
    queue.put("condition", "set the node condition", lambda: sent.append("condition"))
    queue.event("post an Event", lambda: sent.append("event"))
    wait_until(lambda: "condition" in sent and "event" in sent)
    assert sent[0] == "refused" and queue.pending() in (["label"], ["(in flight)"],
                                                         ["label", "(in flight)"])
    queue.close(0.1)
