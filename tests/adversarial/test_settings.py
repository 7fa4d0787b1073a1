"""Settings a careless or hostile operator gives, through the real CLI.

Each bad value is refused before anything is written: exit 2 (7 for a package whose own
default module parameter would smuggle a second one), one line naming the setting as it was
given (the flag, or the env var), no traceback, and the arena unchanged.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from httpserver import self_signed

from adversarial.harness import VERSION, WORK_AREA, Arena, Result, refused_untouched


def _install(arena: Arena, *flags: str, env: dict[str, str] | None = None,
             node_flags: bool = True) -> Result:
    """`install` from the arena's repository, with `flags` and `env` added.

    Config failures are reported to $TERMINATION_LOG (no config yet): point it into work/.
    """
    base = [*arena.args(), "--driver-version", VERSION]
    if not node_flags:  # the host roots then come from the environment
        base = base[6:]
    if not any(f.startswith("--mirror") for f in flags) and "DRIVER_MIRRORS" not in (env or {}):
        base += ["--mirror", f"file://{arena.scene.repo}"]
    return arena.run("install", *base, *flags,
                     env={"TERMINATION_LOG": str(arena.termination_log), **(env or {})})


def _refused_untouched(arena: Arena, flags: tuple[str, ...], env: dict[str, str],
                       *causes: str, code: int = 2, allowed: tuple[str, ...] = ()) -> Result:
    return refused_untouched(arena, lambda: _install(arena, *flags, env=env), code, *causes,
                             allowed=allowed)


# (id, flags, env, causes): each names the setting exactly as it was given
CONTROL_CHARACTERS = [
    ("install-dir-newline-flag", ("--install-dir", "/opt/nvidia\n/etc"), {},
     ("--install-dir=", "U+000A")),
    ("install-dir-newline-env", (), {"NVIDIA_INSTALL_DIR_HOST": "/opt/nvidia\n/etc"},
     ("NVIDIA_INSTALL_DIR_HOST=", "U+000A")),
    ("cache-dir-cr-flag", ("--cache-dir", "/var/cache/x\ry"), {}, ("--cache-dir=", "U+000D")),
    ("cache-dir-escape-env", (), {"DRIVER_CACHE_DIR": "/var/cache/\x1b[31mx"},
     ("DRIVER_CACHE_DIR=", "U+001B")),
    ("preloaded-dir-line-separator-env", (), {"DRIVER_PRELOADED_DIR": "/x\u2028y"},
     ("DRIVER_PRELOADED_DIR=", "U+2028")),
    ("termination-log-newline-flag", ("--termination-log", "/tmp/x\ny"), {},
     ("--termination-log=",)),
    ("service-account-dir-c1-env", (), {"SERVICE_ACCOUNT_DIR": "/var/run/\x85x"},
     ("SERVICE_ACCOUNT_DIR=", "U+0085")),
    ("dev-root-bidi-override-flag", ("--dev-root", "/dev/\u202eved"), {},
     ("--dev-root=", "U+202E")),
    ("params-file-tab-env", (), {"NVIDIA_MODULE_PARAMS_FILE": "/etc/x\tparams"},
     ("NVIDIA_MODULE_PARAMS_FILE=",)),
]

NUMBERS = [
    ("retries-superscript-env", (), {"DOWNLOAD_RETRIES": "²"}, ("DOWNLOAD_RETRIES='²'",)),
    ("retries-arabic-indic-flag", ("--download-retries", "\u0661\u0662"), {},
     ("--download-retries=",)),
    ("lock-timeout-nan-env", (), {"LOCK_TIMEOUT": "nan"}, ("LOCK_TIMEOUT='nan'",)),
    ("lock-timeout-inf-flag", ("--lock-timeout", "inf"), {}, ("--lock-timeout='inf'",)),
    ("deadline-1e999-env", (), {"DOWNLOAD_DEADLINE": "1e999"}, ("DOWNLOAD_DEADLINE='1e999'",)),
    ("deadline-underscore-flag", ("--download-deadline", "1_000"), {},
     ("--download-deadline='1_000'",)),
    ("cache-keep-5000-digits-env", (), {"DRIVER_CACHE_KEEP": "9" * 5000},
     ("DRIVER_CACHE_KEEP=",)),
    ("read-timeout-negative-flag", ("--read-timeout=-1",), {}, ("--read-timeout='-1'",)),
    ("parallel-fullwidth-env", (), {"DOWNLOAD_PARALLEL": "\uff14"}, ("DOWNLOAD_PARALLEL=",)),
]

URLS = [
    ("mirror-unbalanced-bracket-env", (), {"DRIVER_MIRRORS": "http://[::1"},
     ("DRIVER_MIRRORS='http://[::1'",)),
    ("mirror-port-out-of-range-flag", ("--mirror", "https://h:99999/"), {},
     ("--mirror='https://h:99999/'", "port '99999'")),
    ("kube-api-port-not-numeric-flag", ("--kube-api", "https://h:x/"), {},
     ("--kube-api='https://h:x/'", "port 'x'")),
    ("kube-api-empty-host-env", (), {"KUBE_API_URL": "https://:443/"},
     ("KUBE_API_URL='https://:443/'",)),
    ("mirror-space-flag", ("--mirror", "https://mirror example.com/"), {},
     ("--mirror=", "space")),
    ("mirror-stray-bracket-env", (), {"DRIVER_MIRRORS": "https://h]/"},
     ("DRIVER_MIRRORS='https://h]/'",)),
]

MODULE_PARAMS = [
    ("second-param-after-space-flag",
     ("--module-param", "nvidia.NVreg_X=1 nvidia_uvm.uvm_perf=0"), {}, ("--module-param=",)),
    ("second-pair-without-module-env", (), {"NVIDIA_MODULE_PARAMS": "nvidia.NVreg_X=1,NVreg_Y=2"},
     ("NVIDIA_MODULE_PARAMS='NVreg_Y=2'",)),
    ("quoted-space-flag", ("--module-param", 'nvidia.k="a b"'), {}, ("--module-param=",)),
    ("single-quote-flag", ("--module-param", "nvidia.k=it's"), {}, ("--module-param=",)),
    ("quoted-value-env", (), {"NVIDIA_MODULE_PARAMS": 'nvidia.k="1"'},
     ("NVIDIA_MODULE_PARAMS=",)),
    ("tab-in-value-flag", ("--module-param", "nvidia.k=1\tNVreg_Y=2"), {},
     ("--module-param=",)),
    ("bad-module-name-flag", ("--module-param", "nvi/dia.k=1"), {}, ("--module-param=",)),
    ("bad-key-env", (), {"NVIDIA_MODULE_PARAMS": "nvidia.NV-reg=1"},
     ("NVIDIA_MODULE_PARAMS='nvidia.NV-reg=1'",)),
    ("non-ascii-value-env", (), {"NVIDIA_MODULE_PARAMS": "nvidia.k=caf\u00e9"},
     ("NVIDIA_MODULE_PARAMS=",)),
]

CASES = CONTROL_CHARACTERS + NUMBERS + URLS + MODULE_PARAMS


@pytest.mark.parametrize(("flags", "env", "causes"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_setting_is_refused_before_any_write(arena: Arena, flags: tuple[str, ...],
                                                 env: dict[str, str], causes: tuple[str, ...]
                                                 ) -> None:
    done = _refused_untouched(arena, flags, env, *causes)
    assert "error(config)" in done.lines[0]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_host_root_with_a_newline(arena: Arena, how: str) -> None:
    bad = f"{arena.root}\n"

    def run() -> Result:
        if how == "flag":
            return _install(arena, "--host-root", bad)
        return _install(arena, "--proc-root", str(arena.root / "proc"), "--sys-root",
                        str(arena.root / "sys"), env={"HOST_ROOT": bad}, node_flags=False)

    refused_untouched(arena, run, 2, "--host-root=" if how == "flag" else "HOST_ROOT=",
                      "U+000A", allowed=())


def test_termination_log_env_with_a_newline_is_not_written(arena: Arena) -> None:
    """The refusal is not copied to a path that failed its own check."""
    bad = f"{arena.outside}/etc/termination\nlog"
    refused_untouched(arena, lambda: arena.run(
        "install", *arena.args()[:-2], "--mirror", f"file://{arena.scene.repo}",
        env={"TERMINATION_LOG": bad}), 2, "TERMINATION_LOG=", "U+000A", allowed=())


# --- the module-params file, checked when the config loads


@pytest.mark.parametrize("how", ["flag", "env"])
def test_params_file_with_a_smuggling_line(arena: Arena, how: str) -> None:
    path = arena.scene.work / "params.conf"
    path.write_text("# tuned\nnvidia.NVreg_EnableMSI=0\nnvidia.NVreg_X=1 nvidia.NVreg_Y=2\n")
    flags, env = ((("--module-params-file", str(path)), {}) if how == "flag" else
                  ((), {"NVIDIA_MODULE_PARAMS_FILE": str(path)}))
    name = "--module-params-file" if how == "flag" else "NVIDIA_MODULE_PARAMS_FILE"
    _refused_untouched(arena, flags, env, name, str(path), "line 3")


def test_params_file_not_utf8(arena: Arena) -> None:
    path = arena.scene.work / "params.conf"
    path.write_bytes(b"nvidia.NVreg_X=\xff\n")
    _refused_untouched(arena, (), {"NVIDIA_MODULE_PARAMS_FILE": str(path)},
                       "NVIDIA_MODULE_PARAMS_FILE", "not UTF-8")


# --- CA bundles


@pytest.mark.parametrize(("how", "content", "why"), [
    ("flag", b"just text\n", "no PEM certificate"),
    ("env", b"", "no PEM certificate"),
    ("env", b"-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASC\n"
            b"-----END PRIVATE KEY-----\n", "no PEM certificate"),
    ("flag", b"0\x82\x03\x0b0\x82\x01\xf3" + bytes(600), "no PEM certificate"),
], ids=["text-flag", "empty-env", "private-key-env", "der-flag"])
def test_ca_bundle_not_pem(arena: Arena, how: str, content: bytes, why: str) -> None:
    path = arena.scene.work / "ca.pem"
    path.write_bytes(content)
    flags, env = ((("--ca-bundle", str(path)), {}) if how == "flag" else
                  ((), {"DRIVER_CA_BUNDLE": str(path)}))
    _refused_untouched(arena, flags, env, "--ca-bundle" if how == "flag" else "DRIVER_CA_BUNDLE",
                       str(path), why)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_ca_bundle_is_a_directory(arena: Arena, how: str) -> None:
    path = arena.scene.work
    flags, env = ((("--ca-bundle", str(path)), {}) if how == "flag" else
                  ((), {"DRIVER_CA_BUNDLE": str(path)}))
    _refused_untouched(arena, flags, env, "--ca-bundle" if how == "flag" else "DRIVER_CA_BUNDLE",
                       "is a directory")


# --- a package whose own default parameter would smuggle a second one: integrity, exit 7


def _with_default_param(repo: Path, key: str, value: str) -> None:
    """Rewrite the package's manifest with a default parameter; re-point the index at it."""
    path = next(repo.glob("*/*/*/manifest.json"))
    manifest = json.loads(path.read_text())
    manifest["modules"][0]["params"] = {key: value}
    data = json.dumps(manifest, indent=1).encode() + b"\n"
    path.write_bytes(data)
    index = json.loads((repo / "index.json").read_text())
    for entry in index["packages"]:
        entry["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (repo / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(("key", "value"), [("NVreg_X", "1 NVreg_EnableMSI=0"),
                                            ("NVreg X", "1"), ("NVreg_X", '"1"')],
                         ids=["space-in-value", "space-in-name", "quotes"])
def test_package_with_a_smuggling_default_parameter(arena: Arena, key: str, value: str
                                                    ) -> None:
    _with_default_param(arena.scene.repo, key, value)
    (arena.install_dir / ".cache").mkdir(parents=True)  # as after an earlier run
    # refused when the manifest is validated: nothing reaches the cache;
    # the simulated kernel writes its (empty) state when it starts: nothing was loaded
    allowed = (*WORK_AREA, "node/proc/.fake-kernel.json", "node/proc/devices")
    _refused_untouched(arena, (), {}, "error(integrity)", "[fetch]", "default parameter",
                       f"nvidia.{key}", str(arena.scene.repo), code=7, allowed=allowed)
    kernel = json.loads((arena.root / "proc" / ".fake-kernel.json").read_text())
    assert kernel["modules"] == {}
    assert not (arena.install_dir / ".ready.json").exists()


# --- what is legitimate still works


def test_legitimate_values_still_install(arena: Arena, tmp_path: Path) -> None:
    """A '=' inside a value (NVreg_RegistryDwords), decimals, a real CA bundle, an IPv6
    kube API: accepted, and the kernel gets exactly the parameter given."""
    cert, _ = self_signed(tmp_path)
    done = _install(arena, "--lock-timeout", "2.5", "--ca-bundle", str(cert), env={
        "NVIDIA_MODULE_PARAMS": "nvidia.NVreg_RegistryDwords=PowerMizerEnable=0x1;Perf=0x2, "
                                "nvidia-uvm.uvm_perf_prefetch_enable=0",
        "DOWNLOAD_RETRIES": " 3 ", "KUBE_API_URL": "https://[::1]:6443"})
    assert done.code == 0, done.stderr[-3000:]
    kernel = json.loads((arena.root / "proc" / ".fake-kernel.json").read_text())
    assert kernel["modules"]["nvidia"]["params"] == (
        "NVreg_RegistryDwords=PowerMizerEnable=0x1;Perf=0x2")
    assert kernel["modules"]["nvidia_uvm"]["params"] == "uvm_perf_prefetch_enable=0"


@pytest.mark.parametrize("flag_value", [
    "https://user:hunter2@h:99999/repo?token=s3cret",
    "http://user:hunter2@mirror.example/repo?token=s3cret",
])
def test_a_refused_mirror_url_never_shows_its_credentials(arena: Arena, flag_value: str) -> None:
    done = refused_untouched(arena, lambda: arena.run("fetch", *arena.args("--mirror", flag_value)),
                             2, "mirror", "://", allowed=())
    log = arena.termination_log.read_text() if arena.termination_log.exists() else ""
    for secret in ("hunter2", "s3cret", "user:"):
        assert secret not in done.stderr and secret not in done.stdout and secret not in log
