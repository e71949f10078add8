"""Registers the three test tiers' markers and fixtures (see horovod.testing.fixtures) and the skip report
(horovod.testing.skips, on with --strict-skips as in `make test`), and sets the pytest process's garbage collector
for a heap that holds TensorFlow, PyTorch and JAX at once."""

import gc

pytest_plugins = ["horovod.testing.fixtures", "horovod.testing.skips"]

# With the frameworks loaded the heap holds millions of objects, and CPython's default thresholds (a young
# collection every 700 allocations, a full one soon after) rescan them again and again while modules import and
# tests run: about 3 s of the 24 s unit tier. Young collections every 100,000 allocations instead, and what
# collection loaded frozen out of the full collections (`gc.freeze`). Only this process: ranks and launchers keep
# Python's defaults, and a test that needs a collection still calls `gc.collect()`.
gc.set_threshold(100_000, 50, 100)


def pytest_collection_finish(session):  # noqa: D103 — pytest hook
    gc.freeze()
