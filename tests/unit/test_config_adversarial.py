"""Settings a careless or hostile operator might give: refused, exit 2.

hypothesis feeds every parser and load_config as a whole random text: only the installer's
own ConfigError may come out. Module parameters: tests/unit/test_modparams.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from httpserver import self_signed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from installer.config import SETTINGS, SETTINGS_BY_NAME, load_config
from installer.config.modparams import read_params_file
from installer.config.values import Invalid, pem_bundle
from installer.errors import ConfigError

# --- every setting through load_config


def _refused(roots: dict[str, str], name: str, value: str, *, env: bool) -> str:
    setting = SETTINGS_BY_NAME[name]
    assert setting.envvar is not None
    others = {key: root for key, root in roots.items() if key != name}
    flags = others if env else {**others, name: (value,) if setting.multiple else value}
    with pytest.raises(ConfigError) as info:
        load_config(flags, {setting.envvar: value} if env else {})
    line = info.value.one_line()
    assert "\n" not in line and "\r" not in line and info.value.code == 2
    assert (setting.envvar if env else setting.flag) in line
    return line


PATHS = ["host_root", "proc_root", "sys_root", "dev_root", "install_dir", "termination_log",
         "preloaded_dir", "cache_dir", "ca_bundle", "service_account_dir", "module_params_file"]
CONTROLS = ["\n", "\x00", "\x7f", "\x85", "\x1b[31m", "\r", "\u2028", "\u202e", "\udcff", "\t"]


class TestPaths:
    @pytest.mark.parametrize("name", PATHS)
    @pytest.mark.parametrize("control", CONTROLS)
    def test_control_characters(self, roots: dict[str, str], name: str, control: str) -> None:
        value = f"{roots['host_root']}/a{control}b"
        line = _refused(roots, name, value, env=True)
        assert repr(value) in line
        _refused(roots, name, value, env=False)

    def test_newline_in_install_dir_names_it(self, roots: dict[str, str]) -> None:
        line = _refused(roots, "install_dir", "/opt/nvidia\n/etc", env=True)
        assert "NVIDIA_INSTALL_DIR_HOST='/opt/nvidia\\n/etc' is invalid" in line
        assert "U+000A" in line

    @pytest.mark.parametrize("value", ["/opt/nvidia", "/opt/nvidia driver", "/opt/nvídia",
                                       "/opt/nv~1/x-y_z.d", "/opt/日本"])
    def test_ordinary_paths_stay_valid(self, roots: dict[str, str], value: str) -> None:
        config = load_config(roots, {"NVIDIA_INSTALL_DIR_HOST": value,
                                     "DRIVER_CACHE_DIR": value})
        assert str(config.install_dir) == value and str(config.cache_dir) == value


NUMBERS = {
    "lock_timeout": "LOCK_TIMEOUT", "connect_timeout": "DOWNLOAD_CONNECT_TIMEOUT",
    "read_timeout": "DOWNLOAD_READ_TIMEOUT", "download_deadline": "DOWNLOAD_DEADLINE",
    "cache_keep": "DRIVER_CACHE_KEEP", "download_retries": "DOWNLOAD_RETRIES",
    "download_parallel": "DOWNLOAD_PARALLEL",
}
BAD_NUMBERS = ["²", "\u0661\u0662", "1_000", "nan", "NaN", "inf", "-inf", "1e999", "1e3", "0x10",
               "+5", "-1", "", " ", "5 5", "9" * 5000, "1." * 3, "\u0661", "\uff15", "0", "0.0",
               "1,5"]


class TestNumbers:
    @pytest.mark.parametrize("name", list(NUMBERS))
    @pytest.mark.parametrize("value", BAD_NUMBERS)
    def test_refused(self, roots: dict[str, str], name: str, value: str) -> None:
        _refused(roots, name, value, env=True)
        if value.strip():
            _refused(roots, name, value, env=False)

    @pytest.mark.parametrize(("value", "number"), [("300", 300.0), ("0.5", 0.5), (".5", 0.5),
                                                   ("2.", 2.0), (" 30 ", 30.0), ("007", 7.0)])
    def test_decimals_stay_valid(self, roots: dict[str, str], value: str, number: float
                                 ) -> None:
        assert load_config(roots, {"LOCK_TIMEOUT": value}).lock_timeout == number

    def test_integers_stay_valid(self, roots: dict[str, str]) -> None:
        config = load_config(roots, {"DOWNLOAD_RETRIES": " 6", "DRIVER_CACHE_KEEP": "100"})
        assert (config.download_retries, config.cache_keep) == (6, 100)


BAD_URLS = ["http://[::1", "https://h:99999/", "https://h:x/", "https://h:0/", "https://:443/",
            "https:///x", "https://h]/", "https://[::1]x/", "https://[zz]/", "https://h /x",
            "https://h/a b", "https://a:b:c/", "https://h:-1/", "https://h:+1/", "https://h\x00/",
            "https://h\n/", "https://ħ/", "https://[::1]:99999/", "https://u@/", "https://h:٨٠/"]
GOOD_URLS = ["https://mirror.example.com", "https://h:8443/repo/", "http://127.0.0.1:9/",
             "https://[::1]:8443/x", "https://[fe80::1%25eth0]/", "https://user:tok@h/p?q=1#f",
             "https://h:/", "https://my_host.internal./nvidia"]


class TestUrls:
    @pytest.mark.parametrize("value", BAD_URLS)
    def test_bad_mirror(self, roots: dict[str, str], value: str) -> None:
        _refused(roots, "mirrors", value, env=False)
        if not any(c in value for c in " \n"):  # the env var splits on whitespace
            _refused(roots, "mirrors", value, env=True)

    @pytest.mark.parametrize("value", BAD_URLS)
    def test_bad_kube_api(self, roots: dict[str, str], value: str) -> None:
        _refused(roots, "kube_api", value, env=True)
        _refused(roots, "kube_api", value, env=False)

    @pytest.mark.parametrize("value", GOOD_URLS)
    def test_good_urls_stay_valid(self, roots: dict[str, str], value: str) -> None:
        config = load_config({**roots, "mirrors": (value,), "allow_http": True},
                             {"KUBE_API_URL": value})
        assert config.mirrors == (value.rstrip("/"),)
        assert config.kube_api == value.rstrip("/")

    @pytest.mark.parametrize("value", ["file:///srv/repo", "FILE:///srv/a%20b/"])
    def test_file_mirrors_stay_valid(self, roots: dict[str, str], value: str) -> None:
        assert load_config({**roots, "mirrors": (value,)}, {}).mirrors[0].startswith("file:///")

    def test_env_list_still_splits_on_ascii_whitespace_and_commas(
            self, roots: dict[str, str]) -> None:
        config = load_config(roots, {"DRIVER_MIRRORS": "https://a,\n\thttps://b  https://c"})
        assert config.mirrors == ("https://a", "https://b", "https://c")

    def test_unicode_separator_is_not_a_separator(self, roots: dict[str, str]) -> None:
        _refused(roots, "mirrors", "https://a\x85https://b", env=True)


class TestCaBundle:
    def test_a_real_certificate(self, roots: dict[str, str], tmp_path: Path) -> None:
        cert, _ = self_signed(tmp_path)
        assert load_config(roots, {"DRIVER_CA_BUNDLE": str(cert)}).ca_bundle == cert

    @pytest.mark.parametrize(("content", "why"), [
        (b"", "no PEM certificate"),
        (b"not a certificate\n", "no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "no PEM"),
        (b"-----BEGIN CERTIFICATE-----\nMIIB\n", "no PEM certificate"),
        (b"-----BEGIN PRIVATE KEY-----\nMIIBVQIBADANBgkqhkiG9w0BAQEFAASC\n"
         b"-----END PRIVATE KEY-----", "no PEM certificate"),
        (b"\x30\x82\x01\x0a" + bytes(300), "no PEM certificate"),
    ])
    def test_not_pem(self, roots: dict[str, str], tmp_path: Path, content: bytes, why: str
                     ) -> None:
        path = tmp_path / "ca.pem"
        path.write_bytes(content)
        line = _refused(roots, "ca_bundle", str(path), env=True)
        assert str(path) in line and why in line
        _refused(roots, "ca_bundle", str(path), env=False)

    def test_directory(self, roots: dict[str, str], tmp_path: Path) -> None:
        line = _refused(roots, "ca_bundle", str(tmp_path), env=False)
        assert "is a directory" in line

    def test_missing(self, roots: dict[str, str], tmp_path: Path) -> None:
        line = _refused(roots, "ca_bundle", str(tmp_path / "absent.pem"), env=True)
        assert "cannot be read" in line

    def test_the_check_imports_nothing_heavy(self) -> None:
        import subprocess
        import sys

        code = ("import sys, installer.config; "
                "print(sorted(m for m in ('ssl', 'requests', 'pynvml') "
                "if m in sys.modules))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)
        assert done.stdout.strip() == "[]"


# --- hypothesis: nothing but ConfigError out of any setting

_TEXT = st.text(max_size=30) | st.sampled_from(
    ["/", "/x", "1", "0.5", "http://[::1", "https://h:99999", "file:///x", "nvidia.k=1", "\n",
     "true", "535", "\udcff", "\x00", "9" * 400])


@settings(max_examples=300)
@given(st.sampled_from([s for s in SETTINGS]), _TEXT)
def test_every_parser_raises_only_invalid(setting: object, text: str) -> None:
    with contextlib.suppress(Invalid):
        setting.parse(text)  # type: ignore[attr-defined]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(st.sampled_from([s.envvar for s in SETTINGS if s.envvar]), _TEXT),
       flags=st.dictionaries(st.sampled_from([s.name for s in SETTINGS]), _TEXT),
       keep_roots=st.booleans())
def test_load_config_raises_only_config_error(roots: dict[str, str], env: dict[str, str],
                                              flags: dict[str, str], keep_roots: bool) -> None:
    given_flags: dict[str, object] = {
        name: ((value,) if SETTINGS_BY_NAME[name].multiple else value)
        for name, value in flags.items()}
    if keep_roots:
        given_flags.update(roots)
    try:
        load_config(given_flags, env)
    except ConfigError as exc:
        assert "\n" not in exc.one_line() and exc.code == 2


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400) | st.sampled_from([
    b"-----BEGIN CERTIFICATE-----\n" + b"A" * 200 + b"\n-----END CERTIFICATE-----\n",
    b"nvidia.k=1\nnvidia.j=\"x\"\n", b"-----BEGIN CERTIFICATE-----" * 50]))
def test_file_checks_raise_only_invalid(tmp_path: Path, data: bytes) -> None:
    """The CA bundle and the params file, whatever bytes they hold."""
    path = tmp_path / "file"
    path.write_bytes(data)
    for check in (pem_bundle, read_params_file):
        with contextlib.suppress(Invalid):
            check(path)
