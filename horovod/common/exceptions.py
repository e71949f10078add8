"""The error types of the package: one root, :class:`HorovodError`, with Horovod's public names below it."""


class HorovodError(RuntimeError):
    """Root of every error this package raises on purpose."""


class HorovodInternalError(HorovodError):
    """A collective failed because the job broke: a peer died, a connection dropped, Horovod was shut down.

    Elastic training catches it, restores the last committed state and re-initialises.
    """


class HostsUpdatedInterrupt(HorovodError):
    """Raised at ``state.commit()`` when hosts were added or removed; ``skip_sync`` is True when only removed."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("hosts updated" + (" (removed only)" if skip_sync else ""))
        self.skip_sync = skip_sync


class TensorMismatchError(HorovodError):
    """Ranks submitted the same tensor name with different shapes, dtypes, ops, scales or roots.

    Not fatal: the op fails on every rank, and the job can go on.
    """


class UnsupportedOperationError(HorovodError):
    """A collective was asked for something Horovod's core refuses (a reducescatter of a 0-d tensor, or with Adasum).

    A ``RuntimeError``, as Horovod raises it, but not fatal: elastic training does not take it for a broken job.
    """


class HorovodConfigError(HorovodError, ValueError):
    """A ``HOROVOD_*`` variable or launcher flag holds a value that does not parse or is out of range."""


class RendezvousError(HorovodError):
    """The rendezvous service refused a request, or a key did not appear in time."""


class HorovodVersionMismatchError(ImportError):
    """A framework's installed version differs from the one a binding was made for (kept for compatibility)."""

    def __init__(self, name, version, installed_version):
        super().__init__(f"Framework {name} installed with version {installed_version} but found version "
                         f"{version}. This can result in unexpected behavior.")
        self.name = name
        self.version = version
        self.installed_version = installed_version
