"""The device data plane over torch.distributed's process groups: NCCL on GPUs, Gloo as its CPU stand-in.

One :class:`TorchDevicePlane` per job (per ``hvd.init``) executes what the engine negotiated for device tensors
(:mod:`horovod.core.device_plane`): it fuses allreduces into one buffer per device and dtype, runs the collective on
a ``ProcessGroupNCCL`` (or ``ProcessGroupGloo``) of the process set, and unfuses. The communicators bootstrap only
through this job's authenticated rendezvous (:class:`.device_store.RendezvousStore`), never through an open store.
The same code runs on GPUs with NCCL and on CPU tensors with Gloo; the differences (streams, events) are in
:mod:`.device_streams`.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from horovod.common.device import STANDIN_KIND, DeviceTensor
from horovod.common.exceptions import HorovodConfigError, HorovodInternalError
from horovod.common.types import OP_NAMES, OpType, ReduceOp, Response
from horovod.torch._tensors import core_dtype, torch_dtype
from horovod.torch.device_store import store_factory
from horovod.torch.device_streams import Streams

__all__ = ["TorchDevicePlane", "plane_factory"]

log = logging.getLogger("horovod")

_POLL_SECONDS = 0.25    # between liveness checks while a collective runs on the plane

_REDUCE = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.AVERAGE: dist.ReduceOp.SUM, ReduceOp.MIN: dist.ReduceOp.MIN,
           ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT}
# Booleans reduce as bytes: a sum of booleans is their OR, a product their AND (as numpy's add and multiply on bool).
_BOOL_REDUCE = {ReduceOp.SUM: dist.ReduceOp.MAX, ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.MIN: dist.ReduceOp.MIN,
                ReduceOp.PRODUCT: dist.ReduceOp.MIN}


def _tensor(descriptor: Optional[DeviceTensor]) -> Optional[torch.Tensor]:
    """The torch tensor behind a descriptor: torch's own as it is, another framework's through DLPack."""
    if descriptor is None:
        return None
    data = descriptor.data
    return data if isinstance(data, torch.Tensor) else torch.from_dlpack(data)


def _scale(buf: torch.Tensor, factor: float) -> None:
    """Multiply in place; integers are scaled in float64 and truncated, as the CPU plane and Horovod do."""
    if factor == 1.0:
        return
    if buf.dtype.is_floating_point:
        buf.mul_(factor)
    else:
        buf.copy_(torch.trunc(buf.to(torch.float64) * factor))


def _name_the_lost(ranks: Sequence[int], check, seconds: float = 2.0) -> None:
    """After the communicator failed: raise the engine's liveness error naming the rank that was lost, if one was.
    The communicator can see a peer's connection reset before this rank's own connection to it shows the end, so
    the check is repeated for up to ``seconds`` (the kernel closes both at once; a slice of a second is the norm)."""
    deadline = time.monotonic() + seconds
    while True:
        check(ranks)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _wait_then_set(work, done: threading.Event) -> None:
    try:
        work.wait()
    except Exception:     # the caller's own wait raises it again
        pass
    done.set()


class TorchDevicePlane:
    """Collectives on torch tensors through one ``ProcessGroup`` per process set (see the module docstring)."""

    def __init__(self, backend: str, kinds: Tuple[str, ...], store_for: Callable[[str], Any], timeout: float,
                 device: torch.device):
        self.name = backend
        self.kinds = kinds
        self.stats: Counter = Counter()      # bytes and calls per op: what ran on this plane (tests read it)
        self._store_for = store_for
        self._timeout = datetime.timedelta(seconds=max(timeout, 1.0))
        self._streams = Streams(device)
        self._groups: Dict[int, Tuple[Tuple[int, ...], Any]] = {}
        self._made: Counter = Counter()      # communicators made per (set, ranks): names a new one's store scope
        self._fusion: Dict[Tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- communicators ----------------------------------------------------------------------------------------------

    def _group(self, set_id: int, ranks: Sequence[int], index: int, check):
        """The set's communicator, made on first use: every member runs the same response at the same point of
        its loop, so the members make it together."""
        ranks = tuple(ranks)
        known = self._groups.get(set_id)
        if known is not None and known[0] == ranks:
            return known[1]
        self._made[set_id, ranks] += 1
        scope = f"set{set_id}.{len(ranks)}.{abs(hash(ranks)) % 10 ** 9}.{self._made[set_id, ranks]}"
        store = self._store_for(scope, lambda: check(ranks))
        if self.name == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            group = dist.ProcessGroupNCCL(store, index, len(ranks), options)
        else:
            group = dist.ProcessGroupGloo(store, index, len(ranks), self._timeout)
        log.debug("%s communicator for process set %d (ranks %s) made at index %d", self.name, set_id, ranks, index)
        self._groups[set_id] = (ranks, group)
        return group

    def close(self, abort: bool = False) -> None:
        """Release the communicators (aborted when the job failed: no wait on peers that may be gone)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            groups, self._groups = list(self._groups.values()), {}
        for _, group in groups:
            try:
                group.abort() if abort else group.shutdown()
            except Exception as exc:   # a communicator already broken by the failure: nothing more to release
                log.debug("%s communicator release: %s", self.name, exc)
        self._fusion.clear()

    def _wait(self, work, what: str, ranks: Sequence[int], check) -> None:
        """Wait for ``work`` in bounded slices, checking the set's ranks between them: a lost rank aborts the
        communicators and raises HorovodInternalError naming it; a failed collective raises it too."""
        done = threading.Event()
        try:
            work.get_future().add_done_callback(lambda _future: done.set())
        except RuntimeError:     # a work without a future (Gloo's reduce-scatter): a thread waits for it instead
            threading.Thread(target=_wait_then_set, args=(work, done), name="horovod-device-wait",
                             daemon=True).start()
        try:
            while not done.wait(_POLL_SECONDS):
                check(ranks)
            work.wait()
        except HorovodInternalError:
            self.close(abort=True)
            raise
        except Exception as exc:
            self.close(abort=True)
            _name_the_lost(ranks, check)
            raise HorovodInternalError(f"the {self.name} device plane failed in {what}: {exc}") from None

    # -- collectives ------------------------------------------------------------------------------------------------

    def execute(self, response: Response, entries: Dict[str, Any], set_id: int, ranks: Sequence[int],
                index: int, check, activity=None) -> Dict[str, Any]:
        """Run one negotiated response (see :class:`horovod.core.device_plane.DevicePlane`)."""
        if self._closed:
            raise HorovodInternalError(f"the {self.name} device plane has been closed")
        group = self._group(set_id, ranks, index, check)
        op = response.op
        what = f"{OP_NAMES.get(op, op)} of {response.names[0]!r}" + (" ..." if len(response.names) > 1 else "")
        run = {OpType.ALLREDUCE: self._allreduce, OpType.ALLGATHER: self._allgather,
               OpType.BROADCAST: self._broadcast, OpType.ALLTOALL: self._alltoall,
               OpType.REDUCESCATTER: self._reducescatter}.get(op)
        if run is None:
            raise HorovodInternalError(f"the {self.name} device plane cannot run {what}")
        with self._streams.ordered(entries.values()):
            results, work, nbytes = run(response, entries, group, tuple(ranks), index, activity)
            self._wait(work, what, ranks, check)
            results = self._finish(results() if callable(results) else results)
        self.stats[OP_NAMES[op]] += 1
        self.stats[OP_NAMES[op] + "_bytes"] += nbytes
        return results

    def _finish(self, results: Dict[str, Any]) -> Dict[str, Any]:
        """Each result as a descriptor whose ``ready`` event the caller's stream waits on."""
        ready = self._streams.record()
        finished = {}
        for name, value in results.items():
            if isinstance(value, tuple):
                finished[name] = (self._describe(value[0], ready), value[1])
            else:
                finished[name] = self._describe(value, ready)
        return finished

    @staticmethod
    def _describe(tensor: torch.Tensor, ready) -> DeviceTensor:
        return DeviceTensor(tensor, str(tensor.device), core_dtype(tensor.dtype), tuple(tensor.shape), ready)

    def _fusion_buffer(self, like: torch.Tensor, count: int) -> torch.Tensor:
        key = (like.device, like.dtype)
        buf = self._fusion.get(key)
        if buf is None or buf.numel() < count:
            buf = self._fusion[key] = torch.empty(max(count, 1), dtype=like.dtype, device=like.device)
        return buf[:count]

    def _allreduce(self, response, entries, group, ranks, index, activity):
        tensors = {name: _tensor(entries[name].array) for name in response.names if name in entries}
        # (A rank that joined submitted none of them: it contributes zeros of the response's dtype.)
        like = next(iter(tensors.values()), None)
        if like is None:
            like = torch.empty(0, dtype=torch_dtype(response.dtype), device=self._streams.device)
        counts = [int(np.prod(shape)) for shape in response.shapes]
        outputs = {name: (_tensor(entries[name].output) if entries[name].output is not None
                          else torch.empty(response.shapes[i], dtype=like.dtype, device=like.device))
                   for i, name in enumerate(response.names) if name in entries}
        single = len(response.names) == 1 and response.names[0] in entries
        if single:
            name = response.names[0]
            buf = outputs[name].view(-1)
            if outputs[name].data_ptr() != tensors[name].data_ptr():
                buf.copy_(tensors[name].reshape(-1))
        else:
            if activity:
                activity("MEMCPY_IN_FUSION_BUFFER")
            buf = self._fusion_buffer(like, sum(counts))
            offset = 0
            for name, count in zip(response.names, counts):
                part = buf[offset:offset + count]
                part.copy_(tensors[name].reshape(-1)) if name in tensors else part.zero_()
                offset += count
        boolean = buf.dtype == torch.bool
        carrier = buf.view(torch.uint8) if boolean else buf
        _scale(carrier, response.prescale)
        reduce_op = (_BOOL_REDUCE if boolean else _REDUCE)[ReduceOp(response.reduce_op)]
        options = dist.AllreduceOptions()
        options.reduceOp = reduce_op
        work = group.allreduce([carrier], options)

        def unfuse():
            """After the reduction: Average's division and the postscale, then each tensor's part of the fusion buffer to its output."""
            post = response.postscale / len(ranks) if response.reduce_op == ReduceOp.AVERAGE else response.postscale
            _scale(carrier, post)
            if not single:
                if activity:
                    activity("MEMCPY_OUT_FUSION_BUFFER")
                offset = 0
                for name, count in zip(response.names, counts):
                    if name in outputs:
                        outputs[name].view(-1).copy_(buf[offset:offset + count])
                    offset += count
            return outputs
        return unfuse, work, buf.numel() * buf.element_size()

    def _allgather(self, response, entries, group, ranks, index, activity):
        name = response.names[0]
        dims = response.sizes[0]
        trailing = tuple(response.shapes[0][1:])
        mine = _tensor(entries[name].array).reshape((-1,) + trailing)      # (a scalar is one row)
        widest = max(dims) if dims else 0
        padded = torch.zeros((widest,) + trailing, dtype=mine.dtype, device=mine.device)
        padded[:mine.shape[0]].copy_(mine)
        gathered = [torch.empty_like(padded) for _ in ranks]
        work = group.allgather([gathered], [padded])

        def join():
            """After the gather: every rank's rows without the padding, in rank order."""
            return {name: torch.cat([g[:dims[i]] for i, g in enumerate(gathered)])}
        return join, work, padded.numel() * padded.element_size() * len(ranks)

    def _broadcast(self, response, entries, group, ranks, index, activity):
        name = response.names[0]
        entry = entries[name]
        source = _tensor(entry.array)
        out = _tensor(entry.output) if entry.output is not None else torch.empty_like(source)
        root_index = ranks.index(response.root_rank)
        if index == root_index and out.data_ptr() != source.data_ptr():
            out.copy_(source)
        options = dist.BroadcastOptions()
        options.rootRank = root_index
        work = group.broadcast([out], options)
        return {name: out}, work, out.numel() * out.element_size()

    def _alltoall(self, response, entries, group, ranks, index, activity):
        name = response.names[0]
        source = _tensor(entries[name].array).reshape(entries[name].array.shape)     # (rows differ by rank)
        matrix = response.sizes
        received = [matrix[i][index] for i in range(len(ranks))]
        out = torch.empty((sum(received),) + tuple(source.shape[1:]), dtype=source.dtype, device=source.device)
        work = group.alltoall_base(out, source, list(received), list(matrix[index]), dist.AllToAllOptions())
        nbytes = source.numel() * source.element_size()
        return {name: (out, np.asarray(received, dtype=np.int32))}, work, nbytes

    def _reducescatter(self, response, entries, group, ranks, index, activity):
        size = len(ranks)
        name = response.names[0]
        shape = response.shapes[0]
        source = _tensor(entries[name].array).reshape(shape)
        trailing = tuple(shape[1:])
        base, extra = divmod(shape[0], size)
        rows = [base + (1 if i < extra else 0) for i in range(size)]
        widest = max(rows)
        # Equal parts for the communicator: each rank's rows padded to the widest part.
        padded = torch.zeros((size * widest,) + trailing, dtype=source.dtype, device=source.device)
        start = 0
        for i, count in enumerate(rows):
            padded[i * widest:i * widest + count].copy_(source[start:start + count])
            start += count
        _scale(padded, response.prescale)
        out = torch.empty((widest,) + trailing, dtype=source.dtype, device=source.device)
        options = dist.ReduceScatterOptions()
        options.reduceOp = dist.ReduceOp.SUM
        work = group._reduce_scatter_base(out, padded, options)

        def cut():
            """After the reduce-scatter: this rank's rows without the padding, scaled."""
            post = response.postscale / size if response.reduce_op == ReduceOp.AVERAGE else response.postscale
            mine = out[:rows[index]]
            _scale(mine, post)
            return {name: mine}
        return cut, work, padded.numel() * padded.element_size()


def nccl_usable(local_size: int) -> Tuple[bool, str]:
    """Whether NCCL can carry this host's ranks, and why not: a CUDA torch with NCCL and a GPU per local rank
    (NCCL refuses two ranks on one GPU)."""
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    if not dist.is_nccl_available():
        return False, "this torch has no NCCL"
    count = torch.cuda.device_count()
    if count < local_size:
        return False, f"{local_size} ranks on this host share {count} GPU(s), and NCCL needs one GPU per rank"
    return True, ""


def plane_factory(mode: str, topo, scope: str, config) -> Optional[TorchDevicePlane]:
    """The job's plane for ``HOROVOD_DEVICE_PLANE=mode`` (see :func:`horovod.runtime.device.make_plane`)."""
    # A collective waits on its peers as long as the engine's own bound on a busy peer; liveness ends it sooner.
    timeout = max(config.start_timeout, 10 * config.gloo_timeout_seconds, 60.0)
    if mode == "gloo":
        return TorchDevicePlane("gloo", (STANDIN_KIND,), store_factory(topo, scope, config.start_timeout), timeout,
                                torch.device("cpu"))
    usable, why = nccl_usable(topo.local_size)
    if not usable:
        if mode == "nccl":
            raise HorovodConfigError(f"HOROVOD_DEVICE_PLANE=nccl, but {why}; use HOROVOD_DEVICE_PLANE=staged")
        log.debug("rank %d: no NCCL device plane (%s)", topo.rank, why)
        return None
    device = torch.device("cuda", topo.local_rank % torch.cuda.device_count())
    return TorchDevicePlane("nccl", ("cuda",), store_factory(topo, scope, config.start_timeout), timeout, device)
