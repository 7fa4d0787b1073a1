"""A stand-in for `gpu-node-installer prepare --kernel R -o json`, for the agent's tests.

It follows the command's contract as issue 41's agent part gives it; the anchor is this
project's own command, installer/cli/prepare.py and installer/pipeline/prepare.py at commit
638b52b (tests/host/test_next_kernel_prepare.py also runs the real one, so the two are
checked against each other): exit 0 when the package is ready in the host cache, 5 when
no source has it, any other code on failure; stdout is ONE JSON object with `kernel`,
`arch`, `driver_version`, `flavour`, `state` (ready, missing, failed), `source`, `digest`,
`build_command` (str or null), `error` (str or null) and `duration_s`. What it does is set
by FAKE_PREPARE (ready, missing, failed, garbage, huge, hang, wrong-kernel; `,sleep=S`
first waits S seconds); each run appends its argv, niceness and I/O class to the JSON
lines file FAKE_PREPARE_RECORD, so a test can assert how the agent ran it. It writes
nothing else anywhere: it never loads or stages a thing.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SCRIPT = r'''#!{python}
import json, os, subprocess, sys, time
mode, _, extra = os.environ.get("FAKE_PREPARE", "ready").partition(",")
io = subprocess.run(["ionice", "-p", str(os.getpid())], capture_output=True, text=True)
record = {{"argv": sys.argv, "nice": os.getpriority(os.PRIO_PROCESS, 0),
          "ionice": io.stdout.strip(), "pid": os.getpid(),
          "host_root": os.environ.get("HOST_ROOT")}}
with open(os.environ["FAKE_PREPARE_RECORD"], "a") as out:
    out.write(json.dumps(record) + "\n")
if extra.startswith("sleep="):
    time.sleep(float(extra[6:]))
kernel = sys.argv[sys.argv.index("--kernel") + 1] if "--kernel" in sys.argv else ""
answer = {{"kernel": kernel, "arch": "x86_64", "driver_version": "535.261.03",
          "flavour": "open", "state": mode, "source": "mirror https://mirror.test/",
          "digest": "sha256:" + "ab" * 32, "build_command": None, "error": None,
          "duration_s": 0.1}}
if mode == "missing":
    answer["build_command"] = ("gpu-node-installer package build --kernel " + kernel
                               + " --driver-version 535.261.03")
if mode == "failed":
    answer["error"] = "download failed: mirror answered 503"
if mode == "wrong-kernel":
    answer["kernel"], mode = "5.10.0-1-amd64", "ready"
if mode == "hang":
    time.sleep(3600)
if mode == "garbage":
    sys.stdout.write("this is not json {{{{\n")
    sys.exit(0)
if mode == "huge":
    chunk = "x" * 65536
    for _ in range(400):
        sys.stdout.write(chunk)
    sys.exit(0)
sys.stdout.write(json.dumps(answer) + "\n")
sys.exit({{"ready": 0, "missing": 5}}.get(mode, 1))
'''


def write_prepare_standin(bin_dir: Path) -> Path:
    """`gpu-node-installer` in `bin_dir` (put it first on PATH): the stand-in."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "gpu-node-installer"
    path.write_text(SCRIPT.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def standin_env(bin_dir: Path, record: Path, mode: str = "ready") -> dict[str, str]:
    """The environment a test gives the agent for the stand-in to be the one run."""
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "FAKE_PREPARE": mode, "FAKE_PREPARE_RECORD": str(record)}
