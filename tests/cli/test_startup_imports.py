"""Start-up is a feature: `--help` and `check-pod` load no logging framework, no
YAML parser they do not use, no node seam and no pipeline. Checked in fresh processes, by
which modules were imported when each exited (no timings: docs/benchmarks.md has those)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
# what only a node-facing command (or the agent, or a download) needs
NODE_ONLY = ("structlog", "requests", "pynvml", "installer.context", "installer.node.host",
             "installer.pipeline.runner", "installer.stages", "installer.installdir.layout")
PROBE = ("import atexit, sys\n"
         "atexit.register(lambda: print('LOADED', *sorted(m for m in {heavy!r} "
         "if m in sys.modules), file=sys.stderr))\n"
         "sys.argv = ['gpu-node-installer', *{args!r}]\n"
         "from installer.cli import main\n"
         "main()\n")


def loaded(args: list[str], heavy: tuple[str, ...]) -> tuple[int, list[str]]:
    """Exit code of the CLI run in a fresh interpreter, and which of `heavy` it imported."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=heavy, args=args)],
                          capture_output=True, text=True, timeout=60, check=False)
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("LOADED")]
    return done.returncode, line.split()[1:]


def test_importing_the_cli_loads_nothing_heavy() -> None:
    heavy = (*NODE_ONLY, "yaml", "installer.compat.pods")
    code = f"import sys, installer.cli; print(*[m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == ""


def test_help_loads_nothing_heavy() -> None:
    code, found = loaded(["--help"], (*NODE_ONLY, "yaml", "installer.compat.pods"))
    assert (code, found) == (0, [])


@pytest.mark.parametrize("name", ["pod.yaml", "multi.yaml"])
def test_check_pod_loads_no_node_code(name: str) -> None:
    """check-pod reads a file and judges it: the parser yes, the node seam and logs no."""
    code, found = loaded(["check-pod", str(WORKLOADS / name), "--driver", "535.261.03"],
                         (*NODE_ONLY, "yaml"))
    assert code in (0, 14)
    assert found == ["yaml"]


def test_a_command_still_loads_the_pipeline_when_it_runs() -> None:
    """The pipeline is deferred, not gone: `compat` calls it (and needs no node here)."""
    code, found = loaded(["compat", "--cuda", "12.4", "--driver", "550.54.15"],
                         ("installer.pipeline.runner", "installer.context", "structlog"))
    assert (code, found) == (0, ["installer.context", "installer.pipeline.runner"])
