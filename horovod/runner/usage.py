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


# Other launchers' flags (torchrun's in either spelling, mpirun's): horovodrun's nearest flag ("" where it needs
# none) and how it says the same. Spelling alone finds nothing near them, or something wrong.
_FOREIGN = {
    "--nproc-per-node": ("-np", "-np N is the total number of processes (several hosts: -H host1:4,host2:4)"),
    "--nnodes": ("-H", "-H host1:N,host2:N or --hostfile FILE, and every host's processes start over ssh"),
    "--node-rank": ("", "it starts every host's processes itself (-H or --hostfile)"),
    "--master-addr": ("", "it runs its own rendezvous (--network-interface picks the address)"),
    "--master-port": ("", "it runs its own rendezvous on a free port"),
    "--rdzv-endpoint": ("", "it runs its own rendezvous"),
    "--rdzv-backend": ("", "it runs its own rendezvous"),
    "--rdzv-id": ("", "it runs its own rendezvous"),
    "--standalone": ("", "-np N alone runs on this host"),
    "--max-restarts": ("--reset-limit", "--reset-limit N, with elastic training (--min-np, docs/elastic.md)"),
    "--npernode": ("-H", "-H host1:N,host2:N runs N processes on each host"),
}


def suggest(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to ``word`` (for another launcher's flag, such as torchrun's ``--nproc-per-node``,
    horovodrun's nearest flag), or None when none is close."""
    foreign = _FOREIGN.get(word.replace("_", "-"))
    if foreign is not None:
        return foreign[0] or None
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def _foreign_hint(word: str) -> str:
    flag, how = _FOREIGN[word.replace("_", "-")]
    return f"; did you mean {flag}? {how}" if flag else f"; horovodrun needs no {word}: {how}"


def _hint(message: str, options: List[str]) -> str:
    unknown = _UNRECOGNIZED.search(message)
    if unknown:
        for word in unknown.group(1).split():
            if word.split("=")[0].replace("_", "-") in _FOREIGN:
                return _foreign_hint(word.split("=")[0])
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
