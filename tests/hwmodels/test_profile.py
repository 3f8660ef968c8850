"""Hardware profiles: the shipped files, user files, and one-line errors for bad ones."""

from __future__ import annotations

import dataclasses

import pytest
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import list_profiles, load_hardware, to_toml

from memplan.cli import main
from tests.hwmodels.handmade import device

REQUIRED = [
    "p100-pcie-16gb", "v100-sxm2-16gb", "v100-sxm2-32gb", "gtx-1080ti", "rtx-a6000",
    "rtx-4090", "a100-pcie-40gb", "a100-sxm-80gb", "h100-pcie-80gb", "h100-sxm-80gb", "l4",
    "a100-pcie-80gb", "a10", "quadro-rtx-8000", "rtx-3090", "rtx-6000-ada", "cpu-local",
]  # fmt: skip


def test_every_required_profile_is_shipped_and_loads_with_sources():
    assert set(REQUIRED) <= set(list_profiles())
    for name in list_profiles():
        hw = load_hardware(name)
        assert hw.name == name
        for key in ("memory_bytes", "h2d_bytes_per_s", "d2h_bytes_per_s", "transfer_fixed_s",
                    "copy_engines", "h2d_duplex_factor", "peak_flops", "mem_bw_bytes_per_s",
                    "launch_overhead_s"):  # fmt: skip
            assert hw.source[key].strip(), f"{name}: no source for {key}"


def test_a100_figures_and_transfer_time():
    hw = load_hardware("a100-pcie-40gb")
    assert hw.memory_bytes == 40 * 2**30
    assert hw.peak_flops["float32"] == 19.5e12
    assert hw.h2d_bytes_per_s == 25e9
    # 1 GB at 25 GB/s is 40 ms, plus the 2.5 us fixed cost
    dm = DeviceModel(hw, Fixed([0.0]))
    assert dm.copy_time(10**9, Direction.H2D, TimeUnit.S) == pytest.approx(0.04 + 2.5e-6)


def test_pcie_generations_ordered():
    assert load_hardware("p100-pcie-16gb").h2d_bytes_per_s == 12e9
    assert (
        load_hardware("h100-sxm-80gb").h2d_bytes_per_s
        > load_hardware("a100-sxm-80gb").h2d_bytes_per_s
    )


def test_cpu_local_is_measured():
    hw = load_hardware("cpu-local")
    assert "measured" in hw.source["peak_flops"]
    assert hw.copy_engines == 1
    assert set(hw.roofline_efficiency) >= {"conv", "matmul", "elementwise"}


def test_user_toml_round_trips(tmp_path):
    hw = device("my-gpu", source={k: "from a test" for k in (
        "memory_bytes", "h2d_bytes_per_s", "d2h_bytes_per_s", "transfer_fixed_s",
        "copy_engines", "h2d_duplex_factor", "peak_flops", "mem_bw_bytes_per_s",
        "launch_overhead_s")}, description="a test device")  # fmt: skip
    path = tmp_path / "mine.toml"
    path.write_text(to_toml(hw, "a header\nof two lines"))
    assert load_hardware(path) == hw
    assert load_hardware(str(path)) == hw


GOOD = load_hardware("a100-pcie-40gb")


def _write(tmp_path, text: str):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return p


def _set(key: str, value: str):
    """An edit that sets top-level `key` of a profile's text to `value`."""

    def edit(text: str) -> str:
        lines = [
            f"{key} = {value}" if ln.startswith(f"{key} = ") else ln for ln in text.splitlines()
        ]
        return "\n".join(lines) + "\n"

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("memory_bytes", "-1"), "memory_bytes: expected an integer in [1048576, 70368744177664], got -1"),
        (lambda t: t.replace("memory_bytes = 42949672960\n", ""), "memory_bytes: missing"),
        (_set("memory_bytes", "4.2e10"), "memory_bytes: expected an integer, got 42000000000.0"),
        (_set("memory_bytes", "99999999999999999999999999"), "memory_bytes: expected an integer in"),
        (_set("copy_engines", '"two"'), 'copy_engines: expected an integer, got "two"'),
        (_set("copy_engines", "0"), "copy_engines: expected an integer in [1, 64], got 0"),
        (_set("copy_engines", "true"), "copy_engines: expected an integer, got true"),
        (_set("h2d_duplex_factor", "1.5"), "h2d_duplex_factor: expected a number in [0.01, 1], got 1.5"),
        # NOTE [ Profile sanity ranges ]: absurd but finite figures
        (_set("h2d_bytes_per_s", "1e-300"), "h2d_bytes_per_s: expected a number in [1e+06, 1e+13], got 1e-300"),
        (_set("d2h_bytes_per_s", "1e14"), "d2h_bytes_per_s: expected a number in [1e+06, 1e+13], got 100000000000000.0"),
        (_set("mem_bw_bytes_per_s", "5e7"), "mem_bw_bytes_per_s: expected a number in [1e+08, 1e+14]"),
        (_set("launch_overhead_s", "1e300"), "launch_overhead_s: expected a number in [0, 1], got 1e+300"),
        (_set("launch_overhead_s", "-1e-6"), "launch_overhead_s: expected a number in [0, 1]"),
        (_set("transfer_fixed_s", "2"), "transfer_fixed_s: expected a number in [0, 1], got 2"),
        (_set("transfer_fixed_s", "nan"), "transfer_fixed_s: expected a finite number, got NaN"),
        (_set("h2d_bytes_per_s", "inf"), "h2d_bytes_per_s: expected a finite number, got Infinity"),
        (_set("h2d_bytes_per_s", "[1]"), "h2d_bytes_per_s: expected a number, got [1]"),
        (lambda t: t.replace("float32 = 1.95e+13", "float32 = 1e19"), "peak_flops.float32: expected a number in [1e+06, 1e+18], got 1e+19"),
        (lambda t: t.replace("float32 = 1.95e+13", "float32 = 0"), "peak_flops.float32: expected a number in [1e+06, 1e+18], got 0"),
        (lambda t: t.replace("float32 = 1.95e+13", 'float32 = "fast"'), 'peak_flops.float32: expected a number, got "fast"'),
        (lambda t: t.replace("[peak_flops]", "h2d_bw = 3\n[peak_flops]"), 'unknown field "h2d_bw"'),
        (lambda t: t.replace("float32 = 1.95e+13", "fp32 = 1.95e+13"), "peak_flops.fp32: unknown dtype"),
        (lambda t: t + "\n[roofline_efficiency]\nconv = 1e9\n", "roofline_efficiency.conv: expected a number in [0.001, 1000], got 1000000000.0"),
        (lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith("launch_overhead_s = \"")),
         "source.launch_overhead_s: missing"),
        (lambda t: t.replace('memory_bytes = "', 'memory_bytes = 5\nx = "'), "source.memory_bytes: expected a string, got 5"),
        (_set("description", "[1, 2]"), "description: expected a string, got [1, 2]"),
        (_set("name", '""'), 'name: expected a non-empty string, got ""'),
        (lambda t: t.replace('name = "a100-pcie-40gb"', 'name = "a100'), "not valid TOML"),
        (lambda t: t + "\n[source.x]\n" + "a.b.c.d.e.f.g.h.i = 1\n", "nested more than 8 levels deep"),
    ],
)  # fmt: skip
def test_bad_profiles_name_file_and_field(tmp_path, edit, message):
    text = edit(to_toml(GOOD))
    path = _write(tmp_path, text)
    with pytest.raises(LatencyError) as e:
        load_hardware(path)
    assert str(path) in str(e.value)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(LatencyError, match="unknown hardware 'a200'; known: a10, a100-pcie-40gb"):
        load_hardware("a200")
    with pytest.raises(LatencyError, match="no such hardware profile"):
        load_hardware("/nonexistent/x.toml")


def test_flops_for_falls_back_to_float32():
    hw = dataclasses.replace(GOOD, peak_flops={"float32": 1e12})
    assert hw.flops_for("bfloat16") == 1e12
    assert hw.flops_for("int64") == 1e12


def test_cli_hw_list_and_show(capsys, tmp_path):
    assert main(["hw", "list"]) == 0
    out = capsys.readouterr().out
    for name in REQUIRED:
        assert name in out
    assert main(["hw", "show", "l4"]) == 0
    out = capsys.readouterr().out
    assert "300.0 GB/s" in out and "source: NVIDIA L4 datasheet" in out
    hw = load_hardware("l4")  # the allocator's figures too, with their sources
    for key in ("context_reserve_bytes", "conv_workspace_bytes", "matmul_workspace_bytes"):
        assert f"  {key:<24}{getattr(hw, key)} (" in out
        assert hw.source[key][:40] in out
    assert main(["hw", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memplan hw: error: unknown hardware 'nope'") and err.count("\n") == 1
    bad = _write(tmp_path, "name = 1\n")
    assert main(["hw", "show", str(bad)]) == 2
    assert "bad.toml: name: expected a non-empty string, got 1" in capsys.readouterr().err


def test_a_deeply_nested_or_empty_profile_is_one_line(tmp_path):
    deep = _write(tmp_path, "a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(LatencyError, match="bad.toml: nested too deeply to be a hardware profile"):
        load_hardware(deep)
    empty = _write(tmp_path, "")
    with pytest.raises(LatencyError, match="bad.toml: memory_bytes: missing"):
        load_hardware(empty)
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(LatencyError, match="dir.toml: is a directory, not a hardware profile"):
        load_hardware(tmp_path / "dir.toml")
