"""The estimators' data: a DataFrame written to Parquet in the store, read back by each rank as its shard.

Petastorm (Horovod's reader) does not work with today's pyarrow: its 0.13.1 release imports ``pyarrow.filesystem``
and reads ``ParquetDataset.pieces``, both removed from pyarrow years ago. So the ranks read with our own
:class:`ShardReader`, over ``pyarrow.dataset``:

* the unit of sharding is a Parquet row group; with at least as many row groups as ranks, rank ``r`` takes every
  ``size``-th row group from ``r`` on; with fewer, every rank reads them all and keeps every ``size``-th row;
* an epoch is exactly ``steps`` batches on every rank (so every rank runs the same number of collectives); a rank
  whose shard runs out starts over on it, each pass in a fresh random order of row groups, and rows are shuffled
  within a window of ``shuffle_buffer_size`` rows;
* array columns (Spark ``array<...>`` or ML vectors, which :func:`prepare_data` turns into arrays) become 2-D numpy
  arrays, reshaped by the caller to its input shapes; scalar columns become 1-D arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import functions

from horovod.spark.common.store import Store

__all__ = ["DatasetInfo", "prepare_data", "ShardReader", "column_to_numpy", "feature_arrays"]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What :func:`prepare_data` wrote: where, how many rows, and the columns' kinds."""

    train_path: str
    val_path: Optional[str]
    train_rows: int
    val_rows: int
    columns: Tuple[str, ...]


def _arrays_for_vectors(df):
    return df.select([vector_to_array(functions.col(f.name)).alias(f.name) if isinstance(f.dataType, VectorUDT)
                      else functions.col(f.name) for f in df.schema.fields])


def _split(df, validation, seed: int):
    if validation is None or validation == 0:
        return df, None
    if isinstance(validation, str):
        flag = functions.col(validation).cast("boolean")
        return df.filter(~flag).drop(validation), df.filter(flag).drop(validation)
    if not 0 < float(validation) < 1:
        raise ValueError(f"validation must be a fraction in (0, 1) or a column name, got {validation!r}")
    train, val = df.randomSplit([1.0 - float(validation), float(validation)], seed=seed)
    return train, val


def prepare_data(df, store: Store, columns: Sequence[str], validation=None, num_partitions: int = 1,
                 dataset_idx: Optional[str] = None, seed: int = 0) -> DatasetInfo:
    """Write ``df``'s ``columns`` to Parquet in ``store`` (training and validation data), ML vectors as arrays.

    Args:
        validation: a fraction of rows held out at random (seeded), or the name of a boolean column marking the
            validation rows, or None.
        num_partitions: Parquet files per dataset (at least the number of ranks, so each rank has a shard).

    Raises:
        ValueError: a column is missing, or ``validation`` is neither a fraction nor a column.
    """
    wanted = list(columns) + ([validation] if isinstance(validation, str) else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise ValueError(f"the DataFrame has no column(s) {missing}; it has {df.columns}")
    train, val = _split(_arrays_for_vectors(df.select(*wanted)), validation, seed)
    train_path = store.get_train_data_path(dataset_idx)
    train.repartition(num_partitions).write.mode("overwrite").parquet(store.get_full_path(train_path))
    val_path, val_rows = None, 0
    if val is not None:
        val_path = store.get_val_data_path(dataset_idx)
        val.repartition(num_partitions).write.mode("overwrite").parquet(store.get_full_path(val_path))
        val_rows = _count_rows(store, val_path)
    return DatasetInfo(train_path, val_path, _count_rows(store, train_path), val_rows, tuple(columns))


def _dataset(store: Store, path: str) -> pads.Dataset:
    return pads.dataset(path, format="parquet", filesystem=store.fs)


def _count_rows(store: Store, path: str) -> int:
    return _dataset(store, path).count_rows()


def column_to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A Parquet column as numpy: scalars 1-D, equal-length lists 2-D (``rows x length``).

    Raises:
        ValueError: list rows of different lengths.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = array.flatten().to_numpy(zero_copy_only=False)
        rows = len(array)
        if rows and values.size % rows:
            raise ValueError("array column rows have different lengths")
        return values.reshape(rows, values.size // rows if rows else 0)
    return array.to_numpy(zero_copy_only=False)


def feature_arrays(batch: Dict[str, np.ndarray], spec: Dict[str, object]) -> List[np.ndarray]:
    """The model's inputs from a batch: each of ``spec["feature_cols"]`` as float32, reshaped to its entry of
    ``spec["input_shapes"]`` (batch dimension first) where one is given; both estimators feed their models these."""
    shapes = spec["input_shapes"] or []
    inputs = []
    for i, column in enumerate(spec["feature_cols"]):
        array = batch[column].astype(np.float32)
        if i < len(shapes) and shapes[i] is not None:
            array = array.reshape([len(array)] + [int(d) for d in list(shapes[i])[1:]])
        inputs.append(array)
    return inputs


class ShardReader:
    """One rank's shard of a Parquet dataset in the store, as batches of numpy arrays by column.

    Args:
        store: the store; path: the dataset's path in it; columns: the columns to read.
        rank, size: this rank and the number of ranks.
        batch_size: rows per batch; shuffle: random order (seeded by ``seed`` and the pass number).
        shuffle_buffer_size: rows shuffled together (a window over the shard).
        cache: keep every row group read in memory, so later passes read no Parquet (the estimators'
            ``inmemory_cache_all``).
    """

    def __init__(self, store: Store, path: str, columns: Sequence[str], rank: int, size: int, batch_size: int,
                 shuffle: bool = True, seed: int = 0, shuffle_buffer_size: int = 4096, cache: bool = False):
        self.columns = list(columns)
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = seed + 7919 * rank
        self.buffer_rows = max(int(shuffle_buffer_size), self.batch_size)
        groups = [g for fragment in _dataset(store, path).get_fragments()
                  for g in fragment.split_by_row_group() if g.row_groups and g.row_groups[0].num_rows > 0]
        self._stride = 1 if len(groups) >= size else size
        self._offset = rank if len(groups) < size else 0
        self.groups = groups[rank::size] if len(groups) >= size else groups
        self._passes = 0
        self._cache: Optional[Dict[int, Dict[str, np.ndarray]]] = {} if cache else None

    def _read_group(self, index: int) -> Dict[str, np.ndarray]:
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        table = self.groups[index].to_table(columns=self.columns)
        arrays = {c: column_to_numpy(table.column(c)) for c in self.columns}
        part = {c: a[self._offset::self._stride] for c, a in arrays.items()}
        if self._cache is not None:
            self._cache[index] = part
        return part

    def _one_pass(self) -> Iterator[Dict[str, np.ndarray]]:
        rng = np.random.default_rng(self.seed + self._passes)
        self._passes += 1
        order = rng.permutation(len(self.groups)) if self.shuffle else range(len(self.groups))
        window: List[Dict[str, np.ndarray]] = []
        held = 0
        for i in order:
            part = self._read_group(int(i))
            window.append(part)
            held += len(part[self.columns[0]])
            if held >= self.buffer_rows:
                yield self._merge(window, rng)
                window, held = [], 0
        if window:
            yield self._merge(window, rng)

    def _merge(self, parts: List[Dict[str, np.ndarray]], rng) -> Dict[str, np.ndarray]:
        merged = {c: np.concatenate([p[c] for p in parts]) for c in self.columns}
        if self.shuffle:
            perm = rng.permutation(len(merged[self.columns[0]]))
            merged = {c: a[perm] for c, a in merged.items()}
        return merged

    def batches(self, steps: int) -> Iterator[Dict[str, np.ndarray]]:
        """Exactly ``steps`` full batches, passing over the shard as many times as that takes.

        Raises:
            ValueError: this rank's shard is empty.
        """
        if not self.groups:
            raise ValueError("this rank's shard of the dataset is empty; write more rows or row groups")
        made, carry = 0, None
        while made < steps:
            seen = 0
            for chunk in self._one_pass():
                seen += len(chunk[self.columns[0]])
                if carry is not None:
                    chunk = {c: np.concatenate([carry[c], chunk[c]]) for c in self.columns}
                rows = len(chunk[self.columns[0]])
                start = 0
                while rows - start >= self.batch_size and made < steps:
                    yield {c: a[start:start + self.batch_size] for c, a in chunk.items()}
                    start += self.batch_size
                    made += 1
                carry = {c: a[start:] for c, a in chunk.items()}
                if made >= steps:
                    return
            if not seen:
                raise ValueError("this rank's shard of the dataset has no rows")

    def all_rows(self) -> Iterator[Dict[str, np.ndarray]]:
        """One pass over the shard in order, in batches (the last one may be short): for evaluation."""
        for index in range(len(self.groups)):
            part = self._read_group(index)
            rows = len(part[self.columns[0]])
            for start in range(0, rows, self.batch_size):
                yield {c: a[start:start + self.batch_size] for c, a in part.items()}
