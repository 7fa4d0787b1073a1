"""`gpu-node-installer preflight` against a test mirror served on 127.0.0.1: a Node list of
three pools and two arches, per-pool versions (DRIVER_VERSION_MAP), lifecycle warnings,
Blackwell's rules, a COS build's artifacts (HEAD only), Events, and bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubefake
import pytest
import yaml
from click.testing import CliRunner, Result
from cosbucket import RUNFILE_BUCKET, make_bucket
from cosserver import CosServer
from httpserver import MirrorServer

from installer.cli import cli
from installer.packages.repository import Candidate, Index, index_to_bytes, package_path

K_OLD, K_NEW, K_ARM = "6.1.0-40-cloud-amd64", "6.1.0-41-cloud-amd64", "6.1.0-40-cloud-arm64"
POOL = "cloud.google.com/gke-nodepool"
AFTER_535_EOL = "2026-12-05"  # R535's end of life was June 2026


def _candidate(version: str, kernel: str, arch: str, flavour: str) -> Candidate:
    return Candidate(version, kernel, arch, flavour, package_path(kernel, version, flavour, arch))


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorServer]:
    """index.json only: 535 (proprietary) and 570 (open) for K_OLD, 535 for K_ARM; K_NEW
    has nothing. No package body exists, so any attempt to read one would fail."""
    repo = tmp_path_factory.mktemp("repo")
    index = Index((_candidate("535.261.03", K_OLD, "x86_64", "proprietary"),
                   _candidate("570.195.03", K_OLD, "x86_64", "open"),
                   _candidate("535.261.03", K_ARM, "aarch64", "proprietary")),
                  {"default": "535.261.03", "latest": "570.195.03"})
    (repo / "index.json").write_bytes(index_to_bytes(index))
    with MirrorServer(repo) as server:
        yield server


@pytest.fixture(autouse=True)
def _quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("LOG_LEVEL", "error")
    monkeypatch.chdir(tmp_path)


def node(name: str, kernel: str, arch: str, pool: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {POOL: pool, **labels}},
            "status": {"nodeInfo": {"kernelVersion": kernel, "architecture": arch,
                                    "osImage": "Debian GNU/Linux 12 (bookworm)"}}}


def fleet(tmp_path: Path, *nodes: dict[str, Any]) -> Path:
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(nodes)}))
    return path


THREE_POOLS = (node("a-1", K_OLD, "amd64", "pool-a", **{"nvidia.com/gpu.product": "Tesla-T4"}),
               node("a-2", K_OLD, "amd64", "pool-a", **{"nvidia.com/gpu.product": "Tesla-T4"}),
               node("b-1", K_ARM, "arm64", "pool-b"),
               node("c-1", K_NEW, "amd64", "pool-c",
                    **{"cloud.google.com/gke-accelerator": "nvidia-l4"}))


def preflight(mirror: MirrorServer, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["preflight", "--mirror", mirror.url, "--allow-http",
                                    *args], input=stdin)


def rows(result: Result) -> dict[str, dict[str, Any]]:
    return {row["pool"]: row for row in json.loads(result.stdout)["rows"]}


class TestFleet:
    def test_one_kernel_missing_is_exit_14_naming_it_and_its_build_command(
            self, mirror: MirrorServer, tmp_path: Path) -> None:
        result = preflight(mirror, "--nodes", str(fleet(tmp_path, *THREE_POOLS)),
                           "-o", "json")
        assert result.exit_code == 14, result.output
        found = rows(result)
        assert {p: (r["kernel"], r["arch"], r["state"]) for p, r in found.items()} == {
            "pool-a": (K_OLD, "x86_64", "ready"), "pool-b": (K_ARM, "aarch64", "ready"),
            "pool-c": (K_NEW, "x86_64", "missing")}
        assert found["pool-a"]["nodes"] == ["a-1", "a-2"]
        assert found["pool-a"]["source"] == f"mirror {mirror.url}"
        assert found["pool-c"]["build_command"] == (
            "gpu-node-installer package build --nvidia-source "
            "NVIDIA-Linux-x86_64-535.261.03.run --kernel-headers-from-apt "
            f"linux-headers-{K_NEW} --flavour proprietary --arch x86_64 --repo ./repo")
        assert json.loads(result.stdout)["ok"] is False
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"error(incompatible): preflight: kernel {K_NEW} x86_64 "
                               "(pool pool-c) has no driver")
        assert "package build" in line
        # only index.json was read: no manifest, no package file
        assert {r.path for r in mirror.requests} == {"/index.json"}

    def test_text_names_the_missing_kernel_and_the_command(
            self, mirror: MirrorServer, tmp_path: Path) -> None:
        result = preflight(mirror, "--nodes", str(fleet(tmp_path, *THREE_POOLS)))
        assert result.exit_code == 14
        table = [line.split() for line in result.stdout.splitlines()[:4]]
        assert table[0] == ["KERNEL", "ARCH", "POOL", "DRIVER", "SOURCE", "STATE"]
        assert [K_OLD, "x86_64", "pool-a", "(2", "nodes)", "535.261.03", "proprietary",
                "mirror", mirror.url, "ready"] in table
        assert [K_NEW, "x86_64", "pool-c", "535.261.03", "proprietary", "(needed)", "-",
                "missing"] in table
        assert f"missing: {K_NEW} x86_64 pool pool-c" in result.stdout
        assert "make it: gpu-node-installer package build" in result.stdout

    def test_all_served_is_exit_0(self, mirror: MirrorServer, tmp_path: Path) -> None:
        served = [n for n in THREE_POOLS if n["metadata"]["name"] != "c-1"]
        result = preflight(mirror, "--nodes", "-", "-o", "json", stdin=json.dumps(
            {"kind": "List", "apiVersion": "v1", "items": served}))
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["ok"] is True
        assert result.stderr == ""

    def test_roll_out_checks_each_pool_as_if_it_booted_the_new_kernel(
            self, mirror: MirrorServer, tmp_path: Path) -> None:
        served = [n for n in THREE_POOLS if n["metadata"]["name"] != "c-1"]
        result = preflight(mirror, "--nodes", str(fleet(tmp_path, *served)), "--roll-out",
                           f"{K_NEW},x86_64", "-o", "json")
        assert result.exit_code == 14
        found = rows(result)
        assert (found["pool-a"]["kernel"], found["pool-a"]["state"]) == (K_NEW, "missing")
        assert (found["pool-b"]["kernel"], found["pool-b"]["state"]) == (K_ARM, "ready")
        assert K_NEW in result.stderr and "pool-a" in result.stderr

    def test_kernel_flags_with_arches(self, mirror: MirrorServer) -> None:
        result = preflight(mirror, "--kernel", f"{K_OLD},x86_64", "--kernel",
                           f"{K_ARM},arm64", "--kernel", f"{K_NEW},amd64", "-o", "json")
        assert result.exit_code == 14
        states = [(r["kernel"], r["arch"], r["state"])
                  for r in json.loads(result.stdout)["rows"]]
        assert states == [(K_OLD, "x86_64", "ready"), (K_ARM, "aarch64", "ready"),
                          (K_NEW, "x86_64", "missing")]

    def test_per_pool_rules_resolve_different_versions(self, mirror: MirrorServer,
                                                      tmp_path: Path) -> None:
        rules = tmp_path / "map.yaml"
        rules.write_text(f"- selector: {{{POOL}: pool-a}}\n  version: '570'\n"
                         "  flavour: open\n")
        served = [n for n in THREE_POOLS if n["metadata"]["name"] != "c-1"]
        result = preflight(mirror, "--nodes", str(fleet(tmp_path, *served)),
                           "--driver-version-map", str(rules), "-o", "json")
        assert result.exit_code == 0, result.output
        found = rows(result)
        assert (found["pool-a"]["driver"], found["pool-a"]["flavour"],
                found["pool-a"]["rule"]) == ("570.195.03", "open", "map-1")
        assert (found["pool-b"]["driver"], found["pool-b"]["rule"]) == ("535.261.03",
                                                                        "setting")


    def test_a_node_override_label_separates_it_from_its_pool(
            self, mirror: MirrorServer, tmp_path: Path) -> None:
        pinned = node("a-3", K_OLD, "amd64", "pool-a",
                      **{"gpu-node-installer/driver-version.override": "570"})
        result = preflight(mirror, "--nodes", str(fleet(tmp_path, THREE_POOLS[0], pinned)),
                           "-o", "json")
        assert result.exit_code == 0, result.output
        found = {tuple(r["nodes"]): (r["driver"], r["rule"])
                 for r in json.loads(result.stdout)["rows"]}
        assert found == {("a-1",): ("535.261.03", "setting"), ("a-3",): ("570.195.03", "label")}

    def test_a_bad_override_label_names_its_node(self, mirror: MirrorServer,
                                                 tmp_path: Path) -> None:
        pinned = node("a-3", K_OLD, "amd64", "pool-a",
                      **{"gpu-node-installer/driver-version.override": "five"})
        result = preflight(mirror, "--nodes", str(fleet(tmp_path, pinned)))
        assert result.exit_code == 2
        assert "kubectl label node a-3 " in result.stderr


class TestLifecycle:
    def test_past_eol_warns_and_strict_fails(self, mirror: MirrorServer) -> None:
        args = ("--kernel", f"{K_OLD},x86_64", "--today", AFTER_535_EOL, "-o", "json")
        result = preflight(mirror, *args)
        assert result.exit_code == 0, result.output
        (warning,) = json.loads(result.stdout)["warnings"]
        assert warning["code"] == "past-eol" and "R535" in warning["message"]
        strict = preflight(mirror, *args, "--strict")
        assert strict.exit_code == 14
        assert "past its end of life" in strict.stderr.splitlines()[0]

    def test_end_of_life_within_90_days_warns(self, mirror: MirrorServer) -> None:
        result = preflight(mirror, "--kernel", f"{K_OLD},x86_64", "--today", "2026-04-15",
                           "-o", "json")
        (warning,) = json.loads(result.stdout)["warnings"]
        assert warning["code"] == "eol-soon" and "in 76 days" in warning["message"]
        calm = preflight(mirror, "--kernel", f"{K_OLD},x86_64", "--today", "2026-01-15",
                         "-o", "json", "--strict")
        assert calm.exit_code == 0 and json.loads(calm.stdout)["warnings"] == []

    @pytest.mark.parametrize(("flags", "said"), [
        (("--flavour", "proprietary", "--driver-version", "latest"), "proprietary"),
        (("--driver-version", "535.261.03"), "Blackwell"),
    ])
    def test_blackwell_with_proprietary_or_pre_570_is_an_error(
            self, mirror: MirrorServer, flags: tuple[str, ...], said: str) -> None:
        result = preflight(mirror, "--kernel", f"{K_OLD},x86_64", "--gpu", "B200", *flags,
                           "-o", "json")
        assert result.exit_code == 14, result.output
        (row,) = json.loads(result.stdout)["rows"]
        assert row["state"] == "unsupported" and said in row["reason"]

    def test_a_blackwell_label_takes_latest_and_refuses_default(
            self, mirror: MirrorServer, tmp_path: Path) -> None:
        """As the install does: the index's `default` (535) cannot drive a B200, `latest`
        (570, open) can."""
        b200 = node("g-1", K_OLD, "amd64", "pool-g", **{"nvidia.com/gpu.family": "blackwell"})
        nodes = str(fleet(tmp_path, b200))
        result = preflight(mirror, "--nodes", nodes, "--driver-version", "latest", "-o", "json")
        (row,) = json.loads(result.stdout)["rows"]
        assert (row["driver"], row["flavour"], row["state"]) == ("570.195.03", "open",
                                                                 "ready")
        refused = preflight(mirror, "--nodes", nodes, "-o", "json")
        assert refused.exit_code == 14
        (row,) = json.loads(refused.stdout)["rows"]
        assert row["state"] == "unsupported" and "Blackwell" in row["reason"]


class TestCos:
    @pytest.fixture
    def bucket(self, tmp_path: Path) -> Iterator[tuple[CosServer, Any]]:
        bucket = make_bucket(tmp_path / "cos", runfile=False)
        runfile = (bucket.root / RUNFILE_BUCKET / "tesla" / bucket.version
                   / f"NVIDIA-Linux-x86_64-{bucket.version}.run")
        runfile.parent.mkdir(parents=True)
        runfile.write_bytes(b"#!/bin/sh\n")
        # larger than a COS artifact may be: a GET of it would be refused, a HEAD is not
        with bucket.tarball.open("r+b") as handle:
            handle.truncate(5 * 1024**3)
        with CosServer(bucket.root, tls=False) as server:
            yield server, bucket

    def _run(self, server: CosServer, bucket: Any, *more: str) -> Result:
        return CliRunner().invoke(cli, [
            "preflight", "--cos-build", bucket.build_id, "--allow-http",
            "--cos-tools-url", server.cos_tools_url, "--nvidia-runfile-url",
            server.runfile_url, "--gpu", "L4", "-o", "json", *more])

    def test_cos_build_served_by_head_only(self, bucket: tuple[CosServer, Any]) -> None:
        server, built = bucket
        result = self._run(server, built)
        assert result.exit_code == 0, result.output
        (row,) = json.loads(result.stdout)["rows"]
        assert (row["driver"], row["flavour"], row["state"]) == (built.version, "open",
                                                                 "ready")
        assert row["source"].startswith("cos ") and built.build_id in row["source"]

    def test_cos_build_without_the_modules_is_missing(
            self, bucket: tuple[CosServer, Any]) -> None:
        server, built = bucket
        built.tarball.unlink()
        result = self._run(server, built)
        assert result.exit_code == 14
        (row,) = json.loads(result.stdout)["rows"]
        assert row["state"] == "missing" and "nvidia-drivers-" in row["reason"]

    def test_cos_nodes_of_a_node_list_go_to_the_cos_build(
            self, bucket: tuple[CosServer, Any], mirror: MirrorServer, tmp_path: Path) -> None:
        server, built = bucket
        cos = node("cos-1", "6.1.58+", "amd64", "pool-cos",
                   **{"cloud.google.com/gke-accelerator": "nvidia-l4"})
        cos["status"]["nodeInfo"]["osImage"] = "Container-Optimized OS from Google"
        result = CliRunner().invoke(cli, [
            "preflight", "--nodes", str(fleet(tmp_path, cos, THREE_POOLS[0])),
            "--cos-build", built.build_id, "--mirror", mirror.url, "--allow-http",
            "--cos-tools-url", server.cos_tools_url, "--nvidia-runfile-url",
            server.runfile_url, "-o", "json"])
        assert result.exit_code == 0, result.output
        found = rows(result)
        assert found["pool-cos"]["source"].startswith("cos ")
        assert found["pool-cos"]["kernel"] == "6.1.58+"
        assert found["pool-a"]["source"] == f"mirror {mirror.url}"

    def test_cos_with_a_proprietary_only_gpu_is_unsupported(
            self, bucket: tuple[CosServer, Any]) -> None:
        server, built = bucket
        result = CliRunner().invoke(cli, [
            "preflight", "--cos-build", built.build_id, "--allow-http", "--cos-tools-url",
            server.cos_tools_url, "--gpu", "V100", "-o", "json"])
        assert result.exit_code == 14
        assert json.loads(result.stdout)["rows"][0]["state"] == "unsupported"


class TestEvents:
    def test_post_events_on_a_node_of_each_missing_kernel(
            self, mirror: MirrorServer, tmp_path: Path) -> None:
        nodes = {}
        for doc in THREE_POOLS:
            served = kubefake.node_doc(doc["metadata"]["name"], doc["metadata"]["labels"])
            served["status"]["nodeInfo"] = {
                **doc["status"]["nodeInfo"], "machineID": "m", "systemUUID": "s",
                "bootID": "b", "kernelVersion": doc["status"]["nodeInfo"]["kernelVersion"],
                "containerRuntimeVersion": "containerd://1.7", "kubeletVersion": "v1.31.0",
                "kubeProxyVersion": "", "operatingSystem": "linux"}
            nodes[served["metadata"]["name"]] = served
        cluster = kubefake.Cluster(nodes=nodes)
        account = tmp_path / "account"
        account.mkdir()
        (account / "token").write_text(kubefake.TOKEN)
        with kubefake.serve(cluster) as url:
            result = preflight(mirror, "--nodes-from-api", "--post-events", "--kube-api",
                               url, "--service-account-dir", str(account), "-o", "json")
        assert result.exit_code == 14, result.output
        assert not cluster.errors, cluster.errors
        (event,) = cluster.events
        assert event["involvedObject"]["name"] == "c-1"
        assert event["reason"] == "DriverPackageMissing" and event["type"] == "Warning"
        assert K_NEW in event["message"] and "package build" in event["message"]
        assert json.loads(result.stdout)["events"] == [
            "event: DriverPackageMissing posted on node c-1"]


class TestBadInput:
    def _untouched(self, tmp_path: Path, result: Result, code: int, *said: str) -> None:
        assert result.exit_code == code, result.output
        (line,) = result.stderr.splitlines()
        assert "Traceback" not in result.output and "internal" not in line
        for text in said:
            assert text in line, line
        assert not (tmp_path / "termination-log").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            p.name for p in self.before)

    @pytest.fixture(autouse=True)
    def _listing(self, tmp_path: Path) -> None:
        (tmp_path / "nodes.yaml").write_text("kind: List\nitems: [{kind: Node\n")
        self.before = list(tmp_path.iterdir())

    def test_malformed_node_list(self, mirror: MirrorServer, tmp_path: Path) -> None:
        result = preflight(mirror, "--nodes", str(tmp_path / "nodes.yaml"))
        self._untouched(tmp_path, result, 2, "is not valid YAML or JSON")

    def test_a_node_with_a_bad_kernel(self, mirror: MirrorServer, tmp_path: Path) -> None:
        bad = node("x-1", "../../etc", "amd64", "pool-x")
        result = preflight(mirror, "--nodes", "-", stdin=json.dumps(
            {"kind": "List", "items": [bad]}))
        self._untouched(tmp_path, result, 2, "node x-1", "kernelVersion")

    @pytest.mark.parametrize("value", ["6.1 0", "6.1.0,sparc", "", "../x"])
    def test_bad_kernel_flag(self, mirror: MirrorServer, tmp_path: Path, value: str) -> None:
        result = preflight(mirror, "--kernel", value)
        self._untouched(tmp_path, result, 2, "--kernel")

    def test_unreadable_mirror_is_a_download_error_naming_it(self, tmp_path: Path) -> None:
        empty = tmp_path.parent / f"{tmp_path.name}-empty"
        empty.mkdir()
        with MirrorServer(empty) as gone:
            result = preflight(gone, "--kernel", f"{K_OLD},x86_64")
        self._untouched(tmp_path, result, 6, f"preflight cannot read mirror {gone.url}")

    def test_nothing_to_check(self, mirror: MirrorServer, tmp_path: Path) -> None:
        self._untouched(tmp_path, preflight(mirror), 2, "nothing to check")


def test_no_host_mount_is_needed(mirror: MirrorServer) -> None:
    """The defaults (/host, /proc) need not exist: preflight never reads a node."""
    result = preflight(mirror, "--kernel", f"{K_OLD},x86_64")
    assert result.exit_code == 0, result.output
