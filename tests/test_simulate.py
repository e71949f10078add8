"""The simulated control plane: the real negotiation of hundreds of ranks in one process, with faults drawn from
seeds, the invariants checked after every event; a failing seed names itself and replays exactly."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("greenlet")

from horovod.tools.simulate.job import Workload  # noqa: E402
from horovod.tools.simulate.report import figures, scenario  # noqa: E402
from horovod.tools.simulate.varied import FEATURES, Varied  # noqa: E402
from horovod.tools.simulate.world import Faults, draw_faults  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small jobs are cheap and hit the protocols' corners as often as large ones; a few large ones keep the tree deep.
SIZES = (8, 8, 16, 16, 24, 32, 32, 64, 128, 256)
SEEDS = int(os.environ.get("HVD_SIM_SEEDS", "100"))   # 210 took 120 s of the suite; make soak runs 2,000
SMALL = Workload(steps=3, tensors=6)
# Simulated ranks by the hundred take seconds: the sweeps are in the ranks tier, so that `pytest -m unit` stays quick.
many_ranks = pytest.mark.ranks


def _digest(job) -> str:
    return json.dumps([job.world.events_run, repr(job.world.now), sorted(job.failed_at.items()),
                       [r.cycles for r in job.ranks], [str(r.error) for r in job.ranks]])


@many_ranks
def test_seeded_faults_and_workloads_at_8_to_256_ranks_keep_every_invariant_and_every_answer():
    # Each seed draws its faults and its per-rank workload (horovod.tools.simulate.varied: orders, times, new names,
    # a process set, grouped ops, every collective kind, a mismatch on one rank); every result is checked byte for
    # byte against the reduction of what the ranks submitted. HVD_SIM_SEEDS sets a longer sweep (make soak).
    outcomes = {"completed": 0, "failed": 0}
    drawn, results = set(), 0
    for seed in range(SEEDS):
        size = SIZES[seed % len(SIZES)]
        workload = Varied(seed, size)
        job = scenario(size, seed, workload=workload, faults=draw_faults(seed, size, 8, 0.01))
        outcomes["failed" if any(r.error is not None for r in job.ranks) else "completed"] += 1
        drawn |= workload.features
        results += job.answers.results
    # The draws reach both ends: jobs that a lost rank or a partition ended, and jobs that completed.
    assert outcomes["failed"] >= SEEDS // 4 and outcomes["completed"] >= SEEDS // 4, outcomes
    assert drawn == set(FEATURES) and results > 100 * SEEDS, (drawn, results)


@pytest.mark.unit
@pytest.mark.parametrize("victim", [0, 1, 5, 63])
def test_every_survivor_of_a_killed_rank_names_it(victim):
    # Rank 0 (the root), 1 (an interior rank of the tree), 5 and 63 (leaves), killed in the middle of a step.
    job = scenario(64, 3, workload=SMALL, faults=Faults(kill=[(0.004, victim)]))
    survivors = [r for r in job.ranks if not r.dead]
    assert len(survivors) == 63 and job.killed == [victim]
    assert all(f"rank {victim} was lost" in str(r.error) for r in survivors), \
        [str(r.error) for r in survivors if f"rank {victim} was lost" not in str(r.error)][:3]


@pytest.mark.unit
@pytest.mark.parametrize("fault", ["duplicate", "reorder"])
def test_duplicated_and_reordered_frames_cost_time_not_agreement(fault):
    # The network below TCP copies frames or lets later ones of a connection overtake them; the connection delivers
    # each once and in order, so the job completes every step with every cycle agreed (seed 156 once read a copied
    # frame as the next cycle's and two ranks decided differently, unnoticed).
    job = scenario(64, 156, workload=SMALL, faults=Faults(**{fault: 0.3}))
    assert all(r.error is None and r.finished for r in job.ranks)
    assert job.step_done.keys() == set(range(SMALL.steps))
    counted = "copies_dropped" if fault == "duplicate" else "overtaken"
    assert sum(getattr(r.transport, counted) for r in job.ranks) > 0


@many_ranks
def test_a_seed_replays_exactly_in_another_process():
    faults = draw_faults(4, 64, 8, 0.01)
    here = _digest(scenario(64, 4, workload=SMALL, faults=faults))
    code = ("import sys; sys.path.insert(0, %r); from tests.test_simulate import _digest, SMALL; "
            "from horovod.tools.simulate.report import scenario; from horovod.tools.simulate.world import draw_faults; "
            "print(_digest(scenario(64, 4, workload=SMALL, faults=draw_faults(4, 64, 8, 0.01))))" % ROOT)
    # Another process, another string-hash seed: nothing in the simulation may depend on either.
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert there.returncode == 0, there.stderr[-2000:]
    assert there.stdout.strip() == here


@many_ranks
def test_cached_cycles_cost_each_rank_a_bounded_number_of_frames_at_1024_ranks():
    # The tree's steady state: an interior rank reads and writes two frames per child and two to its parent.
    out = figures(1024, 1, steps=3, tensors=8, lifecycle=False)
    assert out["mode"] == "tree" and out["cycles_per_step"] <= 1.34, out
    assert out["frames_max"] <= 8.0 and out["survivors_naming"] == 1023, out


@many_ranks
def test_calibration_recovers_the_costs_it_is_fitted_to_and_prints_the_rest_beside_the_measurements(tmp_path, capsys,
                                                                                                  monkeypatch):
    # "Measured" figures made by the simulation with known costs: fitted from np 2 and 4 only, every np comes back.
    # One fit, the command line's (a fit simulates hundreds of jobs: most of this test's time); its rows checked.
    import dataclasses
    from horovod.tools.simulate import calibration
    from horovod.tools.simulate.startup import StartupModel
    from horovod.tools.simulate.world import CpuModel, LinkModel
    cpu = CpuModel(wake=60e-6, frame=22.5e-6, byte=3e-9, cycle=45e-6, name=1.5e-6, fail=450e-6, submit=4e-6,
                   exit=3e-3)      # 1.5x the first guesses, and a process's end
    costs = calibration.Costs(cpu, dataclasses.replace(LinkModel(), local_latency=35e-6),
                              dataclasses.replace(StartupModel(), boot=0.3, launch=0.2))
    measured = {name: {n: figure(n, 2, costs) for n in (2, 4, 8)} for name, figure in calibration.FIGURES.items()}
    results = tmp_path / "scale-control.json"
    units = {"first_s": 1.0, "ar4_us": 1e6, "cycle20_us": 1e6, "detect_ms": 1e3}
    results.write_text(json.dumps({"meta": {"cores": 2}, "medians": {
        str(n): {name: measured[name][n] * units[name] for name in measured} for n in (2, 4, 8)}}))
    predicted, predict = [], calibration.predict
    monkeypatch.setattr(calibration, "predict", lambda *a, **k: predicted.append(predict(*a, **k)) or predicted[-1])
    assert calibration.main([str(results)]) == 0
    assert "within 25 %: 4 of the 4 cells not fitted" in capsys.readouterr().out
    [rows] = predicted
    assert sorted({r["ranks"] for r in rows}) == [2, 4, 8] and len(rows) == 12
    # Within 6 %: the fit settles a few percent off the true costs (its latency and scale trade off at np 2), and a
    # cycle of 20 names is a step function of them (where the batch spacing splits a burst).
    assert all(abs(r["error"]) < 0.06 for r in rows), [r for r in rows if abs(r["error"]) >= 0.06]
    # Where np 4's run measured failing's CPU (the bench's fail_cpu_us), the fit takes it and finds the end from np 2.
    kill = {"detect_ms": measured["detect_ms"]}
    known = calibration.fit(kill, 2, dataclasses.replace(costs, cpu=dataclasses.replace(cpu, exit=0.0)),
                            failing=450e-6)
    assert known.cpu.fail == 450e-6 and known.cpu.exit == pytest.approx(3e-3, rel=0.02)


@pytest.mark.unit
def test_start_up_boots_ranks_in_waves_of_the_cores_and_hands_records_down_the_tree_past_16():
    from horovod.tools.simulate.startup import StartupModel
    model = StartupModel(launch=0.1, spawn=0.0, boot=0.2)
    once = Workload(steps=1, tensors=1, compute=0.0, jitter=0.0)
    firsts = {n: scenario(n, 1, slots=n, cores=2, workload=once, startup=model) for n in (2, 4, 8, 32)}
    # n ranks on 2 cores boot in n / 2 waves of 0.2 s; the rendezvous and first cycle add little on one host.
    for n, job in firsts.items():
        assert 0.1 + 0.2 * n / 2 <= job.step_done[0] <= 0.1 + 0.2 * n / 2 + 0.01, (n, job.step_done[0])
    # Up to 16 ranks every rank asks the server for every record; past it only rank 0 does.
    assert firsts[8].rendezvous.requests == 16 and firsts[32].rendezvous.requests == 33


@pytest.mark.unit
def test_an_elastic_reset_adds_the_drivers_round_and_a_new_mesh_to_the_lost_ranks_detection():
    from horovod.tools.simulate.elastic import reset_seconds
    phases = reset_seconds(32, slots=8, cores=8, state_bytes=1 << 20)
    assert phases["detect_s"] > 0 and phases["round_s"] > 0 and phases["mesh_first_s"] > 0
    assert phases["broadcast_s"] > (1 << 20) / 1.25e9
    assert phases["reset_s"] == pytest.approx(sum(v for k, v in phases.items() if k != "reset_s"))


@pytest.mark.unit
def test_a_wake_up_refills_the_caches_by_the_machines_curve_for_the_processes_that_ran_since():
    from horovod.tools.simulate.world import CpuModel, Host
    curve = ((0.5, 0.0), (1.5, 0.2), (7.5, 0.6), (63.5, 3.0))
    cpu = CpuModel(cold=100e-6, sharing=curve)
    assert cpu.refill(0) == 0.0 and CpuModel().refill(10) == 0.0          # nothing ran since; no curve
    assert cpu.refill(1.5) == pytest.approx(20e-6) and cpu.refill(100) == pytest.approx(300e-6)
    assert 20e-6 < cpu.refill(3.0) < 60e-6                                 # between points, in log of the count
    # Past one full refill a further share costs the curve's own process's refill, when it is given.
    assert CpuModel(cold=100e-6, sharing=curve, beyond=20e-6).refill(100) == pytest.approx(100e-6 + 2 * 20e-6)
    # A host counts the distinct other ranks that started a run since a rank's last one (not their runs).
    host = Host(0, cores=2)
    assert [host.others_since(r) for r in (0, 1, 2, 1, 1, 0)] == [0, 1, 2, 1, 0, 2]
    # The refill is the machine's: the fit scales the costs it sets and leaves it alone.
    from horovod.tools.simulate.calibration import _scaled
    scaled = _scaled(cpu, 2.0)
    assert scaled.wake == 2 * cpu.wake and scaled.frame == 2 * cpu.frame
    assert (scaled.cold, scaled.sharing, scaled.beyond, scaled.tick) == (cpu.cold, cpu.sharing, cpu.beyond, cpu.tick)
    # Sixteen ranks on two cores pay it; two ranks with a core each (half a process per core ran since) pay nothing.
    from horovod.tools.simulate.calibration import Costs, allreduce_4b_seconds
    cold, warm = Costs(cpu=cpu), Costs()
    assert allreduce_4b_seconds(16, 2, cold) > allreduce_4b_seconds(16, 2, warm) * 1.2
    assert allreduce_4b_seconds(2, 2, cold) == pytest.approx(allreduce_4b_seconds(2, 2, warm), rel=1e-9)


@pytest.mark.unit
def test_a_killed_rank_hangs_up_once_its_process_ended_and_each_failed_survivors_exit_shares_the_cores():
    from horovod.tools.simulate.calibration import Costs, detect_seconds
    from horovod.tools.simulate.job import SCHEDULER_SLICE
    from horovod.tools.simulate.world import CpuModel
    ends = Costs(cpu=CpuModel(exit=5e-3, fail=50e-6, tick=0.0))       # a fully preemptible kernel
    at_tick = Costs(cpu=CpuModel(exit=5e-3, fail=50e-6, tick=4e-3))   # one preempted at its 250 Hz tick
    # Two ranks, a core each: the survivor sees the hang-up once the killed process's 5 ms end ran, then raises.
    assert 5e-3 <= detect_seconds(2, 2, ends) < 5e-3 + 1e-3
    assert detect_seconds(2, 2, at_tick) == pytest.approx(detect_seconds(2, 2, ends))
    # Four ranks on two cores: the survivors that raised first exit, and their ends take both cores in slices; the
    # last survivor runs within a slice or so, not after a whole exit (5 ms) as it would if an exit held its core.
    assert detect_seconds(4, 2, ends) < 5e-3 + 2 * SCHEDULER_SLICE + 1e-3
    # Where the kernel gives way only at its tick, an end keeps the core to the next tick past its slice.
    assert detect_seconds(4, 2, ends) < detect_seconds(4, 2, at_tick) < 5e-3 + 2 * (4e-3 + SCHEDULER_SLICE) + 1e-3
    # Sixteen ranks on two cores: the exits of the first fifteen take the cores the last survivors need (the more
    # so at the tick); when the survivors live on (an elastic job's), the figure leaves them out.
    lingering = detect_seconds(16, 2, ends, exits=False)
    assert detect_seconds(16, 2, at_tick) > detect_seconds(16, 2, ends) > lingering * 1.3
    assert detect_seconds(16, 2, at_tick, exits=False) == pytest.approx(lingering, rel=0.05)
    assert detect_seconds(16, 2, Costs(cpu=CpuModel(fail=50e-6))) < lingering


@pytest.mark.unit
def test_rank_0_folds_every_members_contribution_fitted_from_np_4s_ranks_and_each_roles_cpu_is_shown(capsys):
    import dataclasses
    from horovod.tools.simulate import calibration
    from horovod.tools.simulate.world import CpuModel
    true = calibration.Costs(CpuModel(submit=4e-6, fold=0.5e-6))
    # Rank 0 (the star's) folds the three others' contributions of each of 20 names; the others fold nothing.
    no_fold = calibration.Costs(dataclasses.replace(true.cpu, fold=0.0))
    cycle, bare = calibration.role_cpu(4, 2, true, 20, 10), calibration.role_cpu(4, 2, no_fold, 20, 10)
    assert cycle["rank 0"] - bare["rank 0"] == pytest.approx(0.5e-6 * 3 * 20, rel=0.05)
    assert cycle["others"] == pytest.approx(bare["others"], rel=0.01)
    # It holds each message's as it reads it, before it replies: with a core per rank, sixteen ranks' cycle waits
    # for the last message's 20 (the others' were held while it waited for that one).
    slower = calibration.cycle_seconds(16, 16, true) - calibration.cycle_seconds(16, 16, no_fold)
    assert 0.5e-6 * 20 * 0.9 <= slower < 0.5e-6 * 20 * 3
    # A tree's relay pays it for what its children pass up: at 32 ranks the median relay (ranks 1-10) reads three
    # leaves' 20 contributions each.
    relay, bare_relay = (calibration.role_cpu(32, 2, c, 20, 10)["relays"] for c in (true, no_fold))
    assert relay - bare_relay == pytest.approx(0.5e-6 * 3 * 20, rel=0.1)
    # "Measured" per-rank CPU made by the simulation with the fold known: the fit finds it from np 4's ranks.
    per_rank = {loop: [calibration.role_cpu(4, 2, true, tensors, steps)[role] * 1e6 for role in ("rank 0",) +
                       ("others",) * 3] for loop, tensors, steps in (("ar4", 1, 12), ("cycle20", 20, 10))}
    measured = {name: {n: figure(n, 2, true) for n in (2, 4)} for name, figure in calibration.FIGURES.items()
                if name in ("ar4_us", "cycle20_us")}
    fitted = calibration.fit(measured, 2, roles=per_rank)
    assert fitted.cpu.fold == pytest.approx(0.5e-6, rel=0.15)
    # By role: rank 0, the tree's relays (ranks 1-6 of 20 have children), the others.
    saved = {"medians": {"4": {"cpu_us": per_rank}, "20": {"cpu_us": {
        loop: [500.0] + [300.0] * 6 + [100.0] * 13 for loop in ("ar4", "cycle20")}}}}
    rows = calibration.role_table(saved, 2, fitted).splitlines()
    assert len(rows) == 2 + 4
    twenty = [r for r in rows if r.startswith("| 20 | ar4 |")][0].split("|")
    assert twenty[3].strip().startswith("500 /") and twenty[4].strip().startswith("300 /")
    four = [r for r in rows if r.startswith("| 4 | cycle20 |")][0].split("|")
    assert four[4].strip() == "" and four[5].strip().startswith(f"{per_rank['cycle20'][1]:,.0f} /")


@pytest.mark.unit
def test_pooled_runs_are_one_run_of_all_their_repeats(monkeypatch, tmp_path):
    import json
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import importlib
    scale_control = importlib.import_module("scale_control")

    def run(date, ar4, cold, evicted):
        runs = [{"np": n, "repeat": i, "figures": {"first_s": 1.0, "ar4_us": a * n, "cycle20_us": 3.0,
                                                  "detect_ms": 4.0, "cpu_us": {"ar4": [a] * n}}}
                for i, a in enumerate(ar4) for n in (2, 4)]
        sharing = {"meta": {"kernel_hz": 250}, "rank_cold_us": cold,
                   "runs_us": {"2": [30.0, 30.0], "4": [33.0, 36.0], "evicted": [evicted]}}
        return {"meta": {"date": date, "cores": 2, "repeats": len(ar4), "server_request_us": 5.0},
                "runs": runs, "sharing": sharing}

    saved = [run("a", [10.0, 20.0], 80.0, 60.0), run("b", [30.0, 40.0, 50.0], 100.0, 70.0)]
    paths = []
    for index, one in enumerate(saved):
        paths.append(tmp_path / f"{index}.json")
        paths[-1].write_text(json.dumps(one))
    out = tmp_path / "pooled.json"
    assert scale_control.main(["--pool", *map(str, paths), "--json", str(out)]) == 0
    pooled = json.loads(out.read_text())
    # The median over all five repeats, not a median of the two runs' medians (15 and 40).
    assert pooled["medians"]["4"]["ar4_us"] == 30.0 * 4 and pooled["medians"]["2"]["runs"] == 5
    assert pooled["medians"]["4"]["cpu_us"]["ar4"] == [30.0] * 4
    assert pooled["meta"]["pooled"] == ["a", "b"] and pooled["meta"]["repeats"] == 5
    curve = pooled["sharing"]
    assert curve["runs_us"]["4"] == pytest.approx([33.0, 36.0, 33.0, 36.0]) and curve["rank_cold_us"] == pytest.approx(90.0)
    # The ring of 4's share of a full refill: (34.5 - 30) / (65 - 30).
    assert curve["sharing"][1] == pytest.approx([1.5, 4.5 / 35])


@pytest.mark.unit
def test_the_command_line_refuses_faults_that_cannot_happen_and_runs_every_requested_size(capsys):
    from horovod.tools.simulate.__main__ import main
    assert main(["--ranks", "16", "--kill", "3@0.5"]) == 2          # after the workload ended: not "0 killed"
    assert "--kill 3@0.5 cannot happen in this run: the workload" in capsys.readouterr().err
    for bad in (["--kill", "30@0.001"], ["--partition", "0.001@2"], ["--ranks", "1"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["--ranks", "16", *bad] if bad[0] != "--ranks" else bad)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and len(err.splitlines()) == 1 and "error:" in err, (bad, err)
    assert main(["--ranks", "8,12", "--kill", "3@0.001"]) == 0
    out = capsys.readouterr().out
    assert "seed 1, 8 ranks: 7 failed, 1 killed" in out and "seed 1, 12 ranks: 11 failed, 1 killed" in out, out


@pytest.mark.unit
def test_help_needs_no_greenlet_and_shows_no_markup():
    code = ("import sys; sys.modules['greenlet'] = None; from horovod.tools.simulate.__main__ import main; "
            "main(['--help'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--kill KILL" in proc.stdout, proc.stderr
    assert "``" not in proc.stdout and ":mod:" not in proc.stdout and "(default: 8,64,512,4096)" in proc.stdout
