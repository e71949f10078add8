"""The scaling planner: its model, the fit to benchmark records, and its command line (tier unit, no processes)."""

import json
import re

import numpy as np
import pytest

from horovod.tools import scaling

pytestmark = pytest.mark.unit


def _records(link, ceiling_gbs=1.0):
    here = scaling.LinkModel(fixed_s=link.fixed_s, hop_s=link.hop_s, efficiency=link.efficiency,
                             link_bytes_s=ceiling_gbs * 1e9)
    records = []
    for hosts in (2, 3):
        rows = [{"op": "allreduce", "bytes": b, "seconds": scaling.allreduce_seconds(here, hosts, b)}
                for b in (4, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)]
        rows.append({"op": "model", "bytes": 4 * scaling.MODEL_STEP_PARAMS,
                     "seconds": scaling.step_seconds(here, scaling.Workload("m", scaling.MODEL_STEP_PARAMS, 0.0),
                                                     hosts)})
        records.append({"layout": f"{hosts}x1", "ranks": hosts, "ceiling_gbs": ceiling_gbs,
                        "results": {"horovod-py": rows}})
    return records


def test_fit_recovers_the_constants_and_check_predicts_the_steps():
    truth = scaling.LinkModel(fixed_s=4e-4, hop_s=150e-6, efficiency=0.6)
    fitted = scaling.fit(_records(truth))
    assert fitted.fixed_s == pytest.approx(4e-4, rel=1e-6)
    assert fitted.hop_s == pytest.approx(150e-6, rel=1e-6)
    assert fitted.efficiency == pytest.approx(0.6, rel=1e-6)
    for row in scaling.check(_records(truth)):
        assert abs(row["error"]) < 1e-6


def test_efficiency_falls_with_workers_and_bytes():
    link = scaling.LinkModel()
    small, big = scaling.Workload("s", 5e6, 0.2), scaling.Workload("b", 200e6, 0.2)
    steps = [scaling.step_seconds(link, big, n) for n in (2, 8, 64, 512)]
    assert steps == sorted(steps)
    assert scaling.step_seconds(link, small, 512) < scaling.step_seconds(link, big, 512)
    assert scaling.step_seconds(link, small, 1) >= small.compute_s


def test_published_table_and_check_on_the_command_line(tmp_path, capsys):
    assert scaling.main(["--published"]) == 0
    out = capsys.readouterr().out
    assert "| 512 |" in out and "VGG-16 68%" in out
    path = tmp_path / "crosshost.json"
    path.write_text(json.dumps(_records(scaling.LinkModel(efficiency=0.5))))
    assert scaling.main(["--check", str(path)]) == 0
    assert "| 3x1 |" in capsys.readouterr().out
    assert scaling.main(["--params", "1e7", "--compute-ms", "100", "--fit", str(path), "--workers", "2,4"]) == 0


def test_ranks_sharing_one_machines_cores_are_fitted_for_a_core_each():
    # Namespace hosts on a 2-core machine: the 3-host layout runs every term at 2/3 speed.
    truth = scaling.LinkModel(fixed_s=3e-4, hop_s=100e-6, efficiency=0.7)
    records = _records(truth)
    for record in records:
        share = min(1.0, 2 / record["ranks"])
        here = scaling.LinkModel(fixed_s=truth.fixed_s / share, hop_s=truth.hop_s / share,
                                 efficiency=truth.efficiency * share, link_bytes_s=1e9,
                                 copy_bytes_s=truth.copy_bytes_s * share)
        for row in record["results"]["horovod-py"]:
            if row["op"] == "allreduce":
                row["seconds"] = scaling.allreduce_seconds(here, record["ranks"], row["bytes"])
            else:
                row["seconds"] = scaling.step_seconds(here, scaling.Workload("m", scaling.MODEL_STEP_PARAMS, 0.0),
                                                      record["ranks"])
        record["machine_cores"] = 2
    fitted = scaling.fit(records)
    assert (fitted.fixed_s, fitted.hop_s, fitted.efficiency) == pytest.approx((3e-4, 100e-6, 0.7), rel=1e-6)
    assert all(abs(row["error"]) < 1e-6 for row in scaling.check(records))


def test_a_cost_the_data_cannot_support_is_zero_not_negative():
    # y falls with x: the unconstrained fit is 4 - x (a negative slope). Clamping that slope to 0 afterwards would
    # keep the intercept 4 (residual 14); the best fit with both coefficients >= 0 is the mean, 2, with slope 0.
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])
    np.testing.assert_allclose(scaling._nonnegative_lstsq(x, y), [2.0, 0.0], atol=1e-12)
    # And through the fit: noise that an unconstrained fit would explain with a negative cost.
    records = _records(scaling.LinkModel(fixed_s=0.0, hop_s=0.0, efficiency=0.5))
    for record in records:
        for row in record["results"]["horovod-py"]:
            if row["op"] == "allreduce" and row["bytes"] <= 1024:
                row["seconds"] *= 0.5
    fitted = scaling.fit(records)
    assert fitted.fixed_s >= 0 and fitted.hop_s >= 0 and fitted.efficiency > 0


@pytest.mark.parametrize("workers", [2, 4, 32, 128])
def test_the_control_plane_term_follows_the_simulated_negotiation(workers):
    """The closed form's cycle latency against the simulation it takes its constants from (one rank per host and
    core, one small allreduce per step): peer to peer at 2 and 4 ranks, the 3-ary tree at 32 and 128."""
    pytest.importorskip("greenlet")
    from horovod.tools.simulate.report import figures
    simulated = figures(workers, seed=1, steps=3, tensors=1, slots=1, cores=1, lifecycle=False)["step_latency_s"]
    closed = scaling.cycle_seconds(scaling.ControlModel.simulated(), workers)
    assert closed == pytest.approx(simulated, rel=0.25), (closed, simulated)


def test_the_published_comparison_includes_the_control_plane(capsys):
    assert scaling.main(["--published"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| ResNet-101 | 90%", "| Inception V3 | 90%",
                                                                  "| VGG-16 | 68%"))]
    assert len(rows) == 3, out
    control = scaling.control_seconds(scaling.ControlModel.simulated(), 512)
    assert control > 0 and all(f"{control * 1e3:.2f} ms |" in row for row in rows)
    link = scaling.LinkModel()
    work = scaling.PUBLISHED[0][0]
    assert scaling.step_seconds(link, work, 512, 4, scaling.ControlModel.simulated()) == pytest.approx(
        scaling.step_seconds(link, work, 512, 4) + control)


@pytest.mark.parametrize("workers,per_host,cores", [(2, 2, 2), (16, 8, 8), (128, 8, 8), (64, 64, 2)])
def test_the_start_up_term_follows_the_simulated_start_up(workers, per_host, cores):
    """The closed form's start-up against the simulation's (launch, spawn, boot on shared cores, the rendezvous
    direct or by the tree, the first cycle): one host, several, and many ranks on two cores."""
    pytest.importorskip("greenlet")
    from horovod.tools.simulate.job import Workload, scenario
    from horovod.tools.simulate.startup import StartupModel
    once = Workload(steps=1, tensors=1, compute=0.0, jitter=0.0)
    simulated = scenario(workers, 1, per_host, cores, once, startup=StartupModel()).step_done[0]
    closed = scaling.startup_seconds(scaling.StartupTerm.simulated(), scaling.ControlModel.simulated(), workers,
                                     per_host, cores)
    assert closed == pytest.approx(simulated, rel=0.25), (closed, simulated)
    assert "start-up |" in scaling.predict_table(scaling.LinkModel(), [scaling.PUBLISHED[0][0]], [workers], per_host,
                                                 scaling.ControlModel.simulated(), scaling.StartupTerm.simulated())


def test_the_planner_prints_its_assumptions_and_efficiency_never_rises_with_the_workers(capsys):
    # --per-host 8: 2 and 4 workers share one host (before, they were put on hosts of their own: 83, 80, 87 %).
    assert scaling.main(["--params", "25.6e6", "--compute-ms", "200", "--per-host", "8",
                         "--workers", "2,4,8,16,32,512"]) == 0
    out = capsys.readouterr().out
    effs = [int(e) for e in re.findall(r"/ (\d+)% \|", out)]
    assert len(effs) == 6 and effs == sorted(effs, reverse=True), out
    assert "link bandwidth: 25 Gbit/s between hosts (--link-gbit) [guessed]" in out and "8 worker(s) per host" in out
    assert "overlap: 50% of the compute can hide communication" in out and "compute time: 200 ms a step" in out
    assert "from 8 to 16 workers the job leaves one host" in out
    link = scaling.LinkModel()
    for work, _ in scaling.PUBLISHED:
        steps = [scaling.step_seconds(link, work, n, 4) for n in (2, 4, 8, 16, 512)]
        assert steps == sorted(steps), (work.name, steps)


def test_the_planner_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        scaling.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "worker counts to predict, comma-separated (default: 2,4,8" in text and "(default: 25.0)" in text


def _synthetic(tmp_path, step_s=0.30, compute_s=0.25, allreduce_s=0.10, gradient_bytes=528 << 20):
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps({"benchmark": "pytorch_synthetic_benchmark", "model": "vgg16", "np": 2,
                                "date": "2026-12-07", "step_s": step_s, "compute_s": compute_s,
                                "allreduce_s": allreduce_s, "pack_bytes_s": 3.5e9,
                                "gradient_bytes": gradient_bytes}))
    return path


def test_the_synthetic_benchmarks_json_fits_packing_and_overlap_and_the_rows_say_what_was_fitted(tmp_path, capsys):
    from horovod.tools import planner_fit
    # 0.25 s of compute and 0.10 s of allreduce took 0.30 s together: 0.05 s of the compute hid communication.
    copy, overlap = planner_fit.fit_synthetic(json.loads(_synthetic(tmp_path).read_text()))
    assert copy == 3.5e9 and overlap == pytest.approx(0.2)
    assert planner_fit.fit_synthetic(json.loads(_synthetic(tmp_path, step_s=0.5).read_text()))[1] == 0.0
    # Gradients that fit one fusion buffer: the planner's step is T + C whatever the overlap, so it is not fitted.
    one_buffer = json.loads(_synthetic(tmp_path, gradient_bytes=45 << 20).read_text())
    assert planner_fit.fit_synthetic(one_buffer) == (3.5e9, None)
    assert scaling.main(["--published", "--fit", str(_synthetic(tmp_path, gradient_bytes=45 << 20))]) == 0
    out = capsys.readouterr().out
    assert "overlap not fitted: its 45 MiB of gradients fit one 64 MiB fusion buffer" in out
    assert "| packing | fixed cost per allreduce, latency per ring step, link efficiency, local reduce, overlap," in out
    given = ["--published", "--link-gbit", "100", "--overlap", "0.7", "--fit", str(_synthetic(tmp_path))]
    assert scaling.main(given) == 0
    out = capsys.readouterr().out
    assert "[given (--link-gbit 100; published: 25 Gbit/s)]" in out and "overlap: 70% " in out, out
    assert scaling.main(["--published", "--fit", str(_synthetic(tmp_path))]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| VGG-16 | 68%")]
    assert len(rows) == 1 and "| packing, overlap | fixed cost per allreduce, latency per ring step" in rows[0]
    assert "packing: 3.5 GB/s into the fusion buffer and back" in out and "overlap: 20% " in out
    assert f"[fitted to {tmp_path / 'synthetic.json'}]" in out
    crosshost = tmp_path / "crosshost.json"
    crosshost.write_text(json.dumps(_records(scaling.LinkModel(efficiency=0.5))))
    assert scaling.main(["--params", "1e7", "--compute-ms", "100", "--fit", str(crosshost), "--fit",
                         str(_synthetic(tmp_path)), "--overlap", "0.3", "--workers", "2,4"]) == 0
    out = capsys.readouterr().out
    assert "link efficiency: e = 50% of the link reached by a ring [fitted to" in out
    assert "overlap: 30% of the compute can hide communication (--overlap, or --fit a synthetic benchmark JSON) " \
           "[given (--overlap)]" in out
