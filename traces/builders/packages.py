"""Optional packages (torchvision, transformers, peft), imported when a
factory runs, each with a one-line message when missing or broken."""

from __future__ import annotations

import importlib
from types import ModuleType

from memplan.traces.errors import TraceError


# ---- optional packages --------------------------------------------------------------------
def _package(module: str, who: str, install: str, need: str = "") -> ModuleType:
    """Import `module`, or say in one line that `who` needs it (`need`: what
    to call it, its top-level package by default) and how to `install` it."""
    need = need or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TraceError(f"{who} needs {need}: {install}") from None
    except Exception as e:  # installed but broken, e.g. built for another torch
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise TraceError(f"{who} needs {need}, but importing {module} failed: {reason}") from None


_ZOO_EXTRA = "pip install 'memplan[zoo]'"


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
