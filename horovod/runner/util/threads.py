"""``horovod.runner.util.threads`` as Horovod has it: run a function in a thread, on an event, or over many
argument lists in parallel."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, Optional, Sequence

__all__ = ["in_thread", "on_event", "execute_function_multithreaded"]


def in_thread(target: Callable, args: tuple = (), name: Optional[str] = None, daemon: bool = True,
              silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a new thread and return the thread.

    Args:
        target: the function.
        args: its arguments, a tuple (``(arg,)`` for one).
        name: the thread's name.
        daemon: do not keep the process alive for it.
        silent: swallow any exception ``target`` raises.

    Raises:
        ValueError: ``args`` is not a tuple.
    """
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")
    function = target
    if silent:
        def function(*call_args):
            try:
                target(*call_args)
            except Exception:  # noqa: BLE001 — silent means silent
                pass
    thread = threading.Thread(target=function, args=args, name=name, daemon=daemon)
    thread.start()
    return thread


def on_event(event: threading.Event, func: Callable, args: tuple = (), stop: Optional[threading.Event] = None,
             check_stop_interval_s: float = 1.0, daemon: bool = True, silent: bool = False) -> threading.Thread:
    """In a new thread, wait for ``event`` and then call ``func(*args)``; setting ``stop`` first cancels it.

    ``stop`` is looked at every ``check_stop_interval_s`` seconds. Returns the thread.

    Raises:
        ValueError: ``args`` is not a tuple.
    """
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, for a single argument use (arg,)")

    def wait_then_call():
        while not event.wait(check_stop_interval_s if stop is not None else None):
            if stop.is_set():
                return
        if stop is None or not stop.is_set():
            func(*args)
    return in_thread(wait_then_call, daemon=daemon, silent=silent)


def execute_function_multithreaded(fn: Callable, args_list: Sequence[Sequence[Any]],
                                   block_until_all_done: bool = True,
                                   max_concurrent_executions: int = 1000) -> Optional[Dict[int, Any]]:
    """Call ``fn(*args)`` for every ``args`` of ``args_list`` on up to ``max_concurrent_executions`` threads.

    Returns:
        With ``block_until_all_done``, ``{index in args_list: result}``; else None at once.

    Raises:
        RuntimeError: some call raised (its exception is the cause).
    """
    work: "queue.Queue[int]" = queue.Queue()
    for index in range(len(args_list)):
        work.put(index)
    results: Dict[int, Any] = {}
    errors: list = []

    def worker():
        while True:
            try:
                index = work.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = fn(*args_list[index])
            except Exception as exc:  # noqa: BLE001 — reported below, as Horovod does
                errors.append(exc)
    threads = [in_thread(worker, daemon=not block_until_all_done)
               for _ in range(max(1, min(max_concurrent_executions, len(args_list))))]
    if not block_until_all_done:
        return None
    for thread in threads:
        thread.join()
    if errors or len(results) != len(args_list):
        raise RuntimeError(f"Some threads for func {getattr(fn, '__name__', fn)} did not complete successfully.") \
            from (errors[0] if errors else None)
    return results
