"""The COS bucket and its server as the bucket's tests share them (tests/host/
test_cosbucket.py, test_cosbucket_served.py): one default bucket per module, served over
HTTPS, and a small bucket without the runfile per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from cosbucket import CosBucket, make_bucket
from cosserver import CosServer, object_hashes


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> CosBucket:
    """The default bucket, with the real-files runfile (cached across runs)."""
    return make_bucket(tmp_path_factory.mktemp("cos"))


@pytest.fixture(scope="module")
def server(bucket: CosBucket) -> Iterator[CosServer]:
    with CosServer(bucket.root) as running:
        yield running


@pytest.fixture
def small(tmp_path: Path) -> CosBucket:
    """A bucket without the runfile, for tests that change it."""
    return make_bucket(tmp_path, runfile=False)


def get(server: CosServer, path: str, **headers: str) -> requests.Response:
    return requests.get(server.url + path, headers=headers, timeout=30,
                        verify=str(server.ca_bundle) if server.ca_bundle else True)


def digests_of(data: bytes) -> dict[str, str]:
    crc, md5 = object_hashes(data)
    return {"crc32c": crc, "md5": md5}
