"""One per-process state: ``init`` builds a context, ``shutdown`` leaves no module-level state behind, and ``init``
works again; ``init(process_sets="dynamic")`` leaves the process environment alone.

Every module-level value that outlives a job is a row of docs/architecture.md's table "What outlives a job", read
here: a worker's modules (every binding importable here loaded) hold no other mutable module-level state, and an
init/collectives/shutdown cycle of every binding changes no other module-level value.
"""

import pathlib
import re

import pytest

from horovod.testing import spawn_ranks

ARCHITECTURE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# Not a worker's per-process state: the launchers, the house checks and the test helpers.
_LAUNCHER_SIDE = ("horovod.runner", "horovod.spark", "horovod.ray", "horovod.tools", "horovod.testing")
BINDINGS = ("horovod.numpy", "horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras",
            "horovod.jax")


def declared():
    """``{(module, name): why}``: the rows of docs/architecture.md's table "What outlives a job"."""
    section = ARCHITECTURE.read_text().split("### What outlives a job", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| `(\w+)` \| (.+) \|$", section, re.M)
    return {(module, name): why for module, name, why in rows}


KEPT = set(declared())


def _load_bindings():
    """Import every binding importable here; returns the ones that are."""
    import importlib
    loaded = []
    for name in BINDINGS:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    return loaded


def _worker_modules():
    import sys
    return {name: module for name, module in sorted(sys.modules.items())
            if name.startswith("horovod") and not name.startswith(_LAUNCHER_SIDE) and module is not None}


def _snapshot():
    """Every module-level value of the worker's loaded modules, as something comparable."""
    import copy
    import itertools
    import logging
    import types
    from horovod.runtime.process_sets import ProcessSet
    seen = {}
    for name, module in _worker_modules().items():
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
            elif isinstance(value, itertools.count):
                state = repr(value)
            else:
                state = (id(value), repr(vars(value)) if hasattr(value, "__dict__") else "")
            seen[(name, attr)] = state
    return seen


def _changed(before, after):
    return sorted(f"{k[0]}.{k[1]}: {before.get(k)!r} -> {after.get(k)!r}"
                  for k in set(before) | set(after) if k not in KEPT and before.get(k) != after.get(k))


# -- no undeclared mutable module-level state ----------------------------------------------------------------------

# Calls that change the object they are called on (containers, counters, locks, events, queues).
_MUTATORS = frozenset({"append", "add", "update", "pop", "popitem", "clear", "setdefault", "extend", "insert",
                       "remove", "discard", "appendleft", "popleft", "extendleft", "rotate", "sort", "reverse",
                       "put", "put_nowait", "get_nowait", "acquire", "release", "set", "__setitem__",
                       "__delitem__"})


def _writes(function, name):
    """How ``function``'s own body changes the module-level ``name`` (empty if it does not, or shadows it)."""
    import ast
    nodes = list(ast.walk(function))
    if any(isinstance(n, ast.Global) and name in n.names for n in nodes):
        return {"global"}
    local = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    local |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if name in local:
        return set()
    found = set()
    for n in nodes:
        target = getattr(n, "value", None)
        if isinstance(n, ast.Call):
            target = n.func.value if isinstance(n.func, ast.Attribute) else None
            if isinstance(n.func, ast.Name) and n.func.id == "next" and n.args and \
                    isinstance(n.args[0], ast.Name) and n.args[0].id == name:
                found.add("next()")
        named = isinstance(target, ast.Name) and target.id == name
        if named and isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            found.add("item or attribute written")
        elif named and isinstance(n, ast.Call) and n.func.attr in _MUTATORS:
            found.add(f".{n.func.attr}()")
        elif isinstance(n, ast.withitem) and isinstance(n.context_expr, ast.Name) and n.context_expr.id == name:
            found.add("with")
    return found


def _module_state():
    """``(bindings loaded, [(module, name, how a function changes it)], modules that failed to import)`` for every
    worker module: each module-level name a function rebinds (``global``) or changes in place."""
    import ast
    import importlib
    import inspect
    import logging
    import pkgutil
    import types
    import horovod
    loaded = _load_bindings()
    failed = []
    for info in pkgutil.walk_packages(horovod.__path__, "horovod."):
        if not info.name.startswith(_LAUNCHER_SIDE):
            try:
                importlib.import_module(info.name)
            except ImportError as error:     # an optional dependency this machine lacks
                failed.append(f"{info.name}: {error}")
    state = []
    for module_name, module in _worker_modules().items():
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError):
            continue
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        for attr, value in vars(module).items():
            if attr.startswith("__") or isinstance(value, (types.ModuleType, types.FunctionType, type,
                                                            logging.Logger)):     # (logging's: the process's)
                continue
            how = set().union(*(_writes(f, attr) for f in functions)) if functions else set()
            if how:
                state.append((module_name, attr, sorted(how)))
    return loaded, state, failed


def _bindings_job():
    """Both checks that load every binding, in one job (each rank's imports of TensorFlow, PyTorch and JAX were
    most of either's 30 s): the init/shutdown cycles first, then rank 0 scans the source of every worker module."""
    import horovod.numpy as hvd
    cycle = _bindings_cycle()
    hvd.init()
    first = hvd.rank() == 0
    hvd.shutdown()
    return cycle, _module_state() if first else None


@pytest.fixture(scope="module")
def bindings_job():
    """By rank: ``(_bindings_cycle(), _module_state() on rank 0)`` from one 2-rank job."""
    return spawn_ranks(_bindings_job, 2, timeout=300)


@pytest.mark.ranks
def test_every_mutable_module_global_is_declared(bindings_job):
    [(loaded, state, failed)] = [scan for _, scan in bindings_job[:1]]
    assert "horovod.numpy" in loaded and len(loaded) > 1, f"only {loaded} could be loaded: {failed}"
    found = {(module, name) for module, name, _ in state}
    undeclared = [f"{module}.{name} ({', '.join(how)})" for module, name, how in state if (module, name) not in KEPT]
    assert not undeclared, (
        "module-level state outside the Context: keep it in the Context (a Context.binding state for a binding), or "
        f"declare it in docs/architecture.md's table 'What outlives a job', saying why: {undeclared}")
    stale = sorted(f"{module}.{name}" for module, name in KEPT - found
                   if module.startswith(tuple(loaded)) or not module.startswith(BINDINGS))
    assert not stale, f"declared in docs/architecture.md but no longer module-level state: {stale}"


@pytest.mark.unit
def test_the_table_says_why():
    rows = declared()
    assert ("horovod.runtime.context", "_context") in rows and len(rows) >= 10
    assert all(len(why.strip()) > 20 for why in rows.values()), rows


# -- an init/collectives/shutdown cycle leaves nothing behind ------------------------------------------------------

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
    changed = _changed(before, _snapshot())
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


def _every_binding_once(loaded):
    """One job's work through every loaded binding, using what each keeps per job; returns the name of an
    asynchronous mode built in the job and a torch handle left unsynchronized (None without torch)."""
    from horovod.runtime import async_policy
    name, pending = async_policy.LocalSGD(period=2).name, None
    if "horovod.torch" in loaded:
        import torch
        import horovod.torch as ht
        tensor = torch.ones(2)
        ht.synchronize(ht.allreduce_async_(tensor))
        ht.synchronize(ht.allreduce_async(tensor, name="torch.named"))
        pending = ht.allreduce_async(tensor)      # never synchronized: the job's handle map drops it
    if "horovod.jax" in loaded:
        import jax
        import jax.numpy as jnp
        import horovod.jax as hj
        jax.jit(lambda x: hj.synchronize(hj.allreduce_async(x)) + hj.allreduce(x))(jnp.ones(2)).block_until_ready()
        hj.allreduce(jnp.ones(2))
    if "horovod.tensorflow" in loaded:
        import tensorflow as tf
        import horovod.tensorflow as htf
        tf.function(lambda x: htf.allreduce(x))(tf.ones(2))
        htf.allreduce(tf.ones(2))
    return name, pending


def _bindings_cycle():
    import horovod.numpy as hvd
    from horovod.common.exceptions import HorovodInternalError
    loaded = _load_bindings()
    hvd.init()                        # a first job: JAX compiles, the once-per-process registrations happen
    _every_binding_once(loaded)
    hvd.shutdown()
    before = _snapshot()
    hvd.init()
    first, pending = _every_binding_once(loaded)
    hvd.shutdown()
    changed = _changed(before, _snapshot())
    hvd.init()                        # a new job counts the asynchronous modes' names afresh, on every rank alike
    again, _ = _every_binding_once(loaded)
    stale = None
    if "horovod.torch" in loaded:
        import horovod.torch as ht
        try:
            ht.synchronize(pending)       # the earlier job's handle: refused, never taken for one of this job
        except HorovodInternalError as error:
            stale = str(error)
    hvd.shutdown()
    return loaded, changed, first, again, stale


@pytest.mark.ranks
def test_every_binding_leaves_no_job_state_behind(bindings_job):
    for rank, (loaded, changed, first, again, stale) in enumerate(cycle for cycle, _ in bindings_job):
        assert changed == [], f"rank {rank} ({loaded}): module-level state left behind by shutdown: {changed}"
        assert first == again == "localsgd.0", "each job numbers its asynchronous modes from 0"
        if "horovod.torch" in loaded:
            assert stale and "shut down" in stale, stale


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
