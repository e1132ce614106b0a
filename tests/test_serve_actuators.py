"""The controller's actuators: ``command`` with real commands, ``cgroup`` on files and on the
machine's real cgroups, ``log``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import serve_support

from wirekit.cgroups import (
    CgroupError,
    cgroup_version,
    cpu_limit,
    join_cgroup,
    make_cgroup,
    set_cpu_limit,
)
from wirekit.serve.config import ActuatorConfig
from wirekit.serve.control.actuators import (
    Actuator,
    ActuatorError,
    CgroupActuator,
    CommandActuator,
    LogActuator,
    build_actuator,
)

RECORD = "import json, sys; open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')"


def test_command_runs_the_template_without_a_shell(tmp_path):
    out = tmp_path / "argv.jsonl"
    act = CommandActuator(
        [sys.executable, "-c", RECORD, str(out), "--cpus", "{cpus}", "{container}", "{share}"],
        [sys.executable, "-c", RECORD, str(out), "gpus={gpus}", "{node};{model}"],
        containers={"n1/m1": "box-1"},
        cpus=4.0,
        timeout=30,
    )
    assert isinstance(act, Actuator)
    act.set_cpu_share("n1", "m1", 0.25)
    act.set_cpu_share("n2", "m 2; rm -rf /", 0.5)  # no shell: one argument, as given
    act.set_gpus("n1", "m1", 2)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [
        ["--cpus", "1.000", "box-1", "0.25"],
        ["--cpus", "2.000", "n2-m 2; rm -rf /", "0.5"],
        ["gpus=2", "n1;m1"],
    ]


def test_command_failure_says_why(tmp_path, caplog):
    act = CommandActuator(
        [
            sys.executable,
            "-c",
            "import sys; print('out'); sys.stderr.write('no box'); sys.exit(3)",
        ]
    )
    with (
        caplog.at_level("INFO", logger="wirekit.serve.actuators"),
        pytest.raises(ActuatorError, match="exited with 3: no box"),
    ):
        act.set_cpu_share("n1", "m1", 0.5)
    assert "stdout: out" in caplog.text  # the output is logged


def test_command_timeout_kills_it():
    act = CommandActuator([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    with pytest.raises(ActuatorError, match=r"killed after 0\.5 s"):
        act.set_cpu_share("n1", "m1", 0.5)


def test_command_missing_program():
    act = CommandActuator(["/nonexistent/wirekit-docker", "{cpus}"])
    with pytest.raises(ActuatorError, match="cannot run"):
        act.set_cpu_share("n1", "m1", 0.5)


def test_command_empty_template_skips():
    act = CommandActuator([sys.executable, "-c", "raise SystemExit(1)"])
    act.set_gpus("n1", "m1", 1)  # no gpu_argv: nothing run, no failure
    with pytest.raises(ActuatorError):
        act.set_cpu_share("n1", "m1", 0.5)


def test_log_actuator_records():
    act = build_actuator(ActuatorConfig())
    assert isinstance(act, LogActuator)
    act.set_cpu_share("n1", "m1", 0.3)
    act.set_gpus("n1", "m1", 1)
    assert list(act.calls) == [("cpu", "n1", "m1", 0.3), ("gpu", "n1", "m1", 1)]


# --- cgroups -------------------------------------------------------------------------------


def fake_v2(tmp_path: Path) -> Path:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    return tmp_path


def test_cgroup_v2_cpu_max_format(tmp_path):
    cg = fake_v2(tmp_path)
    assert cgroup_version(cg) == 2
    act = CgroupActuator({"m1": str(cg)}, cpus=2.0, period_us=50_000)
    act.set_cpu_share("n1", "m1", 0.25)
    assert (cg / "cpu.max").read_text() == "25000 50000"
    assert cpu_limit(cg) == 0.5
    act.set_cpu_share("n1", "m1", 0.0)  # the kernel's floor, not 0 (which it refuses)
    assert (cg / "cpu.max").read_text() == "1000 50000"
    set_cpu_limit(cg, None)
    assert cpu_limit(cg) is None


def test_cgroup_v1_files(tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_version(tmp_path) == 1
    CgroupActuator({"n1/m1": str(tmp_path)}, cpus=1.0).set_cpu_share("n1", "m1", 0.3)
    assert (tmp_path / "cpu.cfs_quota_us").read_text() == "30000"
    assert cpu_limit(tmp_path) == pytest.approx(0.3)


def test_cgroup_errors(tmp_path):
    with pytest.raises(ActuatorError, match="no cgroup configured for n1/zz"):
        CgroupActuator({"m1": str(tmp_path)}).set_cpu_share("n1", "zz", 0.5)
    with pytest.raises(CgroupError, match="not a cgroup with a CPU controller"):
        CgroupActuator({"m1": str(tmp_path)}).set_cpu_share("n1", "m1", 0.5)
    with pytest.raises(CgroupError, match="cannot create the cgroup"):
        make_cgroup(tmp_path / "missing" / "deeper")
    # reading a limit back: a cgroup without its period file, or with a file it did not write
    (tmp_path / "cpu.cfs_quota_us").write_text("50000\n")
    with pytest.raises(CgroupError, match="cannot read the CPU quota"):
        cpu_limit(tmp_path)
    (tmp_path / "cpu.cfs_period_us").write_text("soon\n")
    with pytest.raises(CgroupError, match="not a CPU quota the kernel writes"):
        cpu_limit(tmp_path)


@pytest.fixture
def cgroup_root():
    return serve_support.cgroup_root()


def test_real_cgroup_join_and_limit(cgroup_root):
    path = cgroup_root / f"wirekit-test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        join_cgroup(path, proc.pid)
        assert str(proc.pid) in (path / "cgroup.procs").read_text().split()
        CgroupActuator({"m1": str(path)}, cpus=1.0).set_cpu_share("n1", "m1", 0.2)
        assert cpu_limit(path) == pytest.approx(0.2)
    finally:
        proc.kill()
        proc.wait(10)
        serve_support.remove_cgroup(path)


def test_mip_serve_cgroup_that_cannot_be_joined_exits_1(tmp_path):
    import io

    from wirekit.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = ["mip", "serve", "--handler", "wirekit.mip.runtime:echo"]
    status = main([*argv, "--cgroup", str(tmp_path / "no" / "such" / "cgroup")], out, err)
    assert status == 1
    assert "wirekit mip serve: --cgroup:" in err.getvalue()
    assert "cannot create the cgroup" in err.getvalue()
    assert "listening on" not in out.getvalue()  # it never listened
