"""MIG configs that cannot apply to this node: `devices` naming GPUs the node lacks (or not
GPU indexes at all), profiles NVIDIA does not define (the line lists this GPU's) and what
mig-parted refuses (`test_mig_device_filters.py` has the `device-filter` cases). Each is
exit 2 with one line, before any GPU is touched.

The node: 8 A100-40GB GPUs (the NVML stand-in's MIG state in the arena), the driver
installed once per module (the real CLI, `tests/fakenode_gpus.py`) and the installed node
copied into each case's arena (`adversarial.migkit`). Each case runs `partition` sandboxed
as the adversarial suite does and asserts the exit code, the one line, that no GPU's MIG
state changed and that nothing in the arena changed but the readiness a refused partition
withdraws.
"""

from __future__ import annotations

import json

import pytest

from adversarial import migkit
from adversarial.harness import Arena, assert_ok, assert_refused, assert_untouched
from adversarial.migkit import (
    A100,
    A100_SIZES,
    GPUS,
    WITHDRAWN,
    _config,
    _partition,
    _refused,
    _run,
)

# The fixtures (the node installed once per module, copied into each case's arena).
installed = migkit.installed
node = migkit.node

def test_a_config_naming_only_its_gpus_applies(node: Arena) -> None:
    """The baseline the cases differ from: GPUs 0 and 7, 7x1g.5gb each."""
    done = _partition(node, _config('    - devices: [0, 7]\n      mig-enabled: true\n'
                                    '      mig-devices: {"1g.5gb": 7}\n'
                                    '      device-filter: "0x20B010DE"\n'), "case", "--dry-run")
    assert_ok(done)
    assert json.loads(done.stdout)["changed"] == [0, 7]


# ------------------------------------------------------------------------ devices

DEVICES = {
    "GPUs 9 and 12 of 8": ("[9, 12]", "mig-configs.case[0].devices names GPU 9, 12, which "
                           "this node lacks (it has 8 GPUs: 0 to 7)"),
    "GPU 8 beside real ones": ("[0, 1, 8]", "devices names GPU 8, which this node lacks"),
    "a negative index": ("[-1]", "devices holds -1: GPU indexes run from 0 to 63 at most"),
    "an index beyond any node": ("[4096]", "devices holds 4096: GPU indexes run from 0 to 63"),
    "a huge number": ("[" + "9" * 60 + "]", "devices holds a number of 60 digits"),
    "a string index": ('["0"]', "devices holds '0', not a GPU index"),
    "a boolean index": ("[true]", "devices holds True, not a GPU index"),
    "one index, not a list": ("3", "devices is 3, not `all` or a list of GPU indexes"),
    "ALL in capitals": ("ALL", "devices is 'ALL', not `all` or a list of GPU indexes"),
    "an empty list": ("[]", "devices is [], not `all` or a list of GPU indexes"),
}


@pytest.mark.parametrize("case", DEVICES)
def test_devices_the_node_lacks_are_refused(node: Arena, case: str) -> None:
    devices, said = DEVICES[case]
    _refused(node, _config(f"    - devices: {devices}\n      mig-enabled: true\n"
                           '      mig-devices: {"1g.5gb": 7}\n'),
             said, "fix: ")


def test_devices_the_node_lacks_are_refused_in_a_dry_run_too(node: Arena) -> None:
    _refused(node, _config("    - devices: [9, 12]\n      mig-enabled: false\n"),
             "devices names GPU 9, 12, which this node lacks", dry_run=True)


def test_a_later_entry_naming_a_lacking_gpu_stops_the_earlier_ones(node: Arena) -> None:
    """Nothing is applied when any entry cannot be: the first entry is fine on its own."""
    _refused(node, _config('    - devices: all\n      mig-enabled: true\n'
                           '      mig-devices: {"1g.5gb": 7}\n'
                           "    - devices: [8]\n      mig-enabled: false\n"),
             "mig-configs.case[1].devices names GPU 8")


# ----------------------------------------------------------------------- profiles

PROFILES = {
    "a size no GPU has": '"1g.7gb"',
    "a slice count above 7": '"9g.40gb"',
    "not a profile's shape": '"big"',
    "a number": "7",
}


@pytest.mark.parametrize("case", PROFILES)
def test_an_unknown_profile_lists_this_gpus_sizes(node: Arena, case: str) -> None:
    profile = PROFILES[case]
    _refused(node, _config(f"    - devices: [0]\n      mig-enabled: true\n"
                           f"      mig-devices: {{{profile}: 1}}\n"),
             "GPU 0 (NVIDIA A100-SXM4-40GB): ", "is not a MIG profile NVIDIA defines; this "
             f"GPU's profiles are {A100_SIZES}", "fix: use one of them")


def test_an_unknown_mig_profile_setting_lists_them_too(node: Arena) -> None:
    """MIG_PROFILE (one size for every GPU), as GKE's gpu-partition-size would say it."""
    before = node.snapshot()
    done = _run(node, "partition", *node.args("--mig-profile", "1g.7gb", "--dry-run"))
    assert_refused(done, 2, "GPU 0 (NVIDIA A100-SXM4-40GB): '1g.7gb' is not a MIG profile",
                   f"this GPU's profiles are {A100_SIZES}")
    assert_untouched(before, node.snapshot(), WITHDRAWN)


def test_another_models_gke_partition_size_names_those_models(node: Arena) -> None:
    """GKE's /etc/nvidia/gpu_config.json on the node (a node pool's gpu-partition-size):
    2g.12gb is an A30's size, not an A100-40GB's."""
    gke = node.root / "etc/nvidia/gpu_config.json"
    gke.parent.mkdir(parents=True, exist_ok=True)
    gke.write_text(json.dumps({"GPUPartitionSize": "2g.12gb"}))
    before = node.snapshot()
    done = _run(node, "partition", *node.args("--dry-run"))
    assert_refused(done, 2, "GPU 0 (NVIDIA A100-SXM4-40GB): 2g.12gb is a MIG size of "
                   "A30-24GB, not of this GPU (A100-40GB)", f"whose profiles are {A100_SIZES}")
    assert_untouched(before, node.snapshot(), WITHDRAWN)


OTHER_MODELS = {
    "3g.40gb": "A100-80GB, H100-80GB",
    "1g.23gb": "B200, GB200",
    "1g.24gb": "H100-94GB, GH200-96GB, RTX-PRO-6000",
    "4g.96gb+gfx": "RTX-PRO-6000",
    "7g.186gb": "GB200",
}


@pytest.mark.parametrize("size", OTHER_MODELS)
def test_a_size_of_other_models_is_exit_2_naming_them(node: Arena, size: str) -> None:
    """A real NVIDIA size this GPU lacks: exit 2 (as mig-parted refuses it), the line names
    the models that offer it and this GPU's own sizes, before any GPU is touched."""
    _refused(node, _config('    - devices: all\n      mig-enabled: true\n'
                           f'      mig-devices: {{"{size}": 1}}\n'),
             f"GPU 0 (NVIDIA A100-SXM4-40GB): {size} is a MIG size of {OTHER_MODELS[size]}, "
             f"not of this GPU (A100-40GB), whose profiles are {A100_SIZES}",
             "fix: use one of this GPU's (e.g. 1g.5gb), or a device-filter")



def test_the_refusals_never_reached_nvml_writes(node: Arena) -> None:
    """The stand-in's MIG state stays empty across every kind of refusal in one node."""
    for config in (_config("    - devices: [9]\n      mig-enabled: false\n"),
                   _config('    - devices: all\n      mig-enabled: true\n'
                           '      mig-devices: {"1g.7gb": 7}\n')):
        assert _partition(node, config, "case").code == 2
    assert not any((node.base / "mig").glob("gpu*"))


BOUNDED = {
    "a 1000-character field name": ('{"devices": "all", "mig-enabled": true, "'
                                     + "f" * 1000 + '": 1}', "has unknown field 'fff"),
    "a 5000-digit count": ('{"devices": "all", "mig-enabled": true, "mig-devices": '
                           '{"1g.5gb": ' + "9" * 5000 + "}}", "holds a value YAML cannot build"),
    "a 1000-character profile": ('{"devices": "all", "mig-enabled": true, "mig-devices": {"'
                                  + "1g." * 333 + '": 1}}', "is not a MIG profile"),
    "a count that is a long list": ('{"devices": "all", "mig-enabled": true, "mig-devices": '
                                     '{"1g.5gb": [' + ",".join(["1"] * 50_000) + "]}}",
                                     "is [1, 1, 1, 1, ...]"),
}


@pytest.mark.parametrize("case", BOUNDED)
def test_a_refused_value_is_quoted_by_a_bounded_prefix(node: Arena, case: str) -> None:
    """A refusal names the value it refuses by its first characters, never the whole of it:
    the one line stays short however large the config's value (YAML itself caps a key at
    1024 characters)."""
    entry, cause = BOUNDED[case]
    config = _config(f"    - {entry}\n")
    (node.scene.work / "mig.yaml").write_text(config)
    before = node.snapshot()
    done = _partition(node, config, "case", "--dry-run")
    assert_refused(done, 2, "error(config): [partition] ", cause)
    assert max(len(line) for line in done.lines) < 500, "a refusal quoted a whole value"
    assert_untouched(before, node.snapshot(), WITHDRAWN)


# ------------------------------------------------------------- mig-parted's rules
# NVIDIA/mig-parted @ bd7160f4: api/spec/v1/spec.go (a MIG entry needs mig-devices, only
# `version` and `mig-configs` at the top), pkg/types/mig_config.go (not every count 0),
# cmd/nvidia-mig-parted/apply/config.go (`devices: all` skips a GPU without MIG) and
# pkg/types/device.go (device filters with a subsystem id, since its 3882a4d6).

RULES = {
    "mig-enabled true, no mig-devices": (
        "    - devices: all\n      mig-enabled: true\n",
        "mig-configs.case[0] has mig-enabled true but no mig-devices",
        'fix: add mig-devices (e.g. "1g.10gb": 7), or mig-devices: {}'),
    "mig-devices null": (
        "    - devices: all\n      mig-enabled: true\n      mig-devices: null\n",
        "mig-configs.case[0] has mig-enabled true but no mig-devices", "fix: add mig-devices"),
    "every count 0": (
        '    - devices: all\n      mig-enabled: true\n'
        '      mig-devices: {"1g.5gb": 0, "2g.10gb": 0}\n',
        "mig-configs.case[0].mig-devices gives every profile a count of 0",
        "fix: give at least one profile a count of 1 or more"),
}


@pytest.mark.parametrize("case", RULES)
def test_what_mig_parted_refuses_is_refused(node: Arena, case: str) -> None:
    entry, said, fix = RULES[case]
    _refused(node, _config(entry), said, fix)


def test_an_unknown_top_level_key_is_refused(node: Arena) -> None:
    config = ("version: v1\nmig-config:\n  typo: []\nmig-configs:\n  case:\n"
              "    - devices: all\n      mig-enabled: false\n")
    _refused(node, config, "mig.yaml has unknown top-level field 'mig-config'",
             "fix: use only version and mig-configs")


def test_mig_on_with_no_instances_is_mig_parteds_all_enabled(node: Arena) -> None:
    """`mig-devices: {}` (config-default.yaml's `all-enabled`) is not a missing field."""
    done = _partition(node, _config("    - devices: all\n      mig-enabled: true\n"
                                    "      mig-devices: {}\n"), "case", "--dry-run")
    assert_ok(done)
    assert json.loads(done.stdout)["changed"] == list(range(GPUS))


def _without_mig(node: Arena, index: int) -> None:
    """GPU `index` of the arena's node becomes a T4 (no MIG) for NVML."""
    names = [A100[0]] * GPUS
    memory = [str(A100[1])] * GPUS
    names[index], memory[index] = "Tesla T4", "15360"
    node.env.update(FAKE_NVML_NAMES=",".join(names), FAKE_NVML_MEMORY_MIB=",".join(memory))


def test_devices_all_passes_over_a_gpu_without_mig_and_says_so(node: Arena) -> None:
    _without_mig(node, 7)
    before = node.snapshot()
    done = _partition(node, _config('    - devices: all\n      mig-enabled: true\n'
                                    '      mig-devices: {"1g.5gb": 7}\n'), "case", "--dry-run")
    assert_ok(done)
    assert json.loads(done.stdout)["changed"] == list(range(7))
    said = [line for line in done.stderr.splitlines() if "GPU skipped" in line]
    assert len(said) == 1 and '"gpu": 7' in said[0] and "Tesla T4" in said[0], done.stderr
    assert_untouched(before, node.snapshot(), WITHDRAWN)


def test_naming_a_gpu_without_mig_by_index_is_still_refused(node: Arena) -> None:
    _without_mig(node, 7)
    before = node.snapshot()
    done = _partition(node, _config('    - devices: [7]\n      mig-enabled: true\n'
                                    '      mig-devices: {"1g.5gb": 7}\n'), "case", "--dry-run")
    assert_refused(done, 14, "GPU 7 (Tesla T4, 15360 MiB) has no MIG; it cannot be partitioned")
    assert_untouched(before, node.snapshot(), WITHDRAWN)
