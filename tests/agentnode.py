"""A GPU node for the agent's tests: a temp host tree with the stand-in driver staged (NVML
and CUDA stand-ins, plus the daemon stand-ins of tests/native/daemons.py as the package's
daemons), readiness written by the real `signal` command, and the real `agent` command run
in a subprocess against it, reporting to the strict fake API (tests/kubefake.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from click.testing import CliRunner
from kubefake import TOKEN
from native import build_standins, packages
from native.contexts import make_ctx, node_args
from native.daemons import started, write_daemon_standins, write_fabric
from native.packages import _entry, tree_package

from installer.cli import cli
from installer.packages.daemons import DaemonEntry
from installer.packages.manifest import FileEntry, Package, dump_manifest
from installer.stages import stage
from installer.testing import SAMPLE_NODES, build_node

VERSION = "535.261.03"
NODE = "gpu-node-1"
INSTALL = "home/kubernetes/bin/nvidia"
NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Thu Jun 26 2025\n"
FM_CONFIG = ("# Fabric Manager (stand-in)\nLOG_LEVEL=4\nDAEMONIZE=1\nFABRIC_MODE=0\n"
             "TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch\n")
# NVIDIA's shipped /etc/nvidia-imex/config.cfg fields (its IMEX guide, "Config Options")
IMEX_CONFIG = ("DAEMONIZE=1\nSERVER_PORT=50000\n"
               "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n")
A100_BUSES = ("07", "0b", "48", "4c", "88", "8b", "c8", "cb")
ALL = ("nv-fabricmanager", "nvlsm", "nvidia-persistenced")
REPO = Path(__file__).resolve().parents[1]


def daemon_package(work: Path, *, daemons: tuple[str, ...] = ALL,
                   fm_version: str = VERSION, imex_version: str = VERSION) -> Package:
    """The stand-in driver with the daemon stand-ins as the package's `daemons`
    (`nvidia-imex` only when named: GB200/GB300's)."""
    tree = packages.standin_tree(work / "tree", build_standins(work / "built"), VERSION)
    write_daemon_standins(tree / "usr/bin", version=VERSION)
    if fm_version != VERSION:  # a Fabric Manager of another release than the driver
        write_daemon_standins(work / "other", version=fm_version)
        (tree / "usr/bin/nv-fabricmanager").write_bytes(
            (work / "other/nv-fabricmanager").read_bytes())
    configs = {"nv-fabricmanager": ("usr/share/nvidia/nvswitch/fabricmanager.cfg", FM_CONFIG),
               "nvlsm": ("usr/share/nvidia/nvlsm/nvlsm.conf", "# NVLSM (stand-in)\n"),
               "nvidia-imex": ("etc/nvidia-imex/nvidia-imex.cfg", IMEX_CONFIG)}
    for path, text in configs.values():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    base = tree_package(tree, VERSION)
    files: list[FileEntry] = list(base.manifest.files)
    entries = []
    for name in daemons:
        paths = [f"usr/bin/{name}"] + ([configs[name][0]] if name in configs else [])
        files += [_entry(tree, p, "binary" if p.startswith("usr/bin") else "config")
                  for p in paths]
        version = {"nv-fabricmanager": fm_version, "nvidia-imex": imex_version}.get(name)
        entries.append(DaemonEntry(name, version or VERSION, tuple(paths)))
    manifest = dataclasses.replace(base.manifest, files=tuple(files), daemons=tuple(entries))
    digest = hashlib.sha256(dump_manifest(manifest)).hexdigest()
    return Package(manifest=manifest, digest=digest, root=tree, by_hash=False,
                   source="test-tree")


@dataclasses.dataclass
class AgentNode:
    """One node's host tree and the environment its agent runs with."""

    root: Path
    env: dict[str, str]

    @property
    def fabric(self) -> Path:
        return self.root / "fabric"

    @property
    def install(self) -> Path:
        return self.root / INSTALL

    def ready_files(self) -> tuple[Path, Path]:
        return self.install / ".ready.json", self.root / "run/nvidia/validations/driver-ready"

    def ready(self) -> bool:
        return all(path.is_file() for path in self.ready_files())

    def view(self) -> dict[str, object]:
        try:
            return json.loads((self.install / ".agent.json").read_text())
        except (OSError, ValueError):
            return {}

    def pid(self, name: str) -> int | None:
        path = self.root / {"nvidia-persistenced": "var/run/nvidia-persistenced"}.get(
            name, "var/run/nvidia-fabricmanager") / f"{name}.pid"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def started(self) -> list[str]:
        return [str(entry["name"]) for entry in started(self.root)]

    def argv(self, name: str) -> list[str]:
        return [list(map(str, e["argv"])) for e in started(self.root)  # type: ignore[call-overload]
                if e["name"] == name][-1]

    def command(self, *args: str, api: str | None = None) -> list[str]:
        kube = ["--node-name", NODE, "--kube-api", api,
                "--service-account-dir", str(self.root.parent / "serviceaccount")] if api else []
        return [sys.executable, "-m", "installer", *args, *node_args(self.root),
                "--log-format", "json", "--termination-log", str(self.root / "termlog"), *kube]

    def run(self, *args: str, api: str | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args, api=api), env=self.env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, check=False)

    @contextmanager
    def agent(self, *args: str, api: str | None = None) -> Iterator[subprocess.Popen[str]]:
        """The long-running agent; SIGTERM at the end, its daemons checked gone."""
        log = open(self.root / "agent.log", "w")  # noqa: SIM115 (closed below)
        process = subprocess.Popen(self.command("agent", *args, api=api), env=self.env,
                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.close()
            for name in ALL:  # never leave a stand-in behind, whatever the test did
                pid = self.pid(name)
                if pid is not None:
                    with suppress(OSError):
                        os.kill(pid, 9)

    def log(self) -> str:
        return (self.root / "agent.log").read_text(errors="replace")

    def start_order(self) -> list[str]:
        """The daemons in the order the agent started them (its log; the stand-ins' own
        records race each other when two start in one round)."""
        events = [json.loads(line) for line in self.log().splitlines()
                  if line.startswith("{")]
        return [str(e["daemon"]) for e in events if e.get("event") == "daemon started"]


def make_node(tmp_path: Path, package: Package, *, sample: str = "gke-cos-a100x8",
              gpus: int = 8, env: dict[str, str] | None = None, boot: bool = False
              ) -> AgentNode:
    """Build the node, stage the package, load the "driver", signal readiness for real.
    `boot`: as at a fabric node's boot, signal runs before Fabric Manager (the fabric not
    started), so it holds readiness for the agent and publishes nothing."""
    root = build_node(tmp_path / "node", SAMPLE_NODES[sample])
    stage.stage_package(make_ctx(root), package)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(NVRM.format(VERSION))
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("6f1e0c56-0d0f-4b1e-9d53-0f0a4b1c2d3e\n")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    buses = A100_BUSES if gpus == 8 else ("05",)
    node_env = {**{k: v for k, v in os.environ.items()
                   if not k.startswith(("FAKE_", "NODE_NAME", "KUBE", "NVFM_CONFIG_",
                                        "METRICS_"))},
                "FAKE_DAEMON_ROOT": str(root), "FAKE_NVML_GPUS": str(gpus),
                "FAKE_CUDA_DEVICES": str(gpus), "FAKE_NVML_FABRIC_FILE": str(root / "fabric"),
                "FAKE_NVML_BUS_IDS": ",".join(f"00000000:{b}:00.0" for b in buses),
                "FAKE_NVML_EVENTS": "unsupported", "FAKE_FM_SECONDS": "2",
                "METRICS_PORT": "0",  # a server only where a test asks for one
                **(env or {})}
    node = AgentNode(root, node_env)
    write_fabric(node.fabric, [(1 if boot else 3, 0)] * gpus)  # what signal sees
    with _environ(node_env):
        done = CliRunner().invoke(cli, ["signal", *node_args(root), "--log-format", "json",
                                        "--termination-log", str(root / "termlog")])
    assert done.exit_code == 0, done.output
    assert node.ready() is not boot
    write_fabric(node.fabric, [(1, 0)] * gpus)  # the daemons are not running yet
    return node


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def wait_for(what: Callable[[], object], timeout: float, step: float = 0.1) -> float:
    """Poll `what` until truthy; seconds it took (AssertionError after `timeout`)."""
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(step)
    return time.monotonic() - start
