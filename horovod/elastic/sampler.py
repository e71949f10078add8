"""The framework-agnostic core of ``ElasticSampler``: which sample indices this rank reads next.

Every rank shuffles the same indices with the same seed (``seed + epoch``); ranks take every ``size``-th index of
the not yet processed remainder. After ``k`` batches of ``b`` samples on ``n`` ranks, the first ``k*b*n`` indices of
the remainder are exactly the ones processed, whatever the rank, so a sampler resumed from ``processed_num`` on a
different number of ranks neither repeats nor skips a sample (padding of the last round aside).
"""

from __future__ import annotations

import math
import random
from typing import Dict, List, Optional

from horovod.runtime import basics


class ElasticIndexSampler:
    """Indices of a dataset of ``length`` samples for this rank, resumable mid-epoch on another world size.

    Args:
        length: number of samples in the dataset.
        shuffle: shuffle each epoch (deterministically, the same on every rank).
        seed: base seed; epoch ``e`` uses ``seed + e``.
        rank, num_replicas: fixed values for tests; by default Horovod's ``rank()``/``size()`` at each reset.
    """

    def __init__(self, length: int, shuffle: bool = True, seed: int = 0, rank: Optional[int] = None,
                 num_replicas: Optional[int] = None):
        self.length = int(length)
        self.shuffle = shuffle
        self.seed = seed
        self._fixed = (rank, num_replicas)
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that every rank finished one more batch of ``batch_size`` samples."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, count: int) -> None:
        """Record that every rank finished ``count`` more samples."""
        self.processed_num += count * self.num_replicas

    def state_dict(self) -> Dict[str, int]:
        """The sampler's position (``epoch``, ``processed_num``), to save with the training state."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: Dict[str, int]) -> None:
        """Go back to a position :meth:`state_dict` returned, and re-shard what is left of the epoch."""
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Recompute this rank's share from the current membership and what is already processed."""
        rank, replicas = self._fixed
        self.rank = basics.rank() if rank is None else rank
        self.num_replicas = basics.size() if replicas is None else replicas
        order = list(range(self.length))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def indices(self) -> List[int]:
        """This rank's indices for the rest of the epoch (padded so every rank has ``num_samples``)."""
        chosen = list(self.remaining_indices)
        if chosen:
            while len(chosen) < self.total_size:
                chosen += chosen[:self.total_size - len(chosen)]
        return chosen[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices())

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticIndexSampler"]
