"""PCI VPD as sysfs returns it: binary resources, parsed for show and searched for SW_MNG."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from installer.node.fabric import SWITCH_MANAGEMENT, parse_vpd
from installer.testing import nic_vpd, switch_vpd, vpd_bytes


class TestParse:
    def test_switch_management_port(self) -> None:
        data = switch_vpd("MT2412X00001")
        assert parse_vpd(data) == {"ID": "NVIDIA ConnectX-7 SW_MNG", "PN": "SW_MNG-CX7",
                                   "EC": "A1", "SN": "MT2412X00001", "V0": "PCIeGen5 x4",
                                   "V2": "SW_MNG"}
        assert SWITCH_MANAGEMENT in data

    def test_ordinary_nic_has_no_switch_management(self) -> None:
        data = nic_vpd()
        assert parse_vpd(data)["PN"] == "MCX75310AAS"
        assert SWITCH_MANAGEMENT not in data

    def test_checksum_makes_the_read_only_part_sum_to_zero(self) -> None:
        """As the PCI spec defines RV: the image up to and including it sums to 0 mod 256."""
        data = switch_vpd()
        rv = data.index(b"RV")
        assert sum(data[:rv + 4]) % 256 == 0
        assert data[-1] == 0x78  # the end tag

    def test_binary_bytes_around_the_name(self) -> None:
        """The name may sit in a vendor field between binary bytes (NUL padding, lengths):
        the raw search still finds it, the parser strips the padding."""
        data = vpd_bytes("ConnectX-8", V3="\0\0SW_MNG\0\0")
        assert SWITCH_MANAGEMENT in data
        assert parse_vpd(data)["V3"] == "SW_MNG"

    def test_truncated_read_keeps_what_is_complete(self) -> None:
        data = switch_vpd()
        assert parse_vpd(data[:30]) == {"ID": "NVIDIA ConnectX-7 SW_MNG"}
        assert parse_vpd(data[:2]) == {}
        assert parse_vpd(b"") == {}

    def test_stops_at_the_end_tag(self) -> None:
        assert parse_vpd(bytes([0x78]) + switch_vpd()) == {}

    @given(st.binary(max_size=600))
    def test_any_bytes_parse_without_raising(self, data: bytes) -> None:
        fields = parse_vpd(data)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
