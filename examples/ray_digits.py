"""Train the digits CNN of pytorch_digits.py on a Ray cluster: Ray places the workers, Horovod averages gradients.

    python examples/ray_digits.py                                    # a local Ray, 2 workers
    python examples/ray_digits.py --address auto --num-workers 4     # an existing cluster (`ray start --head` ...)
    python examples/ray_digits.py --address auto --num-hosts 2 --workers-per-host 2   # exactly 2 per node

The training function is pytorch_digits.train, unchanged: it calls hvd.init() and trains on its shard, as under
horovodrun. Ray ships this folder to the workers (runtime_env working_dir), so the cluster needs only Ray,
horovod-py, torch and scikit-learn installed.
"""

import argparse
import os
import sys
import tempfile
import time

import ray

from horovod.ray import RayExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pytorch_digits  # noqa: E402  (this folder, shipped to the workers too)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--address", help="an existing Ray cluster (e.g. auto); default: start a local one")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-hosts", type=int, help="instead of --num-workers: this many nodes ...")
    parser.add_argument("--workers-per-host", type=int, default=1, help="... with this many workers each")
    parser.add_argument("--cpus-per-worker", type=float, default=1)
    parser.add_argument("--epochs", type=int, default=12)
    return parser.parse_args(argv)


def main(args):
    started = time.time()
    owned = not ray.is_initialized()      # a caller that started Ray already keeps it
    if owned:
        local = {} if args.address else {"num_cpus": max(args.num_workers, 2), "include_dashboard": False}
        ray.init(address=args.address, runtime_env={"working_dir": HERE, "excludes": ["checkpoints"]}, **local)
    placement = (dict(num_hosts=args.num_hosts, num_workers_per_host=args.workers_per_host) if args.num_hosts
                 else dict(num_workers=args.num_workers))
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), cpus_per_worker=args.cpus_per_worker,
                           **placement)
    executor.start()
    try:
        checkpoint = os.path.join(tempfile.gettempdir(), f"ray_digits_{os.getpid()}.pt")
        train_args = pytorch_digits.parse_args(["--epochs", str(args.epochs), "--checkpoint", checkpoint])
        accuracies = executor.run(pytorch_digits.train, args=[train_args])
    finally:
        executor.shutdown()
        if owned:
            ray.shutdown()
    print(f"ray_digits: {len(accuracies)} Ray workers, test accuracy {100 * accuracies[0]:.2f}% "
          f"(every worker agrees: {len(set(accuracies)) == 1}), {time.time() - started:.1f}s in all", flush=True)
    return accuracies[0]


if __name__ == "__main__":
    main(parse_args())
