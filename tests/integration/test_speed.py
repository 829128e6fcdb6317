"""The trainer's speed options: torch.compile (names unchanged, same results, bit-exact resume) and tcmalloc's notice."""

from __future__ import annotations

import json

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash
from _tiny import make_model

from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.speed import TCMALLOC_HINT, compile_in_place, tcmalloc_loaded, tcmalloc_notice, unwrap_compiled
from diloco.train.trainer import Trainer, train_model


@pytest.fixture(scope="module")
def cache(token_cache):
    return token_cache


def tiny(**kw) -> TrainConfig:
    # Streaming with P=2 fragments: the fragments name the model's parameters, so a renamed parameter fails here.
    base = {
        **load_preset("tiny")["base"],
        "method": "streaming",
        "replicas": 2,
        "sync_every": 6,
        "num_fragments": 2,
        "overlap_steps": 1,
        "merge_alpha": 0.5,
        "steps": 12,
        "checkpoint_every": 6,
        "eval_every": 12,
    }
    return TrainConfig.from_dict({**base, **kw})


def _final(out_dir):
    state = ckpt.load_latest(out_dir)
    return state["replicas"], json.loads((out_dir / "summary.json").read_text())["final_eval_loss"]


@pytest.mark.slow  # ~30 s on 2 cores with a cold inductor cache (the compilation), ~8 s warm
def test_compiled_run_matches_eager_and_resumes_exactly(tmp_path, cache):
    # bf16 + compile, the fast path, against the same run in eager bf16. One dtype only: compiling fp32 as well
    # doubled the test's C++ builds (52 instead of 31; 73 s of CPU instead of 56 with a cold cache on 2 cores).
    train_model(tiny(bf16=True), tmp_path / "eager", cache_dir=cache, progress=False)
    eager_reps, eager_loss = _final(tmp_path / "eager")
    fast = dict(compile=True, bf16=True)
    train_model(tiny(**fast), tmp_path / "fast", cache_dir=cache, progress=False)
    fast_reps, fast_loss = _final(tmp_path / "fast")
    # the same names (no `_orig_mod.` prefix) and the same numbers within bf16's rounding: inductor fuses the
    # autocast ops and rounds to bf16 at other places than eager does, so after 12 steps single weights differ by up
    # to ~0.01 (of ~0.09; measured 0.0107 on AVX-512; the tolerance 0.04 leaves room for another vector width),
    # while the loss of the same parameters agrees to ~3e-6 (measured; rel 1e-4 below)
    for re_, rc in zip(eager_reps, fast_reps):
        assert list(rc["model"]) == list(re_["model"])
        for k in re_["model"]:
            torch.testing.assert_close(rc["model"][k], re_["model"][k], rtol=0.0, atol=0.04, msg=k)
        for ge, gc in zip(re_["algorithm"]["global"], rc["algorithm"]["global"]):
            torch.testing.assert_close(gc, ge, rtol=0.0, atol=0.04)
    assert fast_loss == pytest.approx(eager_loss, rel=1e-4)
    # interrupted after step 7 (checkpoint at 6) and resumed: bit for bit the uninterrupted run. The M = 2
    # replicas are threads; compiling them concurrently made runs differ (5.430 against 5.461 on the tiny preset,
    # bf16), so the trainer compiles one replica at a time.
    cut = tmp_path / "cut"
    with pytest.raises(SimulatedCrash):
        Trainer(tiny(**fast), cut, cache_dir=cache, progress=False, callbacks=[CrashAfter(7, replicas=2)]).run()
    assert ckpt.latest_meta(cut)["step"] == 6
    resumed = Trainer(tiny(**fast), cut, cache_dir=cache, progress=False).run(resume=True)
    cut_reps, _ = _final(cut)
    for rf, rc in zip(fast_reps, cut_reps):
        for k in rf["model"]:
            assert torch.equal(rc["model"][k], rf["model"][k]), k
        for gf, gc in zip(rf["algorithm"]["global"], rc["algorithm"]["global"]):
            assert torch.equal(gc, gf)
    assert resumed.final_eval_loss == fast_loss


def test_compile_keeps_parameter_names_and_unwrap_restores_them():
    model = make_model()
    names = [n for n, _ in model.named_parameters()]
    wrapped = torch.compile(make_model())
    assert all(n.startswith("_orig_mod.") for n, _ in wrapped.named_parameters())  # why the trainer never wraps
    assert [n for n, _ in unwrap_compiled(wrapped).named_parameters()] == names
    assert unwrap_compiled(model) is model
    assert compile_in_place(model) is model and [n for n, _ in model.named_parameters()] == names
    assert list(model.state_dict()) == list(make_model().state_dict())


def test_tcmalloc_is_read_from_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9\n")
    assert tcmalloc_loaded(maps) is True
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert tcmalloc_loaded(maps) is False
    assert tcmalloc_loaded(tmp_path / "absent") is None
    notice = tcmalloc_notice("cpu")
    loaded = tcmalloc_loaded()
    if loaded is False:
        assert "not loaded" in notice and TCMALLOC_HINT in notice and "LD_PRELOAD=" in notice
    elif loaded:
        assert notice.startswith("tcmalloc is loaded")
    assert tcmalloc_notice("meta") is None  # only CPU training is concerned


def test_trainer_says_whether_tcmalloc_is_loaded(tmp_path, cache, capsys):
    train_model(
        tiny(method="diloco", num_fragments=1, overlap_steps=0, merge_alpha=0.0, steps=2, checkpoint_every=0),
        tmp_path,
        cache_dir=cache,
        progress=False,
    )
    err = capsys.readouterr().err
    if tcmalloc_loaded() is not None:
        assert "diloco: tcmalloc is" in err
