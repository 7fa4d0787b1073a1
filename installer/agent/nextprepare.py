"""Preparing the next kernel's driver package: `prepare` run in the background, one at a
time, at the lowest CPU and I/O priority, its answer judged and remembered.

The agent starts `nice -n 19 ionice -c 3 gpu-node-installer prepare --kernel R -o json`
(`prepare_command`, the one place that command line is built) and looks at it once per
round, never waiting; past NEXT_KERNEL_PREPARE_TIMEOUT its process group is killed. The
answer is one JSON object on stdout whose `state` agrees with the exit code (0 ready, 5
missing, anything else failed); anything else (not JSON, over 64 KiB, another kernel, a
state the exit code contradicts, a kill) is a failed preparation, said with the reason.
Results are kept per (kernel, requested driver): a ready kernel is not prepared again; a
missing one is asked again every MISSING_RETRY_S (a mirror may publish it), a failed one
after a doubling backoff. The command only puts a verified package in the host cache: it
never loads or stages anything, and the agent does nothing else for that kernel.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.config import Config
from installer.node import background

READY, MISSING, FAILED, BUILDING = "ready", "missing", "failed", "building"
EXIT_MISSING = 5
MAX_OUTPUT = 64 * 1024
MISSING_RETRY_S = 1800.0
FAILED_RETRY_S = (120.0, 3600.0)  # first retry, cap (doubling between)
MAX_TEXT = 500
ENTRY = "gpu-node-installer"


@dataclass(frozen=True)
class Outcome:
    """What one preparation found (`state` ready, missing or failed)."""

    state: str
    driver_version: str = ""
    flavour: str = ""
    source: str = ""
    digest: str = ""
    build_command: str | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass
class Record:
    """The last outcome for a (kernel, driver) and when to ask again (None: never)."""

    outcome: Outcome
    failures: int
    retry_at: float | None


def entry_argv(environ: Mapping[str, str]) -> list[str]:
    """The installer's own command: its console script on PATH, else this interpreter."""
    found = shutil.which(ENTRY, path=environ.get("PATH"))
    return [found] if found else [sys.executable, "-m", "installer"]


def prepare_command(config: Config, kernel: str, environ: Mapping[str, str]
                    ) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that prepare `kernel`: the install's environment,
    with the roots and install dir this agent was given (flags included), JSON logs."""
    argv = ["nice", "-n", "19", "ionice", "-c", "3", *entry_argv(environ),
            "prepare", "--kernel", kernel, "-o", "json"]
    env = {**environ, "HOST_ROOT": str(config.host_root), "PROC_ROOT": str(config.proc_root),
           "SYS_ROOT": str(config.sys_root), "DEV_ROOT": str(config.dev_root),
           "NVIDIA_INSTALL_DIR_HOST": str(config.install_dir), "LOG_FORMAT": "json",
           "LOG_LEVEL": config.log_level}
    if config.cache_dir is not None:
        env["DRIVER_CACHE_DIR"] = str(config.cache_dir)
    return argv, env


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    """A string field, printable and capped ('' for anything else)."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else "?" for c in value[:limit])


def judge(done: background.Finished, kernel: str, log_tail: str) -> Outcome:
    """The outcome a finished `prepare` run stands for (see the module's rules)."""
    if done.truncated:
        return Outcome(FAILED, error=f"prepare wrote more than {MAX_OUTPUT} bytes to stdout",
                       seconds=done.seconds)
    if done.timed_out:
        return Outcome(FAILED, error=f"prepare ran past {done.seconds:.0f}s and was killed "
                       "(NEXT_KERNEL_PREPARE_TIMEOUT)", seconds=done.seconds)
    try:
        answer = json.loads(done.stdout.decode())
    except (UnicodeDecodeError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        last = log_tail.strip().splitlines()[-1:] or [""]
        return Outcome(FAILED, error=f"prepare exited {done.returncode} without one JSON "
                       f"object on stdout: {_text(last[0], 300)}", seconds=done.seconds)
    state = answer.get("state")
    expected = {0: READY, EXIT_MISSING: MISSING}.get(done.returncode, FAILED)
    error = _text(answer.get("error"))
    if answer.get("kernel") != kernel:
        state, error = FAILED, f"prepare answered for kernel {_text(answer.get('kernel'), 80)!r}"
    elif state != expected:
        state, error = FAILED, (f"prepare exited {done.returncode} with state "
                                f"{_text(state, 20)!r}: {error}".rstrip(": "))
    build = _text(answer.get("build_command")) or None
    return Outcome(state, driver_version=_text(answer.get("driver_version"), 40),
                   flavour=_text(answer.get("flavour"), 20),
                   source=_text(answer.get("source"), 200),
                   digest=_text(answer.get("digest"), 80), build_command=build,
                   error=error or None, seconds=done.seconds)


class Preparer:
    """At most one `prepare` at a time, for the current next kernel; outcomes remembered."""

    def __init__(self, config: Config, environ: Mapping[str, str], work: Path, log: Any) -> None:
        self.config, self.environ, self.log = config, environ, log
        self.log_file = work / "prepare.log"
        self.job: background.Job | None = None
        self.kernel: str | None = None  # the kernel the job prepares
        self.records: dict[tuple[str, str], Record] = {}

    def key(self, kernel: str) -> tuple[str, str]:
        return kernel, self.config.driver_version

    def tick(self, kernel: str | None, now: float) -> tuple[str, Outcome | None]:
        """Advance for `kernel` (None: there is none): the state to say and the last
        outcome behind it."""
        if self.job is not None and self.kernel != kernel:
            self.log.info("next kernel preparation stopped: the next kernel changed",
                          kernel=self.kernel, next_kernel=kernel)
            self.stop()
        if kernel is None:
            return "", None
        if self.job is not None:
            return self._poll(kernel, now)
        record = self.records.get(self.key(kernel))
        if record is not None and (record.retry_at is None or now < record.retry_at):
            return record.outcome.state, record.outcome
        return self._start(kernel, now, record)

    def _start(self, kernel: str, now: float, record: Record | None) -> tuple[str, Outcome | None]:
        argv, env = prepare_command(self.config, kernel, self.environ)
        try:
            self.job = background.start(argv, env=env, log_file=self.log_file,
                                        timeout_s=self.config.next_kernel_prepare_timeout,
                                        limit=MAX_OUTPUT)
        except OSError as exc:
            outcome = Outcome(FAILED, error=f"cannot start {argv[0]}: {exc.strerror or exc}")
            self._remember(kernel, outcome, now)
            return FAILED, outcome
        self.kernel = kernel
        self.log.info("next kernel preparation started", kernel=kernel, pid=self.job.pid,
                      argv=argv, retry=record is not None)
        return self._running(kernel)

    def _running(self, kernel: str) -> tuple[str, Outcome | None]:
        """While a preparation runs: `building` the first time; a retry keeps saying the
        last outcome (a missing kernel asked again is still missing until the answer
        changes: no label flapping, no Event per retry)."""
        record = self.records.get(self.key(kernel))
        return (record.outcome.state, record.outcome) if record else (BUILDING, None)

    def _poll(self, kernel: str, now: float) -> tuple[str, Outcome | None]:
        assert self.job is not None
        done = self.job.poll()
        if done is None:
            return self._running(kernel)
        self.job = None
        outcome = judge(done, kernel, background.tail(self.log_file))
        self._remember(kernel, outcome, now)
        log = self.log.info if outcome.state == READY else self.log.warning
        log("next kernel prepared", kernel=kernel, state=outcome.state,
            driver=outcome.driver_version, source=outcome.source, error=outcome.error,
            exit_code=done.returncode, seconds=round(done.seconds, 1))
        return outcome.state, outcome

    def _remember(self, kernel: str, outcome: Outcome, now: float) -> None:
        previous = self.records.get(self.key(kernel))
        failures = (previous.failures + 1 if previous else 1) if outcome.state == FAILED else 0
        first, cap = FAILED_RETRY_S
        retry_at = None if outcome.state == READY else now + (
            MISSING_RETRY_S if outcome.state == MISSING else min(cap, first * 2 ** (failures - 1)))
        self.records[self.key(kernel)] = Record(outcome, failures, retry_at)

    def stop(self) -> None:
        """Kill a running preparation (the agent stops, or the next kernel changed)."""
        if self.job is not None:
            self.job.stop()
            self.job = None
            self.kernel = None
