"""What issue 19's checks cost the fast path: the 4-byte allreduce and the 200 x 4 KiB step, with and without them.

    horovodrun -np 2 python bench/liveness_cost.py [--rounds 6]

In one job, rounds alternate between the code as it is ("with") and the same code with the per-frame additions
swapped out ("without"): the plain-data check of every decoded control frame (``wire.decode``), the patient
receive of negotiation frames (``TcpTransport.recv_obj``'s ``on_silence``) and the forked-child check of every
operation (``runtime.context.engine``). The liveness probes themselves are the kernel's (no per-operation cost).
Rank 0 prints the medians of each mode. A benchmark, not a test.
"""

import argparse
import io
import statistics
import time

import numpy as np

import horovod.numpy as hvd
from horovod.common.exceptions import HorovodInternalError
from horovod.runtime import context
from horovod.transport import tcp, wire

WITH = (wire.decode, tcp.TcpTransport.recv_obj, context.engine)


def _decode_without(payload):
    try:
        return wire._NoClassUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:
        raise HorovodInternalError(f"garbled control message: {exc}") from None


def _recv_obj_without(self, peer):
    sock = self._sock(peer)
    try:
        return wire.decode(wire.recv_frame(sock))
    except (OSError, ConnectionError) as exc:
        raise self._fail(peer, exc) from None


def _engine_without():
    ctx = context.current()
    if ctx.engine.error is not None:
        raise HorovodInternalError(ctx.engine.error)
    return ctx.engine


def _use(mode):
    decode, recv_obj, engine = WITH if mode == "with" else (_decode_without, _recv_obj_without, _engine_without)
    wire.decode, tcp.TcpTransport.recv_obj, context.engine = decode, recv_obj, engine


def _latency(iters):
    x = np.ones(1, dtype=np.float32)
    times = []
    for i in range(iters):
        start = time.perf_counter()
        hvd.allreduce(x, name="lat")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _step(iters):
    grads = [np.ones(1024, dtype=np.float32) for _ in range(200)]
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        handles = [hvd.allreduce_async(g, name=f"g{i}") for i, g in enumerate(grads)]
        for handle in handles:
            hvd.synchronize(handle)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    hvd.init()
    _latency(200)
    _step(5)
    results = {"with": {"lat": [], "step": []}, "without": {"lat": [], "step": []}}
    for round_ in range(args.rounds):
        for mode in (("with", "without") if round_ % 2 == 0 else ("without", "with")):
            _use(mode)
            hvd.barrier()
            results[mode]["lat"].append(_latency(2000))
            results[mode]["step"].append(_step(20))
    _use("with")
    if hvd.rank() == 0:
        for mode, figures in results.items():
            print(f"{mode:8s} 4 B allreduce median {statistics.median(figures['lat']) * 1e6:7.1f} us   "
                  f"200 x 4 KiB step median {statistics.median(figures['step']) * 1e3:7.2f} ms", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
