"""The node agent's settings: persistence daemon, Fabric Manager, deadlines, the loop's pace,
its /metrics endpoint.

The rows live in the one table in `installer.config`; the parsers are here. Fabric Manager's
own config overrides come as NVIDIA names them (`NVFM_CONFIG_<FIELD>=value` in the
environment) and are checked against the staged config file when the agent starts.
"""

from __future__ import annotations

import ipaddress

from installer.config.readers import AGENT, DAEMONS, IMEX, SIGNALLING, VERIFYING
from installer.config.values import Invalid, boolean, choice, decimal, host_abs_path, ranged
from installer.config.webconfig import web_config_path

PERSISTENCE = ("on", "off")
UVM_PERSISTENCE = ("auto", "on", "off")
MIN_INTERVAL_S = 5.0  # no busy polling: the loop never wakes more often than this
MAX_INTERVAL_S = 10.0  # a daemon's exit withdraws readiness within 10 s
MAX_SECONDS = 86400.0
SECONDS = "a number of seconds above 0, at most 86400"
UVM_PERSISTENCE_MAJOR = 550  # `--uvm-persistence-mode` came with the R550 branch
# The kubelet's PodResources socket directory, as the DaemonSet mounts it into the agent.
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"


@ranged(MIN_INTERVAL_S, MAX_INTERVAL_S)
def interval(value: str) -> float:
    """Seconds between the agent's rounds: 5 to 10."""
    number = decimal(value)
    if not MIN_INTERVAL_S <= number <= MAX_INTERVAL_S:
        raise Invalid(value)
    return number


@ranged(0, MAX_SECONDS, low_open=True)
def deadline(value: str) -> float:
    """Seconds a wait may last: more than 0, at most a day."""
    number = decimal(value)
    if not 0 < number <= MAX_SECONDS:
        raise Invalid(value)
    return number


@ranged(0, MAX_SECONDS)
def wait(value: str) -> float:
    """Seconds a wait may last, 0 meaning none: at most a day."""
    number = decimal(value)
    if not 0 <= number <= MAX_SECONDS:
        raise Invalid(value)
    return number


def uvm_persistence(setting: str, driver_version: str) -> bool:
    """Whether to pass `--uvm-persistence-mode`: `auto` means the branch has it (R550+)."""
    if setting != "auto":
        return setting == "on"
    major = driver_version.partition(".")[0]
    return major.isdigit() and int(major) >= UVM_PERSISTENCE_MAJOR


METRICS_INTERVAL_S = (1.0, 60.0)  # one NVML pass per interval: never per scrape


@ranged(0, 65535, integer=True)
def metrics_port(value: str) -> int:
    """The /metrics port: 1-65535, or 0 for no metrics server at all."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise Invalid(value)
    return int(text)


def metrics_address(value: str) -> str:
    """An IP address to bind (0.0.0.0 every IPv4 interface, :: every IPv6 one)."""
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise Invalid(value) from None


@ranged(*METRICS_INTERVAL_S)
def metrics_interval(value: str) -> float:
    """Seconds between the metrics' collections: 1 to 60."""
    number = decimal(value)
    low, high = METRICS_INTERVAL_S
    if not low <= number <= high:
        raise Invalid(value)
    return number


METRICS_GPM_INTERVAL_S = (0.1, 10.0)  # nvml.h: GPM samples need more than 100 ms between


@ranged(0, 10)
def metrics_gpm_interval(value: str) -> float:
    """Seconds between a GPU's two GPM samples in each collection: 0 (GPM off) or 0.1-10."""
    number = decimal(value)
    low, high = METRICS_GPM_INTERVAL_S
    if number != 0 and not low <= number <= high:
        raise Invalid(value)
    return number


# the agent's /metrics: rows of config.SETTINGS
METRICS_ROWS = (
    ("metrics_port", "--metrics-port", "METRICS_PORT", "9420",
     "port of the agent's Prometheus /metrics and /healthz (0: no metrics server)",
     "an integer from 0 to 65535", metrics_port, AGENT),
    ("metrics_address", "--metrics-address", "METRICS_ADDRESS", "0.0.0.0",  # noqa: S104
     "address the metrics server binds (:: for IPv6)", "an IPv4 or IPv6 address",
     metrics_address, AGENT),
    ("metrics_interval", "--metrics-interval", "METRICS_INTERVAL", "5",
     "seconds between the metrics' collections (NVML, PodResources); a scrape only reads the "
     "latest", "a number of seconds from 1 to 60", metrics_interval, AGENT),
    ("metrics_dcgm_names", "--metrics-dcgm-names", "METRICS_DCGM_NAMES", "false",
     "also serve the GPUs' readings under dcgm-exporter's names, types, units and labels "
     "(DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, ..., and with GPM the DCGM_FI_PROF_* "
     "fields it measures), for dashboards and rules written for it", "true or false",
     boolean, AGENT, True),
    ("metrics_gpm_interval", "--metrics-gpm-interval", "METRICS_GPM_INTERVAL", "1",
     "seconds between the two GPM samples each collection takes of a Hopper or later GPU "
     "(SM activity, SM occupancy, tensor, DRAM and graphics engine activity over that "
     "interval; the "
     "collection takes this much longer, a scrape does not); 0: GPM off",
     "0, or a number of seconds from 0.1 to 10", metrics_gpm_interval, AGENT),
    ("metrics_web_config_file", "--metrics-web-config-file", "METRICS_WEB_CONFIG_FILE", "",
     "TLS and basic auth for /metrics: a Prometheus exporter-toolkit web config file "
     "(tls_server_config cert_file/key_file, basic_auth_users with bcrypt hashes), read when "
     "the agent starts serving; empty: plain HTTP, no authentication",
     "the path of a web config file, or empty", web_config_path, AGENT),
)


# The node agent's settings, as rows of `installer.config.Setting` (name, flag, env var,
# default, help, what is accepted, parser).
# the driver's daemons: who runs Fabric Manager on an NVSwitch/NVLink5 node, and IMEX
DAEMON_ROWS = (
    ("fabric_manager", "--fabric-manager", "FABRIC_MANAGER", "package",
     "who runs Fabric Manager (and NVLSM) on an NVSwitch or NVLink5 node: package (the agent, "
     "from the driver package; a package without them is refused) or host (the node's OS or "
     "hypervisor; the agent starts neither but still withholds readiness until the fabric "
     "completes)", "one of package, host", choice("package", "host"), DAEMONS),
    ("imex", "--imex", "IMEX", "report",
     "GB200/GB300's IMEX (memory export across an NVLink domain): report only shows its state "
     "(NVIDIA's DRA driver or the node's OS manage the service and the channels); host makes "
     "/dev/nvidia-caps-imex-channels/channel0 and has the agent run the package's nvidia-imex "
     "with the domain's IMEX_NODES_CONFIG; off ignores it",
     "one of report, host, off", choice("report", "host", "off"), IMEX),
    ("imex_nodes_config", "--imex-nodes-config", "IMEX_NODES_CONFIG",
     "/etc/nvidia-imex/nodes_config.cfg", "with IMEX=host: the IMEX domain's node list on the "
     "node (one IP address a line, the same on every node of the domain)",
     "an absolute path on the node without '..'", host_abs_path, IMEX),
)

ROWS = (
    ("persistence_mode", "--persistence-mode", "PERSISTENCE_MODE", "on",
     "the agent runs nvidia-persistenced --persistence-mode from the package",
     "one of on, off", choice(*PERSISTENCE), VERIFYING),
    ("uvm_persistence_mode", "--uvm-persistence-mode", "UVM_PERSISTENCE_MODE", "auto",
     "also --uvm-persistence-mode (auto: drivers R550 and later, which have it)",
     "one of auto, on, off", choice(*UVM_PERSISTENCE), VERIFYING),
    ("fabric_timeout", "--fabric-timeout", "FABRIC_TIMEOUT", "600",
     "seconds for every GPU's fabric (NVLink5: first mlx5_core, ib_umad) before an "
     "Event says why the node is not ready", SECONDS, deadline, AGENT),
    ("fabric_wait", "--fabric-wait", "FABRIC_WAIT", "0",
     "on a node with an NVLink fabric, seconds `install`/`signal` wait for every "
     "GPU's fabric to complete before publishing readiness themselves (0: never wait; "
     "the agent publishes it once the fabric completes); past it, exit 12",
     "a number of seconds from 0 to 86400", wait, SIGNALLING),
    ("agent_interval", "--agent-interval", "AGENT_INTERVAL", "5",
     "seconds between the agent's rounds (also woken by GPU events)",
     "a number of seconds from 5 to 10", interval, AGENT),
    ("daemon_stop_timeout", "--daemon-stop-timeout", "DAEMON_STOP_TIMEOUT", "10",
     "seconds a daemon has after SIGTERM before SIGKILL", SECONDS, deadline, DAEMONS),
)


@ranged(60, MAX_SECONDS)
def prepare_timeout(value: str) -> float:
    """Seconds one preparation of the next kernel may run: 60 (a download) to a day."""
    number = decimal(value)
    if not 60 <= number <= MAX_SECONDS:
        raise Invalid(value)
    return number


# the next kernel: rows of config.SETTINGS
NEXT_KERNEL_ROWS = (
    ("next_kernel_prepare", "--next-kernel-prepare", "NEXT_KERNEL_PREPARE", "on",
     "the agent watches for a kernel installed but not running, newer than the running one, "
     "and prepares its driver package in the host cache (`prepare`, at idle CPU and I/O "
     "priority, one at a time), saying the result in the node label "
     "gpu-node-installer/next-kernel; off: none of this", "one of on, off",
     choice("on", "off"), AGENT),
    ("next_kernel_prepare_timeout", "--next-kernel-prepare-timeout",
     "NEXT_KERNEL_PREPARE_TIMEOUT", "3600",
     "seconds one preparation of the next kernel may run (a download, or a build from the "
     "kernel's headers) before it is killed and said failed",
     "a number of seconds from 60 to 86400", prepare_timeout, AGENT),
)
