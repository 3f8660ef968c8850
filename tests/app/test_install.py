"""A non-editable install: one top-level package, `memplan`, whatever else is
installed beside it (configobj ships a top-level `validate` module, PyPI's
`traces` is a package), and shipped traces reachable by name from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build = tmp_path_factory.mktemp("src")
    # build from a copy of what git tracks: no build/ or egg-info lands in the checkout
    files = run("git", "ls-files", cwd=ROOT).split("\n")
    for f in filter(None, files):
        src, dst = ROOT / f, build / f
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    pip = (sys.executable, "-m", "pip")
    run(*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), ".", cwd=build)
    (whl,) = dist.glob("memplan-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_has_one_top_level_package(wheel):
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {n for n in names if not n.endswith(".dist-info")} == {"memplan"}
    listing = zipfile.ZipFile(wheel).namelist()
    assert "memplan/traces/data/resnet50_b16_adam.json.gz" in listing
    assert "memplan/hwmodels/profiles/rtx-a6000.toml" in listing


@pytest.mark.slow
def test_installed_beside_generic_top_level_names(wheel, tmp_path):
    site = tmp_path / "site"
    run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
        str(wheel), cwd=tmp_path)  # fmt: skip
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == [
        "bin",
        "memplan",
    ] or sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == ["memplan"]
    # what configobj and PyPI's `traces` put at the top level
    (site / "validate.py").write_text("raise ImportError('the other validate')\n")
    (site / "traces").mkdir()
    (site / "traces" / "__init__.py").write_text("raise ImportError('the other traces')\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import memplan, memplan.validate, memplan.traces.io as io\n"
        "from memplan.validate import ValidationError\n"
        "print(memplan.__file__); print(len(io.shipped()))"
    )
    out = run(sys.executable, "-c", probe, cwd=elsewhere, env=env).split()
    assert out[0].startswith(str(site)) and int(out[1]) >= 6
    out = run(sys.executable, "-m", "memplan", "compare", "zoo:gpt2", "--gpu", "rtx-a6000",
              "--planners", "release_only", "--json", cwd=elsewhere, env=env)  # fmt: skip
    assert '"planner": "release_only"' in out
