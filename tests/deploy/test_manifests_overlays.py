"""What each overlay is for, and the examples that wait for the installer."""

from __future__ import annotations

from deploy.manifests import (
    container_env,
    host_paths,
    is_installer,
    mounts_by_volume,
    of_kind,
    one,
    pod_spec,
    render,
)
from deploy.test_manifests import _agent_container, _daemonset, _granted, _installer_container


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
