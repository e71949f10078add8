"""Third-party start-up noise the launcher keeps off the user's screen, and nothing else (issue 49, item 10).

A successful 2-rank TensorFlow job printed four lines per rank that no user asked for: absl's "All log messages
before absl::InitializeLog() ..." preamble and TensorFlow's INFO note that oneDNN custom operations are on, each
twice (two libraries log it), then the CPU-feature note. Two rules, both undone by the user's own setting:

* Workers get ``TF_CPP_MIN_LOG_LEVEL=1`` (TensorFlow's INFO off, its warnings and errors kept) unless the user's
  environment sets it (:func:`quiet_defaults`).
* The relay drops, from workers' stderr only, what TensorFlow logs at INFO before its level takes effect: absl's
  preamble line and INFO lines in absl's C++ format from a ``.cc`` source, plus the CPU-feature note's second line
  (:func:`is_startup_note`), when the workers' ``TF_CPP_MIN_LOG_LEVEL`` is 1 or more (:func:`hides_notes`), as
  TensorFlow would itself. A warning or an error (``W``/``E``/``F`` lines), a Python log line (``.py``) and anything
  on stdout pass; ``--output-filename`` files keep every line. Under Ray, whose own log relay carries the workers'
  output, each worker actor drops the same lines from its stderr itself, through a filter process
  (:mod:`horovod.runner.note_filter`), before Ray's relay and log files see them.
"""

from __future__ import annotations

import re
from typing import Dict, Mapping

__all__ = ["QUIET_DEFAULTS", "quiet_defaults", "hides_notes", "is_startup_note"]

QUIET_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "1"}

_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# absl's C++ format: I<mmdd> <hh:mm:ss.us> <thread> <file>.cc:<line>] <message> (I0000 00:00:<epoch>.<us> before
# absl::InitializeLog)
_ABSL_CC_INFO = re.compile(r"I\d{4} [\d:.]+ +\d+ [\w.-]+\.cc:\d+\] ")
_CPU_FEATURES = re.compile(r"To enable the following instructions: .*rebuild TensorFlow with the appropriate "
                           r"compiler flags\.")


def quiet_defaults(base: Mapping[str, str], extra: Mapping[str, str] = ()) -> Dict[str, str]:
    """The variables of :data:`QUIET_DEFAULTS` that neither ``base`` (the launcher's environment) nor ``extra`` set."""
    given = {**dict(extra), **dict(base)}
    return {name: value for name, value in QUIET_DEFAULTS.items() if name not in given}


def hides_notes(env: Mapping[str, str]) -> bool:
    """Whether workers with environment ``env`` asked TensorFlow to hide its INFO lines (level 1 or more)."""
    try:
        return int(str(env.get("TF_CPP_MIN_LOG_LEVEL", "0")).strip() or "0") >= 1
    except ValueError:
        return False


def is_startup_note(line: str) -> bool:
    """Whether ``line`` (of a worker's stderr) is an INFO line TensorFlow wrote before its log level took effect."""
    return line == _ABSL_PREAMBLE or bool(_ABSL_CC_INFO.match(line)) or bool(_CPU_FEATURES.fullmatch(line))
