"""The driver branch lifecycle table (installer/compat/lifecycle.py) against an independent
transcription of NVIDIA's support tables, its findings, and the GPU names read from labels
(installer/compat/gpulabels.py)."""

from __future__ import annotations

import datetime

import pytest

from installer.compat import gpulabels, lifecycle

# Transcribed separately from docs.nvidia.com/datacenter/tesla/drivers/ "Supported Drivers and
# CUDA Toolkit Versions" (v580 edition, and the 615/620 editions for R580's new date, R595,
# R610 and R620): branch -> (designation, end-of-life month, or None).
NVIDIA = {
    535: ("Long Term Support Branch", "2026-06"),
    570: ("Production Branch", "2026-02"),
    580: ("Long Term Support Branch", "2028-06"),
    595: ("Production Branch", "2027-03"),
    610: ("New Feature Branch", "2026-08"),
    620: ("Long Term Support Branch", "2029-09"),
}
# "All other previous driver branches not listed ... are end of life" (v580 edition)
LISTED_ENDED = (525, 550, 560, 565, 575)
DAY = datetime.date(2026, 12, 5)


@pytest.mark.parametrize("number", sorted(NVIDIA))
def test_dated_rows_match_the_transcription(number: int) -> None:
    kind, month = NVIDIA[number]
    row = lifecycle.BRANCHES[number]
    assert row.kind == kind
    assert row.eol is not None and row.eol.strftime("%Y-%m") == month
    assert row.eol.day >= 28  # the last day of the month is still supported


def test_undated_ended_branches_are_listed_as_ended() -> None:
    for number in LISTED_ENDED:
        row = lifecycle.BRANCHES[number]
        assert not row.dated and row.eol is not None and row.eol < DAY


def test_r470_is_the_kepler_ltsb_that_ended_in_july_2024() -> None:
    row = lifecycle.BRANCHES[470]
    assert (row.kind, row.eol) == ("Long Term Support Branch", datetime.date(2024, 7, 31))


class TestFindings:
    def test_r535_past_eol_on_the_day_of_writing(self) -> None:
        (finding,) = lifecycle.findings("535.261.03", "proprietary", ["Ampere"], DAY)
        assert (finding.level, finding.code) == ("warning", "past-eol")

    @pytest.mark.parametrize(("today", "code"), [
        (datetime.date(2028, 3, 1), None), (datetime.date(2028, 4, 1), "eol-soon"),
        (datetime.date(2028, 6, 30), "eol-soon"), (datetime.date(2028, 7, 1), "past-eol")])
    def test_the_90_day_window(self, today: datetime.date, code: str | None) -> None:
        found = lifecycle.findings("580.95.05", "open", ["Hopper"], today)
        assert [f.code for f in found] == ([code] if code else [])

    def test_a_branch_without_a_date_is_no_warning(self) -> None:
        assert lifecycle.findings("590.48.01", "open", [], DAY) == []
        assert lifecycle.findings("999.1.2", "open", [], DAY) == []

    @pytest.mark.parametrize(("version", "flavour", "codes"), [
        ("570.195.03", "proprietary", ["unsupported-flavour"]),
        ("565.57.01", "open", ["unsupported-gpu"]),
        ("580.95.05", "open", []),
    ])
    def test_blackwell_is_open_only_from_r570(self, version: str, flavour: str,
                                              codes: list[str]) -> None:
        found = lifecycle.findings(version, flavour, ["Blackwell"],
                                   datetime.date(2027, 1, 1))
        assert [f.code for f in found if f.level == "error"] == codes

    @pytest.mark.parametrize("arch", ["Maxwell", "Pascal", "Volta"])
    def test_r580_is_the_last_branch_for_maxwell_to_volta(self, arch: str) -> None:
        assert not [f for f in lifecycle.findings("580.95.05", "proprietary", [arch],
                                                  DAY) if f.level == "error"]
        (error,) = [f for f in lifecycle.findings("590.48.01", "proprietary", [arch], DAY)
                    if f.level == "error"]
        assert error.code == "unsupported-gpu" and "580 or older" in error.message


@pytest.mark.parametrize(("labels", "arch"), [
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, "Ampere"),
    ({"nvidia.com/gpu.product": "Tesla-T4"}, "Turing"),
    ({"gpu-node-installer/gpu.family": "blackwell"}, "Blackwell"),
    ({"nvidia.com/gpu.product": "mixed", "nvidia.com/gpu.family": "hopper"}, "Hopper"),
    ({"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}, "Hopper"),
    ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, "Ada Lovelace"),
    ({"cloud.google.com/gke-accelerator": "nvidia-tesla-v100"}, "Volta"),
])
def test_gpu_from_labels(labels: dict[str, str], arch: str) -> None:
    found = gpulabels.gpu_of(labels)
    assert found is not None and found[1] == arch


def test_no_gpu_label_or_an_unknown_one_is_none() -> None:
    assert gpulabels.gpu_of({"kubernetes.io/arch": "amd64"}) is None
    assert gpulabels.gpu_of({"cloud.google.com/gke-accelerator": "nvidia-unheard-of"}) is None
