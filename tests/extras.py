"""Whether the optional packages a test needs import here (the zoo extra)."""

from __future__ import annotations

import importlib

import pytest


def has(package: str) -> bool:
    """True when `package` imports (torchvision built for another torch does not)."""
    try:
        importlib.import_module(package)
    except Exception:
        return False
    return True


needs_transformers = pytest.mark.skipif(not has("transformers"), reason="needs transformers")
needs_torchvision = pytest.mark.skipif(not has("torchvision"), reason="needs torchvision")
