"""Elastic training of the digits CNN on a Ray cluster: Ray's nodes are the hosts, worker actors may die or join.

    python examples/ray_elastic_digits.py                              # a local Ray, up to 2 workers
    python examples/ray_elastic_digits.py --kill-after 20              # ray.kill one worker actor after 20 s
    python examples/ray_elastic_digits.py --address auto --max-workers 8   # an existing cluster

The training function is pytorch_elastic_digits.main, unchanged (hvd.elastic.run with a TorchState committed every
few batches). Discovery comes from Ray (ray.nodes()): every live node offers as many slots as it has CPUs per
worker. A worker actor that dies costs the batches since the last commit; its node is left out of the job for
--cooldown seconds, after which (or as soon as another node joins) the job grows again up to --max-workers.
"""

import argparse
import os
import sys
import threading
import time

import ray

from horovod.ray import ElasticRayExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pytorch_elastic_digits  # noqa: E402  (this folder, shipped to the workers too)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--address", help="an existing Ray cluster (e.g. auto); default: start a local one")
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--max-workers", type=int, default=2)
    parser.add_argument("--cpus-per-worker", type=float, default=1)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--cooldown", type=float, default=10, help="seconds a failed node stays out of the job")
    parser.add_argument("--kill-after", type=float, help="ray.kill one worker actor this many seconds in")
    return parser.parse_args(argv)


def train(argv):
    """The function every worker actor runs: the elastic example's main, then its rank's view of the result."""
    pytorch_elastic_digits.main(pytorch_elastic_digits.parse_args(argv))
    return "done"


def kill_one_worker_later(seconds):
    """Kill one of this job's worker actors (they are named horovod-elastic-...) after ``seconds``."""
    def kill():
        time.sleep(seconds)
        names = sorted(n["name"] if isinstance(n, dict) else n for n in ray.util.list_named_actors(all_namespaces=False))
        victims = [n for n in names if n.startswith("horovod-elastic-")]
        if victims:
            print(f"ray_elastic_digits: ray.kill({victims[-1]})", flush=True)
            ray.kill(ray.get_actor(victims[-1]))
    threading.Thread(target=kill, daemon=True).start()


def main(args):
    started = time.time()
    if not ray.is_initialized():
        local = {} if args.address else {"num_cpus": max(args.max_workers, 2), "include_dashboard": False}
        ray.init(address=args.address, runtime_env={"working_dir": HERE, "excludes": ["checkpoints"]}, **local)
    settings = ElasticRayExecutor.create_settings(min_num_proc=args.min_workers, max_num_proc=args.max_workers,
                                                  elastic_timeout=120, timeout_s=60,
                                                  cooldown_range=(args.cooldown, args.cooldown))
    executor = ElasticRayExecutor(settings, cpus_per_slot=args.cpus_per_worker)
    executor.start()
    if args.kill_after:
        kill_one_worker_later(args.kill_after)
    results = executor.run(lambda: train(["--epochs", str(args.epochs)]))
    print(f"ray_elastic_digits: finished on {len(results)} worker(s) in {time.time() - started:.1f}s", flush=True)
    return results


if __name__ == "__main__":
    main(parse_args())
