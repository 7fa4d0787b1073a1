"""Kernel module parameters against a faithful re-implementation of the
kernel's own next_arg()/parse_args(): whatever the installer accepts, the kernel splits back
into exactly the pairs the operator meant; the rest is refused (exit 2, or 7 for a package)."""

from __future__ import annotations

import string
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.config import ModuleParam
from installer.config.modparams import check_param, parse_module_param, read_params_file
from installer.config.values import Invalid
from installer.errors import IntegrityError
from installer.stages.load import plan
from installer.stages.load.plan import PlannedModule

# --- the kernel's parser, line for line (lib/cmdline.c next_arg, kernel/params.c parse_args)

_KERNEL_SPACE = frozenset(b"\t\n\v\f\r \xa0")  # lib/ctype.c: _S for 9-13, 32 and 160


def next_arg(buf: bytearray, args: int) -> tuple[int, int | None, int]:
    """next_arg() on a NUL-terminated buffer: (param, val or None, next), as offsets."""
    in_quote = quoted = False
    if buf[args] == ord('"'):
        args += 1
        in_quote = quoted = True
    i = equals = 0
    while buf[args + i]:
        if buf[args + i] in _KERNEL_SPACE and not in_quote:
            break
        if equals == 0 and buf[args + i] == ord("="):
            equals = i
        if buf[args + i] == ord('"'):
            in_quote = not in_quote
        i += 1
    val: int | None = None
    if equals:
        buf[args + equals] = 0
        val = args + equals + 1
        if buf[val] == ord('"'):  # don't include quotes in value
            val += 1
            if buf[args + i - 1] == ord('"'):
                buf[args + i - 1] = 0
    if quoted and i > 0 and buf[args + i - 1] == ord('"'):
        buf[args + i - 1] = 0
    if buf[args + i]:
        buf[args + i] = 0
        nxt = args + i + 1
    else:
        nxt = args + i
    while buf[nxt] in _KERNEL_SPACE:  # skip_spaces()
        nxt += 1
    return args, val, nxt


def _cstr(buf: bytearray, at: int) -> str:
    return bytes(buf[at:buf.index(0, at)]).decode("latin-1")


def parse_args(args: str | bytes) -> list[tuple[str, str | None]]:
    """Every (param, value) parse_args() hands to the module's parameter setters."""
    buf = bytearray(args.encode() if isinstance(args, str) else args) + b"\0"
    pos, pairs = 0, []
    while buf[pos] in _KERNEL_SPACE:
        pos += 1
    while buf[pos]:
        param, val, pos = next_arg(buf, pos)
        if val is None and _cstr(buf, param) == "--":
            break
        pairs.append((_cstr(buf, param), None if val is None else _cstr(buf, val)))
    return [(k, v if v is None else v.encode("latin-1").decode()) for k, v in pairs]


class TestTheKernelParserItself:
    """The re-implementation must behave as the kernel documents, or it proves nothing."""

    @pytest.mark.parametrize(("text", "pairs"), [
        ("a=1 b=2", [("a", "1"), ("b", "2")]),
        ('k="a b"', [("k", "a b")]),
        ('"k=a b" c=1', [("k", "a b"), ("c", "1")]),
        ("k=a=b", [("k", "a=b")]),
        ("k=1\tj=2\nz", [("k", "1"), ("j", "2"), ("z", None)]),
        ('k=x"y z" w=1', [("k", 'x"y z"'), ("w", "1")]),
        ("  k=1  j=2 ", [("k", "1"), ("j", "2")]),
        ("k= -- j=1", [("k", "")]),
        ("=x k", [("=x", None), ("k", None)]),
        ('k=""', [("k", "")]),
    ])
    def test_documented_behaviour(self, text: str, pairs: list[tuple[str, str | None]]
                                  ) -> None:
        assert parse_args(text) == pairs

    def test_latin1_nbsp_is_a_kernel_space(self) -> None:
        assert parse_args(b"k=1\xa0j=2") == [("k", "1"), ("j", "2")]


# --- module parameters: accepted ones parse back to exactly what was meant

_VALUES = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_NAMES = st.text(alphabet=string.ascii_letters + string.digits + "_", min_size=1, max_size=12)


def _param_string(params: dict[str, str]) -> str:
    return PlannedModule("m", Path("/m.ko"), "m.ko", False, (), params).param_string


class TestModuleParams:
    @pytest.mark.parametrize("text", [
        "nvidia.NVreg_X=1 nvidia_uvm.uvm_perf=0", 'nvidia.k="a b"', 'nvidia.k="1"',
        "nvidia.k=it's", "nvidia.k=a\tb", "nvidia.k=1\nnvidia.j=2", "nvidia.k=1\x00",
        "nvidia.k=\u00a0", "nvidia.k=caf\u00e9", "nvi dia.k=1", "nvidia.k-j=1", "nvidia.=1",
        ".k=1", "nvidia.k", "nvidia k=1", "nvidia.k.j=1", "nvidia.k=" + "x" * 257,
        "n" * 56 + ".k=1", "nvidia.k\u0131=1", "nvidia.k=1\u2028",
    ])
    def test_refused(self, text: str) -> None:
        with pytest.raises(Invalid):
            parse_module_param(text)

    @pytest.mark.parametrize(("text", "param"), [
        ("nvidia.NVreg_EnableMSI=0", ModuleParam("nvidia", "NVreg_EnableMSI", "0")),
        ("nvidia-uvm.uvm_perf=1", ModuleParam("nvidia_uvm", "uvm_perf", "1")),
        ("nvidia.NVreg_RegistryDwords=PowerMizerEnable=0x1;PerfLevelSrc=0x2222",
         ModuleParam("nvidia", "NVreg_RegistryDwords", "PowerMizerEnable=0x1;PerfLevelSrc=0x2222")),
        ("nvidia.k=", ModuleParam("nvidia", "k", "")),
        ("  nvidia.k=a,b  ", ModuleParam("nvidia", "k", "a,b")),
    ])
    def test_accepted(self, text: str, param: ModuleParam) -> None:
        assert parse_module_param(text) == param
        assert parse_args(_param_string({param.key: param.value})) == [(param.key, param.value)]

    @settings(max_examples=400)
    @given(st.dictionaries(_NAMES, _VALUES, max_size=5))
    def test_what_is_accepted_reaches_the_kernel_as_given(self, params: dict[str, str]
                                                          ) -> None:
        accepted = {}
        for key, value in params.items():
            try:
                param = parse_module_param(f"nvidia.{key}={value}")
            except Invalid:
                with pytest.raises(Invalid):
                    check_param(key, value)
                continue
            check_param(param.key, param.value)
            accepted[param.key] = param.value
        assert parse_args(_param_string(accepted)) == list(accepted.items())

    @settings(max_examples=300)
    @given(st.text(max_size=80))
    def test_random_text_is_a_param_or_invalid(self, text: str) -> None:
        try:
            param = parse_module_param(text)
        except Invalid:
            return
        assert parse_args(_param_string({param.key: param.value})) == [
            (param.key, param.value)]

    def test_a_package_default_that_smuggles_is_integrity(self) -> None:
        module = SimpleNamespace(name="nvidia", params={"NVreg_X": "1 NVreg_Y=2"})
        package = SimpleNamespace(source="file:///repo/x",
                                  manifest=SimpleNamespace(modules=[module]))
        with pytest.raises(IntegrityError) as info:
            plan.merged_params(package, [])  # type: ignore[arg-type]
        assert "file:///repo/x" in info.value.message
        assert "nvidia.NVreg_X" in info.value.message and info.value.code == 7

    @pytest.mark.parametrize(("key", "value"), [("NV X", "1"), ("k", 'a"b'), ("k", "a b"),
                                                ("", "1"), ("k", "\n")])
    def test_check_param(self, key: str, value: str) -> None:
        with pytest.raises(Invalid):
            check_param(key, value)


class TestParamsFile:
    @pytest.mark.parametrize(("data", "line"), [
        (b"nvidia.k=1\nnvidia.j=1 nvidia.z=2\n", 2),
        (b"# c\n\nnvidia.k=\"a b\"\n", 3),
        (b"nvidia.k=1\x0bnvidia.j=2\n", 1),
        (b"nvidia.k=1\r\nnvidia.j=a\x85b\n", None),
    ])
    def test_bad_line_names_the_line(self, tmp_path: Path, data: bytes, line: int | None
                                     ) -> None:
        path = tmp_path / "params.conf"
        path.write_bytes(data)
        with pytest.raises(Invalid) as info:
            read_params_file(path)
        if line is not None:
            assert f"line {line}:" in str(info.value.reason)

    def test_not_utf8(self, tmp_path: Path) -> None:
        path = tmp_path / "params.conf"
        path.write_bytes(b"nvidia.k=\xff\n")
        with pytest.raises(Invalid) as info:
            read_params_file(path)
        assert "not UTF-8" in str(info.value.reason)

    def test_crlf_and_comments_are_fine(self, tmp_path: Path) -> None:
        path = tmp_path / "params.conf"
        path.write_bytes(b"# x\r\nnvidia.k=1 # y\r\n")
        assert read_params_file(path) == [ModuleParam("nvidia", "k", "1")]
