"""stages.partition.config: where the wanted MIG layout comes from, and what is refused.

Sources are files in a temp host tree (GKE's gpu_config.json), a mig-parted file in a temp
dir, settings, and the node label through a real HTTP server speaking the Node API
(tests/kubefake.py). Every refusal is exit 2 with one line naming the file and field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from migconfigs import MIG_PARTED
from native.contexts import make_ctx

from installer.errors import MigConfigError
from installer.stages.partition import config
from installer.stages.partition.plan import GpuLayout, GpuNow

OFF = GpuLayout(False, ())



def _gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", memory: int = 81559) -> GpuNow:
    return GpuNow(index, f"GPU-{index:08d}", name, memory, f"00000000:{10 + index:02x}:00.0",
                  OFF, False)


def _root(tmp_path: Path) -> Path:
    for sub in ("proc", "sys", "etc/nvidia"):
        (tmp_path / "n" / sub).mkdir(parents=True, exist_ok=True)
    return tmp_path / "n"


def _pci(root: Path, index: int, device: str) -> None:
    base = root / "sys/bus/pci/devices" / f"0000:{10 + index:02x}:00.0"
    base.mkdir(parents=True)
    (base / "device").write_text(f"0x{device}\n")
    (base / "vendor").write_text("0x10de\n")


class TestGke:
    def test_partition_size(self, tmp_path: Path) -> None:
        root = _root(tmp_path)
        (root / "etc/nvidia/gpu_config.json").write_text(json.dumps(
            {"GPUPartitionSize": "1g.5gb"}))
        source = config.find(make_ctx(root, mig_profile="3g.40gb"))  # GKE's file wins
        assert source is not None
        assert source.fill == "1g.5gb"
        assert "/etc/nvidia/gpu_config.json" in source.origin

    def test_empty_size_is_no_config(self, tmp_path: Path) -> None:
        root = _root(tmp_path)
        (root / "etc/nvidia/gpu_config.json").write_text('{"GPUPartitionSize": ""}')
        assert config.find(make_ctx(root)) is None

    def test_fifo_or_directory_refused_without_hanging(self, tmp_path: Path) -> None:
        import os

        root = _root(tmp_path)
        path = root / "etc/nvidia/gpu_config.json"
        os.mkfifo(path)  # opened non-blocking: no writer, no hang
        with pytest.raises(MigConfigError) as caught:
            config.find(make_ctx(root))
        assert "gpu_config.json" in caught.value.one_line()
        path.unlink()
        path.mkdir()
        with pytest.raises(MigConfigError):
            config.find(make_ctx(root))

    @pytest.mark.parametrize(("text", "names"), [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not an object"),
        ('{"GPUPartitionSize": 7}', "GPUPartitionSize is 7"),
    ])
    def test_malformed(self, tmp_path: Path, text: str, names: str) -> None:
        root = _root(tmp_path)
        (root / "etc/nvidia/gpu_config.json").write_text(text)
        with pytest.raises(MigConfigError) as caught:
            config.find(make_ctx(root))
        assert caught.value.code == 2
        line = caught.value.one_line()
        assert names in line and "gpu_config.json" in line and "fix:" in line
        assert "\n" not in line


class TestNothing:
    def test_no_source_at_all(self, tmp_path: Path) -> None:
        assert config.find(make_ctx(_root(tmp_path))) is None


class TestMigParted:
    def _file(self, tmp_path: Path, text: str = MIG_PARTED) -> Path:
        path = tmp_path / "config.yaml"
        path.write_text(text)
        return path

    def test_all_1g_10gb_on_h100_and_a100_80gb(self, tmp_path: Path) -> None:
        root = _root(tmp_path)
        _pci(root, 0, "2330")
        _pci(root, 1, "20b5")
        ctx = make_ctx(root, mig_config_file=str(self._file(tmp_path)),
                       mig_config="all-1g.10gb")
        source = config.find(ctx)
        assert source is not None
        gpus = [_gpu(0), _gpu(1, "NVIDIA A100 80GB PCIe", 81920)]
        want = source.layouts(gpus, config.pci_ids(ctx))
        assert want == {0: GpuLayout(True, (("1g.10gb", 7),)),
                        1: GpuLayout(True, (("1g.10gb", 7),))}

    def test_all_balanced_sorted_profiles(self, tmp_path: Path) -> None:
        root = _root(tmp_path)
        _pci(root, 0, "2330")
        ctx = make_ctx(root, mig_config_file=str(self._file(tmp_path)),
                       mig_config="all-balanced")
        source = config.find(ctx)
        assert source is not None
        assert source.layouts([_gpu(0)], config.pci_ids(ctx)) == {0: GpuLayout(
            True, (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)))}

    def test_device_filter_leaves_other_gpus_alone(self, tmp_path: Path) -> None:
        root = _root(tmp_path)
        _pci(root, 0, "2330")
        _pci(root, 1, "1eb8")  # a T4: no entry names it
        ctx = make_ctx(root, mig_config_file=str(self._file(tmp_path)),
                       mig_config="all-1g.10gb")
        source = config.find(ctx)
        assert source is not None
        want = source.layouts([_gpu(0), _gpu(1, "Tesla T4", 15360)], config.pci_ids(ctx))
        assert list(want) == [0]

    @pytest.mark.parametrize(("subsystem", "filters", "taken"), [
        ("147e10de", '"0x20B210DE:0x147E10DE"', True),  # the board's own subsystem
        ("147e10de", '"0x20B210DE"', True),  # a plain id matches every board of the GPU
        ("1463_10de", '"0x20B210DE:0x147E10DE"', False),  # a sibling board
        (None, '"0x20B210DE:0x147E10DE"', False),  # no subsystem known: no match
        ("147e10de", '["0x233010DE", "0x20b210de:0x147e10de"]', True),
    ])
    def test_subsystem_device_filters(self, tmp_path: Path, subsystem: str | None,
                                      filters: str, taken: bool) -> None:
        """mig-parted's `0xDDDDVVVV:0xSSSSVVVV` (pkg/types/device.go `Matches` @ bd7160f4):
        with a subsystem all four parts must match, without one the device and vendor."""
        root = _root(tmp_path)
        _pci(root, 0, "20b2")
        if subsystem:
            base = root / "sys/bus/pci/devices/0000:0a:00.0"
            device, vendor = subsystem.replace("_", "")[:4], subsystem.replace("_", "")[4:]
            (base / "subsystem_device").write_text(f"0x{device}\n")
            (base / "subsystem_vendor").write_text(f"0x{vendor}\n")
        text = ("version: v1\nmig-configs:\n  one:\n    - device-filter: " + filters +
                '\n      devices: all\n      mig-enabled: true\n'
                '      mig-devices: {"1g.10gb": 7}\n')
        ctx = make_ctx(root, mig_config_file=str(self._file(tmp_path, text)), mig_config="one")
        source = config.find(ctx)
        assert source is not None
        want = source.layouts([_gpu(0, "NVIDIA A100-SXM4-80GB", 81920)], config.pci_ids(ctx))
        assert (0 in want) == taken

    def test_devices_all_passes_over_a_gpu_without_mig_and_says_so(self,
                                                                    tmp_path: Path) -> None:
        """mig-parted's apply skips a non-MIG-capable GPU under `devices: all`
        (cmd/nvidia-mig-parted/apply/config.go @ bd7160f4)."""
        text = ('version: v1\nmig-configs:\n  all-1g.10gb:\n    - devices: all\n'
                '      mig-enabled: true\n      mig-devices: {"1g.10gb": 7}\n')
        ctx = make_ctx(_root(tmp_path), mig_config_file=str(self._file(tmp_path, text)),
                       mig_config="all-1g.10gb")
        source = config.find(ctx)
        assert source is not None
        told: list[int] = []
        gpus = [_gpu(0), _gpu(1, "Tesla T4", 15360), _gpu(2)]
        want = source.layouts(gpus, lambda gpu: None, lambda gpu: told.append(gpu.index))
        assert sorted(want) == [0, 2] and told == [1]

    def test_custom_per_device(self, tmp_path: Path) -> None:
        root = _root(tmp_path)
        ctx = make_ctx(root, mig_config_file=str(self._file(tmp_path)), mig_config="custom")
        source = config.find(ctx)
        assert source is not None
        want = source.layouts([_gpu(i) for i in range(4)], config.pci_ids(ctx))
        assert want == {0: GpuLayout(True, (("3g.40gb", 2),)),
                        1: GpuLayout(True, (("1g.10gb", 7),)), 2: OFF}  # GPU 3 untouched

    def test_label_chooses_the_config(self, tmp_path: Path) -> None:
        from kubefake import TOKEN, Cluster, node_doc, serve

        root = _root(tmp_path)
        account = tmp_path / "sa"
        account.mkdir()
        (account / "token").write_text(TOKEN + "\n")
        cluster = Cluster(nodes={"gpu-node-1": node_doc(
            "gpu-node-1", {config.MIG_CONFIG_LABEL: "custom"})})
        with serve(cluster) as url:
            ctx = make_ctx(root, mig_config_file=str(self._file(tmp_path)),
                           node_name="gpu-node-1", kube_api=url,
                           service_account_dir=str(account))
            source = config.find(ctx)
        assert source is not None and "config custom" in source.origin
        assert not cluster.errors

    @pytest.mark.parametrize(("text", "name", "names"), [
        ("version: v2\nmig-configs: {a: []}\n", "a", "version is not v1"),
        ("version: v1\n", "a", "mig-configs is missing"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}\n", "a", "mig-configs.a[0].mig-enabled"),
        ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: true}]}\n", "a",
         "mig-configs.a[0].devices"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "mig-devices: {1g.10gb: -1}}]}\n", "a", "mig-configs.a[0].mig-devices.1g.10gb"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
         "mig-devices: {1g.10gb: 1}}]}\n", "a", "mig-enabled is false"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "device-filter: nvidia}]}\n", "a", "device-filter"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, colour: red}]}\n",
         "a", "unknown field 'colour'"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}\n", "b",
         "no config 'b'"),
        ("version: v1\nmig-configs: [\n", "a", "is not YAML"),
        # mig-parted's api/spec/v1/spec.go and pkg/types/mig_config.go @ bd7160f4
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}\n", "a",
         "mig-configs.a[0] has mig-enabled true but no mig-devices"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "mig-devices: null}]}\n", "a", "has mig-enabled true but no mig-devices"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, "
         "mig-devices: {1g.10gb: 0, 2g.20gb: 0}}]}\n", "a",
         "mig-configs.a[0].mig-devices gives every profile a count of 0"),
        ("version: v1\nflavour: mild\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\n",
         "a", "has unknown top-level field 'flavour'"),
    ])
    def test_malformed(self, tmp_path: Path, text: str, name: str, names: str) -> None:
        path = self._file(tmp_path, text)
        with pytest.raises(MigConfigError) as caught:
            config.find(make_ctx(_root(tmp_path), mig_config_file=str(path), mig_config=name))
        line = caught.value.one_line()
        assert caught.value.code == 2
        assert names in line and str(path) in line and "fix:" in line

    def test_no_config_chosen(self, tmp_path: Path) -> None:
        path = self._file(tmp_path)
        with pytest.raises(MigConfigError) as caught:
            config.find(make_ctx(_root(tmp_path), mig_config_file=str(path)))
        assert "nvidia.com/mig.config" in caught.value.one_line()
        assert "all-balanced" in caught.value.remedy

    def test_unreadable_file(self, tmp_path: Path) -> None:
        with pytest.raises(MigConfigError) as caught:
            config.find(make_ctx(_root(tmp_path), mig_config_file=str(tmp_path / "absent"),
                                 mig_config="a"))
        assert "MIG_CONFIG_FILE" in caught.value.message


class TestProfileSetting:
    def test_one_profile(self, tmp_path: Path) -> None:
        source = config.find(make_ctx(_root(tmp_path), mig_profile="1g.10gb"))
        assert source is not None and source.fill == "1g.10gb"
        assert source.origin == "MIG_PROFILE=1g.10gb"

    def test_bad_profile_setting_is_refused_by_the_config(self, tmp_path: Path) -> None:
        from installer.errors import ConfigError

        with pytest.raises(ConfigError) as caught:
            make_ctx(_root(tmp_path), mig_profile="seven")
        assert "--mig-profile" in caught.value.one_line()


class TestAnyInput:
    """Whatever an operator's ConfigMap or the node's file holds: a Source, None, or one
    MigConfigError line, never another exception."""

    values = st.recursive(
        st.none() | st.booleans() | st.integers(-10, 100) | st.sampled_from(
            ["all", "v1", "1g.10gb", "0x233010DE", "", "mig-enabled", "devices"]),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
            st.sampled_from(["version", "mig-configs", "a", "devices", "mig-enabled",
                             "mig-devices", "device-filter", "1g.10gb", "GPUPartitionSize"]),
            inner, max_size=4),
        max_leaves=12)

    @settings(max_examples=300, deadline=None)
    @given(document=values)
    def test_mig_parted(self, document: object) -> None:
        import yaml

        text = yaml.safe_dump(document)
        try:
            source = config.mig_parted_source(text, "/cfg.yaml", "a")
        except MigConfigError as exc:
            assert "\n" not in exc.one_line() and "/cfg.yaml" in exc.message
            return
        layouts = source.layouts([_gpu(0), _gpu(1)], lambda gpu: "0x233010DE")
        assert set(layouts) <= {0, 1}

    @settings(max_examples=200, deadline=None)
    @given(document=values)
    def test_gke(self, document: object) -> None:
        try:
            source = config.gke_source(json.dumps(document), "/etc/nvidia/gpu_config.json")
        except MigConfigError as exc:
            assert "gpu_config.json" in exc.message
            return
        assert source is None or isinstance(source.fill, str)
