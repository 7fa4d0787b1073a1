"""The agent process's own housekeeping: signals that only ask it to stop, and the heap it
gives back to the node once start-up is done."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_on_signal() -> Iterator[threading.Event]:
    """SIGTERM/SIGINT only set the returned event; the loop acts on it between waits."""
    stop = threading.Event()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, lambda _n, _f: stop.set())
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def trim_heap() -> None:
    """Give the heap start-up freed back to the node (glibc keeps it otherwise): the agent
    lives as long as the pod, and its RSS is what every GPU node pays."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
