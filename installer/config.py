"""One validated, frozen `Config` built from CLI flags and environment variables (flag wins).

Every setting is declared once in `SETTINGS`: the CLI builds its options from it, the README's
configuration table lists it, and the deploy manifests are checked against its env vars.
Validation happens here, before any I/O on the host, and fails with one line naming the
setting, the value and what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from installer.errors import ConfigError

FLAVOURS = ("auto", "open", "proprietary")
LOG_FORMATS = ("auto", "json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error")
VERSION_ALIASES = ("default", "latest")
_VERSION_RE = re.compile(r"^(\d{3,4})(\.\d{1,3}){1,2}$")
_BRANCH_RE = re.compile(r"^\d{3,4}$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


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
    is_flag: bool = False
    multiple: bool = False


class _Invalid(ValueError):
    """Raised by a parser; the message is ignored in favour of the setting's `accepted`."""


def _abs_path(value: str) -> Path:
    if not value.startswith("/"):
        raise _Invalid(value)
    return Path(value)


def _host_abs_path(value: str) -> PurePosixPath:
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise _Invalid(value)
    return path


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise _Invalid(value)
        return lowered

    return parse


def parse_driver_version(value: str) -> str:
    """Accept `default`, `latest`, a branch (`535`) or an exact version (`535.261.03`)."""
    text = value.strip()
    if text.lower() in VERSION_ALIASES:
        return text.lower()
    if _BRANCH_RE.match(text) or _VERSION_RE.match(text):
        return text
    raise _Invalid(value)


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _Invalid(value)


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _Invalid(value) from None
    if not number > 0:
        raise _Invalid(value)
    return number


_NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _node_name(value: str) -> str:
    if not _NODE_NAME_RE.match(value):
        raise _Invalid(value)
    return value


def _url(value: str) -> str:
    text = value.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", text):
        raise _Invalid(value)
    return text


SETTINGS: tuple[Setting, ...] = (
    Setting("host_root", "--host-root", "HOST_ROOT", "/host",
            "where the node's / is mounted", "an absolute path to an existing directory",
            _abs_path),
    Setting("proc_root", "--proc-root", "PROC_ROOT", "/proc",
            "the node's /proc (the container shares the node's kernel)",
            "an absolute path to an existing directory", _abs_path),
    Setting("sys_root", "--sys-root", "SYS_ROOT", "/sys", "the node's /sys",
            "an absolute path to an existing directory", _abs_path),
    Setting("dev_root", "--dev-root", "DEV_ROOT", None,
            "the node's /dev (default: <host root>/dev)", "an absolute path", _abs_path),
    Setting("install_dir", "--install-dir", "NVIDIA_INSTALL_DIR_HOST",
            "/home/kubernetes/bin/nvidia",
            "install directory, as a path on the node",
            "an absolute path on the node without '..'", _host_abs_path),
    Setting("driver_version", "--driver-version", "NVIDIA_DRIVER_VERSION", "default",
            "driver to install", "'default', 'latest', a branch like '535' or an exact "
            "version like '535.261.03'", parse_driver_version),
    Setting("flavour", "--flavour", "NVIDIA_DRIVER_FLAVOUR", "auto",
            "kernel module flavour", "one of auto, open, proprietary", _choice(*FLAVOURS)),
    Setting("log_format", "--log-format", "LOG_FORMAT", "auto",
            "log format (auto: JSON unless stderr is a terminal)",
            "one of auto, json, console", _choice(*LOG_FORMATS)),
    Setting("log_level", "--log-level", "LOG_LEVEL", "info", "lowest level logged",
            "one of debug, info, warning, error", _choice(*LOG_LEVELS)),
    Setting("termination_log", "--termination-log", "TERMINATION_LOG",
            "/dev/termination-log", "where the failure message is also written",
            "an absolute path", _abs_path),
    Setting("lock_timeout", "--lock-timeout", "LOCK_TIMEOUT", "300",
            "seconds to wait for another run's lock", "a positive number of seconds",
            _positive_float),
    Setting("debug", "--debug", "DEBUG", "false",
            "show tracebacks of unexpected errors", "true or false", _bool, is_flag=True),
    Setting("node_name", "--node-name", "NODE_NAME", None,
            "this node's Kubernetes name (labels and an Event are posted only when set)",
            "a Kubernetes node name (lower-case letters, digits, '-' and '.')", _node_name),
    Setting("kube_api", "--kube-api", "KUBE_API_URL", None,
            "Kubernetes API server URL (default: https://$KUBERNETES_SERVICE_HOST:"
            "$KUBERNETES_SERVICE_PORT)", "an http:// or https:// URL", _url),
    Setting("service_account_dir", "--service-account-dir", "SERVICE_ACCOUNT_DIR",
            "/var/run/secrets/kubernetes.io/serviceaccount",
            "where this pod's service-account token, ca.crt and namespace are",
            "an absolute path", _abs_path),
    Setting("driver_root_layout", "--driver-root-layout", "DRIVER_ROOT_LAYOUT", "false",
            "also expose usr/lib/<arch>-linux-gnu and usr/bin in the install dir "
            "(gpu-operator driver-root layout)", "true or false", _bool, is_flag=True),
)

SETTINGS_BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclass(frozen=True)
class Config:
    """Every setting, validated; built once per process by `load_config`."""

    host_root: Path = Path("/host")
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/host/dev")
    install_dir: PurePosixPath = PurePosixPath("/home/kubernetes/bin/nvidia")
    driver_version: str = "default"
    flavour: str = "auto"
    log_format: str = "auto"
    log_level: str = "info"
    termination_log: Path = Path("/dev/termination-log")
    lock_timeout: float = 300.0
    debug: bool = False
    node_name: str | None = None
    kube_api: str | None = None
    service_account_dir: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount")
    driver_root_layout: bool = False


def _raw_value(setting: Setting, flags: Mapping[str, Any], environ: Mapping[str, str]
               ) -> tuple[str | None, str]:
    """The raw text for a setting and where it came from (flag wins over env, env over default)."""
    flag_value = flags.get(setting.name)
    if flag_value not in (None, False, ()):
        return (str(flag_value) if not isinstance(flag_value, bool) else "true"), setting.flag
    if setting.envvar and setting.envvar in environ:
        return environ[setting.envvar], setting.envvar
    return setting.default, f"default of {setting.flag}"


def load_config(flags: Mapping[str, Any], environ: Mapping[str, str]) -> Config:
    """Validate every setting and return the frozen Config, or raise ConfigError."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw, source = _raw_value(setting, flags, environ)
        if raw is None:
            continue
        try:
            values[setting.name] = setting.parse(raw)
        except _Invalid:
            raise ConfigError(
                f"{source}={raw!r} is invalid",
                remedy=f"{setting.flag.lstrip('-')} must be {setting.accepted}",
            ) from None
    values.setdefault("dev_root", values["host_root"] / "dev")
    config = Config(**values)
    _check_roots(config)
    return config


def _check_roots(config: Config) -> None:
    """The host mounts must exist before anything reads them."""
    for name in ("host_root", "proc_root", "sys_root"):
        path: Path = getattr(config, name)
        if not path.is_dir():
            setting = SETTINGS_BY_NAME[name]
            raise ConfigError(
                f"{setting.flag} {path} does not exist or is not a directory",
                remedy=f"mount the node's filesystem there or pass {setting.flag}",
            )

