"""The rendezvous service's store: scoped keys and values, bounded waits, change listeners, remembered nonces.

Thread-safe: the server's thread, the launcher's and a test's may read and write it at once.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional

from horovod.common.rendezvous_client import MAX_CLOCK_SKEW

__all__ = ["KVStore", "NONCE_SECONDS"]

NONCE_SECONDS = 2 * MAX_CLOCK_SKEW + 60     # a nonce is kept longer than any request carrying it is accepted


class KVStore:
    """Scoped key/value store with a bounded wait for a key; thread-safe."""

    def __init__(self):
        self._data: Dict[str, Dict[str, bytes]] = {}
        self._changed = threading.Condition()
        self._nonces: Dict[str, float] = {}
        self._nonce_lock = threading.Lock()
        self._pruned = time.monotonic()
        self._listeners: List[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (from the changing thread) after every change."""
        self._listeners.append(listener)

    def forget_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed_now(self) -> None:
        for listener in list(self._listeners):
            listener()

    def fresh_nonce(self, nonce: str) -> bool:
        """Whether ``nonce`` is new to this store (on any address serving it); it is remembered from now on.

        Nonces go only after :data:`NONCE_SECONDS`, past which the request's clock is refused anyway.
        """
        now = time.monotonic()
        with self._nonce_lock:
            if nonce in self._nonces:
                return False
            if now - self._pruned > 60:
                self._nonces = {n: t for n, t in self._nonces.items() if now - t < NONCE_SECONDS}
                self._pruned = now
            self._nonces[nonce] = now
            return True

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``scope/key`` and wake every waiting reader."""
        with self._changed:
            self._data.setdefault(scope, {})[key] = value
            self._changed.notify_all()
        self._changed_now()

    def get(self, scope: str, key: str, wait: float = 0.0) -> Optional[bytes]:
        """The value of ``scope/key``, waiting up to ``wait`` seconds for it; None if it did not come."""
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                value = self._data.get(scope, {}).get(key)
                remaining = deadline - time.monotonic()
                if value is not None or remaining <= 0:
                    return value
                self._changed.wait(remaining)

    def peek_all(self, scope: str, count: int) -> Optional[Dict[str, bytes]]:
        """Every key and value of ``scope`` if it holds at least ``count`` keys now, else None."""
        with self._changed:
            items = self._data.get(scope, {})
            return dict(items) if len(items) >= count else None

    def get_all(self, scope: str, count: int, wait: float = 0.0) -> Optional[Dict[str, bytes]]:
        """Every key and value of ``scope`` once it holds at least ``count`` keys, waiting up to ``wait`` seconds;
        None if it did not fill in time."""
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                items = self._data.get(scope, {})
                remaining = deadline - time.monotonic()
                if len(items) >= count:
                    return dict(items)
                if remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def delete(self, scope: str, key: Optional[str] = None) -> None:
        """Delete ``scope/key``, or the whole scope when ``key`` is None."""
        with self._changed:
            if key is None:
                self._data.pop(scope, None)
            else:
                self._data.get(scope, {}).pop(key, None)
            self._changed.notify_all()
        self._changed_now()

    def keys(self, scope: str) -> List[str]:
        """The keys of ``scope``, sorted."""
        with self._changed:
            return sorted(self._data.get(scope, {}))
