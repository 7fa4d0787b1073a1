"""`package build` asked to sign with nothing to sign, in the sandboxed arena.

`--nvidia-source` without `--kernel-headers` makes a source package, which needs the
user-mode files (`--deb`, `--run` or `--tree`); given none, with `--sign-key/--sign-cert`, the
one line must say those inputs are missing (it once said "give --modules", which is not
what is missing). Exit 2, no traceback, nothing written: not the `--out-dir`, not the
arena's repository (its index.json unchanged), nothing anywhere else in the arena.
"""

from __future__ import annotations

import pytest
from nvsources import proprietary_source
from signing_keys import make_key

from adversarial.harness import Arena, assert_refused, assert_untouched


@pytest.mark.parametrize("target", ["out-dir", "repo"])
def test_sign_without_user_mode_inputs_names_them(arena: Arena, target: str) -> None:
    inputs = arena.base / "inputs"
    pair = make_key(inputs / "keys", "throwaway")
    source = proprietary_source(inputs / "nvidia-kernel")
    where = (f"--out-dir={arena.base / 'out'}" if target == "out-dir"
             else f"--repo={arena.scene.repo}")
    before = arena.snapshot()
    done = arena.run("package", "build", f"--nvidia-source={source}", where,
                     f"--sign-key={pair.key}", f"--sign-cert={pair.cert}")
    assert_refused(done, 2, "a source package needs the user-mode files too",
                   "no --deb, --run or --tree is given", "fix: also give --deb, --run or --tree")
    assert "--modules" not in done.lines[0]
    assert done.stdout == ""
    assert_untouched(before, arena.snapshot())
