"""daemonset/examples/preflight: the CronJob that runs `preflight --nodes-from-api
--post-events` renders, validates strictly against Kubernetes 1.28-1.33, asks for exactly
the RBAC the command uses, speaks the CLI, and, run as written against the fake API server
and a test mirror, posts the Event of a kernel without a package."""

from __future__ import annotations

import json
from pathlib import Path

import click
import kubefake
import kubernetes_validate
import pytest
from click.testing import CliRunner
from httpserver import MirrorServer

from deploy.manifests import INSTALLER_IMAGE, containers, of_kind, one, pod_spec, render
from installer import __version__
from installer.cli import cli
from installer.config import SETTINGS
from installer.packages.repository import Candidate, Index, index_to_bytes, package_path

TARGET = "examples/preflight"
KUBERNETES_VERSIONS = ("1.28.0", "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
SERVED, NEW = "6.1.0-40-cloud-amd64", "6.1.0-41-cloud-amd64"


def _container() -> dict:
    (cronjob,) = of_kind(render(TARGET), "CronJob")
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = containers(spec)
    return container


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_strictly_valid(version: str) -> None:
    docs = render(TARGET)
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ClusterRole",
                                         "ClusterRoleBinding", "Role", "RoleBinding",
                                         "CronJob"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_it_runs_preflight_with_flags_and_settings_that_exist() -> None:
    container = _container()
    assert container["image"] == f"{INSTALLER_IMAGE}:{__version__}"  # one tag everywhere
    name, *args = container["args"]
    assert name == "preflight"
    command = cli.commands[name]  # type: ignore[attr-defined]
    accepted = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}
    assert {a.split("=", 1)[0] for a in args} <= accepted
    assert {"--nodes-from-api", "--post-events"} <= set(args)
    read = {s.envvar for s in SETTINGS if "preflight" in s.commands}
    assert {e["name"] for e in container["env"]} <= read


def test_rbac_is_nodes_list_and_events_create_in_default_for_its_account() -> None:
    docs = render(TARGET)
    (cronjob,) = of_kind(docs, "CronJob")
    account = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = cronjob["metadata"]["namespace"]
    assert one(docs, "ServiceAccount", account)["metadata"]["namespace"] == namespace
    cluster_role = one(docs, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                      "verbs": ["list"]}]
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "default"  # where node Events live
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"],
                              "verbs": ["create"]}]
    for kind, bound in (("ClusterRoleBinding", cluster_role), ("RoleBinding", role)):
        binding = one(docs, kind)
        assert binding["roleRef"]["name"] == bound["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                        "namespace": namespace}]


def test_pod_runs_unprivileged_with_a_writable_tmp() -> None:
    (cronjob,) = of_kind(render(TARGET), "CronJob")
    spec = pod_spec({"kind": "Job", **cronjob["spec"]["jobTemplate"]})
    assert spec["securityContext"]["runAsNonRoot"] is True
    container = _container()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}


def _node(name: str, kernel: str) -> dict:
    node = kubefake.node_doc(name, {"cloud.google.com/gke-nodepool": f"pool-{name}"})
    node["status"]["nodeInfo"] = {
        "machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": kernel,
        "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://2.0",
        "kubeletVersion": "v1.31.0", "kubeProxyVersion": "", "operatingSystem": "linux",
        "architecture": "amd64"}
    return node


def test_as_written_it_posts_an_event_for_the_kernel_without_a_package(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    index = Index((Candidate("535.261.03", SERVED, "x86_64", "proprietary",
                             package_path(SERVED, "535.261.03", "proprietary", "x86_64")),),
                  {"default": "535.261.03"})
    (repo / "index.json").write_bytes(index_to_bytes(index))
    account = tmp_path / "account"
    account.mkdir()
    (account / "token").write_text(kubefake.TOKEN)
    cluster = kubefake.Cluster(nodes={"old": _node("old", SERVED), "new": _node("new", NEW)})
    container = _container()
    with MirrorServer(repo) as mirror, kubefake.serve(cluster) as url:
        env = {e["name"]: e["value"] for e in container["env"]}
        env.update(DRIVER_MIRRORS=mirror.url, DRIVER_ALLOW_HTTP="true", KUBE_API_URL=url,
                   SERVICE_ACCOUNT_DIR=str(account), LOG_LEVEL="error",
                   TERMINATION_LOG=str(tmp_path / "termination-log"))
        result = CliRunner().invoke(cli, container["args"], env=env)
    assert result.exit_code == 14, result.output
    assert not cluster.errors, cluster.errors
    (event,) = cluster.events
    assert (event["involvedObject"]["name"], event["reason"]) == ("new",
                                                                  "DriverPackageMissing")
    report = json.loads(result.stdout)
    assert [r["state"] for r in report["rows"]] == ["ready", "missing"]
