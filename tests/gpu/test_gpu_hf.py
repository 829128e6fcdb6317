"""The Hugging Face path on CUDA: a pretrained Llama folder trained from its weights with ``--device cuda``
(fp32: the first logged loss is the pretrained model's on the first batches; bf16: finite losses), exported
with ``diloco export`` and reloaded with ``transformers`` to the run's global parameters."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from _gpu import requires_cuda

pytestmark = [requires_cuda, pytest.mark.timeout(300)]
transformers = pytest.importorskip("transformers")

from _pretrained import make_pretrained_llama, make_text  # noqa: E402

from diloco.cli import main as cli_main  # noqa: E402
from diloco.data import ShardSampler  # noqa: E402
from diloco.train.config import TrainConfig  # noqa: E402
from diloco.train.export import global_model  # noqa: E402
from diloco.train.inputs import prepare_inputs  # noqa: E402
from diloco.train.metrics import read_jsonl  # noqa: E402

SETS = {
    "seq_len": 32,
    "method": "streaming",
    "replicas": 2,
    "global_batch": 8,
    "sync_every": 4,
    "num_fragments": 2,
    "overlap_steps": 1,
    "merge_alpha": 0.5,
    "codec": "fp4_e3m0",
    "steps": 12,
    "warmup_steps": 2,
    "inner_lr": 3e-3,
    "eval_every": 12,
    "eval_batches": 2,
}


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_pretrained_llama_on_cuda_trains_and_exports(tmp_path, bf16):
    docs = make_text(tmp_path / "text")
    make_pretrained_llama(tmp_path / "llama", docs)
    run, out = tmp_path / "run", tmp_path / "exported"
    sets = SETS | {"model": f"hf:{tmp_path / 'llama'}", "sources": str(tmp_path / "text"), "bf16": bf16}
    argv = [
        "train",
        "--preset",
        "tiny",
        "--out",
        str(run),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
        "--device",
        "cuda",
    ] + [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    assert cli_main(argv) == 0
    losses = [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert len(losses) == SETS["steps"] and all(math.isfinite(v) for v in losses)
    cfg = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    inputs = prepare_inputs(cfg, tmp_path / "cache")
    if not bf16:  # the first step's loss is the pretrained model's (on the GPU) on each replica's first batch
        pretrained = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").cuda()
        first = []
        for rank in range(cfg.replicas):
            x, y = ShardSampler(
                inputs.data.train,
                rank=rank,
                world_size=cfg.replicas,
                batch_size=cfg.batch_per_replica,
                seq_len=cfg.seq_len,
                seed=cfg.seed,
            ).next_batch()
            with torch.no_grad():
                logits = pretrained(input_ids=x.cuda()).logits
            first.append(F.cross_entropy(logits.float().flatten(0, 1), y.cuda().flatten()).item())
        assert losses[0] == pytest.approx(sum(first) / len(first), rel=1e-4)
    assert cli_main(["export", str(run), "--out", str(out)]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    model, _, _ = global_model(run)
    x = inputs.val_batches[0][0]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=x).logits, model(x)[0])
