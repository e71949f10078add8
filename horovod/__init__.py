"""horovod-py: Horovod's API for distributed data-parallel training, in Python.

``import horovod.torch as hvd`` (or ``horovod.numpy``, ``horovod.tensorflow``) gives the framework binding;
``horovod.run(func, np=N)`` runs a function on N workers and returns their results.
"""

from horovod.version import __version__


def run(*args, **kwargs):
    """Run ``func`` on every worker and return the results by rank; see :func:`horovod.runner.run`."""
    from horovod.runner import run as _run
    return _run(*args, **kwargs)


__all__ = ["__version__", "run"]
