"""A tiny Horovod job on numpy arrays: every rank contributes its rank, all get the sum and the average.

Run: horovodrun -np 2 python examples/numpy_allreduce.py
"""

import numpy as np

import horovod.numpy as hvd


def main():
    hvd.init()
    contribution = np.full(4, float(hvd.rank()), dtype=np.float32)
    total = hvd.allreduce(contribution, op=hvd.Sum, name="total")
    mean = hvd.allreduce(contribution, op=hvd.Average, name="mean")
    expected = sum(range(hvd.size()))
    assert np.allclose(total, expected) and np.allclose(mean, expected / hvd.size())
    print(f"rank {hvd.rank()} of {hvd.size()}: sum={total.tolist()} mean={mean.tolist()}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
