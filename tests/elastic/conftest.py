"""The ``elastic_run`` fixture: elastic jobs under the real horovodrun, closed and checked after the test."""

import pytest

from elastic_run import ElasticRun
from horovod.testing.fixtures import live_processes


@pytest.fixture
def elastic_run(tmp_path):
    runs = []

    def start(hosts, flags, env=None, **kwargs):
        run = ElasticRun(tmp_path, hosts, flags, env, **kwargs)
        runs.append(run)
        return run
    yield start
    for run in runs:
        run.close()
    for run in runs:
        assert not live_processes(run.pids()), "a worker outlived its job"
