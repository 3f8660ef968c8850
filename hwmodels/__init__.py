"""How long things take on a machine: hardware profiles and latency models.

- `Hardware`, `load_hardware`, `list_profiles`: TOML profiles (`hwmodels/profiles/`).
- `LatencyModel` and its kinds: `Fixed`, `Measured`, `Roofline`, `MLPLatency`
  (TENSILE's per-op-class MLP, `hwmodels.mlp`), `EWMA` (plan updating).
- `hwmodels.microbench`: the measurements the MLP is trained on.
Nothing here imports torch until a model is trained, saved or loaded.
"""

from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import EWMA, Fixed, LatencyModel, Measured, Roofline, RooflineOptions
from memplan.hwmodels.mlp import MLPLatency
from memplan.hwmodels.opclass import OpClass, classify
from memplan.hwmodels.profile import Hardware, list_profiles, load_hardware

__all__ = [
    "DeviceModel",
    "Direction",
    "TimeUnit",
    "EWMA",
    "Fixed",
    "Hardware",
    "LatencyError",
    "LatencyModel",
    "MLPLatency",
    "Measured",
    "OpClass",
    "Roofline",
    "RooflineOptions",
    "classify",
    "list_profiles",
    "load_hardware",
]
