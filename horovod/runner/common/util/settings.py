"""``horovod.runner.common.util.settings`` as Horovod has it: the launcher's settings as plain attributes.

This runner does not pass such objects around (it plans jobs from one mapping of options, see
:mod:`horovod.runner.plan`); the classes are here for code that builds them, e.g. to call Horovod-style helpers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BaseSettings", "Settings"]


class BaseSettings:
    """Launcher settings shared by static and elastic jobs (Horovod's attribute names)."""

    def __init__(self, num_proc: Any = None, verbose: int = 0, ssh_port: Any = None, ssh_identity_file: Any = None,
                 extra_mpi_args: Any = None, tcp_flag: Any = None, binding_args: Any = None, key: Any = None,
                 start_timeout: Any = None, output_filename: Any = None, run_func_mode: Any = None, nics: Any = None,
                 elastic: bool = False, prefix_output_with_timestamp: bool = False):
        self.num_proc = num_proc
        self.verbose = verbose
        self.ssh_port = ssh_port
        self.ssh_identity_file = ssh_identity_file
        self.extra_mpi_args = extra_mpi_args
        self.tcp_flag = tcp_flag
        self.binding_args = binding_args
        self.key = key
        self.start_timeout = start_timeout
        self.output_filename = output_filename
        self.run_func_mode = run_func_mode
        self.nics = nics
        self.elastic = elastic
        self.prefix_output_with_timestamp = prefix_output_with_timestamp


class Settings(BaseSettings):
    """Settings of a static job: ``hosts`` is ``host1:2,host2:2``."""

    def __init__(self, hosts: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.hosts = hosts
