"""How to install an optional extra of horovod-py, in words that work wherever this copy came from.

horovod-py is installed from a checkout (``pip install -e .``) or from the wheel or sdist that ``python -m build``
makes of one; no package index serves it, so ``pip install 'horovod-py[ray]'`` finds nothing. A hint therefore names
the extra's own requirements, which pip installs from anywhere, read from this installation's metadata (the one
declaration is ``pyproject.toml``), and then how to ask for the extra itself from a checkout or from a wheel.
"""

from __future__ import annotations

from typing import List

__all__ = ["DISTRIBUTION", "extra_requirements", "install_hint", "require_framework"]

DISTRIBUTION = "horovod-py"


def extra_requirements(extra: str) -> List[str]:
    """The requirements ``extra`` adds, as installed metadata declares them (``[]`` when not installed by pip)."""
    import importlib.metadata

    from packaging.requirements import Requirement

    try:
        declared = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    wanted = []
    for text in declared:
        requirement = Requirement(text)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            requirement.marker = None
            wanted.append(str(requirement))
    return wanted


def install_hint(extra: str) -> str:
    """A pip command that installs ``extra``'s packages, then the extra's name from a checkout and from a wheel."""
    import shlex

    from horovod.version import __version__

    packages = " ".join(shlex.quote(r) for r in extra_requirements(extra))
    first = f"pip install {packages} (" if packages else "install "
    return (f"{first}horovod-py's {extra!r} extra: pip install -e '.[{extra}]' in a checkout of horovod-py, or "
            f"pip install 'horovod_py-{__version__}-py3-none-any.whl[{extra}]' with a wheel"
            f"{')' if packages else ''}")


def require_framework(framework: str, binding: str, extra: str, note: str = "") -> None:
    """Import ``framework`` for ``binding``, or raise an ImportError that says what to install (``note`` after the
    hint): a bare ``No module named 'torch'`` from deep inside a binding tells a new user nothing.

    Raises:
        ImportError: the framework is missing.
    """
    import importlib

    try:
        importlib.import_module(framework)
    except ImportError as error:
        raise ImportError(f"{binding} needs {framework}: {install_hint(extra)}{note}") from error
