"""The COS bucket (tests/cosbucket.py) as tests/cosserver.py serves it: `x-goog-hash` and
the stored length over the whole object's bytes (checked with google-crc32c/hashlib), and
the faults the server can be told to lie with."""

from __future__ import annotations

import hashlib
import shutil
import struct
from collections.abc import Iterator

import cosbucket_fixtures
import pytest
import requests
from cosbucket import CosBucket, tarball_name
from cosbucket_fixtures import digests_of, get
from cosserver import CosServer, object_hashes, parse_x_goog_hash
from httpserver import Fault

# The fixtures: the default bucket and its server (once per module), a small bucket (per test).
bucket = cosbucket_fixtures.bucket
server = cosbucket_fixtures.server
small = cosbucket_fixtures.small



class TestServedHashes:
    """x-goog-hash and x-goog-stored-content-length describe the whole object's bytes."""

    def test_full_get(self, server: CosServer, bucket: CosBucket) -> None:
        answer = get(server, bucket.tarball_path)
        assert answer.status_code == 200
        assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(answer.content)
        assert answer.headers["x-goog-hash"] == (
            "crc32c={crc32c},md5={md5}".format(**digests_of(answer.content)))
        assert answer.headers["x-goog-stored-content-length"] == str(len(answer.content))
        assert answer.content == bucket.tarball.read_bytes()

    def test_range_get_carries_the_whole_objects_hash(self, server: CosServer,
                                                      bucket: CosBucket) -> None:
        whole = bucket.tarball.read_bytes()
        part = get(server, bucket.tarball_path, Range="bytes=100-199")
        assert part.status_code == 206 and part.content == whole[100:200]
        assert parse_x_goog_hash(part.headers["x-goog-hash"]) == digests_of(whole)
        assert part.headers["x-goog-stored-content-length"] == str(len(whole))

    def test_version_file_and_runfile(self, server: CosServer, bucket: CosBucket) -> None:
        answer = get(server, bucket.path("gpu_default_version"))
        assert answer.text == "535.261.03\n"
        assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(b"535.261.03\n")
        assert bucket.runfile is not None
        head = requests.head(server.url + bucket.runfile_path, verify=str(server.ca_bundle),
                             timeout=30)
        assert head.status_code == 200
        crc, md5 = object_hashes(bucket.runfile)
        assert parse_x_goog_hash(head.headers["x-goog-hash"]) == {"crc32c": crc, "md5": md5}
        assert head.headers["x-goog-stored-content-length"] == str(
            bucket.runfile.stat().st_size)
        assert server.runfile_url + bucket.runfile_path.removeprefix(
            "/nvidia-drivers-us-public") == server.url + bucket.runfile_path
        assert server.cos_tools_url == server.url + "/cos-tools"

    def test_tls_needs_the_ca_bundle(self, server: CosServer, bucket: CosBucket) -> None:
        assert server.url.startswith("https://127.0.0.1:") and server.ca_bundle
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(server.url + bucket.path("gpu_default_version"), timeout=30)

    def test_plain_http(self, small: CosBucket) -> None:
        with CosServer(small.root, tls=False) as plain:
            assert plain.url.startswith("http://127.0.0.1:") and plain.ca_bundle is None
            answer = get(plain, small.tarball_path)
            assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(
                answer.content)

    def test_split_header_lines(self, small: CosBucket) -> None:
        with CosServer(small.root, tls=False, split_hash=True) as split:
            answer = get(split, small.tarball_path)
            raw = answer.raw.headers.getlist("x-goog-hash")
            assert [v.split("=")[0] for v in raw] == ["crc32c", "md5"]
            assert parse_x_goog_hash(answer.headers["x-goog-hash"]) == digests_of(
                answer.content)

    def test_requests_are_recorded(self, server: CosServer, bucket: CosBucket) -> None:
        get(server, bucket.path("gpu_latest_version"))
        (seen,) = server.requests_for(bucket.path("gpu_latest_version"))[-1:]
        assert seen.status == 200
        assert seen in server.requests


class TestFaults:
    """Each lie does what it says; the body stays the object's."""

    @pytest.fixture
    def live(self, small: CosBucket) -> Iterator[CosServer]:
        with CosServer(small.root) as running:
            yield running

    def test_wrong_crc32c(self, live: CosServer, small: CosBucket) -> None:
        live.lie(small.tarball_path, crc32c=True)
        answer = get(live, small.tarball_path)
        told, truth = parse_x_goog_hash(answer.headers["x-goog-hash"]), digests_of(
            answer.content)
        assert answer.content == small.tarball.read_bytes()
        assert told["crc32c"] != truth["crc32c"] and told["md5"] == truth["md5"]
        assert len(told["crc32c"]) == len(truth["crc32c"])  # still 4 bytes, just wrong
        again = get(live, small.tarball_path, Range="bytes=0-0")  # every response lies
        assert parse_x_goog_hash(again.headers["x-goog-hash"]) == told

    def test_wrong_md5(self, live: CosServer, small: CosBucket) -> None:
        live.lie(small.tarball_path, md5=True)
        answer = get(live, small.tarball_path)
        told, truth = parse_x_goog_hash(answer.headers["x-goog-hash"]), digests_of(
            answer.content)
        assert told["md5"] != truth["md5"] and told["crc32c"] == truth["crc32c"]

    def test_missing_header(self, live: CosServer, small: CosBucket) -> None:
        live.lie(small.tarball_path, missing=True, times=1)
        answer = get(live, small.tarball_path)
        assert answer.status_code == 200 and "x-goog-hash" not in answer.headers
        assert answer.headers["x-goog-stored-content-length"] == str(len(answer.content))
        assert "x-goog-hash" in get(live, small.tarball_path).headers  # times=1: once

    def test_composite_object_has_only_crc32c(self, live: CosServer, small: CosBucket
                                              ) -> None:
        live.lie(small.tarball_path, composite=True)
        answer = get(live, small.tarball_path)
        assert answer.headers["x-goog-hash"] == "crc32c=" + digests_of(
            answer.content)["crc32c"]

    def test_tarball_404(self, live: CosServer, small: CosBucket) -> None:
        live.missing(small.tarball_path)
        assert get(live, small.tarball_path).status_code == 404
        assert get(live, small.tarball_path).status_code == 404  # stays gone
        assert get(live, small.path("gpu_default_version")).status_code == 200

    def test_missing_version_file(self, live: CosServer, small: CosBucket) -> None:
        small.remove_alias("latest")
        answer = get(live, small.path("gpu_latest_version"))
        assert answer.status_code == 404 and "x-goog-hash" not in answer.headers
        live.missing(small.path("gpu_default_version"))
        assert get(live, small.path("gpu_default_version")).status_code == 404

    def test_alias_pointing_at_a_version_without_a_tarball(self, live: CosServer,
                                                           small: CosBucket) -> None:
        small.write_alias("R550", "550.54.14")
        version = get(live, small.path("gpu_R550_version")).text.strip()
        assert version == "550.54.14"
        assert get(live, small.path(tarball_name(version))).status_code == 404

    def test_httpserver_faults_keep_the_true_hash(self, live: CosServer, small: CosBucket
                                                  ) -> None:
        truth = digests_of(small.tarball.read_bytes())
        live.fault(small.tarball_path, Fault("corrupt", after=10))
        corrupt = get(live, small.tarball_path)
        assert corrupt.content != small.tarball.read_bytes()
        assert parse_x_goog_hash(corrupt.headers["x-goog-hash"]) == truth  # detectable
        live.fault(small.tarball_path, Fault("serve", other=b"replaced upstream"))
        served = get(live, small.tarball_path)
        assert served.content == b"replaced upstream"
        assert parse_x_goog_hash(served.headers["x-goog-hash"]) == digests_of(
            b"replaced upstream")


def test_crc32c_is_castagnoli_big_endian() -> None:
    """The header's crc32c is base64 of the big-endian CRC-32C (RFC 3720's check value)."""
    import base64

    crc, md5 = object_hashes(b"123456789")
    assert struct.unpack(">I", base64.b64decode(crc))[0] == 0xE3069283
    assert base64.b64decode(md5) == hashlib.md5(b"123456789").digest()
    assert shutil.which("makeself"), "makeself (Debian) is needed for the runfile"
