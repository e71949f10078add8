"""Where the estimators keep their data, checkpoints and logs: Horovod's ``Store`` API over ``pyarrow.fs``.

Layout under a store's prefix (Horovod's): ``intermediate_train_data.<idx>`` and ``intermediate_val_data.<idx>``
(Parquet written by Spark), ``runs/<run_id>/checkpoint`` and ``runs/<run_id>/logs``. The driver writes the data, the
ranks read it and rank 0 writes checkpoints, so the prefix must be reachable from the driver and every executor
under the same name: a shared or local path on one machine, HDFS or any filesystem ``pyarrow.fs`` opens.
"""

from __future__ import annotations

import os
import posixpath
from typing import Optional, Tuple

import pyarrow.fs as pafs

from horovod.common.exceptions import HorovodError

__all__ = ["Store", "FilesystemStore", "LocalStore", "HDFSStore", "DBFSLocalStore", "StoreError"]


class StoreError(HorovodError):
    """A store cannot be created or used (no client for its filesystem, a missing path)."""


class Store:
    """A place for an estimator's data, checkpoints and logs; :meth:`create` picks the class from the path."""

    def __init__(self, prefix_path: str, filesystem: pafs.FileSystem, root: str):
        self.prefix_path = prefix_path
        self.fs = filesystem
        self.root = root.rstrip("/") or "/"

    @staticmethod
    def create(prefix_path: str, *args, **kwargs) -> "Store":
        """The store for ``prefix_path``: :class:`HDFSStore` for ``hdfs://``, :class:`DBFSLocalStore` for
        ``/dbfs/`` and ``dbfs:/``, :class:`LocalStore` for a local path or ``file://``, else
        :class:`FilesystemStore` (any URI ``pyarrow.fs`` opens).

        Raises:
            StoreError: no client for the path's filesystem here.
        """
        if prefix_path.startswith("hdfs://"):
            return HDFSStore(prefix_path, *args, **kwargs)
        if prefix_path.startswith(("/dbfs/", "dbfs:/")):
            return DBFSLocalStore(prefix_path, *args, **kwargs)
        if "://" not in prefix_path or prefix_path.startswith("file://"):
            return LocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    # -- paths -----------------------------------------------------------------------------------------------------

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def get_train_data_path(self, idx: Optional[str] = None) -> str:
        """The training data of dataset ``idx``."""
        return self._join("intermediate_train_data" + (f".{idx}" if idx is not None else ""))

    def get_val_data_path(self, idx: Optional[str] = None) -> str:
        """The validation data of dataset ``idx``."""
        return self._join("intermediate_val_data" + (f".{idx}" if idx is not None else ""))

    def get_test_data_path(self, idx: Optional[str] = None) -> str:
        """The test data of dataset ``idx``."""
        return self._join("intermediate_test_data" + (f".{idx}" if idx is not None else ""))

    def get_runs_path(self) -> str:
        """The folder of every run."""
        return self._join("runs")

    def get_run_path(self, run_id: str) -> str:
        """The folder of run ``run_id``."""
        return posixpath.join(self.get_runs_path(), run_id)

    def get_checkpoint_path(self, run_id: str) -> str:
        """The checkpoint file of run ``run_id``."""
        return posixpath.join(self.get_run_path(run_id), self.get_checkpoint_filename())

    def get_checkpoint_filename(self) -> str:
        """The checkpoint's file name."""
        return "checkpoint"

    def get_logs_path(self, run_id: str) -> str:
        """The logs folder of run ``run_id``."""
        return posixpath.join(self.get_run_path(run_id), self.get_logs_subdir())

    def get_logs_subdir(self) -> str:
        """The logs folder's name."""
        return "logs"

    def get_full_path(self, path: str) -> str:
        """``path`` as a URI Spark and pyarrow both open."""
        return path

    # -- files -----------------------------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def read(self, path: str) -> bytes:
        """The bytes of file ``path``.

        Raises:
            StoreError: it does not exist.
        """
        if not self.exists(path):
            raise StoreError(f"{self.get_full_path(path)} does not exist in the store")
        with self.fs.open_input_stream(path) as handle:
            return handle.read()

    def write(self, path: str, data: bytes) -> None:
        """Write ``data`` to file ``path`` (folders are created; written whole, then renamed into place)."""
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        temp = f"{path}.tmp-{os.getpid()}"
        with self.fs.open_output_stream(temp) as handle:
            handle.write(data)
        self.fs.move(temp, path)

    def write_text(self, path: str, text: str) -> None:
        """Write ``text`` (UTF-8) to file ``path``."""
        self.write(path, text.encode("utf-8"))

    def delete(self, path: str) -> None:
        """Remove the file or folder ``path`` if it exists."""
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(path)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(path)

    def is_parquet_dataset(self, path: str) -> bool:
        """Whether ``path`` is a folder of Parquet files written completely (Spark's ``_SUCCESS`` marker)."""
        return self.exists(posixpath.join(path, "_SUCCESS"))

    def __getstate__(self):
        # pyarrow filesystems pickle, but some (HDFS) must reconnect on the executor: keep what rebuilds them.
        return {"prefix_path": self.prefix_path}

    def __setstate__(self, state):
        self.__dict__.update(Store.create(state["prefix_path"]).__dict__)


def _local_root(prefix_path: str) -> str:
    path = prefix_path[len("file://"):] if prefix_path.startswith("file://") else prefix_path
    return os.path.abspath(os.path.expanduser(path))


class LocalStore(Store):
    """A store on a local (or shared, mounted) folder; its folder is created."""

    def __init__(self, prefix_path: str):
        root = _local_root(prefix_path)
        os.makedirs(root, exist_ok=True)
        super().__init__(prefix_path, pafs.LocalFileSystem(), root)

    def get_full_path(self, path: str) -> str:
        """``file://`` + the absolute path."""
        return "file://" + path


class DBFSLocalStore(LocalStore):
    """Databricks' DBFS through its local mount (``/dbfs/...``); ``dbfs:/x`` means ``/dbfs/x``."""

    def __init__(self, prefix_path: str):
        if prefix_path.startswith("dbfs:/"):
            prefix_path = "/dbfs/" + prefix_path[len("dbfs:/"):].lstrip("/")
        super().__init__(prefix_path)


class FilesystemStore(Store):
    """A store on any filesystem ``pyarrow.fs.FileSystem.from_uri`` opens (``s3://``, ``gs://``, ...).

    Raises:
        StoreError: pyarrow has no client for the URI here.
    """

    def __init__(self, prefix_path: str):
        filesystem, root = _open_uri(prefix_path)
        self._scheme = prefix_path.split("://", 1)[0]
        super().__init__(prefix_path, filesystem, root)

    def get_full_path(self, path: str) -> str:
        """The URI of ``path``."""
        return f"{self._scheme}://{path.lstrip('/')}"


def _open_uri(prefix_path: str) -> Tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(prefix_path)
    except (OSError, ValueError, NotImplementedError) as exc:
        raise StoreError(f"no filesystem client for {prefix_path!r} here: {exc}") from None


class HDFSStore(Store):
    """A store on HDFS (``hdfs://namenode:port/path``), through pyarrow's ``HadoopFileSystem``.

    Needs an HDFS client on the driver and every executor: ``libhdfs`` (``ARROW_LIBHDFS_DIR`` or ``HADOOP_HOME``),
    Java, and Hadoop's jars on ``CLASSPATH``.

    Raises:
        StoreError: no HDFS client can be loaded here; the message says what pyarrow reported.
    """

    def __init__(self, prefix_path: str, host: Optional[str] = None, port: Optional[int] = None,
                 user: Optional[str] = None):
        rest = prefix_path[len("hdfs://"):]
        authority, _, path = rest.partition("/")
        name, _, port_text = authority.partition(":")
        self._authority = authority
        try:
            filesystem = pafs.HadoopFileSystem(host or name or "default", port or int(port_text or 8020), user=user)
        except (OSError, RuntimeError) as exc:
            raise StoreError(f"HDFSStore needs an HDFS client (libhdfs, Java and Hadoop's CLASSPATH) on the driver "
                             f"and every executor; pyarrow could not connect to {prefix_path!r}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        super().__init__(prefix_path, filesystem, "/" + path)

    def get_full_path(self, path: str) -> str:
        """``hdfs://<namenode>`` + ``path``."""
        return f"hdfs://{self._authority}{path}"
