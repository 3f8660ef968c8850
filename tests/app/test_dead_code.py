"""No function or class in the package that nothing names (NOTE [ Dead code ])."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections import Counter
from pathlib import Path

# NOTE [ Dead code ]
# A function or class defined in the package is live when its name is used
# somewhere in the repository's Python (package, tests, benchmarks, examples)
# other than in its own definition: read as a name, an attribute, an import
# or a string that is exactly the name (getattr and registries by name). Two
# kinds are live without being named: a function registered by a decorator
# (`@handles(...)`), and a method a library calls (a hook), listed in `HOOKS`
# with the library module whose source calls it (checked). A name shared by
# two definitions keeps both alive: the check can miss dead code but never
# flags live code.
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("memplan", "traces", "hwmodels", "planners", "sim", "validate")
USERS = ("tests", "benchmarks", "examples")

# method name -> the library module that calls it
HOOKS = {
    "_maybe_opt_step": "torch.amp.grad_scaler",
    "on_solution_callback": "ortools.sat.python.cp_model",
    "find_class": "pickle",
}
NOT_REGISTRATION = {"property", "staticmethod", "classmethod", "cached_property", "setter"}


def _files(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for d in folders for p in (ROOT / d).rglob("*.py"))


def _names_used(files: list[Path]) -> Counter[str]:
    used: Counter[str] = Counter()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Name):
                used[node.id] += 1
            elif isinstance(node, ast.Attribute):
                used[node.attr] += 1
            elif isinstance(node, ast.alias):
                used[node.name.rsplit(".", 1)[-1]] += 1
            elif isinstance(node, ast.Constant) and str(node.value).isidentifier():
                used[node.value] += 1
    return used


def _registers(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """A decorator other than property & co: it files the function somewhere."""
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name not in NOT_REGISTRATION:
            return True
    return False


def _unnamed_definitions() -> list[str]:
    used = _names_used(_files(PACKAGE + USERS))
    out = []
    for path in _files(PACKAGE):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            name = node.name
            if name.startswith("__") and name.endswith("__"):
                continue
            if used[name] or name in HOOKS or _registers(node):
                continue
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return out


def test_every_function_and_class_is_used_somewhere():
    assert _unnamed_definitions() == []


def test_the_hooks_are_the_libraries_own():
    for name, module in HOOKS.items():
        assert f".{name}(" in inspect.getsource(importlib.import_module(module)), (name, module)


def test_the_check_finds_a_function_nothing_names(tmp_path, monkeypatch):
    pkg = tmp_path / "sim"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def used():\n    return 1\n\n\ndef dead():\n    return used()\n\n\n"
        "@property\ndef prop():\n    return 2\n\n\n@register('x')\ndef filed():\n    return 3\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert _unnamed_definitions() == ["sim/m.py:5 dead", "sim/m.py:10 prop"]
