"""Crash safety of the paths added since test_crash: SIGKILL storms, then the next run succeeds.

Three storms (tests/killscenes.py): COS assembly (`install` from the cos-tools layout), the
on-node build (`install --build-fallback auto`, make and gcc really running) and index
publishing (`package build --repo`). Each kills its run's process group at instants uniform
over a measured run, checks after every kill that no cache entry, package or index is
half-written (tests/killstorm.py), then lets runs finish and checks again, stricter.

The suite runs KILLS[name] kills per storm (KILLSTORM_KILLS overrides all): the issue's
>= 100 for publishing and COS; the on-node build's runs compile for seconds each, so its
100-kill storm is `benchmarks/killstorm.py`. GNI_CRASH_SEED picks the instants.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from killscenes import cos_scene, fallback_available, fallback_scene, repo_scene
from killstorm import Storm, run_storm, typical_duration

KILLS = {"repo": 100, "cos": 100, "fallback": 6}  # about 35 s, 90 s, 40 s on 2 shared cores
Scene = Callable[[Path], AbstractContextManager[Storm]]


def _kills(name: str) -> int:
    return int(os.environ.get("KILLSTORM_KILLS", KILLS[name]))


def _storm(scene: Scene, name: str, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("GNI_CRASH_SEED", "1234")))
    (tmp_path / "scene").mkdir()
    with scene(tmp_path / "scene") as storm:
        result = run_storm(storm, _kills(name), typical_duration(storm), rng, tmp_path)
    print(result.summary())  # with -s: where the kills landed
    assert result.kills == _kills(name), result.summary()  # each found the run alive
    assert result.corrupt == [], result.corrupt[:5]
    assert result.final_code == 0 and result.final_problems == [], result.final_problems[:3]


def test_repo_publishing_storm(tmp_path: Path) -> None:
    _storm(repo_scene, "repo", tmp_path)


def test_cos_assembly_storm(tmp_path: Path) -> None:
    _storm(cos_scene, "cos", tmp_path)


def test_on_node_build_storm(tmp_path: Path) -> None:
    why = fallback_available()
    if why is not None:
        pytest.skip(why)
    _storm(fallback_scene, "fallback", tmp_path)
