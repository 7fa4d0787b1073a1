"""A manifest's optional `provenance`: what `package build` compiled the modules from.

`{"nvidia_source": {name, version, sha256}, "kernel_headers": [{name, version, sha256}],
"compiler": text, "patches": [{name, sha256}]}`, and `"build_root": {distro, suite,
compiler}` when make ran in a root of the kernel's distro; sha256 may be empty (a directory
given as headers). Validated as strictly as the rest of the manifest (docs/manifest.schema.json).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_PROVENANCE_KEYS = {"nvidia_source", "kernel_headers", "compiler", "patches"}
_INPUT_KEYS = {"name", "version", "sha256"}
_PATCH_KEYS = {"name", "sha256"}
_BUILD_ROOT_KEYS = {"distro", "suite", "compiler"}
_TEXT_MAX = 256
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ProvenanceError(ValueError):
    """Where in the provenance, and what is wrong there."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where, self.problem = where, problem


def _keys(obj: Any, required: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ProvenanceError(where, "must be a JSON object")
    missing, unknown = sorted(required - obj.keys()), sorted(obj.keys() - required)
    if missing:
        raise ProvenanceError(where, f"missing {', '.join(missing)}")
    if unknown:
        raise ProvenanceError(where, f"unknown field {', '.join(unknown)}")
    return obj


def _text(value: Any, where: str, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > _TEXT_MAX or (not empty and not value) or (
            any(ord(c) < 32 or ord(c) == 127 for c in value)):
        raise ProvenanceError(where, f"must be printable text of at most {_TEXT_MAX} characters")
    return value


def _digest_or_empty(value: Any, where: str) -> str:
    if value != "" and not (isinstance(value, str) and _SHA256_RE.match(value)):
        raise ProvenanceError(where, "must be a sha256 (64 lowercase hex digits) or empty")
    return str(value)


def _parse_input(obj: Any, where: str, keys: set[str]) -> dict[str, str]:
    obj = _keys(obj, keys, where)
    out = {"name": _text(obj["name"], f"{where}.name", empty=False),
           "sha256": _digest_or_empty(obj["sha256"], f"{where}.sha256")}
    if "version" in keys:
        out["version"] = _text(obj["version"], f"{where}.version")
    return out


def parse_provenance(value: Any) -> dict[str, Any]:
    """What compiled modules came from: NVIDIA's sources, the headers, compiler, patches."""
    optional = {"build_root", "optional_sources"} & (value.keys() if isinstance(value, dict)
                                                      else set())
    obj = _keys(value, _PROVENANCE_KEYS | optional, "provenance")
    for key in ("kernel_headers", "patches"):
        if not isinstance(obj[key], list) or len(obj[key]) > 64:
            raise ProvenanceError(f"provenance.{key}", "must be a list of at most 64 entries")
    out: dict[str, Any] = {
        "nvidia_source": _parse_input(obj["nvidia_source"], "provenance.nvidia_source",
                                      _INPUT_KEYS),
        "kernel_headers": [_parse_input(item, f"provenance.kernel_headers[{i}]", _INPUT_KEYS)
                           for i, item in enumerate(obj["kernel_headers"])],
        "compiler": _text(obj["compiler"], "provenance.compiler"),
        "patches": [_parse_input(item, f"provenance.patches[{i}]", _PATCH_KEYS)
                    for i, item in enumerate(obj["patches"])],
    }
    if "optional_sources" in optional:  # gdrdrv's and nvidia-fs's sources (optional modules)
        sources = obj["optional_sources"]
        if not isinstance(sources, list) or len(sources) > 8:
            raise ProvenanceError("provenance.optional_sources",
                                  "must be a list of at most 8 entries")
        out["optional_sources"] = [_parse_input(item, f"provenance.optional_sources[{i}]",
                                                _INPUT_KEYS) for i, item in enumerate(sources)]
    if "build_root" in optional:
        root = _keys(obj["build_root"], _BUILD_ROOT_KEYS, "provenance.build_root")
        out["build_root"] = {key: _text(root[key], f"provenance.build_root.{key}")
                             for key in sorted(_BUILD_ROOT_KEYS)}
    return out


def provenance_of(obj: dict[str, Any], fail: Callable[[str, str], Exception]
                  ) -> dict[str, Any] | None:
    """A manifest's optional `provenance`, validated; `fail(where, problem)` makes the error
    (the manifest's own, so the line names the manifest and its source)."""
    try:
        return parse_provenance(obj["provenance"]) if "provenance" in obj else None
    except ProvenanceError as exc:
        raise fail(exc.where, exc.problem) from None
