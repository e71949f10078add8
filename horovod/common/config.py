"""Every ``HOROVOD_*`` setting, declared once, as a typed field of :class:`Config`.

This module is the only reader of ``os.environ`` in the package. Each field of :class:`Config` is one setting: its
annotation is its type, its default is Horovod's, and its :class:`Setting` (``SETTINGS``, built from the fields)
says everything else about it: the help line, the ``horovodrun`` flag and its unit, the allowed range or choices,
whether every rank of a job must use the same value (``agreed``), its key in a ``--config-file`` YAML, who reads it
(``side``: the workers, the launcher or both) and, for a setting accepted only for compatibility, why it has no
effect (``inert``). The launcher's flags, its YAML keys and the environment it hands to workers are generated from
:data:`SETTINGS` (:mod:`horovod.runner.tunables`); workers read their configuration with :func:`load_config`, which
also warns once about each ``HOROVOD_*`` variable that is no setting, naming the closest one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import typing
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Set, Tuple

from horovod.common.exceptions import HorovodConfigError

__all__ = ["MIB", "Setting", "Config", "SETTINGS", "SETTINGS_BY_ENV", "AGREED_SETTINGS", "LOG_LEVELS", "load_config",
           "unknown_variables", "report_variables", "configure_logging", "environ_get", "environ_set",
           "environ_snapshot"]

MIB = 1024 * 1024
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
_SIDES = ("workers", "launcher", "both")
_log = logging.getLogger("horovod")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on", "y", "t"):
        return True
    if lowered in ("0", "false", "no", "off", "n", "f", ""):
        return False
    # Horovod parses booleans with strtol: any positive integer means true.
    return int(lowered) > 0


_PARSERS: Dict[type, Callable[[str], Any]] = {bool: _parse_bool, int: lambda text: int(text.strip()),
                                              float: lambda text: float(text.strip()), str: lambda text: text}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Everything about one setting (see the module docstring); built from a :class:`Config` field.

    ``flag_scale`` converts the flag's unit to the variable's (``--fusion-threshold-mb`` is MiB, the variable bytes).
    ``yaml`` is ``section.key`` in a ``--config-file``; ``yaml_negates`` inverts a boolean there
    (``stall_check.enabled`` sets ``HOROVOD_STALL_CHECK_DISABLE``). ``flag_aliases`` are other spellings of the
    flag and ``off_flags`` spellings that set a boolean to False (besides ``--no-<flag>``), as Horovod accepts them.
    ``default_text`` describes the default in ``--help`` where the plain value would mislead.
    """

    env: str
    attr: str
    type: type
    default: Any
    help: str
    flag: Optional[str] = None
    flag_scale: Optional[int] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    choices: Optional[Tuple[str, ...]] = None
    agreed: bool = False
    yaml: Optional[str] = None
    yaml_negates: bool = False
    side: str = "workers"
    inert: Optional[str] = None
    flag_aliases: Tuple[str, ...] = ()
    off_flags: Tuple[str, ...] = ()
    default_text: Optional[str] = None

    @property
    def launcher_only(self) -> bool:
        """Only the launcher reads it: ``horovodrun`` does not hand it to workers."""
        return self.side == "launcher"

    def check(self, value: Any, source: Optional[str] = None) -> Any:
        """``value`` (already of :attr:`type`) within range and choices; a choice is returned in its own spelling.

        Raises:
            HorovodConfigError: out of range or not a choice; the message names ``source`` (default the variable).
        """
        source = source or self.env
        if self.minimum is not None and value is not None and value < self.minimum:
            raise HorovodConfigError(f"{source}={value!r} must be >= {self.minimum}")
        if self.maximum is not None and value is not None and value > self.maximum:
            raise HorovodConfigError(f"{source}={value!r} must be in [{self.minimum}, {self.maximum}]")
        if self.choices is not None and value is not None:
            spelled = {c.lower(): c for c in self.choices}.get(str(value).strip().lower())
            if spelled is None:
                import difflib
                upper = [c.upper() for c in self.choices]
                close = difflib.get_close_matches(str(value).strip().upper(), upper, n=1)
                hint = f"; did you mean {self.choices[upper.index(close[0])]}?" if close else ""
                raise HorovodConfigError(f"{source}={value!r}: use {', '.join(self.choices)}{hint}")
            return spelled
        return value

    def parse(self, text: str) -> Any:
        """The typed, checked value of the variable's text.

        Raises:
            HorovodConfigError: naming the variable, the text and what is expected.
        """
        try:
            value = _PARSERS[self.type](text)
        except (TypeError, ValueError):
            raise HorovodConfigError(
                f"{self.env}={text!r} is not a valid {self.type.__name__}: {self.help}") from None
        try:
            return self.check(value)
        except HorovodConfigError as exc:
            raise HorovodConfigError(str(exc).replace(f"={value!r}", f"={text!r}", 1)) from None


def _s(default: Any, help: str, **facts: Any) -> Any:
    """A :class:`Config` field: its default, help line and the facts of its :class:`Setting`."""
    return dataclasses.field(default=default, repr=facts.pop("repr", True), metadata={"setting": {"help": help,
                                                                                                **facts}})


_COMPAT = "accepted for compatibility; this version has no such feature"


@dataclasses.dataclass(frozen=True)
class Config:
    """Parsed settings; attribute names are the variable names without ``HOROVOD_``, lower-cased.

    ``load_config().fusion_threshold`` is ``HOROVOD_FUSION_THRESHOLD`` as an int. Instances are immutable; use
    :meth:`replace` for a changed copy. ``Config()`` holds every default.
    """

    # Tensor fusion, cycle and cache.
    fusion_threshold: int = _s(
        128 * MIB, "fusion buffer size in bytes; 0 disables fusion", flag="--fusion-threshold-mb", flag_scale=MIB,
        minimum=0, agreed=True, yaml="params.fusion_threshold_mb")
    cycle_time: float = _s(
        1.0, "minimum milliseconds between background cycles that no caller waits for (left unset: at least 10, so "
        "that a backward pass's gradients fuse); a caller blocked on a result never waits", flag="--cycle-time-ms",
        minimum=0, yaml="params.cycle_time_ms",
        default_text="10 ms when not given; a value given is used as is (Horovod's default is 1)")
    cache_capacity: int = _s(1024, "response cache entries; 0 disables the cache", flag="--cache-capacity",
                             minimum=0, agreed=True, yaml="params.cache_capacity")
    disable_group_fusion: bool = _s(False, "fuse explicit groups separately from other tensors", agreed=True)
    hierarchical_allreduce: bool = _s(False, "reduce within each host, then across hosts",
                                      flag="--hierarchical-allreduce", agreed=True,
                                      yaml="params.hierarchical_allreduce")
    hierarchical_allgather: bool = _s(False, "gather within each host, then across hosts",
                                      flag="--hierarchical-allgather", yaml="params.hierarchical_allgather",
                                      inert="allgather is not hierarchical in this version")
    torus_allreduce: bool = _s(False, "2D torus allreduce", flag="--torus-allreduce", yaml="params.torus_allreduce",
                               inert="there is no torus allreduce in this version")
    shm_disable: bool = _s(False, "never use the shared-memory transport between ranks of one host", agreed=True)
    device_plane: str = _s("auto", "how accelerator tensors travel: nccl, staged, gloo or auto (docs/gpu.md)",
                           choices=("auto", "nccl", "staged", "gloo"), agreed=True)
    negotiation: str = _s(
        "auto", "how ranks agree on which tensors are ready: peer (every rank sends its requests to every other "
        "rank and all decide alike: one network hop), star (through rank 0: two hops, fewer messages), tree "
        "(through rank 0 up and down a 3-ary tree: a few frames per rank and cycle whatever the world size) or "
        "auto (peer up to 4 ranks with a core each unless autotune runs, star up to 16, tree above)",
        choices=("auto", "peer", "star", "tree"), agreed=True)
    shm_min_bytes: int = _s(64 * 1024, "smallest collective that goes through shared memory; smaller ones use TCP, "
                            "whose two small messages beat the shared-memory path's barriers", minimum=0, agreed=True)
    spin_us: int = _s(200, "microseconds a rank whose caller waits polls before it sleeps, where every local rank "
                      "has a core (0: sleep at once; a frame then costs a wake-up)", minimum=0, agreed=True)
    # Autotune.
    autotune: bool = _s(False, "tune fusion threshold and cycle time at run time", flag="--autotune", agreed=True,
                        yaml="autotune.enabled")
    autotune_log: Optional[str] = _s(None, "CSV file of autotune samples", flag="--autotune-log-file",
                                     yaml="autotune.log_file")
    autotune_warmup_samples: int = _s(3, "autotune samples discarded first", flag="--autotune-warmup-samples",
                                      minimum=0, yaml="autotune.warmup_samples")
    autotune_steps_per_sample: int = _s(10, "steps per autotune sample", flag="--autotune-steps-per-sample",
                                        minimum=0, yaml="autotune.steps_per_sample")
    autotune_bayes_opt_max_samples: int = _s(20, "autotune samples at most", flag="--autotune-bayes-opt-max-samples",
                                             minimum=0, yaml="autotune.bayes_opt_max_samples")
    autotune_gaussian_process_noise: float = _s(
        0.8, "Gaussian process noise in [0, 1]", flag="--autotune-gaussian-process-noise", minimum=0, maximum=1,
        yaml="autotune.gaussian_process_noise")
    # Timeline.
    timeline: Optional[str] = _s(None, "Chrome-trace timeline file written by rank 0; DYNAMIC enables "
                                 "start_timeline/stop_timeline", flag="--timeline-filename", yaml="timeline.filename")
    timeline_mark_cycles: bool = _s(False, "mark each background cycle in the timeline",
                                    flag="--timeline-mark-cycles", yaml="timeline.mark_cycles")
    # Stall inspector.
    stall_check_disable: bool = _s(False, "disable the stall inspector", flag="--no-stall-check", agreed=True,
                                   yaml="stall_check.enabled", yaml_negates=True, off_flags=("--stall-check",))
    stall_check_time_seconds: float = _s(60.0, "seconds before a stalled tensor is reported",
                                         flag="--stall-check-warning-time-seconds", minimum=0, agreed=True,
                                         yaml="stall_check.warning_time_seconds")
    stall_shutdown_time_seconds: float = _s(0.0, "seconds before a stalled tensor fails the job (0: never)",
                                            flag="--stall-check-shutdown-time-seconds", minimum=0, agreed=True,
                                            yaml="stall_check.shutdown_time_seconds")
    # Logging.
    log_level: str = _s("WARNING", "level of the 'horovod' logger: TRACE, DEBUG, INFO, WARNING, ERROR or FATAL",
                        flag="--log-level", choices=LOG_LEVELS, yaml="logging.level")
    log_hide_time: bool = _s(False, "omit timestamps from log lines", flag="--log-without-timestamp",
                             yaml="logging.without_timestamp", flag_aliases=("--log-hide-timestamp",),
                             off_flags=("--log-with-timestamp", "--no-log-hide-timestamp"))
    # Controller and transport.
    controller: str = _s("gloo", "controller: gloo (our TCP/shared-memory engine)", inert=_COMPAT)
    cpu_operations: str = _s("gloo", "CPU collective implementation", inert=_COMPAT)
    gloo_timeout_seconds: float = _s(30.0, "seconds of silence from a live peer in a collective between warnings "
                                     "naming it; also bounds opening a connection", flag="--gloo-timeout-seconds",
                                     minimum=0, yaml="library_options.gloo_timeout_seconds")
    busy_peer_timeout_seconds: float = _s(300.0, "seconds a live peer (in a long call that holds Python's GIL, or "
                                          "stopped) may make no progress in a collective before the job fails; 0: "
                                          "no limit", flag="--busy-peer-timeout-seconds", minimum=0)
    liveness_timeout: float = _s(10.0, "seconds a peer's connection may show no sign of life before the peer is "
                                 "declared lost (the kernel probes idle connections, so a rank busy in user code "
                                 "stays alive; 0: no probes)", flag="--liveness-timeout", minimum=0,
                                 yaml="library_options.liveness_timeout")
    gloo_iface: str = _s("", "network interface(s) for the data plane, comma-separated: each host uses the first it "
                         "has")
    gloo_rendezvous_addr: Optional[str] = _s(None, "rendezvous server address (set by the launcher)")
    gloo_rendezvous_port: int = _s(-1, "rendezvous server port (set by the launcher)")
    rendezvous_scope: str = _s("job", "rendezvous namespace of this job's workers")
    mpi_threads_disable: bool = _s(False, "MPI threads off", flag="--mpi-threads-disable",
                                   yaml="library_options.mpi_threads_disable", inert=_COMPAT)
    num_nccl_streams: int = _s(1, "NCCL streams", flag="--num-nccl-streams", yaml="library_options.num_nccl_streams",
                               inert="the device plane runs on one stream per rank (docs/gpu.md)")
    thread_affinity: Optional[str] = _s(None, "cores of each local rank's threads: one entry per local rank, "
                                        "comma-separated, each a core id or a range a-b", flag="--thread-affinity",
                                        yaml="library_options.thread_affinity")
    adasum_mpi_chunk_size: int = _s(1 << 30, "Adasum chunk size in bytes", inert=_COMPAT)
    # Topology (set by the launcher, mpirun or Slurm).
    rank: int = _s(0, "global rank of this worker")
    size: int = _s(1, "number of workers")
    local_rank: int = _s(0, "rank among the workers of this host")
    local_size: int = _s(1, "workers on this host")
    cross_rank: int = _s(0, "index of this host among hosts with this local rank")
    cross_size: int = _s(1, "hosts with this local rank")
    hostname: str = _s("localhost", "host identity of this worker")
    elastic: bool = _s(False, "elastic job: re-rendezvous on membership changes")
    dynamic_process_sets: bool = _s(False, "allow add_process_set/remove_process_set")
    secret_key: Optional[str] = _s(None, "per-job secret (hex), handed to workers by the launcher", repr=False)
    # Launcher.
    start_timeout: float = _s(30.0, "seconds for all workers to start and meet (workers bound their rendezvous and "
                              "connection set-up by it)", flag="--start-timeout", minimum=0, side="both")
    elastic_timeout: float = _s(600.0, "seconds an elastic job waits for enough slots", flag="--elastic-timeout",
                                minimum=0, side="both")
    spark_start_timeout: float = _s(600.0, "seconds horovod.spark waits for the Spark tasks of a job to start",
                                    minimum=0, side="launcher")
    # Many hosts (ssh launch, workers started by mpirun or srun): see docs/cluster.md.
    rendezvous_addr: Optional[str] = _s(None, "under mpirun/srun without horovodrun: address where rank 0 serves the "
                                        "job's rendezvous (an address of rank 0's host)")
    rendezvous_port: int = _s(-1, "under mpirun/srun without horovodrun: port where rank 0 serves the job's "
                              "rendezvous")
    ssh_args: str = _s("", "extra ssh options for launching on remote hosts; they win over the launcher's own "
                       "(e.g. '-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/path')", side="launcher")
    ssh_known_hosts: Optional[str] = _s(None, "known-hosts file where ssh records the key of a host met for the first "
                                        "time (trust on first use; default ~/.horovod/known_hosts, next to "
                                        "~/.ssh/known_hosts, which is read too)", side="launcher")

    _explicit: FrozenSet[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)

    def is_explicit(self, env: str) -> bool:
        """Whether ``env`` (e.g. ``HOROVOD_FUSION_THRESHOLD``) was set, rather than left at its default."""
        return env in self._explicit

    def replace(self, **changes: Any) -> "Config":
        """A copy with ``changes`` (by attribute name) applied.

        Raises:
            AttributeError: a name is no setting.
        """
        unknown = set(changes) - set(SETTINGS_BY_ATTR)
        if unknown:
            raise AttributeError(f"no Horovod setting named {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> Dict[str, Any]:
        """Every setting's value by attribute name."""
        return {name: getattr(self, name) for name in SETTINGS_BY_ATTR}


def _build_settings() -> Tuple[Setting, ...]:
    hints = typing.get_type_hints(Config)
    settings = []
    for field in dataclasses.fields(Config):
        if "setting" not in field.metadata:
            continue
        kind = hints[field.name]
        kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        facts = dict(field.metadata["setting"])
        if facts.get("side", "workers") not in _SIDES:
            raise ValueError(f"setting {field.name}: side must be one of {_SIDES}")
        settings.append(Setting(env=f"HOROVOD_{field.name.upper()}", attr=field.name, type=kind,
                                default=field.default, **facts))
    return tuple(settings)


SETTINGS: Tuple[Setting, ...] = _build_settings()
SETTINGS_BY_ENV: Dict[str, Setting] = {s.env: s for s in SETTINGS}
SETTINGS_BY_ATTR: Dict[str, Setting] = {s.attr: s for s in SETTINGS}
# Settings that choose algorithms, give cache bits their meaning or drive decisions every rank makes alike: every
# rank must use the same values (the core compares them when the mesh forms).
AGREED_SETTINGS: Tuple[str, ...] = tuple(s.attr for s in SETTINGS if s.agreed)
_warned: Set[str] = set()


def unknown_variables(environ: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """Each ``HOROVOD_*`` name of ``environ`` that is no setting, with the closest setting's name (or None)."""
    unknown = [name for name in environ if name.startswith("HOROVOD_") and name not in SETTINGS_BY_ENV]
    if not unknown:
        return {}
    import difflib     # (only then: its import costs every rank's start-up ~5 ms)
    return {name: next(iter(difflib.get_close_matches(name, SETTINGS_BY_ENV, n=1)), None) for name in unknown}


def report_variables(environ: Mapping[str, str], explicit: Optional[FrozenSet[str]] = None) -> None:
    """Warn once per name, on the ``horovod`` logger, about ``HOROVOD_*`` variables of ``environ`` that are no setting
    (naming the closest) and inert settings set to something else than their default (``explicit``: the settings
    set, default those with a value). A launcher reports the environment it gives its workers, which then say nothing
    of it (:func:`load_config`): one report per job, not one per rank.
    """
    explicit = frozenset(s.env for s in SETTINGS if environ.get(s.env)) if explicit is None else explicit
    for name, closest in unknown_variables(environ).items():
        if name not in _warned:
            _warned.add(name)
            hint = f"; did you mean {closest}?" if closest else ""
            _log.warning("%s is not a Horovod setting and is ignored%s", name, hint)
    for env in explicit:
        setting = SETTINGS_BY_ENV[env]
        if setting.inert and env not in _warned and environ[env].strip().lower() != str(setting.default).lower():
            _warned.add(env)
            _log.warning("%s has no effect: %s", env, setting.inert)


def load_config(environ: Optional[Mapping[str, str]] = None) -> Config:
    """Read every setting from ``environ`` (default: the process environment).

    Warns once per name (on the ``horovod`` logger) about ``HOROVOD_*`` variables that are no setting, naming the
    closest setting, and about inert settings set to something else than their default, unless a Horovod launcher
    started this worker (``HOROVOD_GLOO_RENDEZVOUS_ADDR``): the launcher reported them (:func:`report_variables`).
    Reading the process's own environment also applies the logging settings (:func:`configure_logging`).

    Raises:
        HorovodConfigError: a variable is set to a value that does not parse; the message names both.
    """
    env = os.environ if environ is None else environ
    values = {}
    explicit = set()
    for setting in SETTINGS:
        text = env.get(setting.env)
        values[setting.attr] = setting.default if text is None or text == "" and setting.type is not str \
            else setting.parse(text)
        if text is not None and text != "":
            explicit.add(setting.env)
    if not env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):  # else a Horovod launcher started us and reported them
        report_variables(env, frozenset(explicit))
    config = Config(**values, _explicit=frozenset(explicit))
    if environ is None:
        configure_logging(config)
    return config


def configure_logging(config: Config) -> None:
    """Apply ``HOROVOD_LOG_LEVEL`` and ``HOROVOD_LOG_HIDE_TIME`` to the ``horovod`` logger, when either was set.

    Left unset, the logger stays as Python leaves it (warnings and above reach stderr). :func:`load_config` calls
    this when it reads the process's own environment (every worker does, in ``hvd.init()``).
    """
    if not (config.is_explicit("HOROVOD_LOG_LEVEL") or config.is_explicit("HOROVOD_LOG_HIDE_TIME")):
        return
    levels = {"TRACE": 5, "FATAL": logging.CRITICAL}
    _log.setLevel(levels.get(config.log_level, getattr(logging, config.log_level, logging.WARNING)))
    if not any(getattr(h, "_horovod", False) for h in _log.handlers):
        handler = logging.StreamHandler()
        handler._horovod = True  # type: ignore[attr-defined]
        _log.addHandler(handler)
        _log.propagate = False
    fmt = "[%(levelname)s] %(message)s" if config.log_hide_time else "[%(asctime)s %(levelname)s] %(message)s"
    for handler in _log.handlers:
        if getattr(handler, "_horovod", False):
            handler.setFormatter(logging.Formatter(fmt))


def environ_get(name: str, default: Optional[str] = None) -> Optional[str]:
    """Read a variable that is not a Horovod setting (``OMPI_COMM_WORLD_RANK``, ``SLURM_PROCID``, ``PATH``...)."""
    return os.environ.get(name, default)


def environ_snapshot() -> Dict[str, str]:
    """A copy of the process environment, for launchers that pass it on to workers."""
    return dict(os.environ)


def environ_set(name: str, value: Optional[str]) -> None:
    """Set a variable in this process; None removes it. For the places that must change the process's environment
    itself: Horovod's ``util.env`` block, and a Ray actor taking on its job's settings before ``init``."""
    os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
