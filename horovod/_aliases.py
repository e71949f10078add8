"""Horovod's public import paths for modules that live elsewhere here.

Code written for Horovod imports ``horovod.common.process_sets`` or ``horovod.common.basics``; in this package those
modules belong to the worker's front door (``horovod.runtime``), above the ground floor that ``horovod.common`` is.
A file in ``common/`` re-exporting them would make the ground floor import the floor above it, so instead this finder
answers for the old names with the very module object of the new one: one implementation, and
``horovod.common.process_sets.ProcessSet is horovod.runtime.process_sets.ProcessSet``. Nothing is imported until a
user asks for an old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Dict

__all__ = ["ALIASES", "install"]

# old public name -> the module that implements it
ALIASES: Dict[str, str] = {
    "horovod.common.basics": "horovod.runtime.basics",
    "horovod.common.process_sets": "horovod.runtime.process_sets",
    "horovod.common.collectives": "horovod.runtime.collectives",
    "horovod.common.compression": "horovod.runtime.compression",
    "horovod.common.topology": "horovod.runtime.topology",
    "horovod.common.launch_env": "horovod.runtime.launch_env",
    "horovod.common.elastic": "horovod.elastic",
    "horovod.elastic.worker": "horovod.runtime.elastic_worker",
    "horovod.elastic.protocol": "horovod.common.elastic_records",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self._target = target

    def create_module(self, spec):
        module = importlib.import_module(self._target)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The target ran when it was imported. The import system stamped the alias's spec on it: give the module
        # back its own, so reload, pickling by reference and tooling keep seeing the real name.
        module.__spec__ = self._real_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        real = ALIASES.get(fullname)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


_FINDER = _AliasFinder()


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
