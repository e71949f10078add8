"""One per-process state: ``init`` builds a context, ``shutdown`` leaves no module-level state behind, and ``init``
works again; ``init(process_sets="dynamic")`` leaves the process environment alone."""

import pytest

from horovod.testing import spawn_ranks

# Module-level names that outlive shutdown() on purpose (each has a comment next to it saying why).
KEPT = {
    ("horovod.runtime.basics", "_generation"),          # a mesh scope never repeats in a process
    ("horovod.runtime.basics", "_atexit_registered"),   # atexit.register once per process
    ("horovod.runtime.basics", "_dynamic_asked"),       # dynamic mode holds for later inits, as Horovod's
    ("horovod.runtime.failure_report", "_report"),      # the launcher's account: each init re-targets it
    ("horovod.runtime.elastic_worker", "_rounds"),      # the last elastic round this process took part in
    ("horovod.runtime.launch_env", "_served"),          # rank 0's rendezvous servers, reused by a re-init
}

# Not a worker's per-process state: the launchers, the house checks and the test helpers.
_LAUNCHER_SIDE = ("horovod.runner", "horovod.spark", "horovod.ray", "horovod.tools", "horovod.testing")


def _snapshot():
    """Every module-level value of the worker's loaded modules, as something comparable."""
    import copy
    import logging
    import sys
    import types
    from horovod.runtime.process_sets import ProcessSet
    seen = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("horovod") or name.startswith(_LAUNCHER_SIDE) or module is None:
            continue
        for attr, value in vars(module).items():
            if attr.startswith("__") or isinstance(value, (types.ModuleType, types.FunctionType, type,
                                                            logging.Logger)):
                continue
            if isinstance(value, ProcessSet):
                state = (list(value.ranks or ()), value.process_set_id)
            elif isinstance(value, (int, float, str, bytes, bool, tuple, frozenset, type(None))):
                state = value
            elif isinstance(value, (list, dict, set)):
                try:
                    state = copy.deepcopy(value)
                except Exception:  # noqa: BLE001 — not copyable: compare what it shows
                    state = repr(value)
            else:
                state = (id(value), repr(vars(value)) if hasattr(value, "__dict__") else "")
            seen[(name, attr)] = state
    return seen


def _cycle_leaves_nothing():
    import os
    import numpy as np
    import horovod.numpy as hvd
    from horovod.runtime import context, process_sets
    hvd.init(process_sets="dynamic")      # a first init: the once-per-process registrations happen here
    hvd.shutdown()
    before = _snapshot()
    environ = dict(os.environ)
    static = hvd.ProcessSet([0])
    hvd.init(process_sets=[static])
    size = hvd.size()
    during = (list(process_sets.global_process_set.ranks), static.process_set_id)
    hvd.allreduce(np.ones(2))                     # an unnamed tensor: counted
    added = hvd.add_process_set([1]) if size > 1 else None
    hvd.barrier()
    hvd.shutdown()
    after = _snapshot()
    changed = sorted(f"{k[0]}.{k[1]}: {before.get(k)!r} -> {after.get(k)!r}"
                     for k in set(before) | set(after) if k not in KEPT and before.get(k) != after.get(k))
    state = (context.get(), static.process_set_id, added.process_set_id if added else None,
             process_sets.global_process_set.ranks)
    hvd.init()                            # and again: the counts start afresh, on every rank alike
    handle = hvd.allreduce_async(np.ones(1))
    name = handle.name
    handle.result()
    dynamic = context.current().dynamic_sets
    hvd.shutdown()
    return changed, during, state, name, dynamic, environ == dict(os.environ)


@pytest.mark.ranks
@pytest.mark.parametrize("world_size", [1, 2])
def test_shutdown_leaves_no_module_state_and_init_works_again(world_size):
    for rank, (changed, during, state, name, dynamic, same_env) in enumerate(
            spawn_ranks(_cycle_leaves_nothing, world_size, timeout=60)):
        assert changed == [], f"rank {rank}: module-level state left behind by shutdown: {changed}"
        assert during == (list(range(world_size)), 1)
        assert state == (None, None, None, []), "shutdown takes the context, the sets' ids and the ranks back"
        assert name == "allreduce.noname.0", "a fresh context numbers unnamed tensors from 0"
        assert dynamic, "init(process_sets='dynamic') holds for later inits of the process, as in Horovod"
        assert same_env


def _dynamic_environment():
    import os
    import horovod.numpy as hvd
    from horovod.runtime import context
    before = dict(os.environ)
    hvd.init(process_sets="dynamic")
    try:
        dynamic = context.current().dynamic_sets
        ps = hvd.add_process_set([0])
        included = ps.process_set_id == 1 and ps.included() == (hvd.rank() == 0)
    finally:
        hvd.shutdown()
    return dynamic, included, before == dict(os.environ), "HOROVOD_DYNAMIC_PROCESS_SETS" in os.environ


@pytest.mark.ranks
def test_dynamic_mode_does_not_write_the_environment():
    for dynamic, included, same, variable in spawn_ranks(_dynamic_environment, 2, timeout=60):
        assert dynamic and included
        assert same and not variable, "init(process_sets='dynamic') must not write os.environ"
