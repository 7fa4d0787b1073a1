"""Module signatures for `package build`: sign with the operator's key, or attach a vendor's.

`--sign-key KEY --sign-cert CERT [--sign-hash sha256|sha384|sha512]` appends to every module
(those of `--modules`, or those the same command compiled: one kernel, many, both flavours;
the key is read before anything compiles) what the kernel's `scripts/sign-file` appends (see
`modsig`): a detached DER PKCS#7 SignedData with no certificates and no signed attributes,
its signer named by the certificate's issuer and serial. Keys: RSA (2048 bits or more) and
ECDSA on P-256 or P-384, what Linux's module signature check verifies; PEM or DER,
PKCS#1/SEC1/PKCS#8, encrypted ones with the passphrase in `KBUILD_SIGN_PIN` (sign-file's
variable). A module already signed is refused unless `--resign` (its old signature is then
replaced).

`--signatures DIR` attaches a vendor's detached signatures, one `<module>.ko.sig` per module
(what follows the unsigned module in the signed one, as NVIDIA's kmod packages and COS ship
them); each is checked for the kernel's structure and, given `--sign-cert`, verified against
that certificate. Nothing here runs openssl or sign-file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.packages.builder.inputs import ModuleInfo, PackageBuildError
from installer.packages.builder.modsig import (
    MARKER,
    CmsSignature,
    SignatureFormatError,
    make_tail,
    parse_tail,
    strip_signature,
)
from installer.packages.signatures import SignatureEntry

SIGN_HASHES = ("sha256", "sha384", "sha512")
EC_CURVES = ("secp256r1", "secp384r1")
MIN_RSA_BITS = 2048
PIN_VARIABLE = "KBUILD_SIGN_PIN"


@dataclass(frozen=True)
class SigningOptions:
    """What `package build` was asked to do about module signatures."""

    key: Path | None = None
    cert: Path | None = None
    hash: str = "sha256"
    signatures: Path | None = None
    resign: bool = False


def _fail(message: str, remedy: str | None = None) -> PackageBuildError:
    return PackageBuildError(message, remedy=remedy)


def signs(options: SigningOptions) -> bool:
    """Whether the package's modules are to be signed (here, or with a vendor's tails)."""
    return options.key is not None or options.signatures is not None


def check_options(options: SigningOptions) -> None:
    """The flags make sense together (checked before any input is read)."""
    if options.hash not in SIGN_HASHES:
        raise _fail(f"--sign-hash {options.hash!r} is not one of {', '.join(SIGN_HASHES)}")
    if options.key is not None and options.signatures is not None:
        raise _fail("--sign-key and --signatures both sign the modules: give one of them")
    if options.key is not None and options.cert is None:
        raise _fail("--sign-key needs --sign-cert (the certificate the node trusts)")
    if options.cert is not None and options.key is None and options.signatures is None:
        raise _fail("--sign-cert needs --sign-key (to sign) or --signatures (to verify)")
    if options.resign and options.key is None:
        raise _fail("--resign needs --sign-key")


def check_keys(options: SigningOptions) -> None:
    """The certificate and the key read and match, before anything is compiled (minutes:
    a wrong key or passphrase is told first, not after the modules are built)."""
    if options.cert is not None:
        cert = load_cert(options.cert)
        if options.key is not None:
            load_key(options.key, cert)


def apply(options: SigningOptions, modules: list[ModuleInfo], work: Path
          ) -> tuple[list[ModuleInfo], tuple[SignatureEntry, ...]]:
    """Signed copies of the modules (in `work`) and who signed them; the inputs untouched."""
    if options.key is None and options.signatures is None:
        return modules, ()
    cert = load_cert(options.cert) if options.cert else None
    key = load_key(options.key, cert) if options.key and cert else None
    sigs = _signature_files(options.signatures, modules) if options.signatures else {}
    out_dir = work / "signed-modules"
    out_dir.mkdir()
    signed, entries = [], []
    for module in modules:
        data = _unsigned(module, options)
        if key is not None and cert is not None:
            tail = sign(data, key, cert, options.hash)
            entry = _entry(module, "signed", parse_tail(tail), cert)
        else:
            tail = sigs[module.path.name].read_bytes()
            entry = _entry(module, "attached", check_tail(tail, data, cert, module), cert)
        target = out_dir / module.path.name
        target.write_bytes(data + tail)
        signed.append(dataclasses.replace(module, path=target))
        entries.append(entry)
    return signed, tuple(sorted(entries, key=lambda e: e.file))


def _unsigned(module: ModuleInfo, options: SigningOptions) -> bytes:
    if not module.path.name.endswith(".ko"):
        raise _fail(f"module {module.path} is compressed: signatures apply to the "
                    "uncompressed module", remedy="give the uncompressed .ko files")
    data = module.path.read_bytes()
    if not data.endswith(MARKER):
        return data
    if not options.resign:
        raise _fail(f"module {module.path} is already signed",
                    remedy="give the unsigned module, or pass --resign with --sign-key to "
                    "replace its signature")
    try:
        return strip_signature(data)[0]
    except SignatureFormatError as exc:
        raise _fail(f"module {module.path} has a malformed signature: {exc}") from None


def _signature_files(directory: Path, modules: list[ModuleInfo]) -> dict[str, Path]:
    if not directory.is_dir():
        raise _fail(f"--signatures {directory} is not a directory")
    found = {p.name[:-len(".sig")]: p for p in directory.iterdir()
             if p.name.endswith(".sig") and p.is_file()}
    names = {m.path.name for m in modules}
    extra = sorted(set(found) - names)
    if extra:
        raise _fail(f"signature {found[extra[0]]} is for a module the package does not "
                    f"have ({', '.join(sorted(names))})")
    missing = sorted(names - set(found))
    if missing:
        raise _fail(f"module {missing[0]} has no signature {directory / missing[0]}.sig",
                    remedy="give one <module>.ko.sig per module")
    return found


def _entry(module: ModuleInfo, origin: str, sig: CmsSignature, cert: Any) -> SignatureEntry:
    serial = f"{sig.serial:x}" if sig.serial is not None and sig.serial >= 0 else None
    return SignatureEntry(
        f"modules/{module.path.name}", origin, sig.digest,
        cert.issuer.rfc4514_string() if cert is not None else sig.issuer_text, serial,
        cert.subject.rfc4514_string() if cert is not None else None,
        key_id(cert).hex() if cert is not None else (sig.key_id.hex() if sig.key_id else None))


# ---------------------------------------------------------------- keys and certificates


def load_cert(path: Path) -> Any:
    """An X.509 certificate, PEM or DER."""
    from cryptography import x509

    data = _read(path, "--sign-cert")
    try:
        if b"-----BEGIN" in data:
            return x509.load_pem_x509_certificate(data)
        return x509.load_der_x509_certificate(data)
    except ValueError:
        raise _fail(f"--sign-cert {path} is not an X.509 certificate (PEM or DER)") from None


def load_key(path: Path, cert: Any) -> Any:
    """The private key (RSA >= 2048 bits, ECDSA P-256/P-384) that matches `cert`."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    data = _read(path, "--sign-key")
    pin = os.environ.get(PIN_VARIABLE)
    password = pin.encode() if pin else None
    loader = (serialization.load_pem_private_key if b"-----BEGIN" in data
              else serialization.load_der_private_key)
    try:
        key = loader(data, password)
    except TypeError:
        raise _fail(f"--sign-key {path} is encrypted and {PIN_VARIABLE} is not set (or it "
                    "is set and the key is not encrypted)",
                    remedy=f"set {PIN_VARIABLE} to the key's passphrase") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        detail = str(exc).splitlines()[0][:120] if str(exc) else "unreadable"
        raise _fail(f"--sign-key {path} is not a private key this can read ({detail})",
                    remedy="give an RSA or ECDSA key in PEM or DER (and its passphrase in "
                    f"{PIN_VARIABLE})") from None
    if isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < MIN_RSA_BITS:
            raise _fail(f"--sign-key {path} is RSA {key.key_size}: use {MIN_RSA_BITS} bits "
                        "or more")
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        if key.curve.name not in EC_CURVES:
            raise _fail(f"--sign-key {path} is ECDSA on {key.curve.name}: the kernel verifies "
                        "P-256 and P-384")
    else:
        raise _fail(f"--sign-key {path} is a {type(key).__name__.lstrip('_')}: the kernel "
                    "verifies RSA and ECDSA module signatures only")
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise _fail(f"--sign-key {path} does not match --sign-cert "
                    f"({cert.subject.rfc4514_string()})",
                    remedy="give the key the certificate was made for")
    return key


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _fail(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _spki(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    data: bytes = public_key.public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return data


def key_id(cert: Any) -> bytes:
    """The certificate's subjectKeyIdentifier, or the SHA-1 of its public key (RFC 5280)."""
    from cryptography import x509

    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        ski = x509.SubjectKeyIdentifier.from_public_key(cert.public_key())
    digest: bytes = ski.digest
    return digest


# ---------------------------------------------------------------- sign and verify


def _hash(name: str) -> Any:
    from cryptography.hazmat.primitives import hashes

    algorithms: dict[str, Any] = {"sha1": hashes.SHA1, "sha224": hashes.SHA224,
                                  "sha256": hashes.SHA256, "sha384": hashes.SHA384,
                                  "sha512": hashes.SHA512}
    return algorithms[name]()


def sign(module: bytes, key: Any, cert: Any, hash_name: str = "sha256") -> bytes:
    """The tail sign-file would append to `module` (which must be unsigned)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs7

    options = [pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.NoCerts,
               pkcs7.PKCS7Options.NoAttributes, pkcs7.PKCS7Options.Binary]
    der = (pkcs7.PKCS7SignatureBuilder().set_data(module)
           .add_signer(cert, key, _hash(hash_name))
           .sign(serialization.Encoding.DER, options))
    tail = make_tail(der)
    verify(parse_tail(tail), module, cert)  # what we publish, we have checked
    return tail


def check_tail(tail: bytes, module: bytes, cert: Any, where: ModuleInfo) -> CmsSignature:
    """A vendor's detached signature: the kernel's structure, and `cert`'s when given."""
    name = f"{where.path.name}.sig"
    try:
        sig = parse_tail(tail)
    except SignatureFormatError as exc:
        raise _fail(f"signature {name} is malformed: {exc}",
                    remedy="give the detached tail of the signed module "
                    "(what follows the unsigned module)") from None
    if cert is not None:
        try:
            verify(sig, module, cert)
        except SignatureFormatError as exc:
            raise _fail(f"signature {name} does not verify against --sign-cert: {exc}",
                        remedy="give the certificate of the key that signed the modules, "
                        "and the unsigned modules they were made for") from None
    return sig


def verify(sig: CmsSignature, module: bytes, cert: Any) -> None:
    """The signature value over the module's digest, with the certificate's public key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    if sig.key_id is not None and sig.key_id != key_id(cert):
        raise SignatureFormatError("it names another signer (key id)")
    if sig.issuer is not None and (sig.issuer != cert.issuer.public_bytes()
                                   or sig.serial != cert.serial_number):
        raise SignatureFormatError(f"it names another signer ({sig.issuer_text}, serial "
                                   f"{sig.serial:x})" if sig.serial is not None else "")
    signed = module
    if sig.signed_attrs is not None:
        if sig.message_digest != hashlib.new(sig.digest, module).digest():
            raise SignatureFormatError("it was made for other module bytes")
        signed = sig.signed_attrs
    public = cert.public_key()
    try:
        if sig.pkey == "rsa" and isinstance(public, rsa.RSAPublicKey):
            public.verify(sig.value, signed, padding.PKCS1v15(), _hash(sig.digest))
        elif sig.pkey == "ecdsa" and isinstance(public, ec.EllipticCurvePublicKey):
            public.verify(sig.value, signed, ec.ECDSA(_hash(sig.digest)))
        else:
            raise SignatureFormatError(f"it is an {sig.pkey} signature and the certificate's "
                                       "key is not")
    except InvalidSignature:
        raise SignatureFormatError("its signature value does not match the module's "
                                   f"{sig.digest} digest") from None
