"""The floors of the house: which floor every package stands on, and which floors each floor may import.

One table for the layer check (:mod:`horovod.tools.house`) and the picture (:mod:`horovod.tools.house_picture`);
``docs/architecture.md`` says the same in words. A package missing from :data:`ROOMS` breaks the check, so a new
package has to be given a floor.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

__all__ = ["FLOORS", "ROOMS", "MAY_IMPORT", "EXCEPTIONS", "floor_of", "allowed", "excused"]

GROUND, TRANSPORT, ALGORITHMS, ENGINE = "ground floor", "transport", "algorithms", "engine"
FRONT_DOOR, BINDINGS, LAUNCHERS, ESTIMATORS, TOOLS = "front door", "bindings", "launchers", "estimators", "tools"
# From the ground up.
FLOORS: Tuple[str, ...] = (GROUND, TRANSPORT, ALGORITHMS, ENGINE, FRONT_DOOR, BINDINGS, LAUNCHERS, ESTIMATORS, TOOLS)

# Package (a module's name after ``horovod.``; the longest match wins; "" is ``horovod/__init__``) -> its floor.
ROOMS: Dict[str, str] = {
    "common": GROUND, "version": GROUND,
    "transport": TRANSPORT,
    "algorithms": ALGORITHMS,
    "core": ENGINE, "timeline": ENGINE, "autotune": ENGINE,
    "runtime": FRONT_DOOR,
    "numpy": BINDINGS, "torch": BINDINGS, "tensorflow": BINDINGS, "keras": BINDINGS, "jax": BINDINGS,
    "elastic": BINDINGS,
    "": LAUNCHERS, "runner": LAUNCHERS, "ray": LAUNCHERS, "spark": LAUNCHERS,
    "spark.keras": ESTIMATORS, "spark.torch": ESTIMATORS,
    "testing": TOOLS, "tools": TOOLS,
}

# Floor -> (the floors its modules may import at their top level, the floors they may import only inside a function).
# A launcher starts workers and reaches the worker's floors only in the code a worker runs (``run_task``, the Ray
# actor's methods), so importing a launcher never loads the engine; an estimator is the code every rank runs.
MAY_IMPORT: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    GROUND: ((GROUND,), ()),
    TRANSPORT: ((TRANSPORT, GROUND), ()),
    ALGORITHMS: ((ALGORITHMS, TRANSPORT, GROUND), ()),
    ENGINE: ((ENGINE, ALGORITHMS, TRANSPORT, GROUND), ()),
    FRONT_DOOR: ((FRONT_DOOR, ENGINE, GROUND), ()),
    BINDINGS: ((BINDINGS, FRONT_DOOR, GROUND), ()),
    LAUNCHERS: ((LAUNCHERS, GROUND), (FRONT_DOOR, BINDINGS)),
    ESTIMATORS: ((ESTIMATORS, LAUNCHERS, BINDINGS, FRONT_DOOR, GROUND), ()),
    TOOLS: (FLOORS, ()),
}

_PUBLIC_PATH = "Horovod's public path: the file re-exports the front door's objects under the name Horovod gives them"
# (importing module, imported package or module) -> why it may cross its floor's rule. Only Horovod 0.28.1's own
# paths: its ``horovod/common`` had ``basics``, ``process_sets`` and ``elastic`` (and ``exceptions``, ``util``, which
# are ground-floor modules here); a path Horovod never had gets no exception.
EXCEPTIONS: Dict[Tuple[str, str], str] = {
    (f"horovod.common.{name}", target): _PUBLIC_PATH
    for name, target in (("basics", "horovod.runtime"), ("process_sets", "horovod.runtime"),
                         ("elastic", "horovod.elastic"))
}


def floor_of(module: str) -> Optional[str]:
    """The floor of the dotted ``module`` name (``horovod.x.y``), or None when its package has no floor."""
    parts = module.split(".")[1:]
    if not parts:
        return ROOMS[""]
    for cut in range(len(parts), 0, -1):
        floor = ROOMS.get(".".join(parts[:cut]))
        if floor is not None:
            return floor
    return None


def allowed(importer: str, imported: str, inside_function: bool) -> bool:
    """Whether module ``importer`` may import ``imported`` (at its top level, or inside a function)."""
    if "." not in imported:
        return True   # the package root runs before anything of it, and imports nothing at its top level
    own, other = floor_of(importer), floor_of(imported)
    if own is None or other is None:
        return False
    top, local = MAY_IMPORT[own]
    return other in top or (inside_function and other in local)


def excused(importer: str, imported: str) -> Optional[str]:
    """The reason ``importer`` may import ``imported`` against the table, or None."""
    for (name, target), reason in EXCEPTIONS.items():
        if importer == name and (imported == target or imported.startswith(target + ".")):
            return reason
    return None
