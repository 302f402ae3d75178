"""A package's public names loaded on first use (PEP 562), so importing it loads nothing heavy."""

import importlib


def lazy_names(package, homes, modules=()):
    """`(__getattr__, __dir__, __all__)` for `package` (its `__name__`): each name of `homes`
    (`{name: module path}`) is taken from its module, and each of `modules` (submodule names)
    imported, when first used."""
    public = sorted([*homes, *modules])

    def __getattr__(name):
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(importlib.import_module(package))) | set(public))

    return __getattr__, __dir__, public
