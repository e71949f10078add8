"""Tier unit: tunable flags generated from the configuration table, flag → env mapping, --config-file parsing."""


import pytest

import dataclasses
import logging

from horovod.common.config import (AGREED_SETTINGS, MIB, SETTINGS, SETTINGS_BY_ENV, Config, load_config,
                                   unknown_variables)
from horovod.common.exceptions import HorovodConfigError
from horovod.runner import tunables
from horovod.runner.cli import launcher_env, make_parser, resolve_values

pytestmark = pytest.mark.unit


def parse(*argv):
    return make_parser().parse_args([*argv, "python", "train.py"])


def env_of(*argv):
    return launcher_env(resolve_values(parse(*argv)))


def test_every_flagged_setting_is_a_flag():
    parser = make_parser()
    options = {opt for action in parser._actions for opt in action.option_strings}
    for setting in SETTINGS:
        if setting.flag:
            assert setting.flag in options


def test_no_flags_no_tunables():
    assert env_of() == {}


def test_fusion_threshold_is_scaled_to_bytes():
    assert env_of("--fusion-threshold-mb", "32") == {"HOROVOD_FUSION_THRESHOLD": str(32 * MIB)}


def test_numeric_and_string_flags():
    env = env_of("--cycle-time-ms", "2.5", "--cache-capacity", "0", "--timeline-filename", "/tmp/t.json",
                 "--gloo-timeout-seconds", "7", "--log-level", "debug")
    assert env == {"HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_CACHE_CAPACITY": "0",
                   "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_GLOO_TIMEOUT_SECONDS": "7.0",
                   "HOROVOD_LOG_LEVEL": "DEBUG"}
    assert load_config(env).cycle_time == 2.5


def test_boolean_flags_and_their_negation():
    env = env_of("--hierarchical-allreduce", "--timeline-mark-cycles", "--no-stall-check")
    assert env == {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_TIMELINE_MARK_CYCLES": "1",
                   "HOROVOD_STALL_CHECK_DISABLE": "1"}
    assert env_of("--no-hierarchical-allreduce") == {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}


def test_autotune_knobs_only_with_autotune():
    assert env_of("--autotune-warmup-samples", "5") == {}
    env = env_of("--autotune", "--autotune-warmup-samples", "5", "--autotune-log-file", "a.csv")
    assert env == {"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "5", "HOROVOD_AUTOTUNE_LOG": "a.csv"}


def test_stall_timings_only_while_stall_check_is_on():
    assert env_of("--stall-check-warning-time-seconds", "10") == {"HOROVOD_STALL_CHECK_TIME_SECONDS": "10.0"}
    assert env_of("--no-stall-check", "--stall-check-warning-time-seconds", "10") == {
        "HOROVOD_STALL_CHECK_DISABLE": "1"}


def test_timeouts_reach_workers_but_ssh_args_stay_in_the_launcher():
    args = parse("--start-timeout", "12")
    assert args.start_timeout == 12.0
    assert launcher_env(vars(args)) == {"HOROVOD_START_TIMEOUT": "12.0"}
    args = parse("--elastic-timeout", "100")  # elastic workers bound their wait for a round by it
    assert launcher_env(vars(args)) == {"HOROVOD_ELASTIC_TIMEOUT": "100.0"}
    assert SETTINGS_BY_ENV["HOROVOD_SSH_ARGS"].side == "launcher"


def test_network_interface_and_tcp():
    assert env_of("--network-interface", "lo", "--tcp") == {"HOROVOD_GLOO_IFACE": "lo", "NCCL_IB_DISABLE": "1"}
    assert env_of("--network-interfaces", "eth0,eth1") == {"HOROVOD_GLOO_IFACE": "eth0,eth1"}


@pytest.mark.parametrize("argv", [["--fusion-threshold-mb", "-1"], ["--cycle-time-ms", "abc"],
                                  ["--log-level", "LOUD"], ["--cache-capacity", "1.5"]])
def test_bad_flag_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_noise_outside_unit_interval_rejected():
    with pytest.raises(HorovodConfigError, match=r"\[0, 1\]"):
        tunables.tunables_to_env({"autotune": True, "autotune_gaussian_process_noise": 1.5})


def test_malformed_environment_names_variable_and_value():
    with pytest.raises(HorovodConfigError, match="HOROVOD_CACHE_CAPACITY.*'lots'"):
        load_config({"HOROVOD_CACHE_CAPACITY": "lots"})


CONFIG_YAML = """
params:
  fusion_threshold_mb: 16
  cycle_time_ms: 3
  hierarchical_allreduce: true
autotune:
  enabled: true
  warmup_samples: 4
  gaussian_process_noise: 0.5
timeline:
  filename: /tmp/tl.json
  mark_cycles: true
stall_check:
  enabled: true
  warning_time_seconds: 20
library_options:
  gloo_timeout_seconds: 9
logging:
  level: info
"""


def test_config_file_sections(tmp_path):
    path = tmp_path / "hvd.yaml"
    path.write_text(CONFIG_YAML)
    env = env_of("--config-file", str(path))
    assert env == {
        "HOROVOD_FUSION_THRESHOLD": str(16 * MIB), "HOROVOD_CYCLE_TIME": "3.0",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "4",
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5", "HOROVOD_TIMELINE": "/tmp/tl.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "1", "HOROVOD_STALL_CHECK_DISABLE": "0",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "20.0", "HOROVOD_GLOO_TIMEOUT_SECONDS": "9.0",
        "HOROVOD_LOG_LEVEL": "INFO"}


def test_command_line_flags_win_over_config_file(tmp_path):
    path = tmp_path / "hvd.yaml"
    path.write_text("params:\n  fusion_threshold_mb: 16\n  cycle_time_ms: 3\nstall_check:\n  enabled: false\n")
    env = env_of("--config-file", str(path), "--fusion-threshold-mb", "1", "--stall-check-warning-time-seconds", "5")
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(MIB)
    assert env["HOROVOD_CYCLE_TIME"] == "3.0"
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert "HOROVOD_STALL_CHECK_TIME_SECONDS" not in env


def test_config_file_controller():
    assert tunables.config_file_values({"controller": "mpi"}) == {"use_mpi": True}


@pytest.mark.parametrize("document, message", [
    ({"paramz": {}}, "unknown section 'paramz'"),
    ({"params": {"fusion_threshold": 1}}, "unknown key 'fusion_threshold'"),
    ({"params": {"cycle_time_ms": -1}}, "must be >= 0"),
    ({"params": {"hierarchical_allreduce": "yes please"}}, "true or false"),
    ({"controller": "nccl"}, "gloo or mpi"),
    (["params"], "mapping"),
])
def test_config_file_errors(document, message):
    with pytest.raises(HorovodConfigError, match=message):
        tunables.config_file_values(document)


def test_config_file_not_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("params: [unclosed\n")
    with pytest.raises(HorovodConfigError, match="not valid YAML"):
        tunables.load_config_file(str(path))
    with pytest.raises(HorovodConfigError, match="cannot read"):
        tunables.load_config_file(str(tmp_path / "missing.yaml"))


def test_settings_are_typed_fields_with_their_facts():
    config = load_config({"HOROVOD_FUSION_THRESHOLD": "5", "HOROVOD_NEGOTIATION": " Peer ",
                          "HOROVOD_LOG_LEVEL": "debug"})
    assert config.fusion_threshold == 5 and config.negotiation == "peer" and config.log_level == "DEBUG"
    assert config.is_explicit("HOROVOD_FUSION_THRESHOLD") and not config.is_explicit("HOROVOD_CYCLE_TIME")
    assert {f.name for f in dataclasses.fields(Config)} >= {s.attr for s in SETTINGS}
    assert config.replace(cycle_time=2.0).cycle_time == 2.0 and Config().cycle_time == 1.0
    with pytest.raises(AttributeError):
        config.replace(no_such_setting=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rank = 3
    assert "secret" not in repr(load_config({"HOROVOD_SECRET_KEY": "abcd"}))
    assert "fusion_threshold" in AGREED_SETTINGS and "rank" not in AGREED_SETTINGS
    assert SETTINGS_BY_ENV["HOROVOD_FUSION_THRESHOLD"].yaml == "params.fusion_threshold_mb"
    for setting in SETTINGS:
        assert setting.env == "HOROVOD_" + setting.attr.upper() and setting.side in ("workers", "launcher", "both")


def test_range_and_choices_are_checked():
    with pytest.raises(HorovodConfigError, match=r"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE='2'.*\[0, 1\]"):
        load_config({"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "2"})
    with pytest.raises(HorovodConfigError, match="use auto, peer, star"):
        load_config({"HOROVOD_NEGOTIATION": "ring"})


def test_unknown_variable_warns_once_naming_the_closest(caplog):
    assert unknown_variables({"HOROVOD_FUSION_TRESHOLD": "1", "PATH": "/bin"}) == {
        "HOROVOD_FUSION_TRESHOLD": "HOROVOD_FUSION_THRESHOLD"}
    with caplog.at_level(logging.WARNING, logger="horovod"):
        load_config({"HOROVOD_CYCLE_TIMES": "1"})
        load_config({"HOROVOD_CYCLE_TIMES": "1"})
    messages = [r.getMessage() for r in caplog.records if "HOROVOD_CYCLE_TIMES" in r.getMessage()]
    assert messages == ["HOROVOD_CYCLE_TIMES is not a Horovod setting and is ignored; did you mean HOROVOD_CYCLE_TIME?"]


def test_inert_flags_are_accepted_hidden_and_not_passed_on():
    assert env_of("--num-nccl-streams", "2", "--torus-allreduce", "--hierarchical-allgather") == {}
    help_text = make_parser().format_help()
    assert "--num-nccl-streams" not in help_text and "--fusion-threshold-mb" in help_text
    said = []
    assert tunables.warn_inert(vars(parse("--torus-allreduce")), said.append) == ["--torus-allreduce"]
    assert "ignored" in said[0]


def test_every_setting_is_read_somewhere_or_inert():
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parent.parent / "horovod"
    text = "\n".join(p.read_text() for p in root.rglob("*.py"))
    for setting in SETTINGS:
        if setting.inert or setting.side == "launcher":
            continue
        assert re.search(rf"\.{setting.attr}\b|\"{setting.attr}\"|{setting.env}", text), setting.env
