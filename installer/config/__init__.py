"""One validated, frozen `Config` built from CLI flags and environment variables (flag wins).

Every setting is declared once in `SETTINGS` (a subsystem's rows may live in its own module):
the CLI builds its options from it, docs/reference.md lists it, the manifests use its env vars.
Validation happens here, before any I/O on the host, and fails with one line naming the
setting, the value and what is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from installer.config import agent, checks, health, mig, raw, readers, taint, upgrade, values
from installer.config.modparams import ModuleParam as ModuleParam
from installer.config.modparams import parse_module_param as parse_module_param
from installer.config.modparams import read_params_file
from installer.config.values import VERSION_ALIASES as VERSION_ALIASES
from installer.config.values import Invalid as _Invalid
from installer.config.values import parse_driver_version as parse_driver_version
from installer.config.values import pem_bundle
from installer.errors import ConfigError

FLAVOURS = ("auto", "open", "proprietary")
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Setting:
    """One configurable value: its flag, its environment variable and how to parse it."""

    name: str
    flag: str
    envvar: str | None
    default: str | None
    help: str
    accepted: str
    parse: Callable[[str], Any]
    commands: frozenset[str]  # the commands that read it: the only ones whose help shows it
    is_flag: bool = False
    multiple: bool = False


# Files read when the config loads, so a wrong one fails before anything is written or
# downloaded; kept out of the parsers, which stay pure functions of their text.
_FILE_CHECKS: dict[str, Callable[[Path], object]] = {
    "ca_bundle": pem_bundle, "module_params_file": read_params_file}


SETTINGS: tuple[Setting, ...] = (
    Setting("host_root", "--host-root", "HOST_ROOT", "/host",
            "where the node's / is mounted", "an absolute path to an existing directory",
            values.abs_path, readers.NODE),
    Setting("proc_root", "--proc-root", "PROC_ROOT", "/proc",
            "the node's /proc (the container shares the node's kernel)",
            "an absolute path to an existing directory", values.abs_path, readers.NODE),
    Setting("sys_root", "--sys-root", "SYS_ROOT", "/sys", "the node's /sys",
            "an absolute path to an existing directory", values.abs_path, readers.NODE),
    Setting("dev_root", "--dev-root", "DEV_ROOT", None,
            "the node's /dev (default: <host root>/dev)", "an absolute path", values.abs_path,
            readers.NODE),
    Setting("install_dir", "--install-dir", "NVIDIA_INSTALL_DIR_HOST",
            "/home/kubernetes/bin/nvidia",
            "install directory, as a path on the node",
            "an absolute path on the node without '..'", values.host_abs_path, readers.INSTALL_DIR),
    Setting("driver_version", "--driver-version", "NVIDIA_DRIVER_VERSION", "default",
            "driver to install", "'default', 'latest', a branch like '535' or an exact "
            "version like '535.261.03'", values.parse_driver_version, readers.RESOLVING),
    Setting("flavour", "--flavour", "NVIDIA_DRIVER_FLAVOUR", "auto",
            "kernel module flavour", "one of auto, open, proprietary", values.choice(*FLAVOURS),
            readers.RESOLVING),
    *(Setting(*row) for row in upgrade.MAP_ROWS),  # per-pool versions: config/upgrade.py
    Setting("log_format", "--log-format", "LOG_FORMAT", "auto",
            "log format (auto: JSON unless stderr is a terminal)",
            "one of auto, json, console", values.choice(*LOG_FORMATS), readers.LOGS),
    Setting("log_level", "--log-level", "LOG_LEVEL", "info", "lowest level logged",
            "one of debug, info, warning, error", values.choice(*LOG_LEVELS), readers.LOGS),
    Setting("termination_log", "--termination-log", "TERMINATION_LOG",
            "/dev/termination-log", "where the failure message is also written",
            "an absolute path", values.abs_path, readers.NODE),
    Setting("lock_timeout", "--lock-timeout", "LOCK_TIMEOUT", "300",
            "seconds to wait for another run's lock", "a positive number of seconds",
            values.positive_float, readers.LOCKED),
    Setting("debug", "--debug", "DEBUG", "false",
            "show tracebacks of unexpected errors", "true or false", values.boolean,
            readers.LOGS, is_flag=True),
    # driver sources and downloads (fetch stage)
    Setting("mirrors", "--mirror", "DRIVER_MIRRORS", None,
            "driver repository base URL, tried in order (flag repeatable; env: "
            "comma-separated)", "https://, http:// (with --allow-http) or file:// URLs",
            values.mirror_url, readers.DOWNLOADING, multiple=True),
    Setting("preloaded_dir", "--preloaded-dir", "DRIVER_PRELOADED_DIR", None,
            "directory of packages baked into the image, tried first (never the network)",
            "an absolute path", values.abs_path, readers.FETCHING),
    Setting("cache_dir", "--cache-dir", "DRIVER_CACHE_DIR", None,
            "package cache, as a path on the node (default: <install dir>/.cache)",
            "an absolute path on the node without '..'", values.host_abs_path, readers.CACHE),
    Setting("cache_keep", "--cache-keep", "DRIVER_CACHE_KEEP", "2",
            "packages kept in the cache (older ones not in use are pruned)",
            "an integer from 1 to 100", values.int_range(1, 100),
            readers.FETCHING - {"prepare"}),  # prepare only adds to the cache
    Setting("ca_bundle", "--ca-bundle", "DRIVER_CA_BUNDLE", None,
            "CA certificates (PEM) to verify https:// mirrors with",
            "an absolute path to a readable PEM file with at least one certificate",
            values.abs_path, readers.DOWNLOADING),
    Setting("allow_http", "--allow-http", "DRIVER_ALLOW_HTTP", "false",
            "allow plain http:// mirrors (file hashes still checked; index and manifest are "
            "not protected in transit)", "true or false", values.boolean,
            readers.DOWNLOADING, is_flag=True),
    Setting("cos_source", "--cos-source", "COS_SOURCE", "auto",
            "on COS nodes, assemble the package from Google's signed COS GPU artifacts "
            "(auto) or never", "one of auto, never", values.choice("auto", "never"),
            readers.FETCHING),
    Setting("cos_tools_url", "--cos-tools-url", "COS_TOOLS_URL", None,
            "base URL of the cos-tools bucket or a mirror of its layout (default: "
            "storage.googleapis.com/cos-tools, the copy nearest --node-zone)",
            "an https:// URL (http:// with --allow-http)", values.api_url, readers.DOWNLOADING),
    Setting("nvidia_runfile_url", "--nvidia-runfile-url", "NVIDIA_RUNFILE_URL", None,
            "base URL of NVIDIA's runfile bucket for COS (default: storage.googleapis.com/"
            "nvidia-drivers-<us|eu|asia>-public by --node-zone)",
            "an https:// URL (http:// with --allow-http)", values.api_url, readers.DOWNLOADING),
    Setting("ubuntu_source", "--ubuntu-source", "UBUNTU_SOURCE", "never",
            "on Ubuntu nodes, assemble the package from Canonical's signed open modules for "
            "the running kernel and the matching user-mode packages of Ubuntu's archive "
            "(auto), or never", "one of auto, never", values.choice("auto", "never"),
            readers.FETCHING),
    Setting("ubuntu_apt_mirror", "--ubuntu-apt-mirror", "UBUNTU_APT_MIRROR", None,
            "the Ubuntu archive of --ubuntu-source (default: http://archive.ubuntu.com/"
            "ubuntu, arm64 http://ports.ubuntu.com/ubuntu-ports; its signed InRelease, not "
            "the transport, vouches for the files)", "an http://, https:// or file:// URL",
            values.mirror_url, readers.FETCHING),
    Setting("ubuntu_keyring", "--ubuntu-keyring", "UBUNTU_KEYRING", None,
            "the keyring that signs the Ubuntu archive's InRelease, checked by gpgv "
            "(default: /usr/share/keyrings/ubuntu-archive-keyring.gpg)",
            "an absolute path", values.abs_path, readers.FETCHING),
    Setting("node_zone", "--node-zone", "NODE_ZONE", None,
            "this node's cloud zone, e.g. us-central1-a: picks the nearest copy of the COS "
            "and NVIDIA buckets", "a zone name like us-central1-a", values.zone,
            readers.DOWNLOADING),
    Setting("connect_timeout", "--connect-timeout", "DOWNLOAD_CONNECT_TIMEOUT", "10",
            "seconds to wait for a mirror connection", "a positive number of seconds",
            values.positive_float, readers.DOWNLOADING),
    Setting("read_timeout", "--read-timeout", "DOWNLOAD_READ_TIMEOUT", "30",
            "seconds per window in which a mirror must send 64 KiB, else the request is "
            "retried",
            "a positive number of seconds", values.positive_float, readers.DOWNLOADING),
    Setting("download_deadline", "--download-deadline", "DOWNLOAD_DEADLINE", "1800",
            "total seconds allowed for all downloads of one run, retries included",
            "a positive number of seconds", values.positive_float, readers.DOWNLOADING),
    Setting("download_retries", "--download-retries", "DOWNLOAD_RETRIES", "6",
            "attempts per file and mirror (connection errors, timeouts, 429, 5xx)",
            "an integer from 1 to 100", values.int_range(1, 100), readers.DOWNLOADING),
    Setting("download_parallel", "--download-parallel", "DOWNLOAD_PARALLEL", "4",
            "files downloaded at once", "an integer from 1 to 32", values.int_range(1, 32),
            readers.DOWNLOADING),
    Setting("node_name", "--node-name", "NODE_NAME", None,
            "this node's Kubernetes name (labels and an Event are posted only when set)",
            "a Kubernetes node name (lower-case letters, digits, '-' and '.')", values.node_name,
            readers.KUBE),
    Setting("kube_api", "--kube-api", "KUBE_API_URL", None,
            "Kubernetes API server URL (default: https://$KUBERNETES_SERVICE_HOST:"
            "$KUBERNETES_SERVICE_PORT)", "an http:// or https:// URL", values.api_url,
            readers.KUBE_API),
    Setting("kube_api_proxy", "--kube-api-proxy", "KUBE_API_PROXY", None, "HTTP proxy to the "
            "API server (not HTTPS_PROXY)", "http://[user:password@]host:port", values.proxy_url,
            readers.KUBE_API),
    Setting("service_account_dir", "--service-account-dir", "SERVICE_ACCOUNT_DIR",
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "where this pod's service-account token, ca.crt and namespace are",
            "an absolute path", values.abs_path, readers.KUBE_API),
    Setting("gpu_label_prefix", "--gpu-label-prefix", "GPU_LABEL_PREFIX", "gpu-node-installer",
            "prefix of the GPU labels named as gpu-feature-discovery names them (gpu.product, "
            "gpu.count, ...); nvidia.com for clusters without gpu-feature-discovery",
            "one of gpu-node-installer, nvidia.com",
            values.choice("gpu-node-installer", "nvidia.com"), readers.LABELS),
    Setting("driver_root_layout", "--driver-root-layout", "DRIVER_ROOT_LAYOUT", "false",
            "also expose usr/lib/<arch>-linux-gnu and usr/bin in the install dir "
            "(gpu-operator driver-root layout)", "true or false", values.boolean,
            readers.STAGING, is_flag=True),
    # kernel modules (load stage)
    Setting("module_params", "--module-param", "NVIDIA_MODULE_PARAMS", None,
            "kernel module parameter, overriding the package default (flag repeatable; "
            "env: separated by spaces or commas)",
            "module.key=value naming a module of the package, e.g. nvidia.NVreg_EnableMSI=0 "
            "(value: printable ASCII without spaces or quotes)",
            parse_module_param, readers.LOADING, multiple=True),
    Setting("module_params_file", "--module-params-file", "NVIDIA_MODULE_PARAMS_FILE", None,
            "file of module.key=value lines ('#' starts a comment), applied before "
            "--module-param", "an absolute path to a file of module.key=value lines",
            values.abs_path, readers.LOADING),
    Setting("force_load", "--force-load", "FORCE_MODULE_LOAD", "false",
            "load even when preflight predicts a refusal (signature enforcement, GPU bound "
            "to nouveau/vfio-pci, package built for another kernel)", "true or false",
            values.boolean, readers.LOADING, is_flag=True),
    Setting("rdma", "--rdma", "RDMA", "auto",
            "nvidia-peermem (GPUDirect RDMA): auto loads it when the node has an RDMA stack "
            "(ib_core loaded, an RDMA device or NIC), on whenever the package ships it, off "
            "never; loaded only when its symbol versions match the loaded ib_core (else rebuilt "
            "under BUILD_FALLBACK=auto); never fails the install (gpu-node-installer/RDMAReady)",
            "one of auto, on, off", values.choice("auto", "on", "off"), readers.LOADING),
    # on-node build when no package exists for the kernel (fetch stage)
    Setting("build_fallback", "--build-fallback", "BUILD_FALLBACK", "never",
            "when no package exists for the running kernel: build one on the node from a "
            "source package and its headers (auto; nvidia-peermem too, rdma.md) or fail (never)",
            "one of auto, never", values.choice("auto", "never"), readers.FETCHING),
    Setting("build_sign_key", "--build-sign-key", "BUILD_SIGN_KEY", None,
            "private key (PEM) that signs modules built on the node", "an absolute path",
            values.abs_path, readers.FETCHING),
    Setting("build_sign_cert", "--build-sign-cert", "BUILD_SIGN_CERT", None,
            "certificate (PEM or DER) of --build-sign-key, enrolled in the node's keyring",
            "an absolute path", values.abs_path, readers.FETCHING),
    # driver upgrades on a live node (parsers in config/upgrade.py)
    Setting("upgrade_policy", "--upgrade-policy", "UPGRADE_POLICY", "refuse",
            "when another driver version is loaded and in use: refuse (exit 10), evict the "
            "pods holding the GPUs, or drain every non-DaemonSet pod (needs --node-name)",
            "one of refuse, evict, drain", values.choice(*upgrade.POLICIES),
            readers.UPGRADE | {"agent"}),
    Setting("upgrade_timeout", "--upgrade-timeout", "UPGRADE_TIMEOUT", "900",
            "seconds allowed to free the GPUs (evictions refused by a PodDisruptionBudget "
            "are retried until then)", "a number of seconds above 0, at most 86400",
            upgrade.timeout, readers.UPGRADE),
    Setting("upgrade_grace_period", "--upgrade-grace-period", "UPGRADE_GRACE_PERIOD", "pod",
            "grace period given to evicted pods", "whole seconds from 0 to 86400, or 'pod' "
            "(each pod's terminationGracePeriodSeconds)", upgrade.grace_period, readers.UPGRADE),
    Setting("upgrade_restart_daemonsets", "--upgrade-restart-daemonsets",
            "UPGRADE_RESTART_DAEMONSETS", "false",
            "delete DaemonSet pods that hold the GPUs (device plugin, exporters) during an "
            "upgrade; otherwise they block it", "true or false", values.boolean,
            readers.UPGRADE, is_flag=True),
    Setting("upgrade_force", "--upgrade-force", "UPGRADE_FORCE", "false",
            "evict pods that no controller recreates (bare pods, pods whose DaemonSet is "
            "gone) when the upgrade must move them, as kubectl drain --force; otherwise they "
            "block it", "true or false", values.boolean, readers.UPGRADE, is_flag=True),
    Setting("upgrade_delete_emptydir_data", "--upgrade-delete-emptydir-data",
            "UPGRADE_DELETE_EMPTYDIR_DATA", "false",
            "evict pods with emptyDir volumes (their data is lost) when the upgrade must "
            "move them, as kubectl drain --delete-emptydir-data; otherwise they block it",
            "true or false", values.boolean, readers.UPGRADE, is_flag=True),
    Setting("upgrade_pause_operator", "--upgrade-pause-operator", "UPGRADE_PAUSE_OPERATOR",
            "false", "beside gpu-operator: pause its GPU DaemonSets on this node during an "
            "upgrade (each nvidia.com/gpu.deploy.* label that is true becomes "
            "paused-for-driver-upgrade until the new driver is verified)", "true or false",
            values.boolean, readers.UPGRADE, is_flag=True),
    Setting("upgrade_max_unavailable", "--upgrade-max-unavailable",
            "UPGRADE_MAX_UNAVAILABLE", "1",
            "nodes that may be unavailable at once: the rollout overlay's maxUnavailable; "
            "this node waits while that many other nodes of the installer's are cordoned, "
            "NotReady or mid-upgrade, for any reason",
            "a whole number >= 1 or a percentage from 1% to 100%", upgrade.max_unavailable,
            readers.UPGRADE),
    *(Setting(*row) for row in upgrade.JOB_ROWS),  # wait for Jobs: config/upgrade.py
    *(Setting(*row) for row in agent.DAEMON_ROWS),  # who runs Fabric Manager, IMEX
    *(Setting(*row) for row in agent.ROWS),  # the node agent: config/agent.py
    *(Setting(*row) for row in agent.NEXT_KERNEL_ROWS),  # the next kernel's driver
    Setting("cdi", "--cdi", "CDI", "on", "write a CDI spec (kind nvidia.com/gpu) for the staged "
            "driver, read by containerd 2.x, CRI-O and Podman without NVIDIA's toolkit; off "
            "removes ours", "one of on, off", values.choice("on", "off"), readers.CDI),
    Setting("cdi_spec_dir", "--cdi-spec-dir", "CDI_SPEC_DIR", "/var/run/cdi", "where the CDI "
            "spec goes on the node (/etc/cdi persists)", "an absolute path on the node without "
            "'..'", values.host_abs_path, readers.CDI),
    *(Setting(*row) for row in mig.ROWS),  # MIG partitioning: config/mig.py
    *(Setting(*row) for row in agent.METRICS_ROWS),  # the agent's /metrics
    # GPU health in the node agent (parser in config/health.py)
    Setting("xid_critical", "--xid-critical", "XID_CRITICAL", health.DEFAULT,
            "Xids that set the node condition gpu-node-installer/XidCriticalError and post "
            "an XIDError Event (48 always; default: GKE's set)",
            "Xid numbers separated by commas or spaces, none of NVIDIA's application errors "
            "13, 31, 43, 45, 68, 109", health.xid_list, readers.AGENT),
    # the agent's metrics: per-container GPUs from the kubelet
    Setting("pod_resources_dir", "--pod-resources-dir", "POD_RESOURCES_DIR",
            agent.POD_RESOURCES_DIR, "the container's read-only mount of the host's kubelet "
            "pod-resources directory (its kubelet.sock labels GPU metrics per container)",
            "an absolute path", values.abs_path, readers.AGENT),
    *(Setting(*row) for row in taint.ROWS),  # the agent's startup taint: config/taint.py
)

SETTINGS_BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclass(frozen=True)
class Config(mig.MigSettings):
    """Every setting, validated; built once per process by `load_config`."""

    host_root: Path = Path("/host")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/host/dev")
    install_dir: PurePosixPath = PurePosixPath("/home/kubernetes/bin/nvidia")
    driver_version: str = "default"
    flavour: str = "auto"
    driver_version_map: Path | None = None
    log_format: str = "auto"
    log_level: str = "info"
    termination_log: Path = Path("/dev/termination-log")
    lock_timeout: float = 300.0
    debug: bool = False
    mirrors: tuple[str, ...] = ()
    preloaded_dir: Path | None = None
    cache_dir: PurePosixPath | None = None
    cache_keep: int = 2
    ca_bundle: Path | None = None
    allow_http: bool = False
    cos_source: str = "auto"
    cos_tools_url: str | None = None
    nvidia_runfile_url: str | None = None
    ubuntu_source: str = "never"
    ubuntu_apt_mirror: str | None = None
    ubuntu_keyring: Path | None = None
    node_zone: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    download_deadline: float = 1800.0
    download_retries: int = 6
    download_parallel: int = 4
    node_name: str | None = None
    kube_api: str | None = None
    kube_api_proxy: str | None = None
    service_account_dir: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount")
    gpu_label_prefix: str = "gpu-node-installer"
    driver_root_layout: bool = False
    module_params: tuple[ModuleParam, ...] = ()
    module_params_file: Path | None = None
    force_load: bool = False
    build_fallback: str = "never"
    build_sign_key: Path | None = None
    build_sign_cert: Path | None = None
    upgrade_policy: str = "refuse"
    upgrade_timeout: float = 900.0
    upgrade_grace_period: int | None = None
    upgrade_restart_daemonsets: bool = False
    upgrade_force: bool = False
    upgrade_delete_emptydir_data: bool = False
    upgrade_pause_operator: bool = False
    upgrade_max_unavailable: str = "1"
    upgrade_wait_for_jobs: tuple[upgrade.Term, ...] = ()
    upgrade_wait_for_jobs_timeout: float = 0.0
    fabric_manager: str = "package"
    imex: str = "report"
    imex_nodes_config: PurePosixPath = PurePosixPath("/etc/nvidia-imex/nodes_config.cfg")
    persistence_mode: str = "on"
    uvm_persistence_mode: str = "auto"
    fabric_timeout: float = 600.0
    fabric_wait: float = 0.0
    agent_interval: float = 5.0
    daemon_stop_timeout: float = 10.0
    next_kernel_prepare: str = "on"
    next_kernel_prepare_timeout: float = 3600.0
    metrics_port: int = 9420
    metrics_address: str = "0.0.0.0"  # noqa: S104 - Prometheus scrapes the pod IP
    metrics_interval: float = 5.0
    metrics_dcgm_names: bool = False
    metrics_gpm_interval: float = 1.0
    metrics_web_config_file: str = ""  # a path, read by the agent (config.webconfig.load)
    xid_critical: tuple[int, ...] = health.GKE_CRITICAL
    cdi: str = "on"
    rdma: str = "auto"
    cdi_spec_dir: PurePosixPath = PurePosixPath("/var/run/cdi")
    pod_resources_dir: Path = Path(agent.POD_RESOURCES_DIR)
    startup_taint: taint.Taint | None = taint.DEFAULT_TAINT
    startup_taint_restore: bool = False


def load_config(flags: Mapping[str, Any], environ: Mapping[str, str]) -> Config:
    """Validate every setting and return the frozen Config, or raise ConfigError."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.multiple:
            values[setting.name] = raw.parse_many(setting, flags, environ)
            continue
        text, source = raw.raw_value(setting, flags, environ)
        if text is None:
            continue
        try:
            values[setting.name] = setting.parse(text)
            if setting.name in _FILE_CHECKS:
                _FILE_CHECKS[setting.name](values[setting.name])
        except _Invalid as exc:
            raise raw.refusal(setting, source, text, exc) from None
    values.setdefault("dev_root", values["host_root"] / "dev")
    config = Config(**values)
    checks.roots(config, SETTINGS_BY_NAME)
    checks.mirrors(config)
    upgrade.check(config)
    if (config.build_sign_key is None) != (config.build_sign_cert is None):
        raise ConfigError("--build-sign-key and --build-sign-cert go together",
                          remedy="set both BUILD_SIGN_KEY and BUILD_SIGN_CERT, or neither")
    return config
