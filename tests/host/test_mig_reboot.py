"""The MIG reboot guards, end to end: the real CLI in a private PID namespace whose PID 1 is
a stand-in counting the installer's reboot signal (SIGRTMIN+5, systemd's reboot), over an
A100 of the NVML stand-in whose GPU reset reaches nothing, so its mode change waits.

As mig-manager (mig-parted pkg/mig/reconfigure/reconfigure.go @ bd7160f4): a mode still
pending after the reboot made for it is `failed` and reboots no more; the node is never
rebooted without the `rebooting` state recorded (API down: no reboot). Within one boot at
most MIG_REBOOT_LIMIT signals go out.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from mignode import A100_40, MigNode, mig_node

P = "gpu-node-installer/"
NODE_NAME = "gpu-node-1"

pytestmark = pytest.mark.skipif(
    shutil.which("unshare") is None or subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
        check=False).returncode != 0,
    reason="needs unshare --pid (root, util-linux)")


def _waiting_a100(tmp_path: Path) -> MigNode:
    """An installed A100 node whose GPU reset reaches nothing: MIG mode stays pending."""
    node = mig_node(tmp_path, A100_40, 1)
    assert node.install().returncode == 0
    node.stop_resets()
    return node


def _account(tmp_path: Path) -> Path:
    from kubefake import TOKEN

    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    return account


def _partition(node: MigNode, signals: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return node.run_under_init(signals, "partition", "--mig-profile", "1g.5gb",
                               "--mig-reboot", "reboot", *extra)


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    return done.stderr.strip().splitlines()[-1]


def _states(cluster: object) -> list[str]:
    key = P + "mig.config.state"
    return [c.body["metadata"]["labels"][key] for c in cluster.calls  # type: ignore[attr-defined]
            if c.method == "PATCH" and c.body
            and key in c.body.get("metadata", {}).get("labels", {})]


class TestRebootLoop:
    def test_pending_after_the_reboot_is_failed_and_never_reboots_again(
            self, tmp_path: Path) -> None:
        from kubefake import Cluster, node_doc, serve

        node = _waiting_a100(tmp_path)
        signals = tmp_path / "reboots"
        cluster = Cluster(nodes={NODE_NAME: node_doc(NODE_NAME)})
        record = node.scene.install_dir / ".mig-reboot.json"
        with serve(cluster) as url:
            api = ("--node-name", NODE_NAME, "--kube-api", url,
                   "--service-account-dir", str(_account(tmp_path)))
            first = _partition(node, signals, *api)
            assert first.returncode == 15, first.stderr
            assert "the node reboots for the MIG mode of GPU(s) 0" in _last_line(first)
            assert signals.read_text() == "1"  # one reboot signal reached PID 1
            assert _states(cluster) == ["pending", "rebooting"]
            assert json.loads(record.read_text())["boots"] == {"boot-1": 1}

            # the same boot again (the signal did not reboot): the limit of 1 is spent
            again = _partition(node, signals, *api)
            assert again.returncode == 15, again.stderr
            assert "asked 1 time(s) in this boot" in _last_line(again)
            assert "MIG_REBOOT_LIMIT=1" in _last_line(again)
            assert signals.read_text() == "0"

            # the reboot happened and the mode still waits: failed, no reboot, every time
            node.reboot("boot-2")
            for _ in range(2):
                after = _partition(node, signals, *api)
                assert after.returncode == 15, after.stderr
                line = _last_line(after)
                assert "still pending after the node rebooted for it (asked in boot " \
                       "boot-1); no further reboot" in line, line
                assert "delete /home/kubernetes/bin/nvidia/.mig-reboot.json" in line
                assert signals.read_text() == "0"
                assert cluster.node()["metadata"]["labels"][P + "mig.config.state"] == \
                    "failed"
        assert node.gis(0) == []
        assert node.ready() is None
        assert not cluster.errors, cluster.errors

    def test_limit_two_signals_twice_in_one_boot(self, tmp_path: Path) -> None:
        node = _waiting_a100(tmp_path)
        signals = tmp_path / "reboots"
        sent = []
        for _ in range(3):
            done = _partition(node, signals, "--mig-reboot-limit", "2")
            assert done.returncode == 15, done.stderr
            sent.append(signals.read_text())
        assert sent == ["1", "1", "0"]
        assert "asked 2 time(s) in this boot" in _last_line(done)
        assert "SIGRTMIN+5" in _last_line(done)

    def test_applied_after_the_reboot_forgets_the_record(self, tmp_path: Path) -> None:
        """The reboot applies the mode (here: the reset works again): success, the record
        gone, so a later change may reboot once more."""
        node = _waiting_a100(tmp_path)
        signals = tmp_path / "reboots"
        assert _partition(node, signals).returncode == 15
        node.reboot("boot-2")
        node.restore_resets()
        done = _partition(node, signals)
        assert done.returncode == 0, done.stderr
        assert signals.read_text() == "0"
        assert node.gis(0) == [(gi, 0) for gi in range(7, 14)]
        assert not (node.scene.install_dir / ".mig-reboot.json").exists()


class TestNotRecorded:
    def test_api_down_no_reboot(self, tmp_path: Path) -> None:
        """The `rebooting` label cannot be written: failed, no signal, nothing recorded."""
        node = _waiting_a100(tmp_path)
        with socket.socket() as closed:  # a port nothing listens on
            closed.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        signals = tmp_path / "reboots"
        done = _partition(node, signals, "--node-name", NODE_NAME, "--kube-api", url,
                          "--service-account-dir", str(_account(tmp_path)))
        assert done.returncode == 15, done.stderr
        line = _last_line(done)
        assert "mig.config.state label could not be set to rebooting; no reboot" in line
        assert "fix:" in line
        assert signals.read_text() == "0"
        assert not (node.scene.install_dir / ".mig-reboot.json").exists()
        assert node.gis(0) == []

    def test_unreadable_boot_id_no_reboot(self, tmp_path: Path) -> None:
        node = _waiting_a100(tmp_path)
        (node.scene.root / "proc/sys/kernel/random/boot_id").unlink()
        signals = tmp_path / "reboots"
        done = _partition(node, signals)
        assert done.returncode == 15, done.stderr
        line = _last_line(done)
        assert "the boot ID (/proc/sys/kernel/random/boot_id) is unreadable" in line
        assert "no reboot" in line and "fix:" in line
        assert signals.read_text() == "0"

    @pytest.mark.parametrize("record", ["garbage", "fifo", "directory", "foreign-boots"])
    def test_unreadable_record_no_reboot(self, tmp_path: Path, record: str) -> None:
        """A record that cannot be read as ours cannot count reboots: failed, no signal,
        the record left as it was (a FIFO never blocks the run)."""
        import os

        node = _waiting_a100(tmp_path)
        path = node.scene.install_dir / ".mig-reboot.json"
        if record == "garbage":
            path.write_text("{not json")
        elif record == "fifo":
            os.mkfifo(path)
        elif record == "directory":
            path.mkdir()
        else:
            path.write_text('{"boots": {"boot-1": "many"}}')
        signals = tmp_path / "reboots"
        done = _partition(node, signals)
        assert done.returncode == 15, done.stderr
        line = _last_line(done)
        assert "the reboot record /home/kubernetes/bin/nvidia/.mig-reboot.json is " \
               "unreadable" in line, line
        assert "no reboot" in line and "fix:" in line
        assert signals.read_text() == "0"
        assert path.exists()
