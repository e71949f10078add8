"""Allreduce latency and bus bandwidth only: horovod-py beside torch.distributed (Gloo) and Open MPI, in one run.

    python bench/allreduce.py [--np 2] [--max-mib 256] [--seconds 0.5]

The allreduce part of ``bench/suite.py`` (same workers, same timing, same tables); see that file.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    sys.argv[1:1] = ["--ops", "allreduce", "--no-e2e"]
    sys.path.insert(0, HERE)
    import suite
    suite.main()
