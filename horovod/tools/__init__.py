"""Tools users run as modules: ``python -m horovod.tools.house`` (the shape of the package)."""
