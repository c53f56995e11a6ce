"""The package's public surface: version, `__all__` of every package, docstrings, typing marker, light import."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import ranger_jax

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(info.name for info in pkgutil.walk_packages(ranger_jax.__path__, "ranger_jax.") if info.ispkg)
MODULES = sorted(info.name for info in pkgutil.walk_packages(ranger_jax.__path__, "ranger_jax.")
                 if not any(part.startswith("_") for part in info.name.split(".")))


def _public(name: str) -> bool:
    return not name.startswith("_")


def _undocumented(obj) -> bool:
    doc = (vars(obj).get("__doc__") if inspect.isclass(obj) else obj.__doc__) or ""  # a class's own, not inherited
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):  # the signature a dataclass makes up
        return True
    return not doc.strip()


def _members(cls):
    """(name, function) of the public methods, class/static methods and properties `cls` defines itself."""
    for name, value in vars(cls).items():
        if not _public(name):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            yield name, value.__func__
        elif isinstance(value, property):
            yield name, value.fget
        elif inspect.isfunction(value):
            yield name, value


def test_version_is_the_distributions():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    assert ranger_jax.__version__ == pyproject["project"]["version"]
    assert ranger_jax.__version__ == importlib.metadata.version("ranger_jax")


def test_import_ranger_jax_is_light():
    heavy = ("jax", "flax", "numpy", "PIL", "httpx")
    code = f"import sys, ranger_jax; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_names_its_public_api(package):
    module = importlib.import_module(package)
    assert (module.__doc__ or "").strip(), f"{package} has no docstring"
    names = getattr(module, "__all__", None)
    assert names, f"{package} has no __all__"
    assert len(set(names)) == len(names), f"{package}.__all__ repeats a name"
    for name in names:  # a listed submodule may be left unimported on purpose (env.backends); it must import
        if not hasattr(module, name):
            importlib.import_module(f"{package}.{name}")


def test_packages_import_first_in_any_order():
    """Each package, imported first into a fresh interpreter state, loads (its __init__ imports form no cycle)."""
    code = ("import importlib, sys\n"
            f"for name in {PACKAGES!r}:\n"
            "    for m in [m for m in sys.modules if m == 'ranger_jax' or m.startswith('ranger_jax.')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]


def test_public_functions_classes_and_methods_have_docstrings():
    missing = []
    for name in MODULES:
        module = importlib.import_module(name)
        if not (module.__doc__ or "").strip():
            missing.append(f"{name} (module)")
        for attr, obj in vars(module).items():
            if not _public(attr) or getattr(obj, "__module__", None) != name:
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if _undocumented(obj):
                missing.append(f"{name}.{attr}")
            if inspect.isclass(obj):
                missing += [f"{name}.{attr}.{m}" for m, fn in _members(obj) if not (fn.__doc__ or "").strip()]
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def test_qwen3_vl_docstring_lists_its_entry_points():
    from ranger_jax.models import qwen3_vl

    doc = qwen3_vl.__doc__
    for name in qwen3_vl.__all__:
        assert f"`{name}`" in doc or f"{name}`" in doc, f"qwen3_vl docstring does not mention {name}"
    for entry in ("loss.causal_lm_loss", "flops."):
        assert entry in doc, f"qwen3_vl docstring does not mention {entry}"


def test_py_typed_ships():
    assert (Path(ranger_jax.__file__).parent / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["*"]
