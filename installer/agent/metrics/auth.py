"""Basic auth for /metrics (METRICS_WEB_CONFIG_FILE's `basic_auth_users`, bcrypt hashes).

As the exporter-toolkit does, a password that matched once is cached (by a SHA-256 of user
and password, never the password), so a Prometheus scraping every 15 s pays bcrypt's cost
once; a wrong one is checked every time. /healthz stays open: it tells freshness only, and
a kubelet probe carries no credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
from collections.abc import Callable
from typing import Any

OPEN_PATHS = ("/healthz",)
MAX_CACHED = 64


def basic_auth(app: Any, users: dict[str, bytes]) -> Any:
    """`app` behind basic auth for `users` (name -> bcrypt hash)."""
    import bcrypt  # only where basic auth is configured

    passed: set[bytes] = set()
    lock = threading.Lock()

    def allowed(header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True
                                                   ).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = users.get(user)
        if not sep or hashed is None:
            return False
        token = hashlib.sha256(user.encode() + b"\0" + password.encode() + hashed).digest()
        with lock:
            if any(hmac.compare_digest(token, seen) for seen in passed):
                return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with lock:
            if len(passed) < MAX_CACHED:
                passed.add(token)
        return True

    def guarded(environ: dict[str, Any], start: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO", "") in OPEN_PATHS or allowed(
                environ.get("HTTP_AUTHORIZATION", "")):
            return app(environ, start)
        start("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                   ("WWW-Authenticate", 'Basic realm="gpu-node-installer"')])
        return [b"unauthorized\n"]

    return guarded
