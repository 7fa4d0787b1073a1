"""METRICS_WEB_CONFIG_FILE: TLS and basic auth for the agent's /metrics, in the Prometheus
exporter-toolkit's web configuration format, so one file serves every exporter on a node
(node_exporter's and dcgm-exporter's `--web-config-file` take the same).

Provenance: prometheus/exporter-toolkit `docs/web-configuration.md` at
0089e786c388f128bd417609a8ba66c20b35176e: `tls_server_config` (`cert_file`, `key_file`,
`client_auth_type`, `client_ca_file`, `min_version`, `max_version`) and `basic_auth_users`
(user name -> bcrypt hash). The toolkit reads the file strictly (an unknown key is an
error); so do we, and a key of the format this agent does not implement (inline `cert`,
`cipher_suites`, `http_server_config`, `rate_limit`, ...) is refused by name rather than
silently ignored, since each one changes who may connect or how. The file is the agent
container's (a mounted Secret), read once when the agent starts serving: the setting holds
only its path, so the install container, which shares the settings but not the Secret,
never reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.config.values import Invalid, visible
from installer.errors import ConfigError

if TYPE_CHECKING:  # ssl and yaml load only where a file is named (every CLI run imports this)
    import ssl

TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version"}
CLIENT_AUTH = {"NoClientCert": False, "RequireAndVerifyClientCert": True}
VERSIONS = ("TLS12", "TLS13")  # the toolkit's names, in order
BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class WebConfig:
    """What the file asks: TLS (cert_file set) and/or basic auth (users set)."""

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None  # with require_client_cert
    require_client_cert: bool = False
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    users: dict[str, bytes] = field(default_factory=dict)  # name -> bcrypt hash

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None for plain HTTP; ssl.SSLError / OSError when a
        file does not hold what it should."""
        import ssl

        if self.cert_file is None or self.key_file is None:
            return None
        versions = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = versions[self.min_version]
        context.maximum_version = versions[self.max_version]
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.require_client_cert and self.client_ca_file is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.client_ca_file)
        return context


def web_config_path(value: str) -> str:
    """The setting: a path ("" : none), read later by `load` (the agent only)."""
    return visible(value).strip()


def load(path: str) -> WebConfig | None:
    """The agent's web config (None: plain HTTP, no auth); ConfigError, one line naming the
    setting and the cause, when the file does not hold a config this agent implements."""
    try:
        return web_config_file(path)
    except Invalid as exc:
        raise ConfigError(f"METRICS_WEB_CONFIG_FILE={path!r} is invalid: {exc.reason}",
                          remedy="correct the web config file (docs/metrics.md, 'TLS and "
                                 "basic auth') or unset METRICS_WEB_CONFIG_FILE") from None


def web_config_file(value: str) -> WebConfig | None:
    """The parsed file ("" : none, plain HTTP without auth); Invalid naming what is wrong."""
    import ssl

    import yaml  # type: ignore[import-untyped]

    text = value.strip()
    if not text:
        return None
    path = Path(text)
    try:
        raw = path.read_bytes()[:MAX_BYTES + 1]
    except OSError as exc:
        raise Invalid(value, f"it cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise Invalid(value, "it is over 1 MiB")
    try:
        document = yaml.safe_load(raw.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise Invalid(value, f"it is not YAML: {str(exc).splitlines()[0]}") from None
    config = _parse(value, document, path.parent)
    try:
        config.ssl_context()
    except (ssl.SSLError, OSError) as exc:
        raise Invalid(value, f"its certificate, key or client CA does not load: {exc}") from None
    return config


def _parse(value: str, document: Any, base: Path) -> WebConfig:
    if not isinstance(document, dict):
        raise Invalid(value, "it is not a YAML mapping")
    unknown = sorted(set(map(str, document)) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise Invalid(value, f"it sets {', '.join(unknown)}, which this agent does not "
                             "implement (it serves tls_server_config and basic_auth_users)")
    tls = _mapping(value, document.get("tls_server_config"), "tls_server_config")
    extra = sorted(set(map(str, tls)) - TLS_KEYS)
    if extra:
        raise Invalid(value, f"tls_server_config sets {', '.join(extra)}, which this agent "
                             f"does not implement (only {', '.join(sorted(TLS_KEYS))})")
    cert, key = _file(value, tls, "cert_file", base), _file(value, tls, "key_file", base)
    if tls and (cert is None or key is None):
        raise Invalid(value, "tls_server_config needs both cert_file and key_file")
    auth = str(tls.get("client_auth_type", "NoClientCert"))
    if auth not in CLIENT_AUTH:
        raise Invalid(value, f"client_auth_type {auth!r} is not implemented "
                             f"(one of {', '.join(CLIENT_AUTH)})")
    ca = _file(value, tls, "client_ca_file", base)
    if CLIENT_AUTH[auth] and ca is None:
        raise Invalid(value, "client_auth_type RequireAndVerifyClientCert needs client_ca_file")
    low, high = (_version(value, tls, k, d) for k, d in (("min_version", "TLS12"),
                                                         ("max_version", "TLS13")))
    if VERSIONS.index(low) > VERSIONS.index(high):
        raise Invalid(value, "min_version is above max_version")
    return WebConfig(cert_file=cert, key_file=key, client_ca_file=ca,
                     require_client_cert=CLIENT_AUTH[auth], min_version=low, max_version=high,
                     users=_users(value, document.get("basic_auth_users")))


def _mapping(value: str, found: Any, name: str) -> dict[Any, Any]:
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise Invalid(value, f"{name} is not a mapping")
    return found


def _file(value: str, tls: dict[Any, Any], key: str, base: Path) -> Path | None:
    """A file named in the config: relative to the config file's folder, as the toolkit."""
    name = tls.get(key)
    if name in (None, ""):
        return None
    if not isinstance(name, str):
        raise Invalid(value, f"{key} is not a file name")
    path = base / name
    if not path.is_file():
        raise Invalid(value, f"its {key} {str(path)!r} is not a readable file")
    return path


def _version(value: str, tls: dict[Any, Any], key: str, default: str) -> str:
    name = str(tls.get(key, default))
    if name not in VERSIONS:
        raise Invalid(value, f"{key} {name!r} is not one of {', '.join(VERSIONS)}")
    return name


def _users(value: str, found: Any) -> dict[str, bytes]:
    users = _mapping(value, found, "basic_auth_users")
    result: dict[str, bytes] = {}
    for name, hashed in users.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise Invalid(value, f"basic_auth_users has the user name {name!r} (a non-empty "
                                 "string without ':')")
        if not isinstance(hashed, str) or not hashed.startswith(BCRYPT_PREFIXES):
            raise Invalid(value, f"user {name!r}'s password is not a bcrypt hash ($2a$, $2b$ "
                                 "or $2y$; htpasswd -nBC 10 \"\" | tr -d ':\\n' makes one)")
        result[name] = hashed.encode()
    return result
