"""The MIG plan (installer/stages/partition/plan.py): a layout refused before anything changes,
with one line naming the GPU and the sizes it offers; only the GPUs that differ change."""

from __future__ import annotations

import pytest

from installer.errors import ConfigError, MigConfigError, MigLayoutError
from installer.stages.partition.plan import (
    GpuLayout,
    GpuNow,
    changes,
    describe,
    layout,
    normal,
    validate,
)

OFF = GpuLayout(False, ())
A100 = ("NVIDIA A100-SXM4-40GB", 40536)
H100 = ("NVIDIA H100 80GB HBM3", 81559)
T4 = ("Tesla T4", 15360)


def gpu(index: int, model: tuple[str, int] = A100, now: GpuLayout = OFF, *,
        pending: bool = False) -> GpuNow:
    name, memory = model
    return GpuNow(index=index, uuid=f"GPU-{index:08d}", name=name, memory_mib=memory,
                  pci_bus_id=f"00000000:{0x10 + index:02X}:00.0", layout=now,
                  mode_pending=pending)


def on(**devices: int) -> GpuLayout:
    return layout(True, {name.replace("_", ".").replace(".me", "+me"): count
                         for name, count in devices.items()})


def refusal(want: dict[int, GpuLayout], gpus: list[GpuNow]) -> MigConfigError | MigLayoutError:
    with pytest.raises((MigConfigError, MigLayoutError)) as caught:
        validate(want, gpus)
    error = caught.value
    assert isinstance(error, (MigConfigError, MigLayoutError))
    assert "\n" not in error.one_line()
    return error


class TestValidate:
    def test_gke_style_seven_1g_on_eight_a100s_is_accepted(self) -> None:
        validate({i: on(**{"1g_5gb": 7}) for i in range(8)}, [gpu(i) for i in range(8)])

    def test_mig_off_is_fine_on_any_gpu(self) -> None:
        validate({0: OFF, 1: OFF}, [gpu(0, T4), gpu(1)])

    def test_a_size_of_other_models_is_exit_2_naming_them_and_this_gpus_sizes(self) -> None:
        error = refusal({0: on(**{"1g_5gb": 7})}, [gpu(0, H100)])
        assert isinstance(error, MigConfigError) and isinstance(error, ConfigError)
        assert error.code == 2
        line = error.one_line()
        assert "GPU 0 (NVIDIA H100 80GB HBM3): 1g.5gb is a MIG size of A100-40GB, not of " \
               "this GPU (H100-80GB)" in line
        assert "1g.10gb, 1g.10gb+me, 1g.20gb" in line and "7g.80gb" in line

    def test_a_size_two_models_share_names_both(self) -> None:
        line = refusal({0: on(**{"1g_23gb": 1})}, [gpu(0, H100)]).one_line()
        assert "1g.23gb is a MIG size of B200, GB200, not of this GPU" in line

    def test_a_name_no_gpu_has_is_exit_2(self) -> None:
        error = refusal({0: on(**{"1g_7gb": 1})}, [gpu(0)])
        assert isinstance(error, MigConfigError) and isinstance(error, ConfigError)
        assert error.code == 2 and "'1g.7gb' is not a MIG profile NVIDIA defines" \
            in error.one_line()

    @pytest.mark.parametrize("name", ["", "1G.5GB", "1g.5gb ", "seven", "1g.5gb+gfx"])
    def test_malformed_names_are_exit_2(self, name: str) -> None:
        error = refusal({0: GpuLayout(True, ((name, 1),))}, [gpu(0)])
        assert error.code == 2

    @pytest.mark.parametrize("count", [0, -1, True, 1.5, "7"])
    def test_counts_must_be_positive_whole_numbers(self, count: object) -> None:
        error = refusal({0: GpuLayout(True, (("1g.5gb", count),))},  # type: ignore[arg-type]
                        [gpu(0)])
        assert error.code == 2 and "1g.5gb" in error.one_line()

    def test_instances_with_mig_off_are_exit_2(self) -> None:
        error = refusal({0: GpuLayout(False, (("1g.5gb", 1),))}, [gpu(0)])
        assert error.code == 2 and "mig-enabled" in error.one_line()

    def test_a_gpu_the_node_lacks_is_exit_2(self) -> None:
        error = refusal({3: on(**{"1g_5gb": 1})}, [gpu(0), gpu(1)])
        assert error.code == 2 and "GPU 3" in error.one_line() and "0, 1" in error.one_line()

    def test_mig_on_a_gpu_without_mig_is_exit_14(self) -> None:
        error = refusal({0: on(**{"1g_5gb": 1})}, [gpu(0, T4)])
        assert error.code == 14 and "Tesla T4" in error.one_line()
        assert "has no MIG" in error.one_line()
        # MIG on with no instances is still MIG on
        assert refusal({0: on()}, [gpu(0, T4)]).code == 14

    @pytest.mark.parametrize(("devices", "why"), [
        ({"1g_5gb": 8}, "at most 7 of 1g.5gb"),
        ({"4g_20gb": 1, "2g_10gb": 2}, "8 compute slices"),
        ({"3g_20gb": 2, "1g_5gb": 1}, "no placement"),
        ({"1g_10gb": 4, "1g_5gb": 1}, "no placement"),
        ({"1g_5gb_me": 2}, "at most 1 of 1g.5gb+me"),
    ])
    def test_more_than_fits_is_exit_14_saying_why(self, devices: dict[str, int],
                                                  why: str) -> None:
        error = refusal({0: on(**devices)}, [gpu(0)])
        assert error.code == 14
        line = error.one_line()
        assert why in line and "GPU 0 (NVIDIA A100-SXM4-40GB" in line
        assert "it offers 1g.5gb (x7)" in line

    def test_malformed_anywhere_is_reported_before_a_gpu_that_cannot_fit(self) -> None:
        """Exit 2 wins: a config error is the operator's to fix whatever the GPUs."""
        error = refusal({0: on(**{"1g_5gb": 8}), 1: on(**{"2g_5gb": 1})}, [gpu(0), gpu(1)])
        assert error.code == 2

    def test_a_mixed_node_checks_each_gpu_against_its_own_model(self) -> None:
        validate({0: on(**{"1g_5gb": 7}), 1: on(**{"1g_10gb": 7}), 2: OFF},
                 [gpu(0), gpu(1, H100), gpu(2, T4)])
        error = refusal({0: on(**{"1g_10gb": 7}), 1: on(**{"1g_10gb": 7})},
                        [gpu(0), gpu(1, H100)])
        assert "GPU 0" in error.one_line() and "at most 4 of 1g.10gb" in error.one_line()


class TestChanges:
    def test_gpus_already_as_wanted_are_untouched(self) -> None:
        seven = on(**{"1g_5gb": 7})
        gpus = [gpu(0, now=seven), gpu(1, now=seven)]
        assert changes({0: seven, 1: seven}, gpus) == []

    def test_only_the_gpu_that_differs_changes(self) -> None:
        seven, three = on(**{"1g_5gb": 7}), on(**{"2g_10gb": 3})
        gpus = [gpu(0, now=seven), gpu(1, now=seven), gpu(2, now=seven)]
        found = changes({0: seven, 1: three, 2: seven}, gpus)
        assert [(c.gpu.index, c.want, c.mode_change) for c in found] == [(1, three, False)]

    def test_enabling_mig_is_a_mode_change(self) -> None:
        found = changes({0: on(**{"1g_5gb": 7})}, [gpu(0)])
        assert len(found) == 1 and found[0].mode_change

    def test_disabling_mig_is_a_mode_change(self) -> None:
        found = changes({0: OFF}, [gpu(0, now=on(**{"1g_5gb": 7}))])
        assert len(found) == 1 and found[0].mode_change and found[0].want == OFF

    def test_a_pending_mode_is_not_as_wanted(self) -> None:
        """An A100 switched to MIG but not reset: its current layout is MIG off."""
        found = changes({0: on(**{"1g_5gb": 7})}, [gpu(0, pending=True)])
        assert len(found) == 1 and found[0].mode_change
        # MIG on now, but a switch back to off is pending: still differs
        seven = on(**{"1g_5gb": 7})
        assert changes({0: seven}, [gpu(0, now=seven, pending=True)])[0].mode_change

    def test_gpus_the_layout_does_not_name_are_left_alone(self) -> None:
        assert changes({1: OFF}, [gpu(0, now=on(**{"1g_5gb": 7})), gpu(1)]) == []

    def test_incomplete_instances_are_not_as_wanted(self) -> None:
        now = layout(True, {"1g.5gb": 6, "1g.5gb (incomplete)": 1})
        assert [c.gpu.index for c in changes({0: on(**{"1g_5gb": 7})}, [gpu(0, now=now)])] == [0]

    def test_two_spellings_of_one_layout_are_equal(self) -> None:
        spelled = GpuLayout(True, (("2g.10gb", 1), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 0)))
        assert normal(spelled) == on(**{"1g_5gb": 5, "2g_10gb": 1})
        assert changes({0: spelled}, [gpu(0, now=on(**{"1g_5gb": 5, "2g_10gb": 1}))]) == []


def test_describe() -> None:
    assert describe(OFF) == "MIG off"
    assert describe(on()) == "MIG on, no instances"
    assert describe(on(**{"3g_20gb": 1, "1g_5gb": 2})) == "2x 1g.5gb + 1x 3g.20gb"
