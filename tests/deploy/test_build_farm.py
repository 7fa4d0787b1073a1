"""daemonset/examples/build-farm: the Indexed Job of shards, the index Job, the PVCs and
the bucket variant render, validate strictly against Kubernetes 1.28-1.33, and speak the
installer's CLI (every flag of `package build`/`package index` they pass exists)."""

from __future__ import annotations

import shlex

import click
import kubernetes_validate
import pytest

from deploy.manifests import (
    INSTALLER_IMAGE,
    containers,
    of_kind,
    one,
    pod_spec,
    render,
)
from installer import __version__
from installer.cli import cli

KUBERNETES_VERSIONS = ("1.28.0", "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
FARM = ("examples/build-farm/shards", "examples/build-farm/index",
        "examples/build-farm/bucket/shards", "examples/build-farm/bucket/index")
SHARDS = (FARM[0], FARM[2])


@pytest.mark.parametrize("target", FARM)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strictly_valid(target: str, version: str) -> None:
    docs = render(target)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def _installer_args(container: dict) -> list[str]:
    """The installer's argv: `args`, or the words after `gpu-node-installer` in sh -c."""
    if "command" not in container:
        return list(container["args"])
    script = container["args"][0]
    words = shlex.split(script.split("$(", 1)[0])
    return words[words.index("gpu-node-installer") + 1:]


def _installers(target: str) -> list[dict]:
    (job,) = of_kind(render(target), "Job")
    return [c for c in containers(pod_spec(job)) if c["image"].startswith(INSTALLER_IMAGE)]


@pytest.mark.parametrize("target", FARM)
def test_commands_and_flags_exist(target: str) -> None:
    for container in _installers(target):
        group, name, *args = _installer_args(container)
        command = cli.commands[group].commands[name]  # type: ignore[attr-defined]
        accepted = {opt for p in command.params if isinstance(p, click.Option)
                    for opt in p.opts}
        flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
        assert flags <= accepted, f"{target}: {group} {name} has no {flags - accepted}"
        if name == "build":  # everything from the signed archive: nothing staged
            assert {"--repo", "--kernel-headers-from-apt", "--nvidia-source-from-apt",
                    "--debian-mirror"} <= flags


@pytest.mark.parametrize("target", SHARDS)
def test_shards_are_an_indexed_job_of_the_shard_count(target: str) -> None:
    job = one(render(target), "Job", "build-farm-shards")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["parallelism"] <= spec["completions"]
    (shard,) = [c for c in _installers(target) if c["name"] == "shard"]
    env = {e["name"]: e["value"] for e in shard["env"]}
    assert int(env["GNI_SHARD_COUNT"]) == spec["completions"]
    requests = shard["resources"]["requests"]
    assert {"cpu", "memory", "ephemeral-storage"} <= requests.keys()
    assert f"--jobs={requests['cpu']}" in shard["args"]  # make uses what was asked for


@pytest.mark.parametrize("target", FARM)
def test_every_mount_names_a_volume_and_images_are_pinned(target: str) -> None:
    (job,) = of_kind(render(target), "Job")
    spec = pod_spec(job)
    volumes = {v["name"] for v in spec["volumes"]}
    for container in containers(spec):
        assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes
        name, _, tag = container["image"].rpartition(":")
        assert name and tag and tag != "latest"
        if name == INSTALLER_IMAGE:
            assert tag in (__version__, f"{__version__}-build")
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_claims_exist_for_what_the_shards_mount() -> None:
    docs = render(SHARDS[0])
    claims = {doc["metadata"]["name"] for doc in of_kind(docs, "PersistentVolumeClaim")}
    mounted = {v["persistentVolumeClaim"]["claimName"]
               for v in pod_spec(one(docs, "Job"))["volumes"] if "persistentVolumeClaim" in v}
    assert mounted == claims == {"build-farm-repo"}
    repo = one(docs, "PersistentVolumeClaim", "build-farm-repo")
    assert repo["spec"]["accessModes"] == ["ReadWriteMany"]  # shards on several nodes


def test_bucket_shard_uploads_receipts_last() -> None:
    docs = render(SHARDS[1])
    assert "build-farm-repo" not in {d["metadata"]["name"] for d in docs}
    spec = pod_spec(one(docs, "Job"))
    assert [c["name"] for c in spec["initContainers"]] == ["shard"]
    (upload,) = spec["containers"]
    packages, receipts = upload["args"][0].split("&&")
    assert "--exclude '.*'" in packages and "/repo/.receipts" in receipts
