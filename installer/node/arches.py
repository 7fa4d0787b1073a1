"""CPU architectures: the one table between the kernel's names and everyone else's.

The installer names an arch the way the kernel does (`uname -m`: `x86_64`, `aarch64`);
that name is in manifests, index.json, cache refs and messages. Debian, Kubernetes
(`kubernetes.io/arch`), OCI platforms and Go say `amd64`/`arm64`; glibc's multiarch
directories say `<arch>-linux-gnu`; NVIDIA's runfiles `NVIDIA-Linux-<arch>-<v>.run` use the
kernel's name. Every translation goes through this module, so a new arch is one row here.
"""

from __future__ import annotations

# kernel name -> Debian/Kubernetes name
_DEBIAN = {"x86_64": "amd64", "aarch64": "arm64"}
ARCHES = tuple(_DEBIAN)
DEBIAN_ARCHES = tuple(_DEBIAN.values())
# names some tools print for the same arch (`uname -m` on macOS/BSD says arm64)
_ALIASES = {**{debian: kernel for kernel, debian in _DEBIAN.items()}, "arm64": "aarch64"}


def canonical(name: str) -> str | None:
    """The kernel's name for `name` (`amd64` -> `x86_64`), or None for an arch we do not know."""
    name = name.strip()
    if name in _DEBIAN:
        return name
    return _ALIASES.get(name)


def debian(arch: str) -> str:
    """Debian's (and Kubernetes') name for a kernel arch name: `aarch64` -> `arm64`."""
    kernel = canonical(arch)
    if kernel is None:
        raise ValueError(f"unknown arch {arch!r}")
    return _DEBIAN[kernel]


def multiarch(arch: str) -> str:
    """glibc's multiarch triplet (`usr/lib/<triplet>`): `aarch64` -> `aarch64-linux-gnu`."""
    return f"{canonical(arch) or arch}-linux-gnu"
