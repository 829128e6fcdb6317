"""The planner's newer bandwidth settings: eager updates (tau = H) in the simulator, the stat / top-k codecs sent
with error feedback, and their loss costs measured at laptop scale (studies/frontier/frontier-summary.json)."""

import json
from pathlib import Path

import pytest

from diloco.cli import main
from diloco.sim import PRESETS, ModelSpec
from diloco.sim.loss import MEASURED_CODECS, MEASURED_EAGER, MEASURED_MARK, LossModel
from diloco.sim.planner import Candidate, Setup, candidates, evaluate
from diloco.sim.utilization import utilization_curve

ROOT = Path(__file__).parents[2]
SUMMARY = ROOT / "studies" / "frontier" / "frontier-summary.json"


@pytest.fixture(scope="module")
def paper_loss():
    return LossModel.paper()


def _utilization(c: Candidate, model: ModelSpec, latency_s: float) -> float:
    # a link so fast that only latency matters; M = 2 all-gather: one hop
    return float(
        utilization_curve(
            model,
            c.spec(model.num_params),
            [1e18],
            latency_s=latency_s,
            num_workers=2,
            exchange="all_gather",
            overlap_backward=False,
        )[0]
    )


@pytest.mark.parametrize("H", [10, 30])
def test_eager_tolerates_a_whole_outer_step_of_latency(H):
    """tau = H: an exchange released at the end of step t gates step t + H + 1, so a latency up to H step times
    costs nothing; beyond it the period stretches. Closed forms, one worker's clock over H steps of T:

    * Streaming eager (P fragments, the planner's candidate): utilization = min(1, H T / latency);
    * DiLoCo eager (P = 1): the next exchange is released before the gate of the previous one, two are in flight,
      and the period is (H T + latency) / 2: utilization = min(1, 2 H T / (H T + latency)).
    """
    T = 0.5
    model = ModelSpec(12, 1e6, T)
    stream = Candidate("streaming", sync_every=H, num_fragments=5, fragment_layers=3, codec="fp4_e3m0", eager=True)
    dil = Candidate("diloco", sync_every=H, codec="fp4_e3m0", eager=True)
    assert stream.overlap_steps == H and dil.overlap_steps == H  # tau = H, whatever was asked
    assert stream.spec(model.num_params).schedule.overlap_steps == H
    for rel in (0.25, 0.5, 0.9, 0.999, 1.0):
        assert _utilization(stream, model, rel * H * T) == pytest.approx(1.0, abs=1e-9)
        assert _utilization(dil, model, rel * H * T) == pytest.approx(1.0, abs=1e-9)
    for rel in (1.01, 1.5, 3.0):
        lat = rel * H * T
        assert _utilization(stream, model, lat) == pytest.approx(H * T / lat, rel=1e-8)
        assert _utilization(dil, model, lat) == pytest.approx(2 * H * T / (H * T + lat), rel=1e-8)
    # against tau = 1, which tolerates one step: at half an outer step of latency it already stalls
    tau1 = Candidate("streaming", sync_every=H, num_fragments=5, fragment_layers=3, codec="fp4_e3m0", overlap_steps=1)
    assert _utilization(tau1, model, 2 * T) < 1 - 1e-6
    assert _utilization(tau1, model, 0.5 * H * T) < 0.5


def test_planner_candidates_include_the_newer_settings():
    cands = candidates(24, sync_every=(30, 100), overlap=(0, 1))
    labels = {c.label for c in cands}
    for codec in MEASURED_CODECS:  # Streaming DiLoCo only, sent with error feedback
        assert any(c.codec == codec and c.method == "streaming" for c in cands)
        assert not any(c.codec == codec and c.method == "diloco" for c in cands)
        assert f"Streaming H=30 P=9 tau=1 {codec}+EF" in labels
    eager = [c for c in cands if c.eager]
    assert eager and all(c.overlap_steps == c.sync_every and c.method == "streaming" for c in eager)
    assert "Eager H=100 P=9 tau=H fp4_e3m0" in labels
    assert all(c.measured == (c.eager or c.codec in MEASURED_CODECS) for c in cands)
    assert not any(c.eager for c in candidates(24, eager=False))
    with pytest.raises(ValueError, match="unknown codec"):
        candidates(24, codecs=("fp5",))


def test_checked_in_costs_are_the_frontier_studys():
    block = json.loads((ROOT / "src" / "diloco" / "sim" / "data" / "ablations.json").read_text())["frontier"]
    rows = {
        r["method"]: r
        for r in json.loads(SUMMARY.read_text())["rows"]
        if r["size"] == block["size"]
        and r["global_batch"] == block["global_batch"] == 128
        and r.get("device", "cpu") == block.get("device", "cpu") == "cuda"
    }
    measured = LossModel.paper().measured()
    assert measured["source"] == "studies/frontier/frontier-summary.json"
    assert f"{block['num_params']:,} parameters" in measured["setting"] and "128 x 128" in measured["setting"]
    assert "CUDA GPU" in measured["setting"] and "mean over the seeds" in measured["setting"]
    for key, row in measured["rows"].items():
        assert row["eval_loss"] == rows[key]["eval_loss"] and row["gap_pct"] == rows[key]["gap_pct"], key
        assert row["tolerated_steps"] == rows[key]["tolerated_steps"]
        assert rows[key]["num_params"] == block["num_params"]
    for key in (*MEASURED_CODECS.values(), MEASURED_EAGER, "streaming-fp4-tau1", "dp"):
        assert key in measured["rows"]
    # the figures the planner prints
    gaps = {k: round(r["gap_pct"], 2) for k, r in measured["rows"].items()}
    assert gaps == {
        "dp": 0.0,
        "streaming-fp4-tau1": 3.83,
        "eager-fp4-mom0.5": 6.65,
        "stat4-ef0.9": 4.09,
        "stat2-ef0.9": 4.2,
        "topk-sparseloco": 14.93,
        "muon-stat4-ef0.9": -3.5,
    }


def test_measured_costs_are_charged_against_streaming_fp4_tau1(paper_loss):
    rows = paper_loss.measured()["rows"]
    ref = rows["streaming-fp4-tau1"]["eval_loss"]
    base = dict(method="streaming", num_params=1e9, replicas=2, sync_every=30, num_fragments=9, fragment_layers=3)
    fp4 = paper_loss.estimate(**base, overlap_steps=1, bits=4.5, codec="fp4_e3m0")
    for codec, key in MEASURED_CODECS.items():
        e = paper_loss.estimate(**base, overlap_steps=1, bits=4.5, codec=codec)
        (term,) = [t for t in e.terms if t.name == f"{codec}+EF"]
        assert term.relative == max(0.0, rows[key]["eval_loss"] / ref - 1) and term.extrapolated
        assert term.source.startswith(MEASURED_MARK) and "studies/frontier/frontier-summary.json" in term.source
        assert e.loss == pytest.approx(fp4.loss * (1 + term.relative), rel=1e-12)
        assert "bits" not in {t.name for t in e.terms}
    # topk costs +10.69 % on top of Streaming FP4, stat2 +0.35 %, stat4 +0.25 % (both within the seeds' noise)
    assert paper_loss.measured_term("topk-sparseloco", "t").relative == pytest.approx(0.1069, abs=1e-4)
    assert paper_loss.measured_term("stat2-ef0.9", "t").relative == pytest.approx(0.0035, abs=1e-4)
    assert paper_loss.measured_term("stat4-ef0.9", "t").relative == pytest.approx(0.0025, abs=1e-4)
    # eager: tau = 1's cost plus the measured eager-vs-tau-1 cost (+2.71 %), whatever overlap_steps says
    eager = paper_loss.estimate(**base, overlap_steps=30, bits=4.5, codec="fp4_e3m0", eager=True)
    rel = rows[MEASURED_EAGER]["eval_loss"] / ref - 1
    assert rel == pytest.approx(0.0271, abs=1e-4)
    assert eager.loss == pytest.approx(fp4.loss * (1 + rel), rel=1e-12)


def test_plan_output_lists_the_newer_settings_measured_at_laptop_scale(tmp_path, capsys):
    argv = [
        "plan",
        "--size",
        "10B",
        "--workers",
        "2",
        "--tokens-per-step",
        "4e6",
        "--bandwidth",
        "10",
        "0.1",
        "--top",
        "3",
        "--no-plot",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    # each measured setting is shown at every bandwidth, even past --top, marked "m"
    for bw_block in out.split("\n== ")[1:]:
        table = bw_block.split("\n\n")[0].splitlines()
        rows = table[table.index(next(ln for ln in table if "candidate" in ln)) + 1 :]
        for tag in ("stat4+EF", "stat2+EF", "topk+EF", "tau=H"):
            line = next(ln for ln in rows if tag in ln)
            assert line.rstrip().endswith("m"), line
    assert f"'m' after a loss: {MEASURED_MARK}" in out
    assert f"{MEASURED_MARK} (studies/frontier/frontier-summary.json; cpu-1m (984,768 parameters)" in out
    for figure in ("+3.83 %", "+6.65 %", "+4.09 %", "+4.20 %", "+14.93 %", "-3.50 %"):
        assert figure in out, figure
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["measured_at_laptop_scale"]["source"] == "studies/frontier/frontier-summary.json"
    cands = data["bandwidths"][0]["candidates"]
    eager = next(c for c in cands if c["eager"])
    assert eager["measured_at_laptop_scale"] and eager["overlap_steps"] == eager["sync_every"]
    assert any(t["source"].startswith(MEASURED_MARK) for t in eager["loss"]["terms"])
    topk = next(c for c in cands if c["codec"] == "topk")
    assert topk["bits"] == pytest.approx(0.21875, rel=1e-6)  # 64 of every 4096 values, 14 bits each
    assert f"## Costs {MEASURED_MARK}" in (tmp_path / "plan.md").read_text()


def test_plan_without_the_newer_settings_is_the_papers(tmp_path, capsys, paper_loss):
    assert (
        main(
            [
                "plan",
                "--size",
                "10B",
                "--tokens-per-step",
                "4e6",
                "--bandwidth",
                "1",
                "--codecs",
                "bf16,fp8_e4m3,fp4_e3m0",
                "--no-eager",
                "--no-plot",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert MEASURED_MARK not in out and "+EF" not in out and "tau=H" not in out
    model = PRESETS["10B"]
    setup = Setup(model, "given", 2, 20 * model.num_params, 4e6)
    plan = evaluate(setup, candidates(model.num_layers, codecs=("fp4_e3m0",), eager=False), [1e9], paper_loss)
    assert plan.measured == {} and "measured" not in plan.sources


def _report():
    from diloco.studies import frontier_report

    return frontier_report


def test_the_frontier_report_says_when_a_verdict_rests_on_an_unbracketed_lr():
    """A target judged on rows whose inner lr was tried once, or whose best lr is at the edge of what was tried,
    names them: such a verdict is provisional."""
    target = _report().target_verdict
    row = {"gap_pct": 2.0, "eval_loss": 4.0, "at_edge": False, "one_lr": False, "method": "eager"}
    ref = {"gap_pct": 1.8, "eval_loss": 3.99, "at_edge": False, "one_lr": False, "method": "streaming"}
    assert target(row, ref, 0.5).endswith("+0.20 points -> met (target <= +0.5)")
    assert target({**row, "one_lr": True}, ref, 0.5).endswith("met (target <= +0.5; not bracketed: eager (lr))")
    assert target(row, {**ref, "at_edge": True}, 0.1).endswith("MISSED (target <= +0.1; not bracketed: streaming (lr))")
    both = target({**row, "one_lr": True, "batch_at_edge": True}, {**ref, "one_batch": True}, 0.5)
    assert both.endswith("not bracketed: eager (lr and batch), streaming (batch))")


def test_the_frontier_report_takes_each_methods_best_batch_and_says_where_it_sits():
    best_over_batches = _report().best_over_batches
    rows = [
        {"size": "s", "method": "dp", "global_batch": b, "eval_loss": loss}
        for b, loss in ((4, 3.0), (8, 2.0), (16, 2.5))
    ]
    rows += [
        {"size": "s", "method": "eager", "global_batch": b, "eval_loss": loss} for b, loss in ((8, 3.0), (16, 2.9))
    ]
    rows += [
        {"size": "s", "method": "topk", "global_batch": 16, "eval_loss": 4.0},
        {"size": "other", "method": "dp", "global_batch": 32, "eval_loss": 1.0},
    ]
    best = best_over_batches(rows, "s")
    assert {
        k: (r["global_batch"], r["batches_tried"], r["batch_at_edge"], r["one_batch"]) for k, r in best.items()
    } == {"dp": (8, [4, 8, 16], False, False), "eager": (16, [8, 16], True, False), "topk": (16, [16], False, True)}
    # each against DP at DP's best batch (8), not at its own batch
    assert {k: round(r["gap_pct"], 6) for k, r in best.items()} == {"dp": 0.0, "eager": 45.0, "topk": 100.0}
    # a row with more seeds is chosen on its seed 0, as its rivals are, and reported at its seeds' mean; the two
    # devices' rows are never compared
    seeded = [
        {**r, "eval_loss": 2.6, "eval_loss_seed0": 1.9, "seeds": 3, "eval_loss_sd": 0.5}
        if r["method"] == "dp" and r["global_batch"] == 16
        else r
        for r in rows
    ]
    seeded.append({"size": "s", "method": "dp", "global_batch": 64, "eval_loss": 0.5, "device": "cuda"})
    best = best_over_batches(seeded, "s")
    assert (
        best["dp"]["global_batch"] == 16
        and best["dp"]["eval_loss"] == 2.6
        and best["dp"]["batches_tried"] == [4, 8, 16]
    )
    assert round(best["eager"]["gap_pct"], 6) == round(100 * (2.9 / 2.6 - 1), 6)
    assert best_over_batches(seeded, "s", "cuda")["dp"]["eval_loss"] == 0.5


def test_the_frontier_report_writes_the_block_the_planner_reads():
    """`studies/frontier/report.py --planner SIZE` makes the checked-in block from the study's rows, and refuses a
    size where a charged method has no finished run."""
    report = _report()
    checked = json.loads(report.PLANNER_DATA.read_text())["frontier"]
    rows = json.loads(SUMMARY.read_text())["rows"]
    assert report.planner_block(rows, checked["size"], checked["global_batch"], checked.get("device", "cpu")) == checked
    device = checked.get("device", "cpu")
    with pytest.raises(
        ValueError, match=f"no finished run of stat2-ef0.9 at batch {checked['global_batch']} on {device}"
    ):
        report.planner_block(
            [r for r in rows if r["method"] != "stat2-ef0.9"], checked["size"], checked["global_batch"], device
        )
    with pytest.raises(ValueError, match="at batch 3 on cuda;"):  # no method ran at this batch
        report.planner_block(rows, checked["size"], 3, "cuda")
    # the CPU set at batch 128 lacks the codecs: the two devices' runs are never mixed into one block
    with pytest.raises(
        ValueError, match="no finished run of stat4-ef0.9, stat2-ef0.9, topk-sparseloco at batch 128 on cpu"
    ):
        report.planner_block(rows, "cpu-1m", 128, "cpu")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "64"], "--batch 64 only chooses the rows of --planner SIZE"),
        (["--planner", "cpu-1m", "--batch", "0"], "--batch 0: a global batch"),
    ],
)
def test_the_frontier_reports_command_line_refuses_a_bad_batch_before_writing_anything(argv, message, capsys):
    report = _report()
    before = report.PLANNER_DATA.read_bytes()
    with pytest.raises(SystemExit) as exc:
        report.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert report.PLANNER_DATA.read_bytes() == before


def test_the_frontier_report_refuses_a_partial_planner_batch_before_writing_anything(capsys):
    """A ``--planner`` batch where a charged method has no run is refused before the summary, the plot or the
    planner's data is rewritten: every file is left as it was."""
    report = _report()
    files = [report.PLANNER_DATA, SUMMARY, SUMMARY.with_name("frontier.png")]
    before = [(p.stat().st_mtime_ns, p.read_bytes()) for p in files]
    assert report.main(["--planner", "cpu-1m", "--batch", "3"]) == 2
    assert "no finished run of" in capsys.readouterr().err
    assert [(p.stat().st_mtime_ns, p.read_bytes()) for p in files] == before


def test_the_frontier_report_writes_the_planner_batch_asked_for(tmp_path, monkeypatch, capsys):
    """`report.py --planner cpu-1m --batch 128 --device cuda` writes the batch-128 GPU rows (the loop over the
    study's groups once overwrote the batch asked for with the last group's), here into copies in tmp_path."""
    report = _report()
    planner = tmp_path / "ablations.json"
    planner.write_bytes(report.PLANNER_DATA.read_bytes())
    monkeypatch.setattr(report, "HERE", tmp_path)
    monkeypatch.setattr(report, "PLANNER_DATA", planner)
    assert report.main(["--planner", "cpu-1m", "--batch", "128", "--device", "cuda"]) == 0
    assert "(cpu-1m, batch 128, cuda)" in capsys.readouterr().out
    written = json.loads(planner.read_text())["frontier"]
    assert written["global_batch"] == 128 and written["device"] == "cuda"
    assert written == json.loads(report.ROOT.joinpath("src/diloco/sim/data/ablations.json").read_text())["frontier"]
    assert (tmp_path / "frontier.png").exists() and (tmp_path / "frontier-summary.json").exists()
