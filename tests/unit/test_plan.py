"""The planner: its recommendation rule on cases with a known answer, its closed forms, its sources, its CLI."""

import json
from pathlib import Path

import pytest

from diloco.cli import main
from diloco.sim import PRESETS, ModelSpec, utilization_curve
from diloco.sim.loss import MEASURED_MARK, LossModel
from diloco.sim.planner import DEFAULT_CODECS, Setup, candidates, codec_bits, evaluate


@pytest.fixture(scope="module")
def paper_loss():
    return LossModel.paper()


def _plan(model, bandwidths, loss_model, **kw):
    setup = Setup(model, "given", kw.pop("workers", 2), 20 * model.num_params, 4e6)
    return evaluate(setup, candidates(model.num_layers, num_workers=setup.num_workers), bandwidths, loss_model, **kw)


@pytest.mark.parametrize("size, expected", [("1B", "dp"), ("10B", "diloco"), ("100B", "diloco")])
def test_at_very_high_bandwidth_dp_or_diloco_is_recommended(paper_loss, size, expected):
    # Everything computes ~100 % of the time, so the lowest predicted loss wins; at 1B the paper's DiLoCo M = 2
    # law is above DP's (Table 4: 2.464 vs 2.460 at 1.3B), at 10B and 100B below it.
    plan = _plan(PRESETS[size], [1e14], paper_loss)
    rec = plan.recommended[1e14]
    assert rec.candidate.method == expected and rec.utilization > 0.999
    assert rec.candidate.sync_every == (1 if expected == "dp" else 30)


def test_at_100_mbits_only_quantized_overlapped_streaming_stays_above_90_percent(paper_loss):
    # 1B parameters, 24 layers, 1 s per step, two sites over 100 Mbit/s: the full bf16 model takes 160 s to
    # send, FP4 45 s; only fragments (45 / 8 s each) sent while tau >= 1 steps compute can hide it; eager updates
    # (tau = H) hide even bf16 fragments (160 / 8 s) behind a whole outer step, and top-k (0.22 bits) needs no overlap
    # (the settings whose costs are measured at laptop scale: checked on their own below).
    plan = _plan(ModelSpec(24, 1e9, 1.0), [1e8], paper_loss)
    above = [e for e in plan.rows[1e8] if e.utilization >= 0.9]
    assert above, "some setting must reach 90 %"
    for e in above:
        c = e.candidate
        if c.measured:
            continue
        assert c.method == "streaming" and c.overlap_steps >= 1 and c.codec != "bf16", c.label
    assert any(e.candidate.eager and e.candidate.codec == "bf16" for e in above)
    assert any(e.candidate.codec == "topk" and e.candidate.overlap_steps == 0 for e in above)
    # and the recommendation is within the tolerance of DP and the fastest such
    rec = plan.recommended[1e8]
    ok = [e for e in plan.rows[1e8] if e.loss_vs_dp <= plan.tolerance + 1e-12]
    assert rec in ok and rec.wall_clock_s <= min(e.wall_clock_s for e in ok) * 1.001


@pytest.mark.parametrize("gbps", [0.1, 1.0, 10.0])
def test_ten_b_two_sites_recommendation_is_the_fastest_within_tolerance(paper_loss, gbps):
    plan = _plan(PRESETS["10B"], [gbps * 1e9], paper_loss)
    rows = plan.rows[gbps * 1e9]
    rec = plan.recommended[gbps * 1e9]
    assert rec.loss_vs_dp <= plan.tolerance
    faster = [e for e in rows if e.wall_clock_s < rec.wall_clock_s / 1.001]
    assert all(e.loss_vs_dp > plan.tolerance for e in faster)
    # a looser tolerance can only make the recommendation faster
    loose = _plan(PRESETS["10B"], [gbps * 1e9], paper_loss, tolerance=0.02).recommended[gbps * 1e9]
    assert loose.wall_clock_s <= rec.wall_clock_s


def test_closed_forms_wall_clock_bytes_peak(paper_loss):
    model = PRESETS["10B"]
    plan = _plan(model, [1e9], paper_loss)
    steps = 20 * model.num_params / 4e6
    for e in plan.rows[1e9]:
        c = e.candidate
        exchange = "all_gather" if c.codec == "topk" else "reduce_scatter"  # the same bytes at M = 2
        cu = utilization_curve(model, c.spec(model.num_params), [1e9], exchange=exchange)[0]
        assert e.utilization == pytest.approx(cu, rel=1e-12)
        assert e.wall_clock_s == pytest.approx(steps * model.step_time_s / cu, rel=1e-12)
        assert e.bits == codec_bits(c.codec, model.num_params)
        # M = 2: each exchange sends the whole (encoded) payload once; DP every step, the others once per H
        assert e.bytes_sent == pytest.approx(model.num_params * e.bits / 8 * steps / c.sync_every, rel=1e-12)
        if c.method != "streaming":
            assert e.peak_gbps == pytest.approx(model.num_params * e.bits / model.step_time_s / 1e9, rel=1e-12)
        else:  # 48 blocks in 16 fragments of 3: the largest exchange is 3/48 of the model
            assert e.peak_gbps == pytest.approx(model.num_params * 3 / 48 * e.bits / model.step_time_s / 1e9)


def test_every_predicted_number_says_where_it_comes_from(paper_loss):
    plan = _plan(PRESETS["10B"], [1e9], paper_loss)
    data = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert set(data["sources"]) >= {"utilization", "step_time", "wall_clock", "bytes", "loss_law"}
    assert "arXiv:2503.09799" in data["sources"]["loss_law"]
    for cand in data["bandwidths"][0]["candidates"]:
        loss = cand["loss"]
        assert loss["law"].startswith("power+C:") and loss["interval"][0] <= loss["loss"] <= loss["interval"][1]
        assert any("outside the fitted sizes" in n for n in loss["notes"]) and loss["extrapolated"]
        for term in loss["terms"]:
            if cand["measured_at_laptop_scale"] and term["source"].startswith(MEASURED_MARK):
                assert "studies/frontier/frontier-summary.json" in term["source"] and term["extrapolated"]
            else:
                assert "arXiv" in term["source"]


def test_loss_model_marks_ablations_outside_their_data(paper_loss):
    def est(**kw):
        base = dict(
            method="streaming",
            num_params=1e9,
            replicas=2,
            sync_every=100,
            num_fragments=9,
            fragment_layers=3,
            overlap_steps=1,
            bits=4.5,
        )
        e = paper_loss.estimate(**{**base, **kw})
        return {t.name: t for t in e.terms}, e

    terms, e = est()
    assert not any(t.extrapolated for t in terms.values())
    assert est(sync_every=3000)[0]["H"].extrapolated and not est(sync_every=1000)[0]["H"].extrapolated
    assert est(overlap_steps=20)[0]["tau"].extrapolated
    assert est(fragment_layers=6)[0]["fragments"].extrapolated
    assert est(bits=2.0)[0]["bits"].extrapolated
    # H costs grow with H; tau costs grow with tau; DiLoCo at H = 30 is the law itself
    assert est(sync_every=300)[1].loss > est(sync_every=100)[1].loss > est(sync_every=30)[1].loss
    assert est(overlap_steps=5)[1].loss > est(overlap_steps=1)[1].loss
    law = paper_loss.fit.predict(1e9, method="diloco", replicas=2).loss
    assert paper_loss.estimate(method="diloco", num_params=1e9, replicas=2, sync_every=30).loss == law
    # Table 5 H=30 -> 100: +0.68 % (mean of six sizes)
    assert est(sync_every=100)[0]["H"].relative == pytest.approx(0.00683, abs=2e-4)


def test_project_ablations_are_this_projects_measured_runs():
    with open(Path(__file__).parents[2] / "benchmarks" / "results" / "quality.json") as fh:
        best = {b["name"]: b["final_eval_loss"] for b in json.load(fh)["best"]}
    lm = LossModel.paper(ablations="project")
    h = lm.sync_every_term(100)
    assert 1 + h.relative == pytest.approx(best["streaming-h100"] / best["streaming"], rel=1e-9)
    frag = lm.fragments_term(3)
    assert 1 + frag.relative == pytest.approx(best["streaming"] / best["diloco"], rel=1e-9)
    assert "benchmarks/results/quality.json" in frag.source


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 1024, 4095, 4096, 4097, 96_640, 1_000_003, 10**9])
def test_codec_bits_are_the_codecs_exact_bytes(n):
    from diloco.wire.registry import ALL_CODEC_NAMES, get_codec

    assert set(DEFAULT_CODECS) <= set(ALL_CODEC_NAMES)
    for name in DEFAULT_CODECS:
        assert codec_bits(name, n) == get_codec(name).num_bytes(n) * 8 / n, (name, n)
    # and every codec the library has is one the byte function knows
    from diloco.wire.sizes import NAMES, SPARSE_CODECS, bits_per_value

    assert set(NAMES) == set(ALL_CODEC_NAMES)
    for name in NAMES:
        assert bits_per_value(name, n) == get_codec(name).num_bytes(n) * 8 / n, (name, n)
    assert set(SPARSE_CODECS) == {c for c in NAMES if not get_codec(c).reduces_in_place}


def test_codec_bits_at_the_frontier_size_agree_with_the_studys():
    # studies/frontier/frontier-summary.json records the bits per parameter its runs sent at 96,640 parameters,
    # counted over their fragments' payloads (scales and tables per fragment); the planner prices one whole-model
    # payload: the two agree to within half a percent
    summary = json.loads((Path(__file__).parents[2] / "studies" / "frontier" / "frontier-summary.json").read_text())
    runs = {
        r["method"]: r["bits_per_param_per_sync"]
        for r in summary["rows"]
        if r["global_batch"] == 16 and r["num_params"] == 96_640
    }
    for codec, run in (
        ("fp4_e3m0", "streaming-fp4-tau1"),
        ("stat4", "stat4-ef0.9"),
        ("stat2", "stat2-ef0.9"),
        ("topk", "topk-sparseloco"),
    ):
        assert codec_bits(codec, 96_640) == pytest.approx(runs[run], rel=5e-3), codec


def test_packaged_paper_fit_is_what_diloco_fit_gives(paper_loss):
    from diloco.scaling.fit import fit_scaling
    from diloco.scaling.records import paper_table4_records

    fresh = fit_scaling(paper_table4_records(), alternatives=(), max_inits=64)
    for key, law in fresh.loss_laws_c.items():
        packaged = paper_loss.fit.loss_laws_c[key]
        for name, value in law.coef.items():
            assert packaged.coef[name] == pytest.approx(value, rel=1e-3), (key, name)


def test_user_fit_file_and_its_errors(tmp_path):
    from diloco.scaling.fit import fit_scaling
    from diloco.scaling.synthetic import SyntheticLaw

    law = SyntheticLaw(noise=0.0)
    records = [
        {
            "method": m,
            "replicas": r,
            "num_params": n,
            "tokens": 20 * n,
            "status": "ok",
            "eval_loss": float(law.best_loss(n, r, m)),
        }
        for n in (1e7, 3e7, 1e8, 3e8, 1e9)
        for m, r in (("dp", 1), ("diloco", 2))
    ]
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit_scaling(records, max_inits=8, alternatives=()).to_dict()))
    lm = LossModel.from_fit_file(path)
    assert lm.estimate(method="dp", num_params=3e8, replicas=1).loss == pytest.approx(
        float(law.best_loss(3e8, 1, "dp")), rel=2e-3
    )
    no_dp = tmp_path / "nodp.json"
    no_dp.write_text(
        json.dumps(fit_scaling([r for r in records if r["method"] != "dp"], max_inits=8, alternatives=()).to_dict())
    )
    with pytest.raises(ValueError, match="no data-parallel law"):
        LossModel.from_fit_file(no_dp)
    (tmp_path / "bad.json").write_text('{"points": 3}')
    with pytest.raises(ValueError, match="not the JSON `diloco fit` writes"):
        LossModel.from_fit_file(tmp_path / "bad.json")


def test_cli_plan_writes_json_markdown_plot(tmp_path, capsys):
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
        "1",
        "0.1",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("recommended") == 3 and "where the numbers come from" in out and "arXiv:2503.09799" in out
    data = json.loads((tmp_path / "plan.json").read_text())
    assert [b["bandwidth_gbps"] for b in data["bandwidths"]] == [0.1, 1.0, 10.0]
    assert data["setup"]["steps"] == 5e4 and data["tolerance"] == 0.005
    assert "| candidate | utilization |" in (tmp_path / "plan.md").read_text()
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_plan_one_worker_sends_nothing(tmp_path, capsys):
    assert (
        main(
            [
                "plan",
                "--size",
                "1B",
                "--workers",
                "1",
                "--tokens-per-step",
                "1e6",
                "--bandwidth",
                "1",
                "--no-plot",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "plan.json").read_text())
    (only,) = data["bandwidths"][0]["candidates"]
    assert only["method"] == "dp" and only["utilization"] == 1.0 and only["bytes_sent"] == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--size", "10B", "--tokens-per-step", "4e6"], "give the link"),
        (["--size", "10B", "--bandwidth", "1"], "give --tokens-per-step"),
        (["--size", "10B", "--bandwidth", "1", "--tokens-per-step", "4e6", "--codecs", "fp5"], "unknown codec"),
        (["--size", "10B", "--bandwidth", "1", "--tokens-per-step", "4e6", "--sync-every", "a"], "comma-separated"),
        (["--size", "10B", "--bandwidth", "1", "--tokens-per-step", "4e6", "--tolerance", "-1"], "--tolerance"),
        (
            ["--size", "10B", "--bandwidth", "1", "--tokens-per-step", "4e6", "--loss-law", "nope.json"],
            "does not exist",
        ),
    ],
)
def test_cli_plan_user_errors(tmp_path, capsys, argv, message):
    assert main(["plan", *argv, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_cli_plan_from_a_model_config(tmp_path):
    from diloco.models import Transformer, make_config

    config = make_config("cpu-1m", vocab_size=4096, seq_len=128)
    path = tmp_path / "model.json"
    path.write_text(json.dumps({f: getattr(config, f) for f in config.__dataclass_fields__}))
    assert (
        main(
            [
                "plan",
                "--model-config",
                str(path),
                "--step-time",
                "0.4",
                "--tokens-per-step",
                "2048",
                "--bandwidth",
                "0.02",
                "--no-plot",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    model = Transformer(config)
    total = sum(p.numel() for p in model.parameters())
    non_block = total - sum(p.numel() for p in model.blocks.parameters())
    data = json.loads((tmp_path / "o" / "plan.json").read_text())["setup"]["model"]
    assert (data["num_params"], data["num_layers"], data["non_block_params"]) == (total, 5, non_block)


def test_validation_against_the_emulated_link_is_within_five_points_at_the_delivered_bandwidth(paper_loss):
    # benchmarks/validate_planner.py's first table, recomputed from the stored measurements (link.json)
    from diloco.bench import RESULTS_DIR
    from diloco.bench.planner_check import validate_link

    result = validate_link(RESULTS_DIR / "link.json", paper_loss)
    delivered = result["summary"]["delivered"]
    assert delivered["cells"] == 15 and delivered["within_5_points"] == 15
    assert result["summary"]["configured"]["within_5_points"] == 11
