"""Sweep executors: inline, one process per run (one or several at a time), and submitit's local executor.

Every executor must give the same records as the inline one, each run written exactly once, and a
sweep that is interrupted resumes without rerunning or rewriting what finished.
"""

import json
import os

import pytest

from diloco.cli import main
from diloco.scaling.executors import InlineExecutor, LocalExecutor, SubmititExecutor, make_executor
from diloco.scaling.sweep import GridSpec, expand, read_results, run_sweep
from diloco.scaling.synthetic import synthetic_run

GRID = dict(
    sizes=("35M", "90M"),
    inner_lr=(1e-3, 2e-3),
    global_batch=(16,),
    methods=("dp", "diloco"),
    replicas=(2,),
    outer_lr=(0.6,),
    runner="synthetic",
)


def _without_worker(records):
    return [{k: v for k, v in r.items() if k not in ("worker", "wall_time_s")} for r in records]


def _flaky(config):
    """Fails on one grid point (module-level so a child process can import it)."""
    if config["size"] == "90M" and config["method"] == "dp" and config["inner_lr"] == 2e-3:
        raise RuntimeError("boom")
    return synthetic_run(config)


@pytest.fixture(scope="module")
def inline_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("inline") / "r.jsonl"
    run_sweep(GridSpec(**GRID), results_path=out, run_fn=synthetic_run, progress=False, executor=InlineExecutor())
    return sorted(_without_worker(read_results(out)), key=lambda r: r["run_id"])


@pytest.mark.parametrize(
    "executor",
    [
        pytest.param(lambda tmp: LocalExecutor(1), id="local-1"),
        pytest.param(lambda tmp: LocalExecutor(3), id="local-3"),
        pytest.param(lambda tmp: SubmititExecutor(tmp / "submitit", cluster="local", poll_s=0.05), id="submitit-local"),
    ],
)
def test_process_executors_give_the_inline_records_each_once_each_in_its_own_process(
    tmp_path, executor, inline_records
):
    out = tmp_path / "r.jsonl"
    summary = run_sweep(
        GridSpec(**GRID), results_path=out, run_fn=synthetic_run, progress=False, executor=executor(tmp_path)
    )
    records = read_results(out)
    ids = [r["run_id"] for r in records]
    assert len(ids) == len(set(ids)) == len(expand(GridSpec(**GRID))) == summary.ran
    assert sorted(_without_worker(records), key=lambda r: r["run_id"]) == inline_records
    pids = [r["worker"]["pid"] for r in records]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids  # a fresh process per run


def test_a_failing_run_is_recorded_failed_and_the_rest_go_on(tmp_path):
    out = tmp_path / "r.jsonl"
    summary = run_sweep(GridSpec(**GRID), results_path=out, run_fn=_flaky, progress=False, executor=LocalExecutor(2))
    records = read_results(out)
    failed = [r for r in records if r["status"] == "failed"]
    assert summary.failed == 1 and len(failed) == 1 and "RuntimeError: boom" in failed[0]["error"]
    assert len(records) == len(expand(GridSpec(**GRID)))


def test_resume_runs_only_what_is_missing_and_never_writes_a_run_twice(tmp_path):
    grid = GridSpec(**GRID)
    out = tmp_path / "r.jsonl"
    configs = expand(grid)
    first = {**configs[0], **synthetic_run(configs[0]), "status": "ok", "error": None}
    out.write_text(json.dumps(first) + "\n")
    summary = run_sweep(grid, results_path=out, run_fn=synthetic_run, progress=False, executor=LocalExecutor(2))
    assert (summary.skipped, summary.ran) == (1, len(configs) - 1)
    again = run_sweep(grid, results_path=out, run_fn=synthetic_run, progress=False, executor=LocalExecutor(2))
    assert (again.skipped, again.ran) == (len(configs), 0)
    ids = [r["run_id"] for r in read_results(out)]
    assert sorted(ids) == sorted(c["run_id"] for c in configs)
    assert json.loads(out.read_text().splitlines()[0]) == first  # the old record is untouched


def test_cli_executor_options(tmp_path, capsys):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({**GRID, "sizes": list(GRID["sizes"])}))
    out = tmp_path / "r.jsonl"
    assert (
        main(
            [
                "sweep",
                "--grid",
                str(grid),
                "--out",
                str(out),
                "--executor",
                "local",
                "--workers",
                "2",
                "--synthetic-delay",
                "0.01",
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ran"] == len(expand(GridSpec(**GRID)))
    assert all("worker" in r for r in read_results(out))
    for argv, message in (
        (["--workers", "2"], "--workers=2 goes with --executor local"),
        (["--executor", "local", "--slurm", "partition=x"], "--slurm goes with"),
        (["--executor", "slurm", "--slurm", "novalue"], "give KEY=VALUE"),
    ):
        assert main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "x.jsonl"), *argv]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
    with pytest.raises(ValueError, match="unknown executor"):
        make_executor("kubernetes")


def test_streaming_records_train_streaming_and_base_fragments_reach_only_streaming_runs():
    pytest.importorskip("torch")
    from diloco.train.sweep_runner import config_from_record

    grid = GridSpec(
        sizes=("tiny",),
        inner_lr=(3e-3,),
        global_batch=(8,),
        methods=("dp", "diloco", "streaming"),
        replicas=(2,),
        sync_every=(8,),
        num_params={"tiny": 37184},
        base={"vocab_size": 512, "seq_len": 32, "num_fragments": 3, "overlap_steps": 1, "runs_dir": "x"},
    )
    by_method = {c["method"]: config_from_record(c)[0] for c in expand(grid)}
    assert by_method["streaming"].method == "streaming"
    assert (by_method["streaming"].num_fragments, by_method["streaming"].overlap_steps) == (3, 1)
    assert by_method["diloco"].method == "diloco"
    assert (by_method["diloco"].num_fragments, by_method["diloco"].overlap_steps) == (1, 0)
    assert by_method["dp"].method == "dp" and by_method["dp"].num_fragments == 1


def test_several_grids_sweep_as_one_and_a_shared_point_runs_once(tmp_path, capsys):
    """A staged search is several grid files: `--grid a --grid b` runs their union, each point once."""
    a = {**GRID, "sizes": ["35M"], "inner_lr": [1e-3, 2e-3]}
    b = {**GRID, "sizes": ["35M"], "inner_lr": [2e-3, 4e-3]}  # 2e-3 is in both
    paths = []
    for name, grid in (("a", a), ("b", b)):
        paths += ["--grid", str(tmp_path / f"{name}.json")]
        (tmp_path / f"{name}.json").write_text(json.dumps(grid))
    out = tmp_path / "r.jsonl"
    assert main(["sweep", *paths, "--out", str(out), "--no-progress"]) == 0
    want = {c["run_id"] for g in (a, b) for c in expand(GridSpec(**g))}
    got = [r["run_id"] for r in read_results(out)]
    assert sorted(got) == sorted(want) and len(got) == len(set(got)) == 3 * 2  # 3 lrs x (dp, diloco)
    assert {r["inner_lr"] for r in read_results(out)} == {1e-3, 2e-3, 4e-3}
    capsys.readouterr()
    (tmp_path / "c.json").write_text(json.dumps({**a, "runner": "train"}))
    assert main(["sweep", *paths, "--grid", str(tmp_path / "c.json"), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "different runners" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()
