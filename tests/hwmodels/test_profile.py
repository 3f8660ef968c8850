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
    "cpu-local",
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


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("memory_bytes = 42949672960", "memory_bytes = -1"),
         "field 'memory_bytes': expected > 0, got -1"),
        (lambda t: t.replace("memory_bytes = 42949672960\n", ""), "field 'memory_bytes': missing"),
        (lambda t: t.replace("copy_engines = 2", 'copy_engines = "two"'),
         "field 'copy_engines': expected an integer, got 'two'"),
        (lambda t: t.replace("h2d_duplex_factor = 0.5", "h2d_duplex_factor = 1.5"),
         "field 'h2d_duplex_factor': expected a factor in (0, 1]"),
        (lambda t: t.replace("[peak_flops]", "h2d_bw = 3\n[peak_flops]"), "unknown field 'h2d_bw'"),
        (lambda t: t.replace("float32 = 1.95e+13", "fp32 = 1.95e+13"), "peak_flops.fp32: unknown dtype"),
        (lambda t: t.replace("float32 = 1.95e+13", "float32 = 0"),
         "peak_flops.float32: expected a number > 0"),
        (lambda t: "\n".join(ln for ln in t.splitlines() if not ln.startswith("launch_overhead_s = \"")),
         "source.launch_overhead_s: missing"),
        (lambda t: t.replace('name = "a100-pcie-40gb"', 'name = "a100'), "not valid TOML"),
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
    with pytest.raises(LatencyError, match="unknown hardware 'a200'; known: a100-pcie-40gb"):
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
    assert main(["hw", "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memplan hw: error: unknown hardware 'nope'") and err.count("\n") == 1
    bad = _write(tmp_path, "name = 1\n")
    assert main(["hw", "show", str(bad)]) == 2
    assert "field 'name'" in capsys.readouterr().err
