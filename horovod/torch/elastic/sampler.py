"""``ElasticSampler``: a ``torch.utils.data.Sampler`` that resumes mid-epoch on a different number of workers."""

from __future__ import annotations

import torch.utils.data

from horovod.elastic.sampler import ElasticIndexSampler


class ElasticSampler(torch.utils.data.Sampler, ElasticIndexSampler):
    """Shards ``dataset`` over the current workers, skipping what was processed this epoch (see
    :class:`horovod.elastic.ElasticIndexSampler`).

    Call ``record_batch(batch_idx, batch_size)`` after each batch, ``set_epoch(epoch)`` at the start of each
    epoch's first attempt, and keep the sampler in the :class:`TorchState` so it is committed and synced.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        ElasticIndexSampler.__init__(self, len(dataset), shuffle=shuffle, seed=seed)

    def __iter__(self):
        return ElasticIndexSampler.__iter__(self)

    def __len__(self) -> int:
        return ElasticIndexSampler.__len__(self)


__all__ = ["ElasticSampler"]
