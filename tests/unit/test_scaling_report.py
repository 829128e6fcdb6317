"""The report's files and the sweep -> fit -> report command line, end to end on the synthetic runner."""

import json

import pytest

from diloco.cli import main
from diloco.scaling.fit import BestPoint, fit_scaling
from diloco.scaling.records import paper_table4_records
from diloco.scaling.report import MARKDOWN, PLOTS, percent_vs_dp, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def point(key_method: str, m: int, n: int, loss: float) -> BestPoint:
    return BestPoint(key_method, m, n, str(n), loss, None, None, None, None, 1)


def test_percent_vs_dp_is_the_relative_difference():
    pts = [
        point("dp", 1, 10, 2.0),
        point("dp", 1, 20, 4.0),
        point("diloco", 2, 10, 2.02),
        point("diloco", 2, 20, 3.96),
        point("diloco", 4, 30, 1.0),
    ]
    diffs = percent_vs_dp(pts)
    assert diffs["diloco-m2"] == pytest.approx({10: 1.0, 20: -1.0})
    assert diffs["diloco-m4"] == {}  # no DP run at that size


def test_report_on_the_paper_table_writes_plots_and_markdown(tmp_path):
    fit = fit_scaling(paper_table4_records(), max_inits=8)
    paths = write_report(fit, tmp_path, title="Paper Table 4", source="arXiv 2503.09799 Table 4")
    assert {p.name for p in paths.values()} == {*PLOTS.values(), MARKDOWN}
    for name in PLOTS.values():
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    md = (tmp_path / MARKDOWN).read_text()
    assert md.startswith("# Paper Table 4")
    assert fit.coefficient_table() in md and fit.holdout_table() in md
    for name in PLOTS.values():
        assert f"({name})" in md
    # Table 4 has no hyperparameters: the plot says so instead of failing.
    assert fit.lr_laws == {} and fit.lr_joint is None


def test_cli_end_to_end_on_the_synthetic_runner(tmp_path, capsys):
    grid = {
        "sizes": ["35M", "90M", "180M", "335M"],
        "runner": "synthetic",
        "inner_lr": {
            "35M": {"start": 2.5e-3, "stop": 1e-2, "factor": "sqrt2"},
            "90M": {"start": 1.25e-3, "stop": 5e-3, "factor": "sqrt2"},
            "180M": {"start": 6e-4, "stop": 2.5e-3, "factor": "sqrt2"},
            "335M": {"start": 3e-4, "stop": 1.25e-3, "factor": "sqrt2"},
        },
        "global_batch": {"start": 16, "stop": 64, "factor": 2},
        "replicas": [1, 2],
        "outer_lr": [0.6],
    }
    grid_path, results = tmp_path / "grid.json", tmp_path / "results.jsonl"
    grid_path.write_text(json.dumps(grid))

    assert main(["sweep", "--grid", str(grid_path), "--out", str(results), "--dry-run"]) == 0
    assert f"{4 * 5 * 3 * 3} runs, 0 already done" in capsys.readouterr().out  # sizes x lrs x batches x (dp, M=1, M=2)
    assert main(["sweep", "--grid", str(grid_path), "--out", str(results), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ran"] == 4 * 5 * 3 * 3

    fit_json = tmp_path / "fit.json"
    assert (
        main(
            [
                "fit",
                "--results",
                str(results),
                "--smooth-by",
                "inner_lr",
                "--max-inits",
                "4",
                "--bootstrap",
                "5",
                "--json",
                str(fit_json),
                "--predict",
                "1e9",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "| loss | dp | A * N^alpha |" in out and "predictions at N = 1e+09" in out
    data = json.loads(fit_json.read_text())
    assert set(data["loss_laws"]) == {"dp", "diloco-m1", "diloco-m2"} and "SYNTHETIC" in data["source"]

    report_dir = tmp_path / "report"
    assert main(["report", "--results", str(results), "--out", str(report_dir), "--max-inits", "4"]) == 0
    assert all((report_dir / name).stat().st_size > 0 for name in (*PLOTS.values(), MARKDOWN))
    assert "SYNTHETIC" in (report_dir / MARKDOWN).read_text()


def test_cli_user_errors_exit_2_with_a_message(tmp_path, capsys):
    grid_path = tmp_path / "grid.json"
    grid_path.write_text(json.dumps({"sizes": ["35M"], "inner_lr": [1e-3], "global_batch": [8]}))
    out = tmp_path / "r.jsonl"
    assert main(["sweep", "--grid", str(grid_path), "--out", str(out), "--runner", "nope"]) == 2
    assert "unknown runner 'nope'" in capsys.readouterr().err
    assert main(["sweep", "--grid", str(tmp_path / "missing.json"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["sweep", "--grid", str(grid_path), "--out", str(out), "--synthetic-delay", "1"]) == 2
    assert "--synthetic-delay" in capsys.readouterr().err
    out.write_text("")
    assert main(["fit", "--results", str(out)]) == 2
    assert "no finished runs" in capsys.readouterr().err


def test_cli_fit_on_the_paper_table(tmp_path, capsys):
    path = tmp_path / "paper.json"
    assert main(["fit", "--paper-table4", "--max-inits", "4", "--bootstrap", "5", "--json", str(path)]) == 0
    assert "2503.09799" in capsys.readouterr().out
    assert json.loads(path.read_text())["joint"]["joint"]["coef"]["beta"] == pytest.approx(0.0116, rel=0.01)
