"""The module signature reader (`modsig`) and the manifest's `signatures` field.

Signatures are made by the `cryptography` package the product signs with, and by the real
openssl in tests/host/test_packagesign.py; here the reader is fuzzed: a damaged tail is
refused with SignatureFormatError and never crashes another way.
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.packages.builder import modsig, signing
from installer.packages.manifest import ManifestError, manifest_from_dict
from tests.unit.test_package import valid

MODULE = b"\x7fELF" + bytes(range(256)) * 40
NAME = x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "DE"),
                  x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example, Inc."),
                  x509.NameAttribute(NameOID.COMMON_NAME, "kmod signing + key")])


def _cert() -> tuple[Any, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(NAME).issuer_name(NAME)
            .public_key(key.public_key()).serial_number(0x1234abcd)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return key, cert


KEY, CERT = _cert()
TAIL = signing.sign(MODULE, KEY, CERT, "sha256")


def test_tail_names_the_signer_like_the_certificate() -> None:
    sig = modsig.parse_tail(TAIL)
    assert sig.issuer_text == CERT.issuer.rfc4514_string()
    assert sig.serial == 0x1234abcd and (sig.digest, sig.pkey) == ("sha256", "ecdsa")
    assert sig.signed_attrs is None
    signing.verify(sig, MODULE, CERT)
    with pytest.raises(modsig.SignatureFormatError, match="does not match"):
        signing.verify(sig, MODULE + b"x", CERT)


def test_strip_and_append_round_trip() -> None:
    assert modsig.strip_signature(MODULE) == (MODULE, b"")
    assert modsig.strip_signature(MODULE + TAIL) == (MODULE, TAIL)


@given(st.integers(min_value=0, max_value=len(TAIL) - 1), st.integers(1, 255))
@settings(max_examples=400, deadline=None)
def test_a_damaged_tail_is_refused_or_still_names_the_signer(position: int, flip: int) -> None:
    damaged = bytearray(TAIL)
    damaged[position] ^= flip
    try:
        sig = modsig.parse_tail(bytes(damaged))
    except modsig.SignatureFormatError:
        return
    try:  # the structure survived (a byte of a value changed): verification must notice
        signing.verify(sig, MODULE, CERT)
    except modsig.SignatureFormatError:
        return
    raise AssertionError(f"byte {position} ^ {flip} changed nothing the checks see")


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_random_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(modsig.SignatureFormatError):
        modsig.parse_tail(data + modsig.MARKER)


DOCS = Path(__file__).parents[2] / "docs"
SCHEMA = jsonschema.Draft202012Validator(json.loads((DOCS / "manifest.schema.json").read_text()))
ENTRY = {"file": "modules/nvidia.ko", "origin": "signed", "hash": "sha256",
         "issuer": "CN=k", "serial": "1f", "subject": "CN=k", "key_id": "ab" * 20}


def _doc(**changes: Any) -> dict[str, Any]:
    doc = valid()
    entry = copy.deepcopy(ENTRY)
    entry.update(changes)
    doc["signatures"] = [entry]
    return doc


def test_signatures_are_optional_and_round_trip() -> None:
    assert manifest_from_dict(valid()).signatures == ()
    manifest = manifest_from_dict(_doc())
    assert manifest.signatures[0].key_id == "ab" * 20
    SCHEMA.validate(_doc())
    SCHEMA.validate(_doc(subject=None, key_id=None, origin="attached"))


@pytest.mark.parametrize("changes", [
    {"file": "lib64/libcuda.so.535.261.03"}, {"origin": "made"}, {"hash": "md5"},
    {"serial": "1F"}, {"issuer": ""}, {"key_id": 7}, {"issuer": None, "key_id": None},
    {"extra": 1}], ids=str)
def test_bad_signature_entries_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ManifestError, match="signatures"):
        manifest_from_dict(_doc(**changes))
    if "file" not in changes:  # a path of the wrong kind is a check beyond the schema
        assert not SCHEMA.is_valid(_doc(**changes))
