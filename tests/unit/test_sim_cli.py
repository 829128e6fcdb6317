"""`diloco simulate` run in-process: table on stdout, JSON and PNG in --out."""

import json

import pytest

from diloco.cli import main
from diloco.sim.paper import TABLE4, grid_index


def test_named_size_reproduces_the_papers_rows(tmp_path, capsys):
    assert main(["simulate", "--size", "1B", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "DiLoCo" in out and "99%" in out and "x 1.2" in out
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert data["methods"] == ["Data-Parallel", "DiLoCo", "Streaming DiLoCo", "+ overlap", "+ overlap + 4-bit"]
    assert len(data["bandwidth_gbps"]) == 50 and len(data["utilization"]["DiLoCo"]) == 50
    needed = [grid_index(x) for x in data["bandwidth_needed_gbps"]["DiLoCo"]]
    assert needed == [grid_index(v) for v in TABLE4["DiLoCo"]["1B"]] == [14, 22, 26, 29, 36]
    assert data["config"]["size"] == "1B"
    png = (tmp_path / "utilization.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_custom_model_methods_and_grid(tmp_path, capsys):
    argv = ["simulate", "--layers", "12", "--params", "3e8", "--step-time", "0.2", "--methods", "dp,fp4",
            "--sync-every", "30", "--bits", "8", "--bandwidth", "1", "100", "5", "--latency", "0.001",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "simulate.json").read_text())
    assert data["methods"] == ["Data-Parallel", "+ overlap + 8-bit"]
    assert [round(x, 6) for x in data["bandwidth_gbps"]] == [1.0, 3.162278, 10.0, 31.622777, 100.0]
    assert data["model"]["step_time_s"] == 0.2  # no calibration for a measured step time
    table = capsys.readouterr().out
    assert ">100" in table  # data-parallel does not reach 99 % below 100 Gbit/s here


@pytest.mark.parametrize("argv, message", [
    (["--layers", "12"], "give all of --layers, --params and --step-time"),
    (["--size", "1B", "--layers", "12"], "not both"),
    (["--size", "1B", "--methods", "dp,ddp"], "unknown method"),
])
def test_user_errors_exit_2_with_a_message(tmp_path, capsys, argv, message):
    assert main(["simulate", *argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
