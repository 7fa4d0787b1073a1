"""The kernel's module signature format, read and checked without any crypto library.

A signed module is (`scripts/sign-file.c`, `include/linux/module_signature.h`):

    module ‖ DER PKCS#7/CMS SignedData (detached) ‖ struct module_signature ‖ marker

`struct module_signature` is 12 bytes: algo, hash, id_type (2 = PKEY_ID_PKCS7), signer_len,
key_id_len (all but id_type 0 for PKCS#7), 3 pad bytes, and the big-endian length of the
DER; the marker is `~Module signature appended~\\n`. What follows the unsigned module is
the *detached tail* vendors ship as `<module>.ko.sig`. `strip_signature` splits a signed
module; `parse_tail` checks a tail's whole structure (trailer, marker, lengths, DER) and
returns the one signer's fields, which `installer.packages.builder.signing` verifies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MARKER = b"~Module signature appended~\n"
PKEY_ID_PKCS7 = 2
TRAILER = struct.Struct(">BBBBB3sI")  # algo hash id_type signer_len key_id_len pad sig_len
TAIL_OVERHEAD = TRAILER.size + len(MARKER)  # 40 bytes after the DER
MAX_SIGNATURE = 64 * 1024

OID_SIGNED_DATA = "1.2.840.113549.1.7.2"
OID_DATA = "1.2.840.113549.1.7.1"
OID_MESSAGE_DIGEST = "1.2.840.113549.1.9.4"
OID_RSA = "1.2.840.113549.1.1.1"
DIGESTS = {"1.3.14.3.2.26": "sha1", "2.16.840.1.101.3.4.2.4": "sha224",
           "2.16.840.1.101.3.4.2.1": "sha256", "2.16.840.1.101.3.4.2.2": "sha384",
           "2.16.840.1.101.3.4.2.3": "sha512"}
# what the kernel's PKCS#7 parser takes as the signature algorithm (pkcs7_sig_note_pkey_algo)
PKEY_ALGOS = {OID_RSA: "rsa", "1.2.840.10045.4.1": "ecdsa", "1.2.840.10045.4.3.1": "ecdsa",
              "1.2.840.10045.4.3.2": "ecdsa", "1.2.840.10045.4.3.3": "ecdsa",
              "1.2.840.10045.4.3.4": "ecdsa"}
_ECDSA_HASH = {"1.2.840.10045.4.1": "sha1", "1.2.840.10045.4.3.1": "sha224",
               "1.2.840.10045.4.3.2": "sha256", "1.2.840.10045.4.3.3": "sha384",
               "1.2.840.10045.4.3.4": "sha512"}
_NAME_KEYS = {"2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST",
              "2.5.4.10": "O", "2.5.4.11": "OU", "2.5.4.9": "STREET",
              "0.9.2342.19200300.100.1.25": "DC", "0.9.2342.19200300.100.1.1": "UID",
              "1.2.840.113549.1.9.1": "emailAddress"}


class SignatureFormatError(ValueError):
    """A signature tail that is not what the kernel's module signature check reads."""


@dataclass(frozen=True)
class CmsSignature:
    """The one SignerInfo of a module's SignedData."""

    issuer: bytes | None  # DER Name of issuerAndSerialNumber (None: subjectKeyIdentifier)
    serial: int | None
    key_id: bytes | None  # the subjectKeyIdentifier form of the signer id
    digest: str  # sha256, ...
    pkey: str  # rsa | ecdsa
    signed_attrs: bytes | None  # DER of the attributes as a SET (what was signed), if any
    message_digest: bytes | None
    value: bytes

    @property
    def issuer_text(self) -> str | None:
        return name_text(self.issuer) if self.issuer is not None else None


def strip_signature(data: bytes) -> tuple[bytes, bytes]:
    """(unsigned module, detached tail); the tail is empty for an unsigned module.

    Appending the tail to the unsigned module gives `data` back byte for byte.
    """
    if not data.endswith(MARKER):
        return data, b""
    if len(data) < TAIL_OVERHEAD:
        raise SignatureFormatError("the signature trailer is cut short")
    sig_len = TRAILER.unpack_from(data, len(data) - TAIL_OVERHEAD)[6]
    cut = len(data) - TAIL_OVERHEAD - sig_len
    if sig_len == 0 or cut < 0:
        raise SignatureFormatError(f"the trailer's signature length {sig_len} does not fit")
    return data[:cut], data[cut:]


def make_tail(der: bytes) -> bytes:
    """The tail sign-file appends: the DER, the PKCS#7 trailer, the marker."""
    return der + TRAILER.pack(0, 0, PKEY_ID_PKCS7, 0, 0, b"\0\0\0", len(der)) + MARKER


def parse_tail(tail: bytes) -> CmsSignature:
    """Check a detached tail's every field and return its signer, or SignatureFormatError."""
    if not tail.endswith(MARKER):
        raise SignatureFormatError("it does not end with '~Module signature appended~'")
    if len(tail) <= TAIL_OVERHEAD:
        raise SignatureFormatError("it is too short to hold a signature")
    algo, hash_, id_type, signer_len, key_id_len, pad, sig_len = TRAILER.unpack_from(
        tail, len(tail) - TAIL_OVERHEAD)
    if id_type != PKEY_ID_PKCS7:
        raise SignatureFormatError(f"its id_type is {id_type}, not 2 (PKCS#7)")
    if (algo, hash_, signer_len, key_id_len, pad) != (0, 0, 0, 0, b"\0\0\0"):
        raise SignatureFormatError("its trailer's algo/hash/signer/key-id fields must be 0 "
                                   "for PKCS#7")
    if sig_len != len(tail) - TAIL_OVERHEAD:
        raise SignatureFormatError(f"its trailer says {sig_len} signature bytes, it holds "
                                   f"{len(tail) - TAIL_OVERHEAD}")
    if sig_len > MAX_SIGNATURE:
        raise SignatureFormatError(f"its signature is over {MAX_SIGNATURE} bytes")
    return parse_pkcs7(tail[:sig_len])


# ---------------------------------------------------------------- a small DER reader


@dataclass(frozen=True)
class _Tlv:
    tag: int
    start: int  # first content byte
    end: int  # one past the last content byte
    raw_start: int


def _read(data: bytes, pos: int, limit: int) -> _Tlv:
    if pos + 2 > limit:
        raise SignatureFormatError("its DER ends inside an element")
    origin, tag, first = pos, data[pos], data[pos + 1]
    if tag & 0x1F == 0x1F:
        raise SignatureFormatError("its DER uses a multi-byte tag")
    pos += 2
    if first < 0x80:
        length = first
    elif first == 0x80:
        raise SignatureFormatError("its DER uses an indefinite length (not DER)")
    else:
        count = first & 0x7F
        if count > 4 or pos + count > limit:
            raise SignatureFormatError("its DER has a bad length")
        length = int.from_bytes(data[pos:pos + count], "big")
        pos += count
    if pos + length > limit:
        raise SignatureFormatError("its DER element overruns its container")
    return _Tlv(tag, pos, pos + length, origin)


def _children(data: bytes, tlv: _Tlv) -> list[_Tlv]:
    items, pos = [], tlv.start
    while pos < tlv.end:
        child = _read(data, pos, tlv.end)
        items.append(child)
        pos = child.end
    return items


def _expect(tlv: _Tlv, tag: int, what: str) -> _Tlv:
    if tlv.tag != tag:
        raise SignatureFormatError(f"its {what} has DER tag 0x{tlv.tag:02x}, not 0x{tag:02x}")
    return tlv


def _oid(data: bytes, tlv: _Tlv) -> str:
    body = data[_expect(tlv, 0x06, "object identifier").start:tlv.end]
    if not body:
        raise SignatureFormatError("its DER has an empty object identifier")
    values, value = [], 0
    for byte in body:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            values.append(value)
            value = 0
    first = min(values[0] // 40, 2)
    return ".".join(str(v) for v in (first, values[0] - 40 * first, *values[1:]))


def _int(data: bytes, tlv: _Tlv, what: str) -> int:
    return int.from_bytes(data[_expect(tlv, 0x02, what).start:tlv.end], "big", signed=True)


def _algorithm(data: bytes, tlv: _Tlv, what: str) -> str:
    """An AlgorithmIdentifier's OID; its parameters must be absent or NULL."""
    parts = _children(data, _expect(tlv, 0x30, what))
    if not parts or len(parts) > 2 or (len(parts) == 2 and (
            parts[1].tag != 0x05 or parts[1].end != parts[1].start)):
        raise SignatureFormatError(f"its {what} is not an OID with NULL or no parameters")
    return _oid(data, parts[0])


def parse_pkcs7(der: bytes) -> CmsSignature:
    """ContentInfo{signedData} -> its single SignerInfo; detached, as the kernel wants."""
    top = _read(der, 0, len(der))
    if top.end != len(der):
        raise SignatureFormatError("bytes follow its DER SignedData")
    content_info = _children(der, _expect(top, 0x30, "ContentInfo"))
    if len(content_info) != 2 or _oid(der, content_info[0]) != OID_SIGNED_DATA:
        raise SignatureFormatError("it is not a PKCS#7 SignedData")
    wrapped = _children(der, _expect(content_info[1], 0xA0, "content"))
    if len(wrapped) != 1:
        raise SignatureFormatError("its SignedData is missing")
    fields = _children(der, _expect(wrapped[0], 0x30, "SignedData"))
    if len(fields) < 4:
        raise SignatureFormatError("its SignedData lacks fields")
    version = _int(der, fields[0], "SignedData version")
    inner = _children(der, _expect(fields[2], 0x30, "encapsulated content"))
    if not inner or _oid(der, inner[0]) != OID_DATA:
        raise SignatureFormatError("its encapsulated content is not PKCS#7 data")
    if len(inner) > 1:
        raise SignatureFormatError("it embeds the module (not a detached signature)")
    signers = _children(der, _expect(fields[-1], 0x31, "signerInfos"))
    if len(signers) != 1:
        raise SignatureFormatError(f"it has {len(signers)} signers, not 1")
    signer = _signer_info(der, signers[0])
    if version != (1 if signer.key_id is None else 3):  # what the kernel's parser insists on
        raise SignatureFormatError(f"its SignedData version {version} does not go with its "
                                   "signer id (1: issuer and serial, 3: key id)")
    listed = {DIGESTS.get(_algorithm(der, item, "digestAlgorithms"))
              for item in _children(der, _expect(fields[1], 0x31, "digestAlgorithms"))}
    if signer.digest not in listed:
        raise SignatureFormatError(f"its digestAlgorithms do not list {signer.digest}")
    return signer


def _signer_info(der: bytes, tlv: _Tlv) -> CmsSignature:
    parts = _children(der, _expect(tlv, 0x30, "SignerInfo"))
    if len(parts) < 5:
        raise SignatureFormatError("its SignerInfo lacks fields")
    sid, version = parts[1], _int(der, parts[0], "SignerInfo version")
    issuer = serial = key_id = None
    if (version, sid.tag) not in ((1, 0x30), (3, 0x80)):
        raise SignatureFormatError(f"its SignerInfo version {version} does not go with its "
                                   "signer id (1: issuer and serial, 3: key id)")
    if sid.tag == 0x30:
        name, number = ([*_children(der, sid), None, None])[:2]
        if name is None or number is None:
            raise SignatureFormatError("its issuerAndSerialNumber is incomplete")
        issuer = der[_expect(name, 0x30, "issuer").raw_start:name.end]
        serial = _int(der, number, "serial")
    elif sid.tag == 0x80:
        key_id = der[sid.start:sid.end]
    else:
        raise SignatureFormatError("its signer id is neither issuer+serial nor a key id")
    digest_oid = _algorithm(der, parts[2], "digestAlgorithm")
    index, signed_attrs, message_digest = 3, None, None
    if parts[3].tag == 0xA0:
        signed_attrs = b"\x31" + der[parts[3].raw_start + 1:parts[3].end]
        message_digest = _message_digest(der, parts[3])
        index = 4
    if len(parts) < index + 2:
        raise SignatureFormatError("its SignerInfo lacks the signature")
    pkey_oid = _algorithm(der, parts[index], "signature algorithm")
    value = der[_expect(parts[index + 1], 0x04, "signature value").start:parts[index + 1].end]
    if digest_oid not in DIGESTS:
        raise SignatureFormatError(f"its digest algorithm {digest_oid} is not one the kernel "
                                   "takes")
    if pkey_oid not in PKEY_ALGOS:
        raise SignatureFormatError(f"its signature algorithm {pkey_oid} is not RSA "
                                   "(rsaEncryption) or ECDSA, which the kernel takes")
    if _ECDSA_HASH.get(pkey_oid, DIGESTS[digest_oid]) != DIGESTS[digest_oid]:
        raise SignatureFormatError(f"its ECDSA algorithm {pkey_oid} is not for "
                                   f"{DIGESTS[digest_oid]}")
    return CmsSignature(issuer, serial, key_id, DIGESTS[digest_oid], PKEY_ALGOS[pkey_oid],
                        signed_attrs, message_digest, value)


def _message_digest(der: bytes, attrs: _Tlv) -> bytes | None:
    for attr in _children(der, attrs):
        kids = _children(der, _expect(attr, 0x30, "attribute"))
        if len(kids) == 2 and _oid(der, kids[0]) == OID_MESSAGE_DIGEST:
            values = _children(der, _expect(kids[1], 0x31, "attribute values"))
            if values:
                return der[_expect(values[0], 0x04, "messageDigest").start:values[0].end]
    return None


def name_text(name_der: bytes) -> str:
    """An X.509 Name as RFC 4514 text (`CN=...,O=...`, last RDN first), for the manifest."""
    top = _read(name_der, 0, len(name_der))
    rdns = []
    for rdn in _children(name_der, _expect(top, 0x30, "Name")):
        pairs = []
        for pair in _children(name_der, _expect(rdn, 0x31, "RDN")):
            oid_tlv, value = ([*_children(name_der, pair), None, None])[:2]
            if oid_tlv is None or value is None:
                raise SignatureFormatError("its issuer name is malformed")
            oid = _oid(name_der, oid_tlv)
            raw = name_der[value.start:value.end]
            text = raw.decode("utf-16-be" if value.tag == 0x1E else "utf-8", "replace")
            pairs.append(f"{_NAME_KEYS.get(oid, oid)}={_escape(text)}")
        rdns.append("+".join(pairs))
    return ",".join(reversed(rdns))


def _escape(text: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in text)
    if out[:1] in ("#", " "):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out
