"""The estimators' and models' Spark ML parameters, declared once in tables.

Each row makes a :class:`pyspark.ml.param.Param`, a getter and a setter with Horovod's names (``num_proc`` ->
``getNumProc``/``setNumProc``), and a keyword of the constructor. Models, optimizers and losses are Python objects:
they are held as they are and never converted to JSON.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

from pyspark.ml.param import Param, Params

__all__ = ["ESTIMATOR_PARAMS", "MODEL_PARAMS", "declare", "camel", "HorovodParams"]

# (name, doc, default)
ESTIMATOR_PARAMS: Tuple[Tuple[str, str, Any], ...] = (
    ("num_proc", "number of Horovod ranks, one Spark task each (default: spark.default.parallelism)", None),
    ("backend", "what runs the training function (a horovod.spark.common.backend.Backend, e.g. SparkBackend); "
                "at most one of backend and num_proc", None),
    ("model", "the model to train", None),
    ("optimizer", "the optimizer", None),
    ("loss", "the loss: one for every label column, or a list of them", None),
    ("metrics", "metrics computed on training and validation data", None),
    ("store", "the Store for the intermediate data, checkpoints and logs", None),
    ("feature_cols", "the feature columns, one model input each", None),
    ("label_cols", "the label columns, one model output each", None),
    ("input_shapes", "each input's shape (the batch dimension as -1)", None),
    ("validation", "validation data: a fraction of the rows, or a boolean column marking them", None),
    ("callbacks", "callbacks run during training", None),
    ("batch_size", "rows per batch on each rank", 32),
    ("val_batch_size", "rows per validation batch on each rank (default batch_size)", None),
    ("epochs", "number of epochs", 1),
    ("verbose", "0: silent, 1: one line per epoch from rank 0", 1),
    ("shuffle_buffer_size", "rows shuffled together when reading the training data", 4096),
    ("partitions_per_process", "Parquet files written per rank", 4),
    ("train_steps_per_epoch", "batches per epoch (default: the rows / (ranks x batch size))", None),
    ("validation_steps_per_epoch", "validation batches per epoch (default: all validation rows)", None),
    ("run_id", "the run's name in the store (default: generated)", None),
    ("random_seed", "seed of data shuffling and splitting", 0),
    ("inmemory_cache_all", "keep each rank's shard in memory after its first pass (read the Parquet once)", False),
    ("start_timeout", "seconds for the Spark tasks to start (default HOROVOD_SPARK_START_TIMEOUT)", None),
)

MODEL_PARAMS: Tuple[Tuple[str, str, Any], ...] = (
    ("feature_columns", "the feature columns the model reads", None),
    ("label_columns", "the label columns it was trained on", None),
    ("output_cols", "the prediction columns transform adds (default: <label>__output)", None),
    ("input_shapes", "each input's shape (the batch dimension as -1)", None),
    ("output_shapes", "each output's shape per row", None),
    ("run_id", "the run that trained it", None),
)


def camel(name: str) -> str:
    """``num_proc`` -> ``NumProc``."""
    return "".join(part.capitalize() for part in name.split("_"))


def _accessors(name: str):
    def getter(self):
        return self.getOrDefault(getattr(self, name))

    def setter(self, value):
        return self._set(**{name: value})

    getter.__doc__ = f"The value of ``{name}``."
    setter.__doc__ = f"Set ``{name}``; returns self."
    return getter, setter


def declare(cls, table: Sequence[Tuple[str, str, Any]]):
    """Add each row of ``table`` to ``cls``: a ``Param`` attribute, ``get<Name>`` and ``set<Name>``; returns cls."""
    for name, doc, _ in table:
        setattr(cls, name, Param(Params._dummy(), name, doc))
        getter, setter = _accessors(name)
        setattr(cls, f"get{camel(name)}", getter)
        setattr(cls, f"set{camel(name)}", setter)
    cls._param_table = tuple(getattr(cls, "_param_table", ())) + tuple(table)
    return cls


class HorovodParams(Params):
    """Params built from the class's tables; the constructor takes them as keywords."""

    _param_table: Tuple[Tuple[str, str, Any], ...] = ()

    def __init__(self, **kwargs):
        super().__init__()
        self._setDefault(**{name: default for name, _, default in self._param_table})
        self.setParams(**kwargs)

    def setParams(self, **kwargs) -> "HorovodParams":
        """Set several parameters by name.

        Raises:
            TypeError: a name that is no parameter of this class.
        """
        known = {name for name, _, _ in self._param_table}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no parameter(s) {unknown}; it has {sorted(known)}")
        self._set(**{k: v for k, v in kwargs.items() if v is not None})
        return self

    def values(self) -> Dict[str, Any]:
        """Every parameter's current value, by name."""
        return {name: self.getOrDefault(getattr(self, name)) for name, _, _ in self._param_table}
