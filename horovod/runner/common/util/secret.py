"""``horovod.runner.common.util.secret`` as Horovod has it: a job secret and HMAC digests made with it.

The secret is the same kind of 32 random bytes the launcher makes for every job
(:func:`horovod.common.rendezvous_client.make_secret`).
"""

from __future__ import annotations

import hashlib
import hmac

from horovod.common.rendezvous_client import make_secret

__all__ = ["HOROVOD_SECRET_KEY", "DIGEST_LENGTH", "make_secret_key", "compute_digest", "check_digest"]

HOROVOD_SECRET_KEY = "_HOROVOD_SECRET_KEY"
DIGEST_LENGTH = 32


def make_secret_key() -> bytes:
    """32 fresh random bytes."""
    return make_secret()


def compute_digest(key: bytes, message: bytes) -> bytes:
    """The HMAC-SHA256 of ``message`` under ``key``."""
    return hmac.new(key, message, hashlib.sha256).digest()


def check_digest(key: bytes, message: bytes, digest: bytes) -> bool:
    """Whether ``digest`` is ``message``'s HMAC-SHA256 under ``key`` (compared in constant time)."""
    return hmac.compare_digest(compute_digest(key, message), digest)
