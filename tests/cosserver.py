"""Google's storage served on 127.0.0.1: Cloud Storage's hash headers, and lies on demand.

`CosServer(root)` serves a directory (a `cosbucket.make_bucket` tree) over HTTPS
(self-signed, `ca_bundle`) or HTTP, with Range and ETag from httpserver.MirrorServer, and
`x-goog-hash: crc32c=<b64>,md5=<b64>` plus `x-goog-stored-content-length` on every object
response (also on 206, describing the whole object). `lie()` makes it send a wrong crc32c or
md5, no header at all, or a composite object's crc32c alone.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from cosbucket import COS_TOOLS, RUNFILE_BUCKET
from httpserver import Fault, MirrorServer, Request, _Handler, self_signed


@dataclass
class _Lie:
    crc32c: bool
    md5: bool
    missing: bool
    composite: bool
    times: int


def object_hashes(data_or_path: bytes | Path) -> tuple[str, str]:
    """(crc32c, md5) as Cloud Storage writes them: base64 of the big-endian CRC32C and of
    the 16-byte MD5 digest."""
    import google_crc32c

    crc, md5 = google_crc32c.Checksum(), hashlib.md5()  # Cloud Storage's hash
    if isinstance(data_or_path, bytes):
        crc.update(data_or_path)
        md5.update(data_or_path)
    else:
        with data_or_path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                crc.update(chunk)
                md5.update(chunk)
    return (base64.b64encode(crc.digest()).decode(), base64.b64encode(md5.digest()).decode())


def x_goog_hash(crc32c: str | None, md5: str | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (("crc32c", crc32c), ("md5", md5)) if v)


def _wrong(value: str) -> str:
    raw = bytearray(base64.b64decode(value))
    raw[0] ^= 0xFF
    return base64.b64encode(bytes(raw)).decode()


class _CosMirror(MirrorServer):
    """MirrorServer that remembers the fault each request thread took (its body's hash)."""

    def __init__(self, owner: CosServer, root: Path, tls: tuple[Path, Path] | None) -> None:
        super().__init__(root, tls=tls)
        self.owner = owner
        self.local = threading.local()
        handler = type("CosHandler", (_CosHandler,), {"server_state": self})
        self.httpd.RequestHandlerClass = handler

    def take_fault(self, path: str) -> Fault | None:
        fault = super().take_fault(path)
        self.local.fault = fault
        return fault


class _CosHandler(_Handler):
    server_state: _CosMirror

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def end_headers(self) -> None:
        if getattr(self, "_status", None) in (200, 206):
            for name, value in self.server_state.owner.object_headers(
                    self._path(), getattr(self.server_state.local, "fault", None)):
                self.send_header(name, value)
        super().end_headers()


class CosServer:
    """`root` served like storage.googleapis.com: HTTPS (self-signed) or HTTP on 127.0.0.1,
    Range and ETag from httpserver.MirrorServer, Cloud Storage's hash headers, and lies.

    `split_hash=True` sends crc32c and md5 as two `x-goog-hash` header lines (as the XML
    API may; a client library joins them as "crc32c=..., md5=...").
    """

    def __init__(self, root: Path, *, tls: bool = True, split_hash: bool = False) -> None:
        self.root = root
        self.split_hash = split_hash
        self._tls_dir: Path | None = None
        self.ca_bundle: Path | None = None
        pair = None
        if tls:
            self._tls_dir = Path(tempfile.mkdtemp(prefix="cos-tls-"))
            pair = self_signed(self._tls_dir)
            self.ca_bundle = pair[0]
        self.mirror = _CosMirror(self, root, pair)
        self.lies: dict[str, _Lie] = {}
        self._hashes: dict[tuple[Path, int, int], tuple[str, str]] = {}
        self._lock = threading.Lock()

    # --- the server ------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.mirror.url

    @property
    def cos_tools_url(self) -> str:
        return f"{self.url}/{COS_TOOLS}"

    @property
    def runfile_url(self) -> str:
        return f"{self.url}/{RUNFILE_BUCKET}"

    @property
    def requests(self) -> list[Request]:
        with self.mirror.lock:
            return list(self.mirror.requests)

    def requests_for(self, path: str) -> list[Request]:
        return self.mirror.requests_for(path)

    def __enter__(self) -> CosServer:
        self.mirror.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mirror.__exit__(*exc)
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)

    # --- faults ----------------------------------------------------------------------
    def fault(self, path: str, *faults: Fault) -> None:
        """httpserver's faults (drop, status, corrupt, truncate, change, ...) on a path."""
        self.mirror.fault(path, *faults)

    def missing(self, path: str, *, status: int = 404, times: int = 0) -> None:
        """The object answers `status` (404: gone from the bucket); times=0: always."""
        self.mirror.fault(path, Fault("status", status=status, times=times))

    def lie(self, path: str, *, crc32c: bool = False, md5: bool = False,
            missing: bool = False, composite: bool = False, times: int = 0) -> None:
        """The body stays intact, the headers lie: a wrong crc32c, a wrong md5, no
        x-goog-hash at all (`missing`), or only crc32c (`composite`, what Cloud Storage
        sends for composite objects). times=0: every response for `path`."""
        with self._lock:
            self.lies[path] = _Lie(crc32c, md5, missing, composite, times)

    def _take_lie(self, path: str) -> _Lie | None:
        with self._lock:
            lie = self.lies.get(path)
            if lie and lie.times > 0:
                lie.times -= 1
                if lie.times == 0:
                    del self.lies[path]
            return lie

    # --- headers ---------------------------------------------------------------------
    def hashes(self, target: Path) -> tuple[str, str]:
        """(crc32c, md5) of a served file, cached by size and mtime."""
        info = target.stat()
        key = (target, info.st_size, info.st_mtime_ns)
        with self._lock:
            cached = self._hashes.get(key)
        if cached is None:
            cached = object_hashes(target)
            with self._lock:
                self._hashes[key] = cached
        return cached

    def object_headers(self, path: str, fault: Fault | None) -> list[tuple[str, str]]:
        """What Cloud Storage adds to a 200/206: the whole object's hashes and size."""
        if fault is not None and fault.kind in ("change", "serve"):
            crc, md5 = object_hashes(fault.other)
            size = len(fault.other)
        else:
            target = (self.root / path.lstrip("/")).resolve()
            if not target.is_file():
                return []
            crc, md5 = self.hashes(target)
            size = target.stat().st_size
        headers = [("x-goog-stored-content-length", str(size)),
                   ("x-goog-storage-class", "STANDARD")]
        lie = self._take_lie(path)
        if lie is not None:
            if lie.missing:
                return headers
            crc = _wrong(crc) if lie.crc32c else crc
            md5 = _wrong(md5) if lie.md5 else md5
            if lie.composite:
                md5 = ""
        if self.split_hash:
            headers += [("x-goog-hash", x_goog_hash(crc, None))]
            if md5:
                headers.append(("x-goog-hash", x_goog_hash(None, md5)))
        else:
            headers.append(("x-goog-hash", x_goog_hash(crc, md5)))
        return headers


def parse_x_goog_hash(value: str) -> dict[str, str]:
    """{"crc32c": b64, "md5": b64} from an x-goog-hash value (one or joined lines)."""
    out: dict[str, str] = {}
    for part in value.split(","):
        name, sep, digest = part.strip().partition("=")
        if sep:
            out[name] = digest
    return out
