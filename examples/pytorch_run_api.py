"""The digits training of ``pytorch_digits.py`` started from Python with ``horovod.run``: no launcher needed.

    python examples/pytorch_run_api.py --np 2

``horovod.run`` starts the workers, runs the function on each, and returns the results ordered by rank.
"""

import argparse
import os
import sys

import horovod

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_digits import parse_args, train  # noqa: E402  (the example next to this one)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, help="number of workers")
    args, rest = parser.parse_known_args()
    train_args = parse_args(rest)
    accuracies = horovod.run(train, args=(train_args,), np=args.np)
    print(f"test accuracy by rank: {', '.join(f'{100 * a:.2f}%' for a in accuracies)}")


if __name__ == "__main__":
    main()
