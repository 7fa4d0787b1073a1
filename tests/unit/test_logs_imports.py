"""installer/cli/logs.py imports structlog without `rich` and with `asyncio` deferred (what the
long-lived node agent would otherwise carry, unused), and logging still works in both
formats, async methods included; anyone else still imports both normally.

Each case runs in a fresh interpreter (the modules a process has loaded are the subject).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

PRELUDE = """
import json, sys
from installer.cli import logs
"""


def run(code: str) -> dict[str, object]:
    """Run `code` after the prelude; it prints one JSON line last (stdout)."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_json_path_loads_neither_rich_nor_asyncio() -> None:
    found = run("""
logs.configure("json", stream=sys.stderr)
import installer.agent.loop, installer.agent.metrics.server  # the agent's imports
logs.get_logger(stage="agent").info("hello", n=1)
print(json.dumps({"rich": "rich" in sys.modules, "asyncio": "asyncio" in sys.modules}))
""")
    assert found == {"rich": False, "asyncio": False}


def test_logging_still_works_sync_and_async() -> None:
    done = subprocess.run([sys.executable, "-c", PRELUDE + """
import asyncio, io
logs.configure("json", stream=sys.stdout)
log = logs.get_logger(stage="t")
log.info("sync event", n=1)
asyncio.run(log.ainfo("async event", n=2))  # structlog's own asyncio, imported on use
"""], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["event"], e["n"], e["stage"], e["severity"]) for e in events] == [
        ("sync event", 1, "t", "INFO"), ("async event", 2, "t", "INFO")]


def test_the_console_path_renders_exceptions() -> None:
    done = subprocess.run([sys.executable, "-c", PRELUDE + """
logs.configure("console", stream=sys.stdout)
try:
    raise ValueError("boom")
except ValueError:
    logs.get_logger().exception("failed")
"""], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "failed" in done.stdout and "ValueError: boom" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="rich not installed")
def test_others_still_import_rich_and_asyncio() -> None:
    found = run("""
logs.configure("json", stream=sys.stderr)
import asyncio, rich
print(json.dumps({"asyncio": asyncio.get_event_loop_policy() is not None,
                  "rich": hasattr(rich, "print")}))
""")
    assert found == {"asyncio": True, "rich": True}
