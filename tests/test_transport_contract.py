"""One transport contract: every transport defines every member of ``transport.base.Transport`` itself, so that no
caller has to ask whether a member is there."""

import re
from pathlib import Path

import pytest

from horovod.transport import base, mesh
from horovod.transport.patience import Patience
from horovod.transport.tcp import TcpTransport

pytestmark = pytest.mark.unit

ROOT = Path(base.__file__).resolve().parents[1]


def _members(protocol) -> set:
    """The attributes and methods a protocol declares (not those of Protocol or object)."""
    declared = set(getattr(protocol, "__annotations__", {}))
    declared |= {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return declared


def _missing(transport, protocol=base.Transport) -> list:
    """Members that ``transport`` lacks, or only inherits from the protocol's own declarations."""
    missing = []
    for name in sorted(_members(protocol)):
        if not hasattr(transport, name):
            missing.append(name)
        elif callable(getattr(protocol, name, None)) and getattr(type(transport), name) is getattr(protocol, name):
            missing.append(name)
    return missing


def test_the_contract_declares_what_its_callers_use():
    assert {"patience", "fail_own", "fail", "connection", "quiesce", "liveness", "secret", "job_token"} \
        <= _members(base.Transport)


def test_the_socket_transport_defines_every_member_of_the_contract():
    transport = TcpTransport(0, 2, b"s" * 32, 1.0, job_token="job.mesh.1")
    try:
        assert isinstance(transport, base.Transport)
        assert _missing(transport) == []
        assert _missing(transport.patience, base.PatienceLike) == []
    finally:
        transport.close()


def test_the_simulations_transport_defines_every_member_of_the_contract():
    pytest.importorskip("greenlet")
    from horovod.tools.simulate.job import Workload, scenario
    job = scenario(4, 0, workload=Workload(steps=1, tensors=1))
    transport = job.ranks[0].transport
    assert isinstance(transport, base.Transport)
    assert _missing(transport) == []
    assert transport.patience is base.NO_PATIENCE and _missing(transport.patience, base.PatienceLike) == []
    with pytest.raises(NotImplementedError, match="control frames only"):
        transport.duplex()


def test_the_patiences_name_what_the_engine_runs():
    assert _missing(base.NO_PATIENCE, base.PatienceLike) == []
    base.NO_PATIENCE.working_on("ALLREDUCE x")
    patience = Patience(0, 1.0, 0.0, str)
    patience.working_on(lambda: "ALLREDUCE x")
    assert patience.activity() == "ALLREDUCE x"


def test_the_descriptor_limit_error_is_the_contracts_and_mesh_still_exports_it():
    assert mesh.DescriptorLimitError is base.DescriptorLimitError
    execution = (ROOT / "core" / "execution.py").read_text()
    assert "horovod.transport.mesh" not in execution


def test_no_caller_asks_a_transport_whether_it_has_a_member():
    probes = [f"{path.relative_to(ROOT)}:{number}"
              for path in sorted(ROOT.rglob("*.py"))
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r"(getattr|hasattr)\([^)]*transport", line)]
    assert probes == []
