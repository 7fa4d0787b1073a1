"""Throw-away signing keys and certificates made by the real openssl, and signature checks
with the real openssl and kmod's modinfo (shared by the host and real-kernel tiers)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from installer.packages.builder.modsig import TAIL_OVERHEAD, strip_signature


@dataclass(frozen=True)
class KeyPair:
    key: Path
    cert: Path
    subject: str


def make_key(directory: Path, name: str = "rsa", *, newkey: str = "rsa:2048",
             extra: tuple[str, ...] = (), encrypt: str | None = None) -> KeyPair:
    """`openssl req -x509 -newkey ...`: a code-signing certificate and its key."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    subject = f"/O=gpu-node-installer tests/CN={name} module signing key"
    protect = ["-passout", f"pass:{encrypt}"] if encrypt else ["-noenc"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", newkey, *extra, *protect,
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", subject,
                    "-addext", "extendedKeyUsage=codeSigning"],
                   check=True, capture_output=True)
    return KeyPair(key, cert, f"CN={name} module signing key,O=gpu-node-installer tests")


def openssl_verify(signed: Path, cert: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """`openssl cms -verify` of a signed module's DER against its unsigned part."""
    work.mkdir(parents=True, exist_ok=True)
    unsigned, tail = strip_signature(signed.read_bytes())
    (work / "unsigned.ko").write_bytes(unsigned)
    (work / "sig.der").write_bytes(tail[:-TAIL_OVERHEAD])
    return subprocess.run(["openssl", "cms", "-verify", "-binary", "-inform", "DER", "-in",
                           str(work / "sig.der"), "-content", str(work / "unsigned.ko"),
                           "-certfile", str(cert), "-noverify", "-out", "/dev/null"],
                          capture_output=True, text=True, check=False)


def modinfo(module: Path) -> dict[str, str]:
    """kmod's modinfo fields (first line of each) for a module file."""
    done = subprocess.run(["modinfo", str(module)], capture_output=True, text=True, check=True)
    fields: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if ":" in line and not line.startswith(("\t", " ")):
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def cert_field(cert: Path, *args: str) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", *args],
                          capture_output=True, text=True, check=True).stdout.strip()
