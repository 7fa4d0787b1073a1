"""Config: flag beats env beats default; bad values fail with one line naming the setting."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from installer.config import SETTINGS, load_config
from installer.errors import ConfigError


class TestPrecedence:
    def test_defaults(self, roots: dict[str, str], tmp_path: Path) -> None:
        config = load_config(roots, {})
        assert config.install_dir == PurePosixPath("/home/kubernetes/bin/nvidia")
        assert config.driver_version == "default"
        assert config.flavour == "auto"
        assert config.dev_root == tmp_path / "dev"

    def test_env_is_read(self, roots: dict[str, str]) -> None:
        config = load_config(roots, {"NVIDIA_DRIVER_VERSION": "535",
                                     "NVIDIA_INSTALL_DIR_HOST": "/opt/nvidia"})
        assert config.driver_version == "535"
        assert config.install_dir == PurePosixPath("/opt/nvidia")

    def test_flag_wins_over_env(self, roots: dict[str, str]) -> None:
        config = load_config({**roots, "driver_version": "535.261.03"},
                             {"NVIDIA_DRIVER_VERSION": "latest"})
        assert config.driver_version == "535.261.03"

    def test_env_host_root(self, roots: dict[str, str]) -> None:
        env = {"HOST_ROOT": roots.pop("host_root")}
        assert str(load_config(roots, env).host_root) == env["HOST_ROOT"]

    @pytest.mark.parametrize("value", ["default", "LATEST", "535", "535.261.03", "550.54"])
    def test_accepted_versions(self, roots: dict[str, str], value: str) -> None:
        assert load_config({**roots, "driver_version": value}, {}).driver_version == (
            value.lower())


class TestRejection:
    @pytest.mark.parametrize(("env", "value"), [
        ("NVIDIA_DRIVER_VERSION", "5 3 5"),
        ("NVIDIA_DRIVER_VERSION", "535.261.03; rm -rf /"),
        ("NVIDIA_DRIVER_VERSION", "v535"),
        ("NVIDIA_DRIVER_FLAVOUR", "closed"),
        ("NVIDIA_INSTALL_DIR_HOST", "relative/dir"),
        ("NVIDIA_INSTALL_DIR_HOST", "/home/../etc"),
        ("LOG_FORMAT", "xml"),
        ("LOCK_TIMEOUT", "-1"),
        ("DEBUG", "maybe"),
    ])
    def test_bad_env_value_names_the_variable(self, roots: dict[str, str], env: str,
                                              value: str) -> None:
        with pytest.raises(ConfigError) as info:
            load_config(roots, {env: value})
        line = info.value.one_line()
        assert env in line and repr(value) in line and "\n" not in line
        assert info.value.code == 2

    def test_bad_flag_names_the_flag(self, roots: dict[str, str]) -> None:
        with pytest.raises(ConfigError, match="--flavour='closed'"):
            load_config({**roots, "flavour": "closed"}, {})

    def test_missing_host_root(self, roots: dict[str, str], tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"--host-root .* does not exist"):
            load_config({**roots, "host_root": str(tmp_path / "absent")}, {})

    def test_relative_root(self, roots: dict[str, str]) -> None:
        with pytest.raises(ConfigError, match="--proc-root='proc' is invalid"):
            load_config({**roots, "proc_root": "proc"}, {})


def test_every_setting_has_flag_env_and_help() -> None:
    for setting in SETTINGS:
        assert setting.flag.startswith("--") and setting.help and setting.accepted
    envvars = [s.envvar for s in SETTINGS if s.envvar]
    assert len(envvars) == len(set(envvars))


class TestCosSettings:
    """COS_SOURCE, COS_TOOLS_URL, NVIDIA_RUNFILE_URL, NODE_ZONE: checked before any I/O."""

    def test_defaults_and_values(self, roots: dict[str, str]) -> None:
        config = load_config(roots, {})
        assert (config.cos_source, config.cos_tools_url, config.node_zone) == (
            "auto", None, None)
        config = load_config(roots, {"COS_SOURCE": "NEVER", "NODE_ZONE": "europe-west4-b",
                                     "COS_TOOLS_URL": "https://mirror.internal/cos-tools/"})
        assert (config.cos_source, config.node_zone, config.cos_tools_url) == (
            "never", "europe-west4-b", "https://mirror.internal/cos-tools")

    @pytest.mark.parametrize(("env", "named"), [
        ({"COS_SOURCE": "sometimes"}, "COS_SOURCE"),
        ({"NODE_ZONE": "us central"}, "NODE_ZONE"),
        ({"NODE_ZONE": "../../etc"}, "NODE_ZONE"),
        ({"COS_TOOLS_URL": "ftp://x/cos"}, "COS_TOOLS_URL"),
        ({"NVIDIA_RUNFILE_URL": "https://u:secret@host/x\n"}, "NVIDIA_RUNFILE_URL"),
        ({"COS_TOOLS_URL": "http://mirror/cos-tools"}, "plain http://")])
    def test_refused(self, roots: dict[str, str], env: dict[str, str], named: str) -> None:
        with pytest.raises(ConfigError) as caught:
            load_config(roots, env)
        line = caught.value.one_line()
        assert named in line and "secret" not in line, line
