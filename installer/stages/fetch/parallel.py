"""Bounded parallel jobs (one package's file downloads): the first failure cancels the rest."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from installer.errors import DownloadError

T = TypeVar("T")


def run_parallel(jobs: Iterable[Callable[[], T]], parallel: int) -> list[T]:
    """Run jobs on at most `parallel` threads; the first failure (or a signal in the waiting
    thread) cancels what has not begun; what has begun is waited for."""
    stop = threading.Event()

    def guarded(job: Callable[[], T]) -> T:
        if stop.is_set():
            raise _Cancelled()
        return job()

    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="download") as pool:
        futures = [pool.submit(guarded, job) for job in jobs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # a signal (installer.node.interrupts): jobs not begun never begin
            _cancel(stop, futures)
            raise
        failed = [f for f in done if f.exception() is not None]
        if failed:
            _cancel(stop, futures)
            wait(futures)
            raise _first_real(futures)
        return [future.result() for future in futures]


def _cancel(stop: threading.Event, futures: list[Future[T]]) -> None:
    stop.set()
    for future in futures:
        future.cancel()


class _Cancelled(Exception):
    """A job skipped because an earlier one failed."""


def _first_real(futures: list[Future[T]]) -> BaseException:
    for future in futures:
        if not future.cancelled():
            exc = future.exception()
            if exc is not None and not isinstance(exc, _Cancelled):
                return exc
    return DownloadError("downloads were cancelled")
