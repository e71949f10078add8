"""horovod-py, Horovod's API in Python: bindings (``torch``, ``tensorflow``, ``keras``, ``jax``, ``numpy``), ``elastic``,
the launchers (``runner``, ``ray``, ``spark``) and the engine under them (``runtime``, ``core``, ``algorithms``, ...).

``import horovod.torch as hvd`` (or ``horovod.numpy``, ``horovod.tensorflow``) gives the framework binding;
``horovod.run(func, np=N)`` runs a function on N workers and returns their results.
"""

from horovod.version import __version__


def run(*args, **kwargs):
    """Run ``func`` on every worker and return the results by rank; see :func:`horovod.runner.run`."""
    from horovod.runner import run as _run
    return _run(*args, **kwargs)


__all__ = ["__version__", "run"]
