"""A manifest's optional `provenance` (compiled modules): the parser and the schema agree."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.packages.manifest import (
    ManifestError,
    dump_manifest,
    manifest_from_dict,
    parse_manifest,
)
from tests.unit.test_package import valid
from tests.unit.test_schemas import MANIFEST

SHA = "d" * 64
PROVENANCE = {
    "nvidia_source": {"name": "nvidia-kernel-source", "version": "535.261.03-1", "sha256": SHA},
    "kernel_headers": [{"name": "linux-headers-6.1.0-57-amd64", "version": "6.1.192-3",
                        "sha256": SHA},
                       {"name": "linux-headers-6.1.0-57-amd64", "version": "6.1.0-57-amd64",
                        "sha256": ""}],
    "compiler": "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
    "patches": [{"name": "fix.patch", "sha256": SHA}],
}


def with_provenance(path: str = "", value: Any = None) -> dict[str, Any]:
    doc = valid()
    doc["provenance"] = copy.deepcopy(PROVENANCE)
    if path:
        *parents, last = path.split(".")
        node: Any = doc["provenance"]
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return doc


def test_valid_provenance_round_trips_and_old_manifests_stay_valid() -> None:
    doc = with_provenance()
    MANIFEST.validate(doc)
    manifest = manifest_from_dict(doc)
    assert manifest.provenance == PROVENANCE
    assert parse_manifest(dump_manifest(manifest)) == manifest
    old = manifest_from_dict(valid())  # no provenance: as before, and dumped without it
    assert old.provenance is None and b"provenance" not in dump_manifest(old)


@pytest.mark.parametrize(("path", "value"), [
    ("nvidia_source.sha256", "X" * 64), ("nvidia_source.name", ""),
    ("nvidia_source.name", "a\nb"), ("compiler", "gcc\n"), ("nvidia_source.version", "\n"),
    ("compiler", 12), ("compiler", "x" * 300),
    ("patches.0.sha256", "abc"), ("kernel_headers", {}), ("patches", [1]),
    ("kernel_headers.0.extra", "x"),
])
def test_both_refuse(path: str, value: Any) -> None:
    doc = with_provenance(path, value)
    assert not MANIFEST.is_valid(doc)
    with pytest.raises(ManifestError, match="provenance"):
        manifest_from_dict(doc)


def test_null_provenance_is_refused() -> None:
    doc = valid()
    doc["provenance"] = None
    assert not MANIFEST.is_valid(doc)
    with pytest.raises(ManifestError):
        manifest_from_dict(doc)


@given(st.sampled_from(["nvidia_source.name", "nvidia_source.version", "nvidia_source.sha256",
                        "kernel_headers.0.version", "compiler", "patches.0.name",
                        "patches.0.sha256", "patches", "kernel_headers"]),
       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                 st.just(SHA), st.lists(st.text(max_size=4), max_size=2)))
@settings(max_examples=300, deadline=None)
def test_parser_accepts_only_schema_valid_provenance(path: str, value: Any) -> None:
    doc = with_provenance(path, value)
    try:
        manifest_from_dict(doc)
    except ManifestError:
        assert not MANIFEST.is_valid(doc)
        return
    MANIFEST.validate(doc)


BUILD_ROOT = {"distro": "debian", "suite": "trixie", "compiler": "gcc-14 14.2.0-19"}


def test_build_root_round_trips() -> None:
    doc = with_provenance("build_root", dict(BUILD_ROOT))
    MANIFEST.validate(doc)
    manifest = manifest_from_dict(doc)
    assert manifest.provenance is not None and manifest.provenance["build_root"] == BUILD_ROOT
    assert parse_manifest(dump_manifest(manifest)) == manifest


@pytest.mark.parametrize("value", [
    None, "trixie", {"distro": "debian", "suite": "trixie"},
    {**BUILD_ROOT, "path": "/srv/roots/trixie"}, {**BUILD_ROOT, "suite": 14},
    {**BUILD_ROOT, "compiler": "gcc\n14"},
])
def test_both_refuse_a_bad_build_root(value: Any) -> None:
    doc = with_provenance("build_root", value)
    assert not MANIFEST.is_valid(doc)
    with pytest.raises(ManifestError, match="provenance"):
        manifest_from_dict(doc)
