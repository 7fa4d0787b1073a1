"""config.upgrade: the upgrade policy's settings are validated before any I/O (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from installer.cli import cli
from installer.config import load_config
from installer.config.upgrade import grace_period, max_unavailable
from installer.config.values import Invalid
from installer.errors import ConfigError


def _config(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    roots = {"HOST_ROOT": str(tmp_path), "PROC_ROOT": str(tmp_path), "SYS_ROOT": str(tmp_path)}
    return load_config({}, {**roots, **env})


class TestDefaults:
    def test_refuse_is_the_default_and_needs_no_node_name(self, tmp_path: Path) -> None:
        config = _config(tmp_path)
        assert config.upgrade_policy == "refuse"
        assert (config.upgrade_timeout, config.upgrade_grace_period) == (900.0, None)
        assert config.upgrade_restart_daemonsets is False
        assert config.upgrade_max_unavailable == "1"

    def test_evict_with_every_value(self, tmp_path: Path) -> None:
        config = _config(tmp_path, UPGRADE_POLICY="Evict", NODE_NAME="gpu-1",
                         UPGRADE_TIMEOUT="120.5", UPGRADE_GRACE_PERIOD="30",
                         UPGRADE_RESTART_DAEMONSETS="true", UPGRADE_MAX_UNAVAILABLE="25%")
        assert (config.upgrade_policy, config.upgrade_timeout) == ("evict", 120.5)
        assert (config.upgrade_grace_period, config.upgrade_restart_daemonsets) == (30, True)
        assert config.upgrade_max_unavailable == "25%"


class TestRefusals:
    @pytest.mark.parametrize(("env", "named"), [
        ({"UPGRADE_POLICY": "kill"}, "UPGRADE_POLICY='kill'"),
        ({"UPGRADE_TIMEOUT": "0"}, "UPGRADE_TIMEOUT='0'"),
        ({"UPGRADE_TIMEOUT": "-5"}, "UPGRADE_TIMEOUT='-5'"),
        ({"UPGRADE_TIMEOUT": "1e9"}, "UPGRADE_TIMEOUT='1e9'"),
        ({"UPGRADE_TIMEOUT": "90000"}, "UPGRADE_TIMEOUT='90000'"),
        ({"UPGRADE_GRACE_PERIOD": "-1"}, "UPGRADE_GRACE_PERIOD='-1'"),
        ({"UPGRADE_GRACE_PERIOD": "1.5"}, "UPGRADE_GRACE_PERIOD='1.5'"),
        ({"UPGRADE_GRACE_PERIOD": "86401"}, "UPGRADE_GRACE_PERIOD='86401'"),
        ({"UPGRADE_MAX_UNAVAILABLE": "0"}, "UPGRADE_MAX_UNAVAILABLE='0'"),
        ({"UPGRADE_MAX_UNAVAILABLE": "0%"}, "UPGRADE_MAX_UNAVAILABLE='0%'"),
        ({"UPGRADE_MAX_UNAVAILABLE": "101%"}, "UPGRADE_MAX_UNAVAILABLE='101%'"),
        ({"UPGRADE_MAX_UNAVAILABLE": "2.5"}, "UPGRADE_MAX_UNAVAILABLE='2.5'"),
        ({"UPGRADE_RESTART_DAEMONSETS": "maybe"}, "UPGRADE_RESTART_DAEMONSETS='maybe'"),
    ])
    def test_one_line_naming_the_setting(self, tmp_path: Path, env: dict[str, str],
                                         named: str) -> None:
        with pytest.raises(ConfigError) as caught:
            _config(tmp_path, **env)
        assert named in caught.value.one_line()
        assert caught.value.code == 2

    @pytest.mark.parametrize("policy", ["evict", "drain"])
    def test_eviction_needs_the_node_name(self, tmp_path: Path, policy: str) -> None:
        with pytest.raises(ConfigError, match="needs this node's name"):
            _config(tmp_path, UPGRADE_POLICY=policy)

    def test_cli_exits_2_before_touching_the_host(self, tmp_path: Path) -> None:
        """The host root does not even exist: the policy is refused first."""
        missing = tmp_path / "no-such-root"
        done = CliRunner().invoke(cli, ["install", "--host-root", str(missing)],
                                  env={"UPGRADE_POLICY": "evict-all"})
        assert done.exit_code == 2
        assert "UPGRADE_POLICY='evict-all' is invalid" in done.output
        assert not missing.exists()


class TestParsers:
    @pytest.mark.parametrize(("text", "value"), [("pod", None), ("", None), ("0", 0),
                                                 ("600", 600)])
    def test_grace_period(self, text: str, value: int | None) -> None:
        assert grace_period(text) == value

    @pytest.mark.parametrize(("text", "value"), [("1", "1"), ("007", "7"), ("10%", "10%"),
                                                 ("100%", "100%")])
    def test_max_unavailable(self, text: str, value: str) -> None:
        assert max_unavailable(text) == value

    @pytest.mark.parametrize("text", ["", "-1", "1%%", "%", "50 %", "٣"])
    def test_max_unavailable_refusals(self, text: str) -> None:
        with pytest.raises(Invalid):
            max_unavailable(text)
