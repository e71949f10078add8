"""Bounded waits for the Spark tests: a job that overruns is cancelled and fails its test instead of hanging."""

import threading
import time

import pytest


def bounded(spark_session, fn, timeout: float):
    """Call ``fn()`` in a thread; past ``timeout`` cancel every Spark job and fail the test (no hang)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: B902 — re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        spark_session.sparkContext.cancelAllJobs()
        thread.join(30)
        pytest.fail(f"the Spark job did not finish within {timeout}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def no_active_spark_jobs(spark_session, within: float = 30.0) -> bool:
    """Whether Spark has no running job left (waiting up to ``within`` for them to wind down)."""
    tracker = spark_session.sparkContext.statusTracker()
    deadline = time.monotonic() + within
    while tracker.getActiveJobsIds() or tracker.getActiveStageIds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
