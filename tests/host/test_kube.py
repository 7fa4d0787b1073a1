"""node.kube: API server discovery, TLS against the in-cluster CA on 127.0.0.1, and what it
does with slow, failing or malformed answers."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubefake
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


# --- answers: one deadline per call, retried writes, refused shapes (tests/kubefake.py) ----

NODE = "gpu-node-1"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[kube.ApiServer, kubefake.Cluster]]:
    cluster = kubefake.Cluster(node_name=NODE, nodes={NODE: kubefake.node_doc(NODE)})
    directory = tmp_path / "fake-sa"
    directory.mkdir()
    (directory / "token").write_text(kubefake.TOKEN + "\n")
    with kubefake.serve(cluster) as url:
        api = kube.api_server(url, directory, {})
        assert api is not None
        yield api, cluster


class TestDeadline:
    def test_a_trickled_answer_ends_at_the_deadline(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        body = json.dumps({"kind": "PodList", "metadata": {}, "items": []}).encode()
        cluster.faults["GET /api/v1/pods"] = [kubefake.Reply(body=body, trickle_s=0.3)]
        start = time.monotonic()
        with pytest.raises(kube.Late, match=r"GET /api/v1/pods\?.*no complete answer "
                                            r"within 1\.0 s") as caught:
            kube.pods_on_node(api, NODE, deadline=start + 1.0)
        assert time.monotonic() - start < 3.0  # one deadline, not one per read
        assert caught.value.bound == ""

    def test_a_bound_names_itself(self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        cluster.faults[f"GET /api/v1/nodes/{NODE}"] = [kubefake.Reply(body=b"{}" * 20,
                                                                      trickle_s=0.3)]
        bounded = api.bounded(time.monotonic() + 0.5, "UPGRADE_TIMEOUT")
        with pytest.raises(kube.Late, match=r"\(UPGRADE_TIMEOUT ran out\)") as caught:
            kube.get_node(bounded, NODE, deadline=time.monotonic() + 30)
        assert caught.value.bound == "UPGRADE_TIMEOUT"

    def test_a_path_that_could_split_the_request_is_refused(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        with pytest.raises(kube.KubeError, match="a path a request line cannot hold"):
            kube.get_pod(api, "default", "x HTTP/1.1\r\nX-Injected: 1")
        assert cluster.calls == []


class TestRetries:
    def test_label_writes_retry_429_and_503_with_backoff(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        cluster.faults[f"PATCH /api/v1/nodes/{NODE}"] = [
            kubefake.Reply(429, b'{"kind":"Status"}', headers={"Retry-After": "1"}), 503]
        kube.patch_node_labels(api, NODE, {"a/b": "c"}, deadline=time.monotonic() + 5)
        patches = [c for c in cluster.calls if c.method == "PATCH"]
        assert [c.status for c in patches] == [429, 503, 200]
        assert patches[1].at - patches[0].at >= 0.9  # Retry-After: 1 was honoured
        assert cluster.node()["metadata"]["labels"]["a/b"] == "c"

    def test_retries_stop_at_the_deadline(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        cluster.faults["POST /api/v1/namespaces/default/events"] = [503] * 100
        start = time.monotonic()
        with pytest.raises(kube.KubeError, match="HTTP 503") as caught:
            kube.post_node_event(api, NODE, reason="R", message="m", deadline=start + 1.0)
        assert caught.value.status == 503 and time.monotonic() - start < 2.0
        assert 2 <= len(cluster.calls) < 100

    def test_reads_and_evictions_are_not_retried(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        cluster.faults[f"GET /api/v1/nodes/{NODE}"] = [503]
        with pytest.raises(kube.KubeError, match="HTTP 503"):
            kube.get_node(api, NODE)
        assert len(cluster.calls) == 1


class TestShapes:
    @pytest.mark.parametrize(("body", "problem"), [
        (b"<html>upstream gateway</html>", "not JSON"),
        (b"", "empty"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'{"items": [' * 40 + b"]}" * 40, "nested deeper than 32 levels"),
        (b'{"items": NaN}', "not JSON"),
        (b'{"kind": "PodList", "items": {"a": 1}}', "items is a dict, not a list"),
        (b'{"kind": "PodList", "items": null}', "items is missing, not a list"),
        (b'{"kind": "PodList", "items": ["pod"]}', "an item of the answer is a str"),
        (b'{"items": [], "metadata": {"continue": 7}}', "metadata.continue is a int"),
    ])
    def test_a_2xx_list_answer_that_is_not_a_list_is_an_error(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster], body: bytes,
            problem: str) -> None:
        api, cluster = fake
        cluster.faults["GET /api/v1/pods"] = [kubefake.Reply(body=body)]
        with pytest.raises(kube.KubeError) as caught:
            kube.pods_on_node(api, NODE)
        assert problem in str(caught.value), caught.value
        assert len(str(caught.value)) < 600

    def test_the_answer_is_named_by_a_bounded_prefix(
            self, fake: tuple[kube.ApiServer, kubefake.Cluster]) -> None:
        api, cluster = fake
        cluster.faults[f"GET /api/v1/nodes/{NODE}"] = [
            kubefake.Reply(body=b"<html>" + b"x" * 100_000 + b"\x1b[31m")]
        with pytest.raises(kube.KubeError, match=r"not JSON.*'<html>xxx.*\.\.\.$"):
            kube.get_node(api, NODE)
