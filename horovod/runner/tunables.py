"""The tunable ``horovodrun`` flags, generated from :data:`horovod.common.config.SETTINGS`, and their mapping to env.

Every setting that has a ``flag`` becomes one argparse option (booleans as ``store_true`` with a ``--no-`` twin);
:func:`tunables_to_env` turns parsed values into the ``HOROVOD_*`` variables handed to workers, and
:func:`apply_config_file` fills values from a ``--config-file`` YAML with Horovod's sections. Flags given on the
command line win over the file. Both mappings are pure functions.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Mapping, MutableMapping, Optional

from horovod.common.config import SETTINGS, Setting
from horovod.common.exceptions import HorovodConfigError

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

# Horovod exports the autotune knobs only with --autotune, and stall timings only while the stall check is on.
_NEEDS_AUTOTUNE = "HOROVOD_AUTOTUNE_"
_NEEDS_STALL_CHECK = ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")


def flag_settings() -> List[Setting]:
    """The settings that ``horovodrun`` exposes as flags, in table order."""
    return [s for s in SETTINGS if s.flag]


def dest_of(setting: Setting) -> str:
    """The argparse destination of a setting's flag: ``--fusion-threshold-mb`` → ``fusion_threshold_mb``."""
    return setting.flag.lstrip("-").replace("-", "_")


def _flag_type(setting: Setting):
    def parse(text: str) -> Any:
        try:
            value = setting.parse(text)
        except HorovodConfigError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (flag {setting.flag})") from None
        if setting.env == "HOROVOD_LOG_LEVEL":
            value = _check_log_level(value)
        return value
    parse.__name__ = setting.type.__name__
    return parse


def _check_log_level(value: str) -> str:
    if value.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"log level {value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def add_tunable_flags(parser: argparse.ArgumentParser) -> None:
    """Add one option per flagged setting to ``parser``; every default is None so explicit flags can be told apart."""
    group = parser.add_argument_group("tunable parameters (passed to workers as HOROVOD_* variables)")
    for setting in flag_settings():
        dest = dest_of(setting)
        shown = setting.default if not setting.flag_scale else setting.default // setting.flag_scale
        help_text = f"{setting.help} ({setting.env}; default: {shown})"
        if setting.type is bool:
            group.add_argument(setting.flag, dest=dest, action="store_true", default=None, help=help_text)
            if not setting.flag.startswith("--no-"):
                group.add_argument("--no-" + setting.flag[2:], dest=dest, action="store_false", default=None,
                                   help=argparse.SUPPRESS)
        else:
            group.add_argument(setting.flag, dest=dest, type=_flag_type(setting), default=None, help=help_text)


def tunables_to_env(values: Mapping[str, Any]) -> Dict[str, str]:
    """Map parsed flag values (by argparse destination) to the workers' ``HOROVOD_*`` variables.

    Unset values (None) and launcher-only settings (``--start-timeout``) are left out, so workers fall back to
    Horovod's defaults. ``--fusion-threshold-mb`` is scaled to bytes.

    Args:
        values: e.g. ``vars(args)``; keys other than tunable destinations are ignored.

    Returns:
        ``{"HOROVOD_FUSION_THRESHOLD": "33554432", ...}``.

    Raises:
        HorovodConfigError: a value is out of range (negative, noise outside [0, 1]).
    """
    env: Dict[str, str] = {}
    autotune = bool(values.get("autotune"))
    stall_check = not values.get("no_stall_check")
    for setting in flag_settings():
        value = values.get(dest_of(setting))
        if value is None or setting.launcher_only:
            continue
        if setting.env.startswith(_NEEDS_AUTOTUNE) and not autotune:
            continue
        if setting.env in _NEEDS_STALL_CHECK and not stall_check:
            continue
        _validate(setting, value)
        if setting.type is bool:
            env[setting.env] = "1" if value else "0"
        elif setting.flag_scale:
            env[setting.env] = str(int(value * setting.flag_scale))
        else:
            env[setting.env] = str(value)
    return env


def _validate(setting: Setting, value: Any) -> None:
    if setting.type is bool or value is None or isinstance(value, str):
        return
    if setting.minimum is not None and value < setting.minimum:
        raise HorovodConfigError(f"{setting.flag} must be >= {setting.minimum}, got {value}")
    if setting.env == "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE" and not 0 <= value <= 1:
        raise HorovodConfigError(f"{setting.flag} must be in [0, 1], got {value}")


# YAML: section → {key in the section: argparse destination}. "enabled" of stall_check is inverted.
def _section_keys() -> Dict[str, Dict[str, str]]:
    dests = {dest_of(s) for s in flag_settings()}
    prefixed = {"autotune": "autotune_", "timeline": "timeline_", "stall_check": "stall_check_", "logging": "log_"}
    sections: Dict[str, Dict[str, str]] = {
        "params": {d: d for d in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity", "hierarchical_allreduce",
                                  "hierarchical_allgather", "torus_allreduce")},
        "library_options": {d: d for d in ("mpi_threads_disable", "num_nccl_streams", "thread_affinity",
                                           "gloo_timeout_seconds")},
    }
    for section, prefix in prefixed.items():
        sections[section] = {d[len(prefix):]: d for d in dests if d.startswith(prefix)}
    sections["autotune"]["enabled"] = "autotune"
    sections["autotune"]["log_file"] = "autotune_log_file"
    sections["stall_check"]["enabled"] = "no_stall_check"
    sections["logging"]["level"] = "log_level"
    sections["logging"]["without_timestamp"] = "log_without_timestamp"
    return sections


def _coerce(setting: Optional[Setting], dest: str, value: Any) -> Any:
    if setting is None or value is None:
        return value
    if setting.type is bool:
        if not isinstance(value, bool):
            raise HorovodConfigError(f"config file: {dest} must be true or false, got {value!r}")
        return value
    parsed = setting.parse(str(value))
    return _check_log_level(parsed) if setting.env == "HOROVOD_LOG_LEVEL" else parsed


def config_file_values(document: Any, source: str = "config file") -> Dict[str, Any]:
    """Translate a parsed ``--config-file`` YAML document into argparse destinations and values.

    Sections as in Horovod: ``controller`` (``gloo``/``mpi``), ``params``, ``autotune`` (``enabled``, ``log_file``,
    ``warmup_samples``...), ``timeline`` (``filename``, ``mark_cycles``), ``stall_check`` (``enabled``,
    ``warning_time_seconds``, ``shutdown_time_seconds``), ``library_options``, ``logging`` (``level``).

    Raises:
        HorovodConfigError: the document is not a mapping, or names an unknown section or key, or a bad value.
    """
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise HorovodConfigError(f"{source}: expected a mapping of sections, got {type(document).__name__}")
    by_dest = {dest_of(s): s for s in flag_settings()}
    sections = _section_keys()
    values: Dict[str, Any] = {}
    for section, body in document.items():
        if section == "controller":
            if str(body).lower() not in ("gloo", "mpi"):
                raise HorovodConfigError(f"{source}: controller must be gloo or mpi, got {body!r}")
            values["use_" + str(body).lower()] = True
            continue
        if section not in sections:
            raise HorovodConfigError(f"{source}: unknown section {section!r}; known: controller, "
                                     f"{', '.join(sorted(sections))}")
        if body is None:
            continue
        if not isinstance(body, Mapping):
            raise HorovodConfigError(f"{source}: section {section!r} must be a mapping")
        for key, value in body.items():
            dest = sections[section].get(key)
            if dest is None:
                raise HorovodConfigError(f"{source}: unknown key {key!r} in section {section!r}; known: "
                                         f"{', '.join(sorted(sections[section]))}")
            value = _coerce(by_dest.get(dest), dest, value)
            if dest == "no_stall_check":
                value = not value
            values[dest] = value
    return values


def apply_config_file(args: MutableMapping[str, Any], file_values: Mapping[str, Any]) -> Dict[str, Any]:
    """Fill the values that the command line left unset (None or absent) from ``file_values``; returns a new dict."""
    merged = dict(args)
    for dest, value in file_values.items():
        if merged.get(dest) is None:
            merged[dest] = value
    return merged


def load_config_file(path: str) -> Dict[str, Any]:
    """Read a YAML ``--config-file`` and return its values by argparse destination.

    Raises:
        HorovodConfigError: the file cannot be read or parsed, or its content is invalid.
    """
    try:
        import yaml
    except ImportError:
        raise HorovodConfigError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except OSError as exc:
        raise HorovodConfigError(f"cannot read config file {path!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise HorovodConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    return config_file_values(document, source=f"config file {path!r}")


__all__ = ["LOG_LEVELS", "flag_settings", "dest_of", "add_tunable_flags", "tunables_to_env", "config_file_values",
           "apply_config_file", "load_config_file"]
