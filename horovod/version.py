"""The package's version: Horovod's API level, then this project's own release number.

``__version__`` is a PEP 440 release with four parts, ``0.28.1.N``: the first three are the Horovod release whose
API and behaviour this package implements (0.28.1), the fourth is horovod-py's own release counter (``N`` = 1 for the
first release). So version gates written for Horovod (``version >= 0.28.1``, ``SpecifierSet(">=0.28")``) pass, a gate
on a later Horovod (``>= 0.29``) does not, and it is never a pre-release. ``RELEASE`` is the project's number alone.
"""

__all__ = ["__version__", "HOROVOD_API_VERSION", "RELEASE"]

HOROVOD_API_VERSION = "0.28.1"
RELEASE = 1
__version__ = "0.28.1.1"
