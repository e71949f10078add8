"""The tunable ``horovodrun`` flags, generated from :data:`horovod.common.config.SETTINGS`, and their mapping to env.

Every setting that has a ``flag`` becomes one argparse option (booleans as ``store_true`` with a ``--no-`` twin);
:func:`tunables_to_env` turns parsed values into the ``HOROVOD_*`` variables handed to workers, and
:func:`apply_config_file` fills values from a ``--config-file`` YAML with Horovod's sections. Flags given on the
command line win over the file. Both mappings are pure functions.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional

from horovod.common.config import LOG_LEVELS, MIB, SETTINGS, Setting
from horovod.common.exceptions import HorovodConfigError

__all__ = ["LOG_LEVELS", "flag_settings", "dest_of", "add_tunable_flags", "tunables_to_env", "warn_inert",
           "config_file_values", "apply_config_file", "load_config_file"]

# Horovod exports the autotune knobs only with --autotune, and stall timings only while the stall check is on.
_NEEDS_AUTOTUNE = "HOROVOD_AUTOTUNE_"
_NEEDS_STALL_CHECK = ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def flag_settings() -> List[Setting]:
    """The settings that ``horovodrun`` exposes as flags, in table order."""
    return [s for s in SETTINGS if s.flag]


def dest_of(setting: Setting) -> str:
    """The argparse destination of a setting's flag: ``--fusion-threshold-mb`` → ``fusion_threshold_mb``."""
    return setting.flag.lstrip("-").replace("-", "_")


_BY_FLAG = {s.flag: s for s in flag_settings()}


def _flag_type(setting: Setting):
    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except HorovodConfigError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (flag {setting.flag})") from None
    parse.__name__ = setting.type.__name__
    return parse


def add_tunable_flags(parser: argparse.ArgumentParser) -> None:
    """Add one option per flagged setting to ``parser``; every default is None so explicit flags can be told apart.

    Flags of inert settings are still parsed (command lines written for Horovod keep working) but hidden from
    ``--help``; :func:`warn_inert` says they have no effect.
    """
    group = parser.add_argument_group("tunable parameters (passed to workers as HOROVOD_* variables)")
    for setting in flag_settings():
        dest = dest_of(setting)
        help_text = argparse.SUPPRESS if setting.inert else _help(setting)
        if setting.type is bool:
            group.add_argument(setting.flag, dest=dest, action="store_true", default=None, help=help_text)
            for alias in setting.flag_aliases:
                group.add_argument(alias, dest=dest, action="store_true", default=None, help=argparse.SUPPRESS)
            offs = setting.off_flags + (() if setting.flag.startswith("--no-") else ("--no-" + setting.flag[2:],))
            for off in offs:
                group.add_argument(off, dest=dest, action="store_false", default=None, help=argparse.SUPPRESS)
        else:
            group.add_argument(setting.flag, *setting.flag_aliases, dest=dest, type=_flag_type(setting),
                               default=None, help=help_text)


def _help(setting: Setting) -> str:
    if setting.flag_scale == MIB:
        text = setting.help.replace(" in bytes", " in MiB")
        return f"{text} ({setting.env} holds bytes; default: {setting.default // MIB} MiB)"
    return f"{setting.help} ({setting.env}; default: {setting.default_text or setting.default})"


def tunables_to_env(values: Mapping[str, Any]) -> Dict[str, str]:
    """Map parsed flag values (by argparse destination) to the workers' ``HOROVOD_*`` variables.

    Unset values (None), launcher-only settings and inert ones are left out, so workers fall back to Horovod's
    defaults. ``--fusion-threshold-mb`` is scaled to bytes.

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
        if value is None:
            continue
        _validate(setting, value)
        if setting.launcher_only or setting.inert:
            continue
        if setting.env.startswith(_NEEDS_AUTOTUNE) and not autotune:
            continue
        if setting.env in _NEEDS_STALL_CHECK and not stall_check:
            continue
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
    setting.check(value, source=setting.flag)


def warn_inert(values: Mapping[str, Any], log: Callable[[str], None] = _stderr) -> List[str]:
    """Say, for each flag given (or set by the config file) whose setting has no effect here, that it is ignored.

    Returns:
        The flags named.
    """
    named = [s.flag for s in flag_settings() if s.inert and values.get(dest_of(s)) is not None]
    for flag in named:
        log(f"horovodrun: warning: {flag} is ignored: {_BY_FLAG[flag].inert}")
    return named


def _section_keys() -> Dict[str, Dict[str, str]]:
    """YAML ``section`` → {key in the section: argparse destination}, from each setting's ``yaml``."""
    sections: Dict[str, Dict[str, str]] = {}
    for setting in flag_settings():
        if setting.yaml:
            section, _, key = setting.yaml.partition(".")
            sections.setdefault(section, {})[key] = dest_of(setting)
    return sections


def _coerce(setting: Optional[Setting], dest: str, value: Any) -> Any:
    if setting is None or value is None:
        return value
    if setting.type is bool:
        if not isinstance(value, bool):
            raise HorovodConfigError(f"config file: {dest} must be true or false, got {value!r}")
        return not value if setting.yaml_negates else value
    return setting.parse(str(value))


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
            values[dest] = _coerce(by_dest[dest], dest, value)
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

