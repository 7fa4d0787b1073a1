"""SIGTERM and SIGINT end a run within a second, the way any failure ends it.

The kubelet sends SIGTERM on every pod deletion; Python's defaults would either kill the
run on the spot (no line, no termination log) or, for SIGINT, raise KeyboardInterrupt
only in the main thread while worker threads finish their downloads. Here, while a
command runs (`handled()`), the first signal:

1. runs the abort hooks of work blocked outside the main thread (the downloads register
   theirs: the watchdog cuts every transfer's socket and wakes every wait);
2. raises `Signalled` in the main thread. It is a BaseException, like KeyboardInterrupt,
   so no `except InstallerError` mistakes it for a source's failure and moves on to the
   next mirror; the runner turns it into `InterruptedRun` (130) or `TerminatedRun` (143)
   naming the stage, and the ordinary failure path runs: the cache's per-run temp folder
   removed, the node lock released, the previous version declared ready again.

Later signals are ignored: the cleanup is never cut short by a second one, and never ends
in a traceback or a death by signal. A hook runs inside the signal handler, in the middle
of whatever the main thread was doing: it may only flag and wake (an RLock of its own is
safe; a plain lock the main thread might hold is not).

It lives with the node seam because, like the node lock, it is about this process on the
node; the stages (downloads), the runner and the CLI all reach it from there.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from installer.errors import InstallerError, InterruptedRun, TerminatedRun

SIGNALS = (signal.SIGINT, signal.SIGTERM)
AbortHook = Callable[[], None]


class Signalled(BaseException):
    """A run-ending signal arrived; raised in the main thread (and by aborted workers)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def error(self, stage: str, where: str) -> InstallerError:
        """The reportable failure: the class for this signal, `where` saying what stopped."""
        cls = InterruptedRun if self.signum == signal.SIGINT else TerminatedRun
        err = cls(f"stopped by {signal.Signals(self.signum).name} {where}")
        err.stage = stage
        return err


class _State:
    """The process's one signal state (signals are per process, so this is too)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.armed = False
        self.hooks: dict[object, AbortHook] = {}


_state = _State()


def _handle(signum: int, _frame: FrameType | None) -> None:
    if _state.received is not None:
        return
    _state.received = signum
    for other in SIGNALS:  # later ones change nothing, up to the exit (even while Python
        signal.signal(other, signal.SIG_IGN)  # finalises, which resets a Python handler)
    if not _state.armed:
        return
    for hook in list(_state.hooks.values()):
        with contextlib.suppress(Exception):
            hook()
    raise Signalled(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Signalled` in this block (main thread only; elsewhere a
    no-op). The previous handlers come back after it, unless a signal arrived: then the
    run is ending and later signals stay ignored, up to the exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _state.received, _state.armed = None, True
    for signum in SIGNALS:
        signal.signal(signum, _handle)
    try:
        yield
    finally:
        _state.armed = False
        if _state.received is None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def disarm() -> None:
    """From now on a signal is only noted, then ignored (the run is already reporting
    its outcome)."""
    _state.armed = False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A step that must not stop half-way (replacing the kernel's modules: old ones out, new
    ones in): a signal in this block takes effect at its end, unless the block fails."""
    was = _state.armed
    _state.armed = False
    try:
        yield
    finally:
        _state.armed = was
    if was and _state.received is not None:
        raise Signalled(_state.received)


def received() -> int | None:
    """The signal that is ending this run, if any."""
    return _state.received


def raise_if_received() -> None:
    """For work on other threads: stop at a safe point once the run is ending."""
    if _state.received is not None:
        raise Signalled(_state.received)


def register(hook: AbortHook) -> Callable[[], None]:
    """Run `hook` (signal-safe: flag and wake only) when a signal arrives, until the
    returned function is called."""
    key = object()
    _state.hooks[key] = hook

    def unregister() -> None:
        _state.hooks.pop(key, None)

    return unregister
