"""JAX arrays on an accelerator, proven on the CPU by the same code: the binding's host-staged path (JAX_OPS)
carries a jax array described as a GPU array through host memory to the CPU data plane and puts the result back as
a jax array on the array's device, at 2 ranks, against numpy. (A real GPU array takes this path when the job has no
device plane for it; ``bench/gpu_check.py`` runs torch's on a GPU.)"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from horovod.testing import spawn_ranks  # noqa: E402

ENV = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "JAX_PLATFORMS": "cpu"}


def _staged(world):
    import jax.numpy as jnp
    import horovod.jax as hvd
    from horovod.common.device import DeviceTensor
    from horovod.jax._arrays import JAX_OPS, from_core, to_core
    from horovod.runtime import collectives as core
    hvd.init()
    me = hvd.rank()
    seen = {"host_leaf": type(to_core(jnp.ones(2))[0]).__name__}     # a CPU jax array stays a host array
    x = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) * (me + 1)
    described = DeviceTensor(x, "cuda:0", "bfloat16", (2, 3), None, JAX_OPS)
    summed = core.allreduce(described, name="staged", op=hvd.Sum)
    seen["sum"] = (type(summed).__name__, summed.device, np.asarray(from_core(summed, x.dtype), np.float32).tolist(),
                   str(from_core(summed, x.dtype).dtype))
    rows = DeviceTensor(jnp.full((me + 1, 2), float(me)), "cuda:0", "float32", (me + 1, 2), None, JAX_OPS)
    gathered = from_core(core.allgather(rows, name="rows"), jnp.float32)
    seen["gather"] = (type(gathered).__name__, np.asarray(gathered)[:, 0].tolist())
    hvd.shutdown()
    return seen


@pytest.mark.ranks
def test_a_gpu_array_is_staged_through_the_host_and_comes_back_a_jax_array():
    for seen in spawn_ranks(_staged, 2, timeout=90, args=(2,), env=ENV):
        assert seen["host_leaf"] == "ndarray"
        kind, device, values, dtype = seen["sum"]
        assert (kind, device, dtype) == ("DeviceTensor", "cuda:0", "bfloat16")
        assert values == (np.arange(6).reshape(2, 3) * 3).tolist()
        assert seen["gather"][0] in ("ArrayImpl", "Array") and seen["gather"][1] == [0.0, 1.0, 1.0]
