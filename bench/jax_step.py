"""One jitted JAX training step, data-parallel on N processes: horovod.jax beside jax.distributed (and mpi4jax).

    python bench/jax_step.py [--np 2] [--steps 300] [--rounds 3] [--sizes 64,256,256,10] [--mpi4jax-site DIR]

The same model (an MLP, by default 64-256-256-10: ~85 k parameters, ``--sizes``), batch (64 per worker), optimizer
(SGD) and timing loop, with the gradient averaging done by:

1. ``horovod-py``: ``hvd.DistributedOptimizer(optax.sgd)`` inside the jitted step (one ordered host callback per
   step; the engine fuses the six gradients), started by ``horovodrun -np N``;
2. ``jax.distributed``: ``jax.distributed.initialize`` with JAX's CPU collectives (Gloo), the step a
   ``shard_map`` over one CPU device per process with ``lax.pmean`` of the flattened gradient (one all-reduce);
3. ``mpi4jax`` (when it imports, e.g. built into ``--mpi4jax-site``): ``mpi4jax.allreduce`` of the flattened
   gradient inside the jitted step, started by ``mpirun -np N``.

Each runs ``--rounds`` times, alternating (a shared machine's speed drifts); every process uses one XLA thread
(``--xla_cpu_multi_thread_eigen=false``) so the N processes share the cores alike. Prints steps per second per
round and the median ratio of horovod-py's to each other's. A benchmark, not a test: nothing asserts on time.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--sizes", default="64,256,256,10", help="the MLP's layer widths")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mpi4jax-site", default="", help="a folder holding mpi4jax (pip install --target)")
    parser.add_argument("--only", default="", help="comma-separated implementations to run")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default="", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- the workers ----------------------------------------------------------------------------------------------------

def _model(jax, jnp, args, rank):
    sizes, batch_size = [int(s) for s in args.sizes.split(",")], args.batch_size
    key = jax.random.PRNGKey(0)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) * (2.0 / fan_in) ** 0.5,
                       "b": jnp.zeros(fan_out)})
    rng = np.random.RandomState(rank)
    x = rng.rand(batch_size, sizes[0]).astype(np.float32)
    y = rng.randint(0, sizes[-1], batch_size).astype(np.int32)
    return params, x, y


def _loss(jax, optax):
    def loss(params, x, y):
        for layer in params[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        logits = x @ params[-1]["w"] + params[-1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss


def _time(step, state, x, y, args, barrier, block):
    for _ in range(args.warmup):
        state = step(*state, x, y)
    block(state)
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        state = step(*state, x, y)
    block(state)
    return args.steps / (time.perf_counter() - start)


def worker_horovod(args):
    import jax
    import optax

    import horovod.jax as hvd
    hvd.init()
    params, x, y = _model(jax, jax.numpy, args, hvd.rank())
    opt = hvd.DistributedOptimizer(optax.sgd(0.01))
    loss = _loss(jax, optax)

    @jax.jit
    def step(params, opt_state, x, y):
        updates, opt_state = opt.update(jax.grad(loss)(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    rate = _time(step, (params, opt.init(params)), x, y, args, hvd.barrier, jax.block_until_ready)
    rate = float(hvd.allreduce(jax.numpy.float32(rate), op=hvd.Min, name="rate"))
    if hvd.rank() == 0:
        print(f"RESULT steps_per_sec={rate:.2f}", flush=True)
    hvd.shutdown()


def worker_jax_distributed(args):
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, num_processes=args.np, process_id=args.process_id)
    import optax
    from jax.flatten_util import ravel_pytree
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("d",))
    params, x, y = _model(jax, jax.numpy, args, args.process_id)
    opt, loss = optax.sgd(0.01), _loss(jax, optax)

    def local_step(params, opt_state, x, y):
        flat, unravel = ravel_pytree(jax.grad(loss)(params, x, y))
        updates, opt_state = opt.update(unravel(jax.lax.pmean(flat, "d")), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    shard_map = jax.shard_map
    step = jax.jit(shard_map(local_step, mesh=mesh, in_specs=(P(), P(), P("d"), P("d")), out_specs=(P(), P())))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("d"))
    state = (jax.device_put(params, replicated), jax.device_put(opt.init(params), replicated))
    x, y = (jax.make_array_from_process_local_data(sharded, a) for a in (x, y))
    total = jax.jit(shard_map(lambda v: jax.lax.pmin(v, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()))

    def barrier():
        total(jax.make_array_from_process_local_data(sharded, np.zeros(1, np.float32))).block_until_ready()
    rate = _time(step, state, x, y, args, barrier, jax.block_until_ready)
    rate = float(total(jax.make_array_from_process_local_data(sharded, np.array([rate], np.float32)))[0])
    if args.process_id == 0:
        print(f"RESULT steps_per_sec={rate:.2f}", flush=True)
    jax.distributed.shutdown()


def worker_mpi4jax(args):
    import jax
    import mpi4jax
    import optax
    from jax.flatten_util import ravel_pytree
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    params, x, y = _model(jax, jax.numpy, args, comm.rank)
    opt, loss = optax.sgd(0.01), _loss(jax, optax)

    @jax.jit
    def step(params, opt_state, x, y):
        flat, unravel = ravel_pytree(jax.grad(loss)(params, x, y))
        averaged = unravel(mpi4jax.allreduce(flat, op=MPI.SUM, comm=comm) / comm.size)
        updates, opt_state = opt.update(averaged, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    rate = _time(step, (params, opt.init(params)), x, y, args, comm.Barrier, jax.block_until_ready)
    rate = comm.allreduce(rate, op=MPI.MIN)
    if comm.rank == 0:
        print(f"RESULT steps_per_sec={rate:.2f}", flush=True)


def worker_local(args):
    """The same step without any communication, one process: what the step costs before averaging."""
    import jax
    import optax
    params, x, y = _model(jax, jax.numpy, args, 0)
    opt, loss = optax.sgd(0.01), _loss(jax, optax)

    @jax.jit
    def step(params, opt_state, x, y):
        updates, opt_state = opt.update(jax.grad(loss)(params, x, y), opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    rate = _time(step, (params, opt.init(params)), x, y, args, lambda: None, jax.block_until_ready)
    print(f"RESULT steps_per_sec={rate:.2f}", flush=True)


WORKERS = {"horovod-py": worker_horovod, "jax.distributed": worker_jax_distributed, "mpi4jax": worker_mpi4jax,
           "local (no communication, 1 process)": worker_local}


# -- the driver -----------------------------------------------------------------------------------------------------

def _env(args):
    paths = [ROOT] + ([args.mpi4jax_site] if args.mpi4jax_site else []) + [os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)), XLA_FLAGS=XLA_FLAGS,
                JAX_PLATFORMS="cpu", MPI4JAX_NO_WARN_JAX_VERSION="1")


def _worker_args(args, name):
    return [sys.executable, os.path.abspath(__file__), "--worker", name, "--np", str(args.np), "--steps",
            str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size), "--sizes", args.sizes]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, name):
    env = _env(args)
    if name == "horovod-py":
        procs = [subprocess.Popen([sys.executable, "-m", "horovod.runner", "-np", str(args.np),
                                   *_worker_args(args, name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)]
    elif name == "jax.distributed":
        coordinator = f"127.0.0.1:{_free_port()}"
        procs = [subprocess.Popen(_worker_args(args, name) + ["--process-id", str(i), "--coordinator", coordinator],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for i in range(args.np)]
    elif name == "mpi4jax":
        procs = [subprocess.Popen(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.np),
                                   *_worker_args(args, name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)]
    else:
        procs = [subprocess.Popen(_worker_args(args, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)]
    outputs = [p.communicate(timeout=900) for p in procs]
    text = "".join(out + err for out, err in outputs)
    match = re.search(r"RESULT steps_per_sec=([\d.]+)", text)
    if not match or any(p.returncode for p in procs):
        sys.exit(f"{name} failed:\n{text[-4000:]}")
    return float(match.group(1))


def _available(args):
    names = ["horovod-py", "jax.distributed"]
    probe = subprocess.run([sys.executable, "-c", "import mpi4jax"], env=_env(args), capture_output=True)
    if probe.returncode == 0:
        names.append("mpi4jax")
    else:
        print("mpi4jax does not import here: left out (see --mpi4jax-site)", flush=True)
    names.append("local (no communication, 1 process)")
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    return [n for n in names if not only or n in only]


def main():
    args = parse_args()
    if args.worker:
        WORKERS[args.worker](args)
        return
    names = _available(args)
    print(f"MLP {args.sizes.replace(',', '-')}, batch {args.batch_size} per worker, {args.np} workers, one XLA thread "
          f"each, {args.steps} timed steps, {args.rounds} alternating round(s)", flush=True)
    rates = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names:
            rates[name].append(_launch(args, name))
            print(f"round {round_ + 1}: {name:40s} {rates[name][-1]:9.1f} steps/s", flush=True)
    print("\n| implementation | steps/s (median of rounds) | rounds | horovod-py / it (median of per-round ratios) |")
    print("|---|---|---|---|")
    for name in names:
        ratios = [h / r for h, r in zip(rates.get("horovod-py", []), rates[name])]
        ratio = f"{float(np.median(ratios)):.2f}x" if ratios and name != "horovod-py" else "-"
        print(f"| {name} | {float(np.median(rates[name])):.1f} | {', '.join(f'{r:.1f}' for r in rates[name])} "
              f"| {ratio} |")


if __name__ == "__main__":
    main()
