"""Every ``HOROVOD_*`` setting, declared once.

This module is the only reader of ``os.environ`` in the package. Each :class:`Setting` carries the environment
variable's name (Horovod's), its type, its default (Horovod's), a help line and, where ``horovodrun`` exposes it, the
command-line flag. The launcher's tunable flags and the environment it hands to workers are generated from
:data:`SETTINGS`; workers read their configuration with :func:`load_config`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from horovod.common.exceptions import HorovodConfigError

MIB = 1024 * 1024


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on", "y", "t"):
        return True
    if lowered in ("0", "false", "no", "off", "n", "f", ""):
        return False
    # Horovod parses booleans with strtol: any positive integer means true.
    return int(lowered) > 0


_PARSERS: Dict[type, Callable[[str], Any]] = {
    bool: _parse_bool,
    int: lambda text: int(text.strip()),
    float: lambda text: float(text.strip()),
    str: lambda text: text,
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One configuration knob: environment variable, type, default, help and optional ``horovodrun`` flag.

    ``flag_scale`` converts the flag's unit to the variable's (``--fusion-threshold-mb`` is MiB, the variable bytes).
    ``minimum`` rejects values below it, as Horovod's launcher rejects negative tunables.
    """

    env: str
    type: type
    default: Any
    help: str
    flag: Optional[str] = None
    flag_scale: Optional[int] = None
    minimum: Optional[float] = None
    launcher_only: bool = False
    choices: Optional[Tuple[str, ...]] = None    # allowed values of a string setting (compared lower-cased)

    @property
    def attr(self) -> str:
        return self.env[len("HOROVOD_"):].lower() if self.env.startswith("HOROVOD_") else self.env.lower()

    def parse(self, text: str) -> Any:
        try:
            value = _PARSERS[self.type](text)
        except (TypeError, ValueError):
            raise HorovodConfigError(
                f"{self.env}={text!r} is not a valid {self.type.__name__}: {self.help}") from None
        if self.minimum is not None and value is not None and value < self.minimum:
            raise HorovodConfigError(f"{self.env}={text!r} must be >= {self.minimum}")
        if self.choices is not None:
            value = value.strip().lower()
            if value not in self.choices:
                raise HorovodConfigError(f"{self.env}={text!r}: use {', '.join(self.choices)}")
        return value


S = Setting
SETTINGS: Tuple[Setting, ...] = (
    # Tensor fusion, cycle and cache.
    S("HOROVOD_FUSION_THRESHOLD", int, 128 * MIB, "fusion buffer size in bytes; 0 disables fusion",
      flag="--fusion-threshold-mb", flag_scale=MIB, minimum=0),
    S("HOROVOD_CYCLE_TIME", float, 1.0, "minimum milliseconds between background cycles that no caller waits for "
      "(left unset: at least 10, so that a backward pass's gradients fuse); a caller blocked on a result never waits",
      flag="--cycle-time-ms", minimum=0),
    S("HOROVOD_CACHE_CAPACITY", int, 1024, "response cache entries; 0 disables the cache",
      flag="--cache-capacity", minimum=0),
    S("HOROVOD_DISABLE_GROUP_FUSION", bool, False, "fuse explicit groups separately from other tensors"),
    S("HOROVOD_HIERARCHICAL_ALLREDUCE", bool, False, "reduce within each host, then across hosts",
      flag="--hierarchical-allreduce"),
    S("HOROVOD_HIERARCHICAL_ALLGATHER", bool, False, "gather within each host, then across hosts",
      flag="--hierarchical-allgather"),
    S("HOROVOD_TORUS_ALLREDUCE", bool, False, "2D torus allreduce", flag="--torus-allreduce"),
    S("HOROVOD_SHM_DISABLE", bool, False, "never use the shared-memory transport between ranks of one host"),
    S("HOROVOD_NEGOTIATION", str, "auto", "how ranks agree on which tensors are ready: peer (every rank sends its "
      "requests to every other rank and all decide alike: one network hop), star (through rank 0: two hops, "
      "fewer messages in large jobs) or auto (peer up to 4 ranks with a core each, unless autotune runs)",
      choices=("auto", "peer", "star")),
    S("HOROVOD_SHM_MIN_BYTES", int, 64 * 1024, "smallest collective that goes through shared memory; smaller ones "
      "use TCP, whose two small messages beat the shared-memory path's barriers", minimum=0),
    # Autotune.
    S("HOROVOD_AUTOTUNE", bool, False, "tune fusion threshold and cycle time at run time", flag="--autotune"),
    S("HOROVOD_AUTOTUNE_LOG", str, None, "CSV file of autotune samples", flag="--autotune-log-file"),
    S("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", int, 3, "autotune samples discarded first",
      flag="--autotune-warmup-samples", minimum=0),
    S("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", int, 10, "steps per autotune sample",
      flag="--autotune-steps-per-sample", minimum=0),
    S("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", int, 20, "Bayesian optimisation samples",
      flag="--autotune-bayes-opt-max-samples", minimum=0),
    S("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", float, 0.8, "Gaussian process noise in [0, 1]",
      flag="--autotune-gaussian-process-noise", minimum=0),
    # Timeline.
    S("HOROVOD_TIMELINE", str, None, "Chrome-trace timeline file written by rank 0; DYNAMIC enables "
      "start_timeline/stop_timeline", flag="--timeline-filename"),
    S("HOROVOD_TIMELINE_MARK_CYCLES", bool, False, "mark each background cycle in the timeline",
      flag="--timeline-mark-cycles"),
    # Stall inspector.
    S("HOROVOD_STALL_CHECK_DISABLE", bool, False, "disable the stall inspector", flag="--no-stall-check"),
    S("HOROVOD_STALL_CHECK_TIME_SECONDS", float, 60.0, "seconds before a stalled tensor is reported",
      flag="--stall-check-warning-time-seconds", minimum=0),
    S("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", float, 0.0, "seconds before a stalled tensor fails the job "
      "(0: never)", flag="--stall-check-shutdown-time-seconds", minimum=0),
    # Logging.
    S("HOROVOD_LOG_LEVEL", str, "WARNING", "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL", flag="--log-level"),
    S("HOROVOD_LOG_HIDE_TIME", bool, False, "omit timestamps from log lines", flag="--log-without-timestamp"),
    # Controller and transport.
    S("HOROVOD_CONTROLLER", str, "gloo", "controller: gloo (our TCP/shared-memory engine)"),
    S("HOROVOD_CPU_OPERATIONS", str, "gloo", "CPU collective implementation"),
    S("HOROVOD_GLOO_TIMEOUT_SECONDS", float, 30.0, "seconds a peer may stay silent before the job fails",
      flag="--gloo-timeout-seconds", minimum=0),
    S("HOROVOD_GLOO_IFACE", str, "", "network interface for the data plane"),
    S("HOROVOD_GLOO_RENDEZVOUS_ADDR", str, None, "rendezvous server address (set by the launcher)"),
    S("HOROVOD_GLOO_RENDEZVOUS_PORT", int, -1, "rendezvous server port (set by the launcher)"),
    S("HOROVOD_RENDEZVOUS_SCOPE", str, "job", "rendezvous namespace of this job's workers"),
    S("HOROVOD_MPI_THREADS_DISABLE", bool, False, "accepted for compatibility", flag="--mpi-threads-disable"),
    S("HOROVOD_NUM_NCCL_STREAMS", int, 1, "accepted for compatibility (no GPU support)", flag="--num-nccl-streams"),
    S("HOROVOD_THREAD_AFFINITY", str, None, "accepted for compatibility", flag="--thread-affinity"),
    S("HOROVOD_ADASUM_MPI_CHUNK_SIZE", int, 1 << 30, "Adasum chunk size in bytes"),
    # Topology (set by the launcher, mpirun or Slurm).
    S("HOROVOD_RANK", int, 0, "global rank of this worker"),
    S("HOROVOD_SIZE", int, 1, "number of workers"),
    S("HOROVOD_LOCAL_RANK", int, 0, "rank among the workers of this host"),
    S("HOROVOD_LOCAL_SIZE", int, 1, "workers on this host"),
    S("HOROVOD_CROSS_RANK", int, 0, "index of this host among hosts with this local rank"),
    S("HOROVOD_CROSS_SIZE", int, 1, "hosts with this local rank"),
    S("HOROVOD_HOSTNAME", str, "localhost", "host identity of this worker"),
    S("HOROVOD_ELASTIC", bool, False, "elastic job: re-rendezvous on membership changes"),
    S("HOROVOD_DYNAMIC_PROCESS_SETS", bool, False, "allow add_process_set/remove_process_set"),
    S("HOROVOD_SECRET_KEY", str, None, "per-job secret (hex), handed to workers by the launcher"),
    # Launcher.
    S("HOROVOD_START_TIMEOUT", float, 30.0, "seconds for all workers to start and meet (workers bound their "
      "rendezvous and connection set-up by it)", flag="--start-timeout", minimum=0),
    S("HOROVOD_ELASTIC_TIMEOUT", float, 600.0, "seconds an elastic job waits for enough slots",
      flag="--elastic-timeout", minimum=0, launcher_only=True),
    # Many hosts (ssh launch, workers started by mpirun or srun): see docs/cluster.md.
    S("HOROVOD_RENDEZVOUS_ADDR", str, None, "under mpirun/srun without horovodrun: address where rank 0 serves the "
      "job's rendezvous (an address of rank 0's host)"),
    S("HOROVOD_RENDEZVOUS_PORT", int, -1, "under mpirun/srun without horovodrun: port where rank 0 serves the "
      "job's rendezvous"),
    S("HOROVOD_SSH_ARGS", str, "", "extra ssh options for launching on remote hosts, e.g. '-o "
      "UserKnownHostsFile=/path'", launcher_only=True),
)
del S

SETTINGS_BY_ENV: Dict[str, Setting] = {s.env: s for s in SETTINGS}


class Config:
    """Parsed settings; attribute names are the variable names without ``HOROVOD_``, lower-cased.

    ``Config().fusion_threshold`` is ``HOROVOD_FUSION_THRESHOLD`` as an int. Instances are immutable.
    """

    __slots__ = ("_values", "_explicit")

    def __init__(self, values: Mapping[str, Any], explicit: frozenset = frozenset()):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_explicit", frozenset(explicit))

    def is_explicit(self, env: str) -> bool:
        """Whether ``env`` (e.g. ``HOROVOD_FUSION_THRESHOLD``) was set, rather than left at its default."""
        return env in self._explicit

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._values[attr]
        except KeyError:
            raise AttributeError(f"no Horovod setting named {attr!r}") from None

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError("Config is immutable; use replace()")

    def replace(self, **changes: Any) -> "Config":
        unknown = set(changes) - set(self._values)
        if unknown:
            raise AttributeError(f"no Horovod setting named {sorted(unknown)}")
        return Config({**self._values, **changes}, self._explicit)

    def as_dict(self) -> Dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        shown = {k: v for k, v in self._values.items() if k != "secret_key"}
        return f"Config({shown})"


def load_config(environ: Optional[Mapping[str, str]] = None) -> Config:
    """Read every setting from ``environ`` (default: the process environment).

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
    return Config(values, frozenset(explicit))


def environ_get(name: str, default: Optional[str] = None) -> Optional[str]:
    """Read a variable that is not a Horovod setting (``OMPI_COMM_WORLD_RANK``, ``SLURM_PROCID``, ``PATH``...)."""
    return os.environ.get(name, default)


def environ_snapshot() -> Dict[str, str]:
    """A copy of the process environment, for launchers that pass it on to workers."""
    return dict(os.environ)


def environ_set(name: str, value: str) -> None:
    """Set a variable in this process (``init(process_sets="dynamic")`` does, as Horovod does)."""
    os.environ[name] = value
