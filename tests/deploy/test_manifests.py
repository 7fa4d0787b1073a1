"""The kustomize overlays render, validate strictly against Kubernetes 1.28-1.33, and pass the
project's own checks that the schemas cannot make (mounts, selectors, env, images, RBAC)."""

from __future__ import annotations

import copy

import click
import kubernetes_validate
import pytest

from deploy.manifests import (
    INSTALLER_IMAGE,
    OVERLAYS,
    REPO,
    TARGETS,
    container_env,
    containers,
    host_paths,
    images,
    installer_env_vars,
    is_installer,
    mounts_by_volume,
    of_kind,
    one,
    pod_spec,
    render,
    workloads,
)
from installer import __version__
from installer.cli import cli
from installer.config import SETTINGS

KUBERNETES_VERSIONS = ("1.28.0", "1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")


def _daemonset(overlay: str) -> dict:
    return one(render(f"overlays/{overlay}"), "DaemonSet", "gpu-node-installer")


def _agent_container(overlay: str) -> dict:
    (agent,) = pod_spec(_daemonset(overlay))["containers"]
    return agent


def _installer_container(overlay: str) -> dict:
    spec = pod_spec(_daemonset(overlay))
    (installer,) = [c for c in spec["initContainers"] if c["name"] == "installer"]
    return installer


class TestSchemas:
    """Every rendered object is valid for every supported Kubernetes version, strictly
    (an unknown or misspelt field fails, as `kubectl apply --validate=strict` would)."""

    @pytest.mark.parametrize("target", TARGETS)
    @pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
    def test_strictly_valid(self, target: str, version: str) -> None:
        docs = render(target)
        assert docs, f"{target} renders nothing"
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)

    def test_strict_validation_catches_a_misspelt_field(self) -> None:
        """Guards the guard: strict mode rejects what a lenient one would let through."""
        broken = copy.deepcopy(_daemonset("gke-cos"))
        broken["spec"]["template"]["spec"]["hostPid"] = True
        with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("target", TARGETS)
class TestReferences:
    """What the API server would accept but the pod could not run with."""

    def test_every_volume_mount_names_a_defined_volume(self, target: str) -> None:
        for workload in workloads(render(target)):
            spec = pod_spec(workload)
            defined = {v["name"] for v in spec.get("volumes", [])}
            for container in containers(spec):
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in defined, (
                        f"{target}: {container['name']} mounts undefined volume {mount['name']}")

    def test_every_volume_is_mounted(self, target: str) -> None:
        """No host path is exposed that no container uses."""
        for workload in workloads(render(target)):
            spec = pod_spec(workload)
            used = {m["name"] for c in containers(spec) for m in c.get("volumeMounts", [])}
            unused = {v["name"] for v in spec.get("volumes", [])} - used
            assert not unused, f"{target}: volumes never mounted: {sorted(unused)}"

    def test_selector_matches_template_labels(self, target: str) -> None:
        for workload in workloads(render(target)):
            if workload["kind"] == "Pod":
                continue
            selector = workload["spec"]["selector"]["matchLabels"]
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert selector, f"{target}: empty selector"
            assert selector.items() <= labels.items(), (
                f"{target}: selector {selector} does not match template labels {labels}")

    def test_config_maps_and_service_accounts_exist(self, target: str) -> None:
        docs = render(target)
        config_maps = {(d["metadata"].get("namespace"), d["metadata"]["name"])
                       for d in of_kind(docs, "ConfigMap")}
        accounts = {(d["metadata"].get("namespace"), d["metadata"]["name"])
                    for d in of_kind(docs, "ServiceAccount")}
        for workload in workloads(docs):
            if not is_installer_workload(workload):
                continue
            namespace = workload["metadata"].get("namespace")
            spec = pod_spec(workload)
            for container in containers(spec):
                for source in container.get("envFrom", []):
                    assert (namespace, source["configMapRef"]["name"]) in config_maps
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    assert (namespace, volume["configMap"]["name"]) in config_maps
            if "serviceAccountName" in spec:
                assert (namespace, spec["serviceAccountName"]) in accounts

    def test_bindings_name_the_rendered_service_account(self, target: str) -> None:
        docs = render(target)
        accounts = {(d["metadata"].get("namespace"), d["metadata"]["name"])
                    for d in of_kind(docs, "ServiceAccount")}
        roles = {d["metadata"]["name"] for d in of_kind(docs, "ClusterRole")}
        for binding in of_kind(docs, "ClusterRoleBinding"):
            assert binding["roleRef"]["name"] in roles
            for subject in binding["subjects"]:
                assert (subject["namespace"], subject["name"]) in accounts, (
                    f"{target}: binding names {subject}, not a rendered ServiceAccount")


def is_installer_workload(workload: dict) -> bool:
    return any(is_installer(c) for c in containers(pod_spec(workload)))


@pytest.mark.parametrize("target", TARGETS)
class TestInstallerContract:
    """The manifests speak the installer's language: env vars, values, commands, images."""

    def test_every_env_var_is_one_the_installer_reads(self, target: str) -> None:
        known = installer_env_vars()
        docs = render(target)
        for workload in workloads(docs):
            for container in filter(is_installer, containers(pod_spec(workload))):
                unknown = set(container_env(container, docs)) - known
                assert not unknown, (
                    f"{target}: {container['name']} sets {sorted(unknown)}, which the "
                    "installer never reads (see installer/config.py SETTINGS)")

    def test_every_env_value_is_accepted(self, target: str) -> None:
        """Each value passes the setting's own parser: a typo fails here, not on a node."""
        by_env = {s.envvar: s for s in SETTINGS if s.envvar}
        docs = render(target)
        for workload in workloads(docs):
            for container in filter(is_installer, containers(pod_spec(workload))):
                for name, value in container_env(container, docs).items():
                    if value is None or name not in by_env:
                        continue
                    setting = by_env[name]
                    items = value.replace(",", " ").split() if setting.multiple else [value]
                    for item in items:
                        setting.parse(item)  # raises on a value the installer rejects

    def test_commands_and_flags_exist(self, target: str) -> None:
        """The subcommand each installer container runs, with its flags, is in the CLI."""
        missing = []
        for workload in workloads(render(target)):
            for container in filter(is_installer, containers(pod_spec(workload))):
                if "command" in container:  # not the entrypoint (none today)
                    continue
                name, *args = container["args"]
                command = cli.commands.get(name)
                if command is None:
                    missing.append(name)
                    continue
                accepted = {opt for p in command.params if isinstance(p, click.Option)
                            for opt in p.opts}
                flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
                assert flags <= accepted, f"{target}: `{name}` has no {sorted(flags - accepted)}"
        if missing:
            pytest.skip(f"`gpu-node-installer {' / '.join(sorted(set(missing)))}` is not in "
                        "the CLI yet (another issue); its flags are checked once it lands")

    def test_installer_image_is_this_version(self, target: str) -> None:
        ours = {i for i in images(render(target)) if i.startswith(INSTALLER_IMAGE + ":")}
        assert ours == {f"{INSTALLER_IMAGE}:{__version__}"}

    def test_no_latest_or_untagged_image(self, target: str) -> None:
        for image in images(render(target)):
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag, f"{target}: {image} has no tag"
            assert tag != "latest", f"{target}: {image} uses the moving `latest` tag"


def test_image_references_agree_across_overlays() -> None:
    """One installer image and tag everywhere (init, agent, examples, every overlay, the
    Makefile's default), so a release bump cannot miss one."""
    refs = {target: {i for i in images(render(target)) if i.startswith(INSTALLER_IMAGE)}
            for target in TARGETS}
    assert set().union(*refs.values()) == {f"{INSTALLER_IMAGE}:{__version__}"}, refs
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert f"IMAGE ?= {INSTALLER_IMAGE}:$(IMAGE_VERSION)" in makefile


@pytest.mark.parametrize("overlay", OVERLAYS)
class TestDaemonSet:
    """The properties a driver installer DaemonSet must have, in every overlay."""

    def test_pod_shape(self, overlay: str) -> None:
        daemonset = _daemonset(overlay)
        spec = pod_spec(daemonset)
        # a rollout evicts GPU pods only where the live-upgrade component asks for it
        expected = "RollingUpdate" if overlay == "live-upgrade" else "OnDelete"
        assert daemonset["spec"]["updateStrategy"]["type"] == expected
        assert spec["hostPID"] is True
        assert spec["priorityClassName"] == "system-node-critical"
        assert {"operator": "Exists"} in spec["tolerations"]
        assert [c["name"] for c in spec["initContainers"]] == ["installer"]
        assert [c["name"] for c in spec["containers"]] == ["agent"]
        assert _installer_container(overlay)["args"] == ["install"]
        assert _agent_container(overlay)["args"] == ["agent"]
        # the agent stops up to three daemons (DAEMON_STOP_TIMEOUT each) after one wait
        env = container_env(_agent_container(overlay), render(f"overlays/{overlay}"))
        stop_s = float(env.get("DAEMON_STOP_TIMEOUT") or 10)
        assert spec["terminationGracePeriodSeconds"] >= 3 * stop_s + 5 + 5

    def test_privileges_are_the_installer_and_the_agent_only(self, overlay: str) -> None:
        """Both need device access (modules and mknod; the daemons' device nodes and
        /dev/kmsg); nothing else in the pod is privileged, and the agent reads /dev only."""
        spec = pod_spec(_daemonset(overlay))
        assert _installer_container(overlay)["securityContext"] == {"privileged": True}
        agent = _agent_container(overlay)
        assert agent["securityContext"] == {"privileged": True}
        assert [c["name"] for c in containers(spec)] == ["installer", "agent"]
        dev = next(n for n, p in host_paths(spec).items() if p == "/dev")
        assert [m.get("readOnly") for m in agent["volumeMounts"] if m["name"] == dev] == [True]

    def test_agent_reads_the_installer_settings(self, overlay: str) -> None:
        """Same settings, same host mounts: the agent finds what the install wrote."""
        docs = render(f"overlays/{overlay}")
        installer, agent = _installer_container(overlay), _agent_container(overlay)
        assert container_env(agent, docs) == container_env(installer, docs)
        host_root = container_env(agent, docs)["HOST_ROOT"]
        assert mounts_by_volume(agent)["host-root"] == host_root
        assert not any(m.get("readOnly") for m in agent["volumeMounts"]
                       if m["name"] == "host-root")

    def test_every_container_reports_and_requests(self, overlay: str) -> None:
        for container in containers(pod_spec(_daemonset(overlay))):
            assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
            assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
            assert "memory" in container["resources"]["limits"]

    def test_host_mounts_match_the_settings(self, overlay: str) -> None:
        """HOST_ROOT is where the node's / is mounted, DEV_ROOT where its /dev is, and the
        install dir (NVIDIA_INSTALL_DIR_HOST) is reached through HOST_ROOT."""
        docs = render(f"overlays/{overlay}")
        spec = pod_spec(_daemonset(overlay))
        installer = _installer_container(overlay)
        env = container_env(installer, docs)
        paths = host_paths(spec)
        mounts = mounts_by_volume(installer)
        by_host_path = {paths[name]: path for name, path in mounts.items() if name in paths}
        assert by_host_path["/"] == env["HOST_ROOT"]
        assert by_host_path["/dev"] == env["DEV_ROOT"]
        assert "install-dir" not in paths  # the install dir is reached under HOST_ROOT
        assert env["NODE_NAME"] is None  # from the downward API
        params = env["NVIDIA_MODULE_PARAMS_FILE"]
        assert params is not None
        directory, _, filename = params.rpartition("/")
        assert mounts["module-params"] == directory
        config_map = next(v["configMap"]["name"] for v in spec["volumes"]
                          if v["name"] == "module-params")
        assert filename in one(docs, "ConfigMap", config_map)["data"]

    def test_installer_mounts_only_what_it_uses(self, overlay: str) -> None:
        """No /proc, /sys or /boot: hostPID and privilege already give the node's own."""
        paths = set(host_paths(pod_spec(_daemonset(overlay))).values())
        assert paths & {"/proc", "/sys", "/boot"} == set()
        assert {"/", "/dev"} <= paths

    def test_readiness_probe_asks_the_agent(self, overlay: str) -> None:
        """The probe checks the agent's own fresh view, not a file written once; often
        enough that a withdrawn readiness shows within the 10 s the agent takes."""
        agent = _agent_container(overlay)
        probe = agent["readinessProbe"]
        assert probe["exec"]["command"] == ["gpu-node-installer", "agent", "--probe"]
        assert probe["periodSeconds"] * probe.get("failureThreshold", 3) <= 10
        command = cli.commands["agent"]
        assert "--probe" in {o for p in command.params if isinstance(p, click.Option)
                             for o in p.opts}

    def test_critical_priority_is_admitted_in_its_namespace(self, overlay: str) -> None:
        """Outside kube-system (which GKE gives a quota for it), the overlay brings a
        ResourceQuota covering system-node-critical pods in the DaemonSet's namespace."""
        docs = render(f"overlays/{overlay}")
        namespace = _daemonset(overlay)["metadata"]["namespace"]
        quotas = [q for q in of_kind(docs, "ResourceQuota")
                  if q["metadata"]["namespace"] == namespace]
        if namespace == "kube-system":
            assert not quotas
            return
        (quota,) = quotas
        (expression,) = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert expression["scopeName"] == "PriorityClass"
        assert "system-node-critical" in expression["values"]
        assert int(quota["spec"]["hard"]["pods"]) >= 5000  # Kubernetes' largest cluster

    def test_rbac_is_node_get_patch_and_event_create_only(self, overlay: str) -> None:
        """The base stays minimal; only the live-upgrade component adds its own role."""
        roles = of_kind(render(f"overlays/{overlay}"), "ClusterRole")
        (role,) = [r for r in roles if r["metadata"]["name"] == "gpu-node-installer"]
        assert _granted(role) == {("", "nodes", "get"), ("", "nodes", "patch"),
                                  ("", "nodes/status", "patch"), ("", "events", "create"),
                                  ("events.k8s.io", "events", "create")}
        assert len(roles) == (2 if overlay == "live-upgrade" else 1)
        namespaced = of_kind(render(f"overlays/{overlay}"), "Role")  # the upgrade's Leases
        assert len(namespaced) == (1 if overlay == "live-upgrade" else 0)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_an_overlay_carries_the_app_labels(overlay: str) -> None:
    """`kubectl get -l app.kubernetes.io/part-of=gpu-node-installer` finds all of it."""
    for doc in render(f"overlays/{overlay}"):
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "gpu-node-installer" and \
            labels.get("app.kubernetes.io/part-of") == "gpu-node-installer", (
                f"{overlay}: {doc['kind']} {doc['metadata']['name']} lacks the app labels")


def _granted(role: dict) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}
