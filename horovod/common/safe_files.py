"""Writing files whose path the user chose, which may lie in a directory other users can write (``/tmp``).

The docs suggest ``/tmp/timeline.json``; ``open(path, "w")`` follows a symlink another user planted there and
overwrites its target with the job's rights (root's, often), or truncates a file another user left there. Every file
the job writes at a path it was given is opened here instead: a symlink is refused (``O_NOFOLLOW``), and so is
anything but a regular file that this user owns and that has no other name (a hard link another user made to a file
of ours); such a file is truncated only after those checks, on the descriptor they were made on. The error names the
path and why.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO

__all__ = ["UnsafePathError", "open_for_writing"]


class UnsafePathError(OSError):
    """A path the job was asked to write is a symlink, or a file it should not clobber."""


def open_for_writing(path: str, what: str, mode: str = "w", encoding: str = "utf-8") -> IO:
    """Open ``path`` (the ``what`` of the job: "the timeline", ...) for writing from its start, never following a
    symlink or clobbering a file that is not this user's own; ``mode`` is ``"w"`` or ``"w+"`` (text) or their
    binary forms.

    Raises:
        UnsafePathError: the path is a symlink, or an existing file that is not a regular file of this user with one
            name.
        OSError: the file cannot be created (the directory does not exist, or is not writable).
    """
    flags = os.O_CREAT | (os.O_RDWR if "+" in mode else os.O_WRONLY) | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(errno.ELOOP, f"{what} path {path} is a symlink; refusing to follow it (another "
                                               f"user may have planted it): choose a path in a directory only you "
                                               f"can write, or remove the link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink > 1:
            raise UnsafePathError(errno.EEXIST, f"{what} path {path} is already there and is not a regular file of "
                                                f"this user with one name (owner uid {info.st_uid}, {info.st_nlink} "
                                                f"links); refusing to overwrite it: choose another path, or remove it")
        os.ftruncate(fd, 0)
        return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": encoding}))
    except BaseException:
        os.close(fd)
        raise
