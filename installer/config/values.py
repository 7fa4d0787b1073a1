"""What a setting's text may hold: visible characters, ASCII numbers, URLs that parse one way.

A value reaches host files (ld.so.conf.d, the termination log), log lines, URLs and the
kernel. So a value is refused (exit 2 by the caller) unless it is what it looks like: no
control, format or line-separator character, numbers in ASCII digits that Python and a
person read alike ('²', '١٢', '1_000', 'nan', '1e999' are not numbers here), and URLs whose
host and port every client parses the same way. Only the standard library's light modules are
imported: this runs at CLI start for every command.
"""

from __future__ import annotations

import binascii
import ipaddress  # already loaded by pathlib (urllib.parse)
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

# Cc: C0, DEL and C1 controls; Cf: format (bidi overrides, zero-width); Cs: lone surrogates
# (non-UTF-8 bytes in the environment); Zl, Zp: line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_DECIMAL = re.compile(r"[0-9]{1,9}(?:\.[0-9]{0,9})?|\.[0-9]{1,9}")
_INTEGER = re.compile(r"[0-9]{1,9}")
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252}[A-Za-z0-9_])?\.?")
_PORT = re.compile(r"[0-9]{0,5}")
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----([A-Za-z0-9+/=\s]+)-----END CERTIFICATE-----")
PEM_LIMIT = 16 << 20  # a full CA store is about 250 KiB


class Invalid(ValueError):
    """Raised by a parser; `reason`, when given, is added to the setting's `accepted` text."""

    def __init__(self, value: str, reason: str | None = None) -> None:
        super().__init__(value)
        self.reason = reason


def visible(value: str) -> str:
    """`value` itself, or Invalid when it holds a character that is not what it looks like."""
    if value.isascii() and value.isprintable():
        return value
    hidden = next((c for c in value if unicodedata.category(c) in _HIDDEN), None)
    if hidden is not None:
        raise Invalid(value, f"it holds the control character U+{ord(hidden):04X}")
    return value


def decimal(value: str) -> float:
    """A number of ASCII digits with an optional fraction: `300`, `0.5`, `.5`, `2.`."""
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        raise Invalid(value, "numbers are plain decimals (digits with an optional '.' "
                             "fraction, like 30 or 0.5): no exponent, sign, '_', inf or nan")
    return float(text)


def integer(value: str) -> int:
    """ASCII digits only (at most nine: `int()` would take '١٢', '1_0' and 5000 digits)."""
    text = value.strip()
    if not _INTEGER.fullmatch(text):
        raise Invalid(value)
    return int(text)


def check_authority(url: str, authority: str) -> None:
    """`[user@]host[:port]`: a DNS name, IPv4 or bracketed IPv6 host and a port 1-65535."""
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        inside, bracket, port = hostport[1:].partition("]")
        if not bracket or not _ipv6(inside) or (port and not port.startswith(":")):
            raise Invalid(url, f"{hostport!r} is not a bracketed IPv6 address and port")
        host, port = inside, port[1:]
    else:
        host, _, port = hostport.partition(":")
        if not _HOSTNAME.fullmatch(host):
            raise Invalid(url, f"{host!r} is not a host name or address")
    if not _PORT.fullmatch(port) or (port and not 0 < int(port) < 65536):
        raise Invalid(url, f"port {port!r} is not a number from 1 to 65535")


def _ipv6(text: str) -> bool:
    address = text.partition("%")[0]  # a zone index (fe80::1%eth0) is the client's business
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


def network_url(value: str, schemes: tuple[str, ...]) -> str:
    """`scheme://authority[/rest]` with a scheme in `schemes`, a valid authority, no spaces."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in schemes:
        raise Invalid(value)
    if any(c.isspace() for c in value):
        raise Invalid(value, "it holds a space")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if not authority:
        raise Invalid(value, "it has no host")
    check_authority(value, authority)
    return value


def pem_bundle(path: Path) -> Path:
    """A readable file of PEM certificates, at least one whose body decodes to DER.

    Cheap on purpose (no ssl import at CLI start): catches the usual mistakes (a directory,
    a DER file, a key, an empty or truncated file) before a download fails on them.
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(PEM_LIMIT + 1)
    except IsADirectoryError:
        raise Invalid(str(path), "it is a directory") from None
    except OSError as exc:
        raise Invalid(str(path), f"it cannot be read ({exc.strerror})") from None
    if len(data) > PEM_LIMIT:
        raise Invalid(str(path), f"it is larger than {PEM_LIMIT >> 20} MiB")
    if not any(_der(match.group(1)) for match in _PEM.finditer(data)):
        raise Invalid(str(path), "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    return path


def _der(body: bytes) -> bool:
    try:
        der = binascii.a2b_base64(b"".join(body.split()), strict_mode=True)
    except (binascii.Error, ValueError):
        return False
    return len(der) > 64 and der[0] == 0x30  # an X.509 certificate is an ASN.1 SEQUENCE


def shown_url(raw: str) -> str:
    """A URL as a message may show it: no user, password, query or fragment (tokens live
    there). Plain string work, so a malformed URL is shown as safely as a good one."""
    scheme, sep, rest = raw.partition("://")
    cut = re.split(r"[?#]", rest if sep else raw, maxsplit=1)[0]
    if not sep:
        return cut
    authority, slash, path = cut.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


VERSION_ALIASES = ("default", "latest")
_VERSION_RE = re.compile(r"^(\d{3,4})(\.\d{1,3}){1,2}$", re.ASCII)
_BRANCH_RE = re.compile(r"^\d{3,4}$", re.ASCII)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def abs_path(value: str) -> Path:
    if not visible(value).startswith("/"):
        raise Invalid(value)
    return Path(value)


def host_abs_path(value: str) -> PurePosixPath:
    path = PurePosixPath(visible(value))
    if not path.is_absolute() or ".." in path.parts:
        raise Invalid(value)
    return path


@dataclass(frozen=True)
class Bounds:
    """The range a numeric parser accepts, for the CLI's help and completion (the parser
    alone validates)."""

    low: float | None
    high: float | None
    integer: bool = False
    low_open: bool = False


# What the CLI may show of a parser: its fixed values or its range (never used to validate).
CHOICES: dict[Callable[[str], Any], tuple[str, ...]] = {}
RANGES: dict[Callable[[str], Any], Bounds] = {}
P = TypeVar("P", bound=Callable[[str], Any])


def ranged(low: float | None, high: float | None, *, integer: bool = False,
           low_open: bool = False) -> Callable[[P], P]:
    """Note the range a parser accepts, so the CLI can type its option."""
    def mark(parse: P) -> P:
        RANGES[parse] = Bounds(low, high, integer, low_open)
        return parse

    return mark


def choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise Invalid(value)
        return lowered

    CHOICES[parse] = choices
    return parse


def parse_driver_version(value: str) -> str:
    """Accept `default`, `latest`, a branch (`535`) or an exact version (`535.261.03`)."""
    text = value.strip()
    if text.lower() in VERSION_ALIASES:
        return text.lower()
    if _BRANCH_RE.fullmatch(text) or _VERSION_RE.fullmatch(text):
        return text
    raise Invalid(value)


def boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise Invalid(value)


@ranged(0, None, low_open=True)
def positive_float(value: str) -> float:
    number = decimal(value)
    if not number > 0:
        raise Invalid(value)
    return number


_NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def node_name(value: str) -> str:
    if not _NODE_NAME_RE.fullmatch(value):
        raise Invalid(value)
    return value


def api_url(value: str) -> str:
    text = visible(value).strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", text):
        raise Invalid(value)
    return network_url(text, ("http", "https"))


def proxy_url(value: str) -> str:
    """An HTTP proxy: http://[user:password@]host[:port], nothing after the authority."""
    text = api_url(value)
    scheme, _, rest = text.partition("://")
    if scheme.lower() != "http":
        raise Invalid(value, "a proxy is reached over http:// (https to the API server "
                             "goes through it with CONNECT)")
    if re.search(r"[/?#]", rest):
        raise Invalid(value, "a proxy URL has no path, query or fragment")
    return text


def int_range(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        number = integer(value)
        if not low <= number <= high:
            raise Invalid(value)
        return number

    RANGES[parse] = Bounds(low, high, integer=True)
    return parse


def mirror_url(value: str) -> str:
    """A repository base URL; the trailing slash is dropped so paths join predictably."""
    text = visible(value).strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("https", "http", "file") or not rest:
        raise Invalid(value)
    if scheme.lower() == "file":
        if not rest.startswith("/"):
            raise Invalid(value, "a file:// mirror needs an absolute path, as in "
                                 "file:///srv/repo (no host, no relative path)")
        if any(c.isspace() for c in rest):
            raise Invalid(value)
    else:
        network_url(text, ("http", "https"))
    return f"{scheme.lower()}://{rest}"


_ZONE_RE = re.compile(r"^[a-z]+(-[a-z0-9]+){1,3}$", re.ASCII)


def zone(value: str) -> str:
    """A cloud zone name (`us-central1-a`): only its region prefix picks a bucket copy."""
    text = value.strip()
    if not _ZONE_RE.fullmatch(text) or len(text) > 63:
        raise Invalid(value)
    return text
