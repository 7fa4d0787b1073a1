"""installer.node.interrupts in this process: what a signal raises, when, and what it leaves.

Each test puts this process's own SIGINT/SIGTERM handlers back afterwards (a received signal
leaves them ignored, as a run that is ending wants), so pytest keeps its Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from installer.errors import InterruptedRun, TerminatedRun
from installer.node import interrupts


@pytest.fixture(autouse=True)
def own_handlers() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in interrupts.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def deliver(signum: int) -> None:
    """Signal this process and give the main thread bytecodes to run the handler in."""
    os.kill(os.getpid(), signum)
    for _ in range(100):
        time.sleep(0.01)


def test_a_signal_raises_once_and_later_ones_are_ignored() -> None:
    with pytest.raises(interrupts.Signalled) as caught, interrupts.handled():
        deliver(signal.SIGTERM)
    assert caught.value.signum == signal.SIGTERM
    assert interrupts.received() == signal.SIGTERM
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


@pytest.mark.parametrize(("signum", "cls", "code", "slug"), [
    (signal.SIGTERM, TerminatedRun, 143, "terminated"),
    (signal.SIGINT, InterruptedRun, 130, "interrupted"),
])
def test_the_error_names_the_signal_and_the_stage(signum: int, cls: type, code: int,
                                                   slug: str) -> None:
    error = interrupts.Signalled(signum).error("fetch", "during the fetch stage")
    assert isinstance(error, cls)
    assert error.code == code
    name = signal.Signals(signum).name
    assert error.one_line().startswith(
        f"error({slug}): [fetch] stopped by {name} during the fetch stage; fix: ")


def test_without_a_signal_the_previous_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.handled():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
    assert interrupts.received() is None


def test_hooks_run_before_the_raise_and_not_after_unregistering() -> None:
    calls: list[str] = []
    unregister_first = interrupts.register(lambda: calls.append("first"))
    unregister_second = interrupts.register(lambda: calls.append("second"))
    unregister_first()
    try:
        with pytest.raises(interrupts.Signalled), interrupts.handled():
            deliver(signal.SIGINT)
    finally:
        unregister_second()
    assert calls == ["second"]


def test_a_deferred_step_finishes_then_the_signal_takes_effect() -> None:
    steps: list[str] = []
    with pytest.raises(interrupts.Signalled), interrupts.handled():
        with interrupts.deferred():
            deliver(signal.SIGTERM)
            steps.append("finished")
        steps.append("after the step")
    assert steps == ["finished"]


def test_once_disarmed_a_signal_is_only_noted() -> None:
    with interrupts.handled():
        interrupts.disarm()
        deliver(signal.SIGTERM)
    assert interrupts.received() == signal.SIGTERM


def test_raise_if_received_is_for_workers_after_the_signal() -> None:
    with interrupts.handled():
        interrupts.raise_if_received()  # nothing yet
        interrupts.disarm()
        deliver(signal.SIGINT)
        with pytest.raises(interrupts.Signalled):
            interrupts.raise_if_received()
