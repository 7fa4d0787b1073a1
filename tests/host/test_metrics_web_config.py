"""METRICS_WEB_CONFIG_FILE: TLS and basic auth in the Prometheus exporter-toolkit's web
config format (prometheus/exporter-toolkit `docs/web-configuration.md` at
0089e786c388f128bd417609a8ba66c20b35176e). A real TLS client (Python's ssl, verifying a CA
made here), Debian's real Prometheus scraping over HTTPS with basic auth, and the real
agent serving with the file; bad files refused in one line naming the setting and cause."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from host.test_agent_metrics import GPUS, gpu_line, metrics_node
from prometheus import running

from installer.agent.metrics.auth import basic_auth
from installer.agent.metrics.server import make_app, serve
from installer.agent.metrics.snapshot import GpuReading, Snapshot
from installer.config import load_config
from installer.config.values import Invalid
from installer.config.webconfig import load, web_config_file
from installer.errors import ConfigError
from installer.packages.manifest import Package

PASSWORD = "s3cret-scrape"


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_tls(folder: Path) -> Path:
    """A CA (ca.pem) and a server certificate for 127.0.0.1 it signed (cert.pem, key.pem)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def build(subject: str, public: Any, issuer: str, ca: bool) -> x509.CertificateBuilder:
        builder = (x509.CertificateBuilder().subject_name(_name(subject))
                   .issuer_name(_name(issuer)).public_key(public)
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder

    ca = build("test CA", ca_key.public_key(), "test CA", True).sign(ca_key, hashes.SHA256())
    cert = build("agent", key.public_key(), "test CA", False).sign(ca_key, hashes.SHA256())
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return folder


def web_config(folder: Path, *, tls: bool = True, users: bool = True, extra: str = "") -> Path:
    """A web config file as an operator writes it: relative file names, an htpasswd-style
    $2y$ hash."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    text = ""
    if tls:
        text += "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
    if users:
        text += f"basic_auth_users:\n  prometheus: '{hashed.replace('$2b$', '$2y$', 1)}'\n"
    path = folder / "web-config.yml"
    path.write_text(text + extra)
    return path


def snapshot() -> Snapshot:
    return Snapshot(taken_at=time.time(), gpus=(GpuReading(
        index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:10:00.0",
        duty_cycle=25.0),))


class Log:
    def __getattr__(self, level: str) -> Any:
        return lambda *args, **fields: None


def get(url: str, ca: Path | None = None, user: str = "", password: str = ""
        ) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url)
    if user:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


@pytest.fixture
def tls_server(tmp_path: Path) -> Any:
    folder = make_tls(tmp_path / "tls")
    config = web_config_file(str(web_config(folder)))
    assert config is not None and config.users
    app = basic_auth(make_app(snapshot, 5.0, Log()), config.users)
    httpd, _ = serve("127.0.0.1", 0, app, tls=config.ssl_context(), read_timeout_s=2.0)
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}", folder / "ca.pem"
    finally:
        httpd.shutdown()
        httpd.server_close()


class TestServer:
    """A real TLS client: the CA verifies the agent; basic auth guards /metrics only."""

    def test_tls_and_basic_auth(self, tls_server: tuple[str, Path]) -> None:
        address, ca = tls_server
        status, _, body = get(f"https://{address}/metrics", ca, "prometheus", PASSWORD)
        assert status == 200 and "gpu_node_installer_gpu_duty_cycle_ratio{" in body
        status, headers, _ = get(f"https://{address}/metrics", ca)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert get(f"https://{address}/metrics", ca, "prometheus", "wrong")[0] == 401
        assert get(f"https://{address}/metrics", ca, "nobody", PASSWORD)[0] == 401
        assert get(f"https://{address}/healthz", ca)[0] == 200  # probes carry no credentials
        with pytest.raises(urllib.error.URLError) as untrusted:
            get(f"https://{address}/metrics", None, "prometheus", PASSWORD)  # system CAs
        assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises((ConnectionError, urllib.error.URLError)):
            get(f"http://{address}/metrics")  # plain HTTP gets no answer
        # the server still serves after the failed handshakes
        assert get(f"https://{address}/metrics", ca, "prometheus", PASSWORD)[0] == 200

    def test_prometheus_scrapes_with_basic_auth(self, tls_server: tuple[str, Path],
                                                tmp_path: Path) -> None:
        address, ca = tls_server
        scrape = {"scheme": "https", "tls_config": {"ca_file": str(ca)},
                  "basic_auth": {"username": "prometheus", "password": PASSWORD}}
        with running([address], tmp_path / "prom", scrape=scrape) as prom:
            assert prom.values("up") == {frozenset({("instance", address),
                                                    ("job", prom.targets()[0]["labels"]["job"])}):
                                         1.0}
            duty = prom.values("gpu_node_installer_gpu_duty_cycle_ratio")
            assert list(duty.values()) == [0.25]
            assert prom.targets()[0]["scrapeUrl"] == f"https://{address}/metrics"


class TestFile:
    """Bad files: one line naming the setting and the cause (exit 2, config)."""

    @pytest.mark.parametrize(("extra", "cause"), [
        ("rate_limit:\n  interval: 1s\n  burst: 2\n", "it sets rate_limit, which this agent"),
        ("http_server_config:\n  http2: false\n", "it sets http_server_config"),
    ])
    def test_unimplemented_keys_are_refused(self, tmp_path: Path, extra: str,
                                            cause: str) -> None:
        path = web_config(make_tls(tmp_path), extra=extra)
        with pytest.raises(Invalid) as caught:
            web_config_file(str(path))
        assert cause in str(caught.value.reason)

    @pytest.mark.parametrize(("text", "cause"), [
        ("tls_server_config:\n  cert_file: cert.pem\n", "needs both cert_file and key_file"),
        ("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
         "  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "sets cipher_suites"),
        ("tls_server_config:\n  cert_file: cert.pem\n  key_file: nokey.pem\n",
         "key_file"),
        ("tls_server_config:\n  cert_file: key.pem\n  key_file: cert.pem\n",
         "does not load"),
        ("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
         "  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        ("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
         "  min_version: TLS10\n", "min_version 'TLS10' is not one of TLS12, TLS13"),
        ("basic_auth_users:\n  prometheus: plaintext\n", "is not a bcrypt hash"),
        ("basic_auth_users: [a, b]\n", "basic_auth_users is not a mapping"),
        ("- a list\n", "not a YAML mapping"),
        ("tls_server_config: {cert_file: [\n", "is not YAML"),
    ])
    def test_bad_files(self, tmp_path: Path, text: str, cause: str) -> None:
        folder = make_tls(tmp_path)
        (folder / "web-config.yml").write_text(text)
        with pytest.raises(Invalid) as caught:
            web_config_file(str(folder / "web-config.yml"))
        assert cause in str(caught.value.reason)

    def test_setting_is_a_path_the_agent_loads(self, tmp_path: Path) -> None:
        """The setting holds the path only: the install container, which shares the
        settings but not the Secret, never reads it; the agent's load refuses."""
        roots = {"HOST_ROOT": str(tmp_path), "PROC_ROOT": str(tmp_path),
                 "SYS_ROOT": str(tmp_path)}
        assert load_config({}, roots).metrics_web_config_file == ""
        assert load("") is None
        absent = str(tmp_path / "absent.yml")
        config = load_config({}, {**roots, "METRICS_WEB_CONFIG_FILE": absent})
        with pytest.raises(ConfigError) as caught:
            load(config.metrics_web_config_file)
        assert str(caught.value).startswith(f"METRICS_WEB_CONFIG_FILE={absent!r} is invalid: "
                                            "it cannot be read")
        assert caught.value.code == 2
        good = load(str(web_config(make_tls(tmp_path / "tls"), tls=False)))
        assert good is not None and list(good.users) == ["prometheus"]
        assert good.ssl_context() is None  # basic auth over plain HTTP


def test_the_agent_serves_https_with_basic_auth(tmp_path: Path, package: Package) -> None:
    folder = make_tls(tmp_path / "tls")
    node, base = metrics_node(tmp_path, package, [gpu_line(i) for i in range(GPUS)],
                              METRICS_WEB_CONFIG_FILE=str(web_config(folder)),
                              METRICS_GPM_INTERVAL="0")
    url = base.replace("http://", "https://") + "/metrics"
    with node.agent():
        deadline, answer = time.monotonic() + 60, (0, {}, "")
        while time.monotonic() < deadline:
            try:
                answer = get(url, folder / "ca.pem", "prometheus", PASSWORD)
            except (OSError, urllib.error.URLError):
                answer = (0, {}, "")
            if answer[0] == 200 and "duty_cycle_gpu_node{" in answer[2]:
                break
            time.sleep(0.3)
        unauthorized = get(url, folder / "ca.pem")[0]
    assert answer[0] == 200 and "duty_cycle_gpu_node{" in answer[2], node.log()[-2000:]
    assert unauthorized == 401
    assert '"tls": true' in node.log() or "tls=True" in node.log(), node.log()[-2000:]


def test_the_agent_refuses_a_bad_file_in_one_line(tmp_path: Path, package: Package) -> None:
    folder = make_tls(tmp_path / "tls")
    bad = web_config(folder, extra="rate_limit:\n  interval: 1s\n  burst: 2\n")
    node, _ = metrics_node(tmp_path, package, [gpu_line(0)], METRICS_WEB_CONFIG_FILE=str(bad))
    done = subprocess.run(node.command("agent"), env=node.env, capture_output=True, text=True,
                          timeout=60, check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error(")]
    assert errors == [f"error(config): METRICS_WEB_CONFIG_FILE={str(bad)!r} is invalid: it sets "
                      "rate_limit, which this agent does not implement (it serves "
                      "tls_server_config and basic_auth_users); fix: correct the web config "
                      "file (docs/metrics.md, 'TLS and basic auth') or unset "
                      "METRICS_WEB_CONFIG_FILE"], done.stderr
    assert "Traceback" not in done.stderr
