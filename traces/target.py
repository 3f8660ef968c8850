"""The device a trace describes: the GPU (or cpu) it was captured *for*.

A capture on a real device records that device. A capture on meta records
meta's own dispatch unless it names a `Target`: then what PyTorch's dispatch
would run on that device is emulated (`memplan.traces.emulate`) and the trace
records the target. The hardware layer builds targets from its profiles
(`Hardware.target()`); this module only describes them, so `traces` imports
nothing of ours.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from memplan.traces.errors import TraceError


class TargetDevice(enum.Enum):
    """The device type whose dispatch a target's trace follows."""

    CUDA = "cuda"
    CPU = "cpu"


class AttentionBackend(enum.Enum):
    """The kernel `F.scaled_dot_product_attention` runs. AUTO: the one the
    target's dispatch picks (NOTE [ SDPA backend selection ] in
    traces/emulate/sdpa_selection.py); the others pin it, as
    `torch.nn.attention.sdpa_kernel` does."""

    AUTO = "auto"
    FLASH = "flash"
    EFFICIENT = "efficient"
    CUDNN = "cudnn"
    MATH = "math"


@dataclass(frozen=True, slots=True)
class Target:
    """A device a trace is captured for. `name` is the hardware profile it
    came from; `compute_capability` is (major, minor) for CUDA and None for
    cpu; `attention` pins the SDPA backend (AUTO lets the target pick)."""

    name: str
    device: TargetDevice
    compute_capability: tuple[int, int] | None = None
    attention: AttentionBackend = AttentionBackend.AUTO

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TraceError(f"target name={self.name!r} must be a non-empty string")
        cc = self.compute_capability
        if self.device is TargetDevice.CUDA:
            if (
                not isinstance(cc, tuple)
                or len(cc) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in cc)
                or not (3 <= cc[0] <= 20 and 0 <= cc[1] <= 9)
            ):
                raise TraceError(
                    f"target {self.name}: compute_capability={cc!r} must be (major, minor), "
                    "major in [3, 20] and minor in [0, 9]"
                )
        elif cc is not None:
            raise TraceError(f"target {self.name}: a cpu target has no compute capability")
        if self.device is TargetDevice.CPU and self.attention in (
            AttentionBackend.EFFICIENT,
            AttentionBackend.CUDNN,
        ):
            raise TraceError(
                f"target {self.name}: attention={self.attention.value} runs on CUDA only "
                "(cpu has flash and math)"
            )

    @property
    def sm(self) -> int:
        """The compute capability as one number (8.0 -> 80); 0 for cpu."""
        cc = self.compute_capability
        return 0 if cc is None else 10 * cc[0] + cc[1]

    def describe(self) -> str:
        """`a100-sxm-80gb (cuda, sm 8.0)`, `cpu-local (cpu)`, with a pinned
        attention backend after a semicolon."""
        cc = self.compute_capability
        arch = f"{self.device.value}, sm {cc[0]}.{cc[1]}" if cc else self.device.value
        pinned = (
            "" if self.attention is AttentionBackend.AUTO else f"; attention {self.attention.value}"
        )
        return f"{self.name} ({arch}{pinned})"

    def to_json(self) -> dict:
        out: dict = {"name": self.name, "device": self.device.value}
        if self.compute_capability is not None:
            out["compute_capability"] = list(self.compute_capability)
        out["attention"] = self.attention.value
        return out


def parse_compute_capability(text: str, where: str) -> tuple[int, int]:
    """`"8.0"` -> (8, 0); anything else a one-line `TraceError` naming `where`."""
    major, dot, minor = str(text).partition(".")
    if not dot or not major.isdigit() or not minor.isdigit() or len(minor) != 1:
        raise TraceError(f"{where}: compute capability {text!r} must read MAJOR.MINOR (8.0, 9.0)")
    return int(major), int(minor)


# NOTE [ Capture targets ]
# A trace says which device it describes (`TraceMeta.target`). On meta with a
# target, the step runs under `emulate.Emulation` and records what the
# target's dispatch would run (traces/emulate/). On a real device the target
# must be that device's type (a cpu capture for a cpu target, a cuda capture
# for a cuda one): the trace records what ran, and the target only names it.
# Without a target a meta capture records meta's own dispatch (math
# attention, per-step RNN cells, no autocast), as traces from before targets.
def check_target(target: Target | None, device: str) -> None:
    """That `target` may be captured on `device` (NOTE [ Capture targets ])."""
    if target is None:
        return
    if not isinstance(target, Target):
        raise TraceError(f"target={target!r} must be a traces.target.Target")
    if device == "meta":
        return
    kind = "cuda" if device.startswith("cuda") else device
    if kind != target.device.value:
        raise TraceError(
            f"target {target.name} is a {target.device.value} device: capture it on meta "
            f"(emulated) or on {target.device.value}, not on {device}"
        )
