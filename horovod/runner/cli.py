"""``horovodrun``: start N workers of a training script, as Horovod's launcher does.

``horovodrun -np 4 python train.py`` runs four workers on this machine, each told its rank and where the job's
rendezvous service is through ``HOROVOD_*`` variables. This module parses; the tunable flags come from the
configuration table (:mod:`horovod.runner.tunables`); static jobs run through :mod:`horovod.runner.plan` (local, ssh
or ``--mpi`` backend), elastic ones (``--min-np``, ``--host-discovery-script``) through
:mod:`horovod.runner.elastic.launch`. jsrun is parsed and refused with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from horovod.common import config
from horovod.common.exceptions import HorovodConfigError
from horovod.common.failure_records import SCOPE, FailureRecord
from horovod.runner import tunables
from horovod.runner.backends.mpirun import MpiNotFoundError
from horovod.runner.check_build import check_build_text
from horovod.runner.elastic.launch import is_elastic, main_elastic, settings_from_values
from horovod.runner.pipeline import LaunchConfig, NotAvailableYetError
from horovod.runner.network import NetworkError
from horovod.runner.plan import exit_status, launcher_env, plan_job, run_static
from horovod.runner.ssh import HostCheckError
from horovod.runner.diagnosis import read_records, summary
from horovod.runner.usage import HorovodArgumentParser, usage_error
from horovod.version import __version__

__all__ = ["main", "make_parser", "check_available", "launcher_env", "resolve_values", "configure_launcher_logging"]

_CONTROLLERS = ("use_gloo", "use_mpi", "use_jsrun")


def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--version", action="store_true", help="show the version and exit")
    parser.add_argument("-np", "--num-proc", dest="np", type=int, help="total number of training processes")
    parser.add_argument("-cb", "--check-build", action="store_true",
                        help="show which frameworks, controllers and tensor operations are available, and exit")
    parser.add_argument("--disable-cache", action="store_true", help="accepted for compatibility")
    parser.add_argument("--network-interfaces", dest="nics", help="comma-separated network interfaces to use")
    parser.add_argument("--network-interface", dest="nic", action="append",
                        help="a network interface to use (repeatable)")
    parser.add_argument("--output-filename", help="also write each rank's output to DIR/rank.N/{stdout,stderr}")
    parser.add_argument("--verbose", action="store_true", help="print what the launcher does")
    parser.add_argument("--config-file", help="YAML file of parameters, with Horovod's sections; flags given on "
                                              "the command line win")
    ssh = parser.add_argument_group("ssh (hosts that are not this machine; extra options: HOROVOD_SSH_ARGS)")
    ssh.add_argument("-p", "--ssh-port", type=int, help="ssh port on all hosts")
    ssh.add_argument("-i", "--ssh-identity-file", help="ssh private key file")


def _add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    elastic = parser.add_argument_group("elastic")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, help="minimum number of workers")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, help="maximum number of workers")
    elastic.add_argument("--slots-per-host", "--slots", dest="slots", type=int, help="slots per discovered host")
    elastic.add_argument("--reset-limit", type=int, help="maximum number of elastic resets")
    elastic.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"),
                         help="cooldown range in seconds of blacklisted hosts")


def _add_launcher_flags(parser: argparse.ArgumentParser) -> None:
    library = parser.add_argument_group("library options")
    library.add_argument("--mpi-args", help="extra mpirun arguments (with --mpi)")
    library.add_argument("--tcp", dest="tcp_flag", action="store_true", help="TCP only for NCCL (NCCL_IB_DISABLE=1)")
    library.add_argument("--binding-args", help="process binding arguments (accepted for compatibility)")
    logging = parser.add_argument_group("logging")
    logging.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", dest="prefix_output_with_timestamp",
                         action="store_true", help="prefix each output line with a timestamp")
    hosts = parser.add_argument_group("hosts").add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="hosts and slots: host1:2,host2:4 (default localhost:<np>)")
    hosts.add_argument("-hostfile", "--hostfile", help="file of 'hostname slots=N' lines")
    hosts.add_argument("--host-discovery-script", help="elastic: script printing the available hosts, one "
                                                       "'host' or 'host:slots' per line")
    controller = parser.add_argument_group("controller").add_mutually_exclusive_group()
    controller.add_argument("--gloo", dest="use_gloo", action="store_true", default=None,
                            help="TCP controller (the default and only one available)")
    controller.add_argument("--mpi", dest="use_mpi", action="store_true", default=None,
                            help="start the workers with Open MPI's mpirun (they still talk over TCP)")
    controller.add_argument("--jsrun", dest="use_jsrun", action="store_true", default=None,
                            help="jsrun launcher (not available yet)")


def make_parser() -> argparse.ArgumentParser:
    """The ``horovodrun`` argument parser with Horovod's flags."""
    parser = HorovodArgumentParser(prog="horovodrun", description="Horovod Runner")
    _add_job_flags(parser)
    tunables.add_tunable_flags(parser)
    _add_elastic_flags(parser)
    _add_launcher_flags(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="command to run, e.g. python train.py")
    return parser


def check_available(values: Mapping[str, Any]) -> None:
    """Refuse combinations and features this version parses but does not implement.

    Raises:
        ValueError: ``--mpi-args`` without ``--mpi``.
        NotAvailableYetError: naming the feature.
    """
    if values.get("mpi_args") and not values.get("use_mpi"):
        raise ValueError("--mpi-args needs --mpi")
    if values.get("use_jsrun"):
        raise NotAvailableYetError("jsrun launch is not available yet; use --gloo")


def resolve_values(args: argparse.Namespace) -> Dict[str, Any]:
    """The parsed flags merged with ``--config-file`` (command-line flags win), as a dict by destination."""
    values = vars(args).copy()
    if args.config_file:
        from_file = tunables.load_config_file(args.config_file)
        if any(values.get(c) for c in _CONTROLLERS):
            from_file = {k: v for k, v in from_file.items() if k not in _CONTROLLERS}
        values = tunables.apply_config_file(values, from_file)
    return values


def configure_launcher_logging(values: Mapping[str, Any]) -> None:
    """Apply ``--log-level`` and the timestamp flags (or their ``HOROVOD_*`` variables) to this launcher's
    ``horovod`` loggers, as they will be to the workers'.

    Raises:
        HorovodConfigError: a ``HOROVOD_*`` variable of this environment does not parse.
    """
    settings = config.load_config({**config.environ_snapshot(), **tunables.tunables_to_env(values)})
    config.configure_logging(settings)


def _plan(values: Mapping[str, Any]) -> Optional[LaunchConfig]:
    """The static job to run, or None for an elastic one; raises ValueError and friends for usage errors."""
    check_available(values)
    tunables.warn_inert(values)
    if not values["command"]:
        raise ValueError("no command given; usage: horovodrun -np N python train.py")
    if is_elastic(values):
        settings_from_values(values)  # usage errors first
        return None
    if values["np"] is None:
        raise ValueError("the following arguments are required: -np/--num-proc")
    return plan_job(values, values["command"])


def _run(values: Mapping[str, Any], launch: LaunchConfig) -> int:
    records: List[FailureRecord] = []
    try:
        result = run_static(values, launch, finish_store=lambda store: records.extend(read_records(store, SCOPE)))
    except (NetworkError, HostCheckError, MpiNotFoundError) as exc:
        print(f"horovodrun: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        print(f"horovodrun: cannot start {launch.command[0]!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 127
    if result.first_failure is not None and not values.get("use_mpi"):
        print(summary(result, records), file=sys.stderr, flush=True)
    return exit_status(result, passthrough=bool(values.get("use_mpi")))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``horovodrun`` with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when every worker succeeded, 1 when one failed, 2 for a usage error, 128+N when
        interrupted by signal N (with ``--mpi``, ``mpirun``'s own status).
    """
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.version or args.check_build:
        print(__version__ if args.version else check_build_text(__version__), end="\n" if args.version else "")
        return 0
    try:
        values = resolve_values(args)
        configure_launcher_logging(values)
        launch = _plan(values)
    except (ValueError, HorovodConfigError, NotAvailableYetError) as exc:
        print(usage_error(parser.prog, str(exc), parser.option_strings()), file=sys.stderr, flush=True)
        return 2
    if launch is None:
        return main_elastic(values, launcher_env(values))
    return _run(values, launch)
