"""Usage errors of ``horovodrun``: one line naming the problem, with a did-you-mean suggestion where one fits.

argparse prints the whole usage block before an error; with ``horovodrun``'s sixty-odd flags that block buries the
one line that matters. :class:`HorovodArgumentParser` prints ``horovodrun: error: <what>; did you mean <flag>?``
instead; ``--help`` still shows everything.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Iterable, List, NoReturn, Optional

__all__ = ["HorovodArgumentParser", "suggest", "usage_error"]

_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)$")
_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def suggest(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to ``word``, or None when none is close."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def _hint(message: str, options: List[str]) -> str:
    unknown = _UNRECOGNIZED.search(message)
    if unknown:
        for word in unknown.group(1).split():
            close = suggest(word.split("=")[0], options) if word.startswith("-") else None
            if close:
                return f"; did you mean {close}?"
    choice = _CHOICE.search(message)
    if choice:
        close = suggest(choice.group(1), [c.strip(" '") for c in choice.group(2).split(",")])
        if close:
            return f"; did you mean {close}?"
    return ""


def usage_error(prog: str, message: str, options: Iterable[str] = ()) -> str:
    """The one line ``horovodrun`` prints for a usage error (``message`` flattened to one line)."""
    flat = " ".join(str(message).split())
    return f"{prog}: error: {flat}{_hint(flat, list(options))} (see {prog} --help)"


class HorovodArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line with a suggestion (exit status 2, as argparse's)."""

    def option_strings(self) -> List[str]:
        """Every option string of the parser (``-np``, ``--num-proc``...)."""
        return [s for action in self._actions for s in action.option_strings]

    def error(self, message: str) -> NoReturn:
        """Print :func:`usage_error` to stderr and exit with status 2."""
        print(usage_error(self.prog, message, self.option_strings()), file=sys.stderr, flush=True)
        sys.exit(2)
