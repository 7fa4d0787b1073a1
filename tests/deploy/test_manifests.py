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


class TestOverlays:
    """What each overlay is for."""

    def test_live_upgrade_rolls_out_one_bounded_step_at_a_time(self) -> None:
        from installer.config.upgrade import max_unavailable

        docs = render("overlays/live-upgrade")
        strategy = _daemonset("live-upgrade")["spec"]["updateStrategy"]
        assert strategy["type"] == "RollingUpdate"
        env = container_env(_installer_container("live-upgrade"), docs)
        assert env["UPGRADE_POLICY"] in ("evict", "drain")
        # the installer's own guard and the controller's bound agree, and both are valid
        assert max_unavailable(str(strategy["rollingUpdate"]["maxUnavailable"])) \
            == env["UPGRADE_MAX_UNAVAILABLE"]
        assert _daemonset("gke-cos")["spec"]["updateStrategy"] == {"type": "OnDelete"}

    def test_live_upgrade_deletes_gpu_daemonset_pods_and_pauses_the_operators(self) -> None:
        """GKE's device plugin holds the driver on every GKE GPU node: its pod must be
        deleted (its replacement waits at the device-file gate); beside gpu-operator, the
        operator's DaemonSets are paused through their labels instead."""
        env = container_env(_installer_container("live-upgrade"),
                            render("overlays/live-upgrade"))
        assert env["UPGRADE_RESTART_DAEMONSETS"] == "true"
        assert env.get("UPGRADE_PAUSE_OPERATOR", "false") == "false"  # no operator on GKE
        operator = container_env(_installer_container("operator-compatible"),
                                 render("overlays/operator-compatible"))
        assert operator["UPGRADE_PAUSE_OPERATOR"] == "true"

    def test_live_upgrade_rbac_is_what_the_flow_calls(self) -> None:
        docs = render("overlays/live-upgrade")
        (role,) = [r for r in of_kind(docs, "ClusterRole")
                   if r["metadata"]["name"] == "gpu-node-installer-upgrade"]
        assert _granted(role) == {("", "pods", "get"), ("", "pods", "list"),
                                  ("", "pods", "delete"), ("", "pods/eviction", "create"),
                                  ("", "nodes", "list"), ("apps", "daemonsets", "get")}
        (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding")
                      if b["roleRef"]["name"] == "gpu-node-installer-upgrade"]
        account = one(docs, "ServiceAccount", "gpu-node-installer")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-node-installer",
                                        "namespace": account["metadata"]["namespace"]}]
        (slots,) = [r for r in of_kind(docs, "Role")
                    if r["metadata"]["name"] == "gpu-node-installer-upgrade-slots"]
        assert _granted(slots) == {("coordination.k8s.io", "leases", "get"),
                                   ("coordination.k8s.io", "leases", "create"),
                                   ("coordination.k8s.io", "leases", "update")}
        assert slots["metadata"]["namespace"] == account["metadata"]["namespace"]
        (bound,) = [b for b in of_kind(docs, "RoleBinding")
                    if b["roleRef"]["name"] == "gpu-node-installer-upgrade-slots"]
        assert bound["subjects"] == binding["subjects"]

    def test_gke_cos_mounts_root_where_gke_does(self) -> None:
        docs = render("overlays/gke-cos")
        installer = _installer_container("gke-cos")
        env = container_env(installer, docs)
        assert env["HOST_ROOT"] == "/root"
        assert env["NVIDIA_INSTALL_DIR_HOST"] == "/home/kubernetes/bin/nvidia"
        assert {d["metadata"].get("namespace") for d in docs
                if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")} == {"kube-system"}
        assert not of_kind(docs, "Namespace")

    def test_gke_cos_runs_only_where_gke_does_not_install_the_driver(self) -> None:
        spec = pod_spec(_daemonset("gke-cos"))
        terms = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        arch = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]}
        # not where GKE's own confidential DaemonSet goes (nvidia-driver-installer/cos/
        # daemonset-confidential.yaml at 992db812 selects on this label)
        confidential = {"key": "cloud.google.com/gke-confidential-nodes-instance-type",
                        "operator": "DoesNotExist"}
        assert terms == [{"matchExpressions": [
            {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"},
            {"key": "cloud.google.com/gke-gpu-driver-version", "operator": "DoesNotExist"},
            confidential, arch,
        ]}, {"matchExpressions": [
            {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"},
            {"key": "cloud.google.com/gke-gpu-driver-version", "operator": "In",
             "values": ["disabled"]},
            confidential, arch,
        ]}]
        assert spec["tolerations"] == [{"operator": "Exists"}]

    def test_ubuntu_installs_under_opt(self) -> None:
        env = container_env(_installer_container("ubuntu"), render("overlays/ubuntu"))
        assert env["NVIDIA_INSTALL_DIR_HOST"] == "/opt/nvidia"
        assert env["HOST_ROOT"] == "/host"

    def test_operator_compatible_writes_the_operator_contract(self) -> None:
        docs = render("overlays/operator-compatible")
        spec = pod_spec(_daemonset("operator-compatible"))
        installer = _installer_container("operator-compatible")
        env = container_env(installer, docs)
        assert env["DRIVER_ROOT_LAYOUT"] == "true"
        paths = host_paths(spec)
        mounts = mounts_by_volume(installer)
        run_nvidia = next(n for n, p in paths.items() if p == "/run/nvidia")
        assert mounts[run_nvidia] == f"{env['HOST_ROOT']}/run/nvidia"
        # the agent withdraws and restores the env file on the same mount
        assert mounts_by_volume(_agent_container("operator-compatible"))[run_nvidia] == \
            f"{env['HOST_ROOT']}/run/nvidia"


class TestExamples:
    """The device plugin waits for the driver; the GPU pod asks for a GPU the right way."""

    def test_device_plugin_waits_for_the_installer(self) -> None:
        plugin = one(render("examples"), "DaemonSet", "nvidia-gpu-device-plugin")
        spec = pod_spec(plugin)
        (wait,) = spec["initContainers"]
        assert is_installer(wait) and wait["args"][0] == "wait-ready"
        env = container_env(wait, render("examples"))
        install_dir = env["NVIDIA_INSTALL_DIR_HOST"]
        nvidia = host_paths(spec)["nvidia"]
        assert nvidia == install_dir
        assert mounts_by_volume(wait)["nvidia"] == f"{env['HOST_ROOT']}{install_dir}"
        plugin_mounts = mounts_by_volume(spec["containers"][0])
        assert plugin_mounts["nvidia"] == "/usr/local/nvidia"

    def test_gpu_pod_requests_a_gpu_in_limits_on_a_gpu_type(self) -> None:
        pod = one(render("examples"), "Pod")
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "cloud.google.com/gke-accelerator" in pod["spec"]["nodeSelector"]
