"""What the Torch and Keras estimators share: ``fit`` (data to the store, training with ``horovod.spark.run``) and
the returned model's ``transform``, history and persistence.

A framework module supplies three things: the training function run on every rank (it returns, from rank 0, the
history, the trained model's bytes and the outputs' shapes), how a model becomes bytes and back, and how a model
predicts a batch of numpy inputs.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import uuid
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow.fs as pafs
from pyspark.ml import Estimator, Model
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import functions
from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

from horovod.spark.common.data import DatasetInfo, prepare_data
from horovod.spark.common.params import ESTIMATOR_PARAMS, MODEL_PARAMS, HorovodParams, declare
from horovod.spark.driver import active_context
from horovod.spark.runner import run

__all__ = ["HorovodEstimator", "HorovodModel", "inputs_from_columns", "dataset_steps"]

_METADATA = "metadata.json"
_MODEL_FILE = "model.bin"


def _as_list(value) -> List:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


class _EstimatorParams(HorovodParams):
    pass


declare(_EstimatorParams, ESTIMATOR_PARAMS)
# Horovod spells these two accessors with a capital M.
_EstimatorParams.getInMemoryCacheAll = _EstimatorParams.getInmemoryCacheAll
_EstimatorParams.setInMemoryCacheAll = _EstimatorParams.setInmemoryCacheAll


class HorovodEstimator(Estimator, _EstimatorParams):
    """An estimator whose ``fit(df)`` trains on ``num_proc`` Horovod ranks and returns a :class:`HorovodModel`.

    Subclasses set :attr:`model_class` and implement :meth:`_trainer` and :meth:`_train_payload`.
    """

    model_class: type = None  # type: ignore[assignment]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def _check(self) -> None:
        for name in ("model", "store", "feature_cols", "label_cols"):
            if not self.getOrDefault(getattr(self, name)):
                raise ValueError(f"{type(self).__name__} needs the parameter {name!r}")

    def _trainer(self) -> Callable:
        """The function every rank runs with the training spec."""
        raise NotImplementedError

    def _train_payload(self) -> Dict[str, Any]:
        """The framework's objects for the ranks (model, optimizer, loss...) as picklable values."""
        raise NotImplementedError

    def _input_shapes(self) -> Optional[List]:
        """Each feature column's shape for the model (batch dimension -1): ``input_shapes``; a framework may
        derive them from the model when not given."""
        return self.getOrDefault(self.input_shapes)

    def _num_proc(self) -> int:
        """The number of ranks: the backend's, else ``num_proc``, else the Spark context's default parallelism.

        Raises:
            ValueError: both ``backend`` and ``num_proc`` are set (Horovod refuses that too).
        """
        backend, num_proc = self.getOrDefault(self.backend), self.getOrDefault(self.num_proc)
        if backend is not None:
            if num_proc is not None:
                raise ValueError('At most one of parameters "backend" and "num_proc" may be specified')
            return int(backend.num_processes())
        return int(num_proc or active_context().defaultParallelism)

    def _fit(self, df):
        self._check()
        params = self.values()
        run_id = params["run_id"] or f"{type(self).__name__.lower()}_{uuid.uuid4().hex[:12]}"
        num_proc = self._num_proc()
        columns = _as_list(params["feature_cols"]) + _as_list(params["label_cols"])
        info = prepare_data(df, params["store"], columns, params["validation"],
                            num_proc * max(1, int(params["partitions_per_process"])), run_id,
                            int(params["random_seed"]))
        input_shapes = self._input_shapes()
        spec = dict(params, run_id=run_id, info=info, payload=self._train_payload(), input_shapes=input_shapes,
                    feature_cols=_as_list(params["feature_cols"]), label_cols=_as_list(params["label_cols"]),
                    model=None, optimizer=None, loss=None, metrics=None, callbacks=None, backend=None)
        backend = params["backend"]
        if backend is not None:
            results = backend.run(self._trainer(), args=(spec,))
        else:
            results = run(self._trainer(), args=(spec,), num_proc=num_proc, start_timeout=params["start_timeout"],
                          verbose=params["verbose"])
        history, model_bytes, output_shapes = results[0]
        model = self.model_class(model=self.model_class.model_from_bytes(model_bytes), history=history,
                                 feature_columns=_as_list(params["feature_cols"]),
                                 label_columns=_as_list(params["label_cols"]),
                                 input_shapes=input_shapes, output_shapes=output_shapes, run_id=run_id)
        return model



class _ModelParams(HorovodParams):
    pass


declare(_ModelParams, MODEL_PARAMS)


def inputs_from_columns(series: Sequence[pd.Series], shapes: Optional[Sequence]) -> List[np.ndarray]:
    """Numpy model inputs from pandas columns of numbers or arrays, reshaped to ``shapes`` (batch dimension -1)."""
    inputs = []
    for i, column in enumerate(series):
        first = column.iloc[0] if len(column) else 0
        array = np.stack(column.to_numpy()) if isinstance(first, (list, np.ndarray)) else column.to_numpy()
        array = array.astype(np.float32)
        if shapes and i < len(shapes) and shapes[i] is not None:
            array = array.reshape([len(column)] + [int(d) for d in list(shapes[i])[1:]])
        inputs.append(array)
    return inputs


class HorovodModel(Model, _ModelParams, MLWritable, MLReadable):
    """A trained model as a Spark ML Transformer: ``transform(df)`` adds one prediction column per label
    (``<label>__output``: a double, or an array of doubles for outputs of several values).

    Subclasses implement :meth:`model_to_bytes`, :meth:`model_from_bytes` and :meth:`predictor`.
    """

    def __init__(self, model=None, history: Optional[Dict] = None, **kwargs):
        super().__init__(**kwargs)
        self.model = model
        self.history = history or {}

    def getModel(self):
        """The trained framework model."""
        return self.model

    def getHistory(self) -> Dict:
        """The metrics of every epoch, as training reported them."""
        return self.history

    def getOutputCols(self) -> List[str]:
        """The prediction columns: ``output_cols``, else ``<label>__output`` for each label."""
        return _as_list(self.getOrDefault(self.output_cols)) or \
            [f"{c}__output" for c in _as_list(self.getOrDefault(self.label_columns))]

    # -- framework hooks -------------------------------------------------------------------------------------------

    def model_to_bytes(self) -> bytes:
        """The trained model as bytes."""
        raise NotImplementedError

    @staticmethod
    def model_from_bytes(data: bytes):
        """A model from :meth:`model_to_bytes`' bytes."""
        raise NotImplementedError

    @classmethod
    def predictor(cls, data: bytes) -> Callable[[List[np.ndarray]], List[np.ndarray]]:
        """A function from a batch of inputs to the model's outputs, built from the model's bytes (on an
        executor)."""
        raise NotImplementedError

    # -- transform -------------------------------------------------------------------------------------------------

    def _transform(self, df):
        outputs = self.getOutputCols()
        shapes = _as_list(self.getOrDefault(self.output_shapes)) or [[1]] * len(outputs)
        scalar = [int(np.prod(s)) == 1 for s in shapes]
        schema = StructType([StructField(c, DoubleType() if s else ArrayType(DoubleType()))
                             for c, s in zip(outputs, scalar)])
        data, cls = self.model_to_bytes(), type(self)
        input_shapes = self.getOrDefault(self.input_shapes)

        with _pandas_version_warning_ignored():
            return self._predicted(df, schema, outputs, scalar, data, cls, input_shapes)

    def _predicted(self, df, schema, outputs, scalar, data, cls, input_shapes):
        @functions.pandas_udf(schema)
        def predict(*columns: pd.Series) -> pd.DataFrame:
            # On the executor's Python worker, which converts the batch after this returns: its filter for good.
            warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)
            results = cls.predictor(data)(inputs_from_columns(columns, input_shapes))
            frame = {}
            for name, result, single in zip(outputs, results, scalar):
                flat = np.asarray(result, dtype=np.float64).reshape(len(columns[0]), -1)
                frame[name] = flat[:, 0] if single else list(flat)
            return pd.DataFrame(frame)

        features = [vector_to_array(functions.col(c)) if isinstance(df.schema[c].dataType, VectorUDT)
                    else functions.col(c) for c in self.getOrDefault(self.feature_columns)]
        column = f"__horovod_output_{uuid.uuid4().hex[:8]}"
        out = df.withColumn(column, predict(*features))
        return out.select("*", *[functions.col(f"{column}.{c}").alias(c) for c in outputs]).drop(column)

    # -- persistence -----------------------------------------------------------------------------------------------

    def write(self) -> MLWriter:
        """A writer that saves the parameters, the history and the model's bytes under a folder."""
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        """A reader that loads what :meth:`write` saved."""
        return _ModelReader(cls)


_PANDAS_WARNING = "PySpark does not yet fully support pandas"


@contextlib.contextmanager
def _pandas_version_warning_ignored():
    """pyspark warns that it "does not yet fully support pandas >= 3.0.0" (the spark extra's pandas) each time it
    defines or runs a pandas UDF: three times per transform, none of them the user's to act on. Only that warning is
    ignored, and only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PANDAS_WARNING, category=FutureWarning)
        yield


def _filesystem(path: str):
    if "://" in path and not path.startswith("file://"):
        return pafs.FileSystem.from_uri(path)
    local = path[len("file://"):] if path.startswith("file://") else path
    return pafs.LocalFileSystem(), local


class _ModelWriter(MLWriter):
    def __init__(self, instance: HorovodModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        filesystem, root = _filesystem(path)
        filesystem.create_dir(root, recursive=True)
        metadata = {"class": f"{type(self.instance).__module__}.{type(self.instance).__name__}",
                    "params": self.instance.values(), "history": self.instance.history}
        with filesystem.open_output_stream(posixpath.join(root, _METADATA)) as handle:
            handle.write(json.dumps(metadata).encode("utf-8"))
        with filesystem.open_output_stream(posixpath.join(root, _MODEL_FILE)) as handle:
            handle.write(self.instance.model_to_bytes())


class _ModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> HorovodModel:
        """The model saved under ``path``."""
        filesystem, root = _filesystem(path)
        with filesystem.open_input_stream(posixpath.join(root, _METADATA)) as handle:
            metadata = json.loads(handle.read().decode("utf-8"))
        with filesystem.open_input_stream(posixpath.join(root, _MODEL_FILE)) as handle:
            model = self.cls.model_from_bytes(handle.read())
        return self.cls(model=model, history=metadata["history"], **metadata["params"])


def dataset_steps(info: DatasetInfo, size: int, batch_size: int, steps: Optional[int]) -> int:
    """Batches per epoch: ``steps``, else the training rows over ``size`` ranks of ``batch_size`` (at least 1)."""
    return int(steps) if steps else max(1, info.train_rows // (size * batch_size))
