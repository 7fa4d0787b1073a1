"""Grace Hopper / Grace Blackwell superchips in the compat tables: ids, branches, flavours."""

from __future__ import annotations

import pytest

from installer.compat import gpusupport, nodelabels
from installer.errors import IncompatibleError
from installer.node import gpus

GRACE = {  # PCI id: (name, architecture, first branch)
    0x2342: ("GH200 120GB/480GB", "Grace Hopper", 535),
    0x2348: ("GH200 144G HBM3e", "Grace Hopper", 535),
    0x2941: ("GB200", "Grace Blackwell", 570),
    0x31C2: ("GB300", "Grace Blackwell Ultra", 580),
}


@pytest.mark.parametrize("device", sorted(GRACE), ids=[f"{d:04x}" for d in sorted(GRACE)])
class TestGraceSuperchips:
    def test_known_by_id_open_modules_only(self, device: int) -> None:
        name, architecture, _ = GRACE[device]
        found, arch = gpus.lookup(device)
        assert (found, arch.name) == (name, architecture)
        assert arch.flavours == ("open",) and arch.preferred_flavour == "open"

    def test_first_branch_drives_it_and_the_one_before_does_not(self, device: int) -> None:
        _, architecture, first = GRACE[device]
        assert gpusupport.branch_supports(first, architecture)
        assert not gpusupport.branch_supports(first - 5, architecture)
        assert gpusupport.unsupported_architectures(f"{first - 5}.10.01", [architecture]) == [
            architecture]

    def test_proprietary_is_refused_auto_picks_open(self, device: int) -> None:
        _, architecture, first = GRACE[device]
        assert gpusupport.pick_flavour("auto", [architecture], f"{first}.10.01") == "open"
        with pytest.raises(IncompatibleError, match="proprietary kernel modules do not "
                           f"support the {architecture}"):
            gpusupport.pick_flavour("proprietary", [architecture], f"{first}.10.01")


def test_families_are_the_generation_gpu_feature_discovery_names() -> None:
    assert nodelabels.family(None, "Grace Hopper") == "hopper"
    assert nodelabels.family(None, "Grace Blackwell") == "blackwell"
    assert nodelabels.family(None, "Grace Blackwell Ultra") == "blackwell"
    assert nodelabels.family(None, "Hopper") == "hopper"


def test_gh200_with_h100_on_one_node_takes_open_from_535() -> None:
    archs = ["Grace Hopper", "Hopper"]
    assert gpusupport.flavours_for(archs) == ("open",)
    assert gpusupport.supported_range(archs).first == 535
