"""What every rank of a ``TorchEstimator.fit`` runs: read its shard, train with ``horovod.torch``, checkpoint.

Rank 0 returns the history, the trained model's bytes and the outputs' shapes; the others return None. Metrics are
averaged over the ranks each epoch (training: the mean over batches; validation: over every validation row).
"""

from __future__ import annotations

import io
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cloudpickle
import numpy as np
import torch

import horovod.torch as hvd
from horovod.spark.common.data import ShardReader, feature_arrays
from horovod.spark.common.estimator import dataset_steps

__all__ = ["train", "to_tensors"]


def _name(metric, index: int) -> str:
    return getattr(metric, "__name__", None) or type(metric).__name__ or f"metric_{index}"


def to_tensors(batch: Dict[str, np.ndarray], spec: Dict[str, Any]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Model inputs (float32, reshaped to ``input_shapes``) and labels (int64 for integer columns, else float32)."""
    inputs = [torch.from_numpy(np.ascontiguousarray(array)) for array in feature_arrays(batch, spec)]
    labels = []
    for column in spec["label_cols"]:
        array = batch[column]
        labels.append(torch.from_numpy(array.astype(np.int64) if np.issubdtype(array.dtype, np.integer)
                                       else array.astype(np.float32)))
    return inputs, labels


def _outputs(model, inputs) -> List[torch.Tensor]:
    out = model(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _measure(model, batch, spec, losses, metrics) -> Tuple[torch.Tensor, List[float], List[torch.Tensor]]:
    inputs, labels = to_tensors(batch, spec)
    outputs = _outputs(model, inputs)
    loss = sum(fn(o, l) for fn, o, l in zip(losses, outputs, labels))
    with torch.no_grad():  # a metric is a number to report, not part of the graph
        values = [float(m(outputs[0].detach(), labels[0])) for m in metrics]
    return loss, values, outputs


def _train_epoch(model, optimizer, reader: ShardReader, steps: int, spec, losses, metrics) -> Tuple[np.ndarray, list]:
    # With backward_passes_per_step k (Horovod's meaning): the gradients of k batches, each loss divided by k,
    # accumulate before one allreduce and one optimizer step; an epoch's last group may be shorter.
    passes = int(spec.get("backward_passes_per_step") or 1)
    model.train()
    sums = np.zeros(1 + len(metrics))
    shapes = None
    for index, batch in enumerate(reader.batches(steps)):
        if index % passes == 0:
            optimizer.zero_grad()
        loss, values, outputs = _measure(model, batch, spec, losses, metrics)
        (loss / passes if passes > 1 else loss).backward()
        if (index + 1) % passes == 0 or index + 1 == steps:
            optimizer.step()
        sums += [float(loss.detach()), *values]
        shapes = shapes or [list(o.shape[1:]) for o in outputs]
    return hvd.allreduce(torch.from_numpy(sums / steps), op=hvd.Average, name="train_metrics").numpy(), shapes


def _validate(model, reader: Optional[ShardReader], spec, losses, metrics) -> Optional[np.ndarray]:
    if reader is None:
        return None
    model.eval()
    sums = np.zeros(2 + len(metrics))  # weighted sums of loss and metrics, then the row count
    with torch.no_grad():
        for batch in reader.all_rows():
            rows = len(next(iter(batch.values())))
            loss, values, _ = _measure(model, batch, spec, losses, metrics)
            sums[:-1] += rows * np.array([float(loss), *values])
            sums[-1] += rows
    total = hvd.allreduce(torch.from_numpy(sums), op=hvd.Sum, name="val_metrics").numpy()
    return total[:-1] / max(total[-1], 1.0)


def _checkpoint(model, spec) -> None:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    spec["store"].write(spec["store"].get_checkpoint_path(spec["run_id"]), buffer.getvalue())


def _record(history, names: Sequence[str], train, val) -> Dict[str, float]:
    current = {}
    for i, name in enumerate(names):
        history["train"].setdefault(name, []).append(float(train[i]))
        current[name] = float(train[i])
        if val is not None:
            history["validation"].setdefault(name, []).append(float(val[i]))
            current[f"val_{name}"] = float(val[i])
    return current


def train(spec: Dict[str, Any]):
    """Train on this rank (see the module docstring); ``spec`` is the estimator's parameters plus ``info`` and
    ``payload`` (the cloudpickled model, optimizer, losses, metrics and callbacks)."""
    hvd.init()
    torch.manual_seed(int(spec["random_seed"]))
    model, optimizer, losses, metrics, callbacks = cloudpickle.loads(spec["payload"])
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=int(spec.get("backward_passes_per_step") or 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    info, size = spec["info"], hvd.size()
    columns = list(spec["feature_cols"]) + list(spec["label_cols"])
    reader = ShardReader(spec["store"], info.train_path, columns, hvd.rank(), size, spec["batch_size"],
                         seed=int(spec["random_seed"]), shuffle_buffer_size=spec["shuffle_buffer_size"],
                         cache=bool(spec["inmemory_cache_all"]))
    val_reader = ShardReader(spec["store"], info.val_path, columns, hvd.rank(), size,
                             spec["val_batch_size"] or spec["batch_size"], shuffle=False,
                             cache=bool(spec["inmemory_cache_all"])) if info.val_path else None
    steps = dataset_steps(info, size, spec["batch_size"], spec["train_steps_per_epoch"])
    names = ["loss"] + [_name(m, i) for i, m in enumerate(metrics)]
    history: Dict[str, Dict[str, list]] = {"train": {}, "validation": {}}
    shapes = None
    for epoch in range(int(spec["epochs"])):
        train_values, shapes = _train_epoch(model, optimizer, reader, steps, spec, losses, metrics)
        current = _record(history, names, train_values, _validate(model, val_reader, spec, losses, metrics))
        if hvd.rank() == 0:
            _checkpoint(model, spec)
            if spec["verbose"]:
                print(f"epoch {epoch + 1}/{spec['epochs']}: " + ", ".join(f"{k}={v:.4f}" for k, v in current.items()),
                      flush=True)
        for callback in callbacks:
            callback(epoch, current)
    if hvd.rank() != 0:
        return None
    return history, cloudpickle.dumps(model), shapes
