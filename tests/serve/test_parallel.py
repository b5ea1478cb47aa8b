"""Tensor- and pipeline-parallel serving: the preflight of the model's shapes against the number
of GPUs, the flags vLLM gets, and bad input before anything starts. Several GPUs cannot be had on
these machines, so what vLLM does with the split is measured on the device (docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantkit.config import ServeConfig
from quantkit.errors import BadInput
from quantkit.serve.engines.vllm import check_parallel, vllm_command
from quantkit.serve.target import resolve_target


def _config(hidden: int, mlp: int, heads: int, kv: int, layers: int = 32,
            group: int | None = 128) -> dict[str, Any]:
    cfg: dict[str, Any] = {"hidden_size": hidden, "intermediate_size": mlp,
                           "num_attention_heads": heads, "num_key_value_heads": kv,
                           "num_hidden_layers": layers}
    if group:
        cfg["quantization_config"] = {"config_groups": {"group_0": {
            "targets": ["Linear"], "weights": {"num_bits": 4, "group_size": group}}}}
    return cfg


LLAMA3_8B = _config(4096, 14336, 32, 8)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_llama3_8b_w4a16_splits_over_1_2_4_8_gpus(tp):
    assert check_parallel(LLAMA3_8B, tp, 1) == []


@pytest.mark.parametrize("cfg,tp,message", [
    (LLAMA3_8B, 3, "model.layers.N.self_attn has 32 attention heads, not a multiple of 3"),
    (_config(4096, 14336, 32, 3), 2, "3 KV heads, which 2 GPUs can neither split nor replicate"),
    # Llama-2-7B's MLP: 11008 / 4 = 2752 columns per GPU is 21.5 groups of 128
    (_config(4096, 11008, 32, 32), 4, "model.layers.N.mlp.down_proj's input (11008 columns) is "
                                      "not a whole number of 128-column groups per GPU"),
    (_config(4096, 11000, 32, 32, group=None), 16, "mlp has 11000 rows, not a multiple of 16"),
])
def test_a_split_that_does_not_fit_names_the_layer(cfg, tp, message):
    with pytest.raises(BadInput) as exc:
        check_parallel(cfg, tp, 1)
    assert message in exc.value.message
    assert "--tensor-parallel-size" in exc.value.hint


def test_what_fits_is_what_the_hint_offers():
    with pytest.raises(BadInput) as exc:
        check_parallel(_config(4096, 11008, 32, 32), 4, 1)
    # 11008 = 2^8 x 43: 2 GPUs hold 43 groups of 128 each, 4 would hold 21.5
    assert "use --tensor-parallel-size 1 or 2 for" in exc.value.hint
    assert "divides 2752" in exc.value.hint
    assert check_parallel(_config(4096, 11008, 32, 32), 2, 1) == []
    # the same model unquantized has no groups to keep whole
    assert check_parallel(_config(4096, 11008, 32, 32, group=None), 4, 1) == []


def test_a_shard_below_the_fast_kernels_tile_is_a_note():
    # the demo model (hidden 576, 9 heads, 3 KV heads, MLP 1536) at group 32 over 3 GPUs:
    # o_proj keeps 192 columns each (a whole number of groups), down_proj 512
    notes = check_parallel(_config(576, 1536, 9, 3, layers=30, group=32), 3, 1)
    assert notes == []
    notes = check_parallel(_config(576, 1632, 9, 3, layers=30, group=32), 3, 1)
    assert len(notes) == 1 and "mlp.down_proj: 544 input columns per GPU" in notes[0]


def test_pipeline_stages_cannot_outnumber_the_layers():
    assert check_parallel(LLAMA3_8B, 2, 4) == []
    with pytest.raises(BadInput, match="--pipeline-parallel-size 40 exceeds the model's 32 layers"):
        check_parallel(LLAMA3_8B, 1, 40)


def test_vllm_gets_the_split(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA3_8B, "max_position_embeddings": 8192}))
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    t = resolve_target(tmp_path)
    cmd = vllm_command("vllm", t, ServeConfig(tensor_parallel_size=2, pipeline_parallel_size=2),
                       9000, 4096)
    flags = dict(zip(cmd[2::2], cmd[3::2]))
    assert flags["--tensor-parallel-size"] == "2" and flags["--pipeline-parallel-size"] == "2"
    one = vllm_command("vllm", t, ServeConfig(), 9000, 4096)
    assert "--tensor-parallel-size" not in one and "--pipeline-parallel-size" not in one


@pytest.mark.parametrize("args,message", [
    (["--tensor-parallel-size", "3"], "has 4 attention heads, not a multiple of 3"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0 must be at least 1"),
    (["--engine", "transformers", "--tensor-parallel-size", "2"],
     "transformers serves on one device"),
])
def test_serve_refuses_a_split_before_starting(args, message, cli, tiny_artifact, tmp_path):
    """exit 2, one error line naming the problem and one hint, no engine started, no file left."""
    log = tmp_path / "engine.log"
    code, out, err = cli("serve", str(tiny_artifact), "--allow-unvalidated", "--port", "8931",
                         "--log-file", str(log), *args)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], err
    assert any(line.startswith("hint:") for line in err.splitlines())
    assert not log.exists()


def test_doctor_reports_the_layout_and_idle_gpus():
    from quantkit.loadtest.doctor import check_parallel_layout

    two = {"count": 2}
    split = check_parallel_layout({"tensor_parallel_size": 2}, "vllm", two)
    assert split["status"] == "pass" and "over 2 GPU(s)" in split["reason"]
    idle = check_parallel_layout({}, "vllm", {"count": 4})
    assert idle["status"] == "warn" and "3 idle" in idle["reason"]
    assert "--tensor-parallel-size 4" in idle["fix"]
    one = check_parallel_layout({}, "llama.cpp", None)
    assert one["status"] == "pass" and "one device" in one["reason"]
    assert check_parallel_layout({}, "transformers", two)["status"] == "warn"
