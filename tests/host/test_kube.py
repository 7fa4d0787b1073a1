"""node.kube: API server discovery, and TLS against the in-cluster CA on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from installer.node import kube


def account(tmp_path: Path, *, ca: Path | None = None) -> Path:
    directory = tmp_path / "sa"
    directory.mkdir()
    (directory / "token").write_text("tok\n")
    if ca is not None:
        shutil.copy(ca, directory / "ca.crt")
    return directory


class TestDiscovery:
    def test_from_the_service_environment(self, tmp_path: Path) -> None:
        api = kube.api_server(None, account(tmp_path), {"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                                        "KUBERNETES_SERVICE_PORT": "443"})
        assert api is not None and api.base_url == "https://10.0.0.1:443"
        assert api.ca_file is None

    def test_ipv6_service_host_is_bracketed(self, tmp_path: Path) -> None:
        api = kube.api_server(None, account(tmp_path), {"KUBERNETES_SERVICE_HOST": "fd00::1"})
        assert api is not None and api.base_url == "https://[fd00::1]:443"

    def test_explicit_url_wins(self, tmp_path: Path) -> None:
        api = kube.api_server("http://127.0.0.1:9", account(tmp_path),
                              {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
        assert api is not None and api.base_url == "http://127.0.0.1:9"

    def test_nothing_without_url_or_token(self, tmp_path: Path) -> None:
        assert kube.api_server(None, account(tmp_path), {}) is None
        assert kube.api_server("http://127.0.0.1:9", tmp_path / "missing", {}) is None


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, standing in for the cluster CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (scripts/install-deps.sh installs it)")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "ca.crt", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_api(certificate: tuple[Path, Path]) -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(f"{self.command} {self.path} {self.headers.get('Authorization')}")
            body = json.dumps({}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


class TestTls:
    def test_trusts_the_service_account_ca(self, tmp_path: Path, certificate: tuple[Path, Path],
                                           tls_api: tuple[str, list[str]]) -> None:
        url, seen = tls_api
        api = kube.api_server(url, account(tmp_path, ca=certificate[0]), {})
        assert api is not None
        kube.patch_node_labels(api, "n1", {"a/b": "c"})
        assert seen == ["PATCH /api/v1/nodes/n1 Bearer tok"]

    def test_refuses_a_server_the_ca_did_not_sign(self, tmp_path: Path,
                                                  tls_api: tuple[str, list[str]]) -> None:
        url, seen = tls_api
        api = kube.api_server(url, account(tmp_path), {})
        assert api is not None
        with pytest.raises(kube.KubeError, match="SSLError"):
            kube.patch_node_labels(api, "n1", {"a/b": "c"})
        assert seen == []
