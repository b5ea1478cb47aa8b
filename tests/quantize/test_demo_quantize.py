"""The demo model end to end through the CLI at group 64: perplexity must stay within a bound.

Bound, from docs/BENCHMARKS.md: on this held-out text our GPTQ (act-order, g64, 32 x 512 tokens)
gave +19.6% perplexity over fp32 where llm-compressor gave +20.0% and round-to-nearest is worse
than both. The test asks for less than +30% and strictly better than round-to-nearest.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch

from quantkit.engines.hf import model_perplexity, token_windows
from quantkit.quantize.numerics import fake_quantize

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # a quality check on the demo model


def test_demo_gptq_g64_perplexity(demo_model, cli, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = Path(sysconfig.get_paths()["stdlib"])
    held = [f.read_text() for f in sorted((root / "email").glob("*.py")) if f.stat().st_size]
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"text": t}) + "\n" for t in held))
    calib = tmp_path / "calib"
    assert cli("calibrate", "smollm2-135m", "--source", "builtin:stdlib-docs@0.5", "--source",
               "builtin:stdlib-code@0.5", "--samples", "32", "--min-tokens", "512",
               "--max-tokens", "512", "--exclude", str(heldout), "--out", str(calib))[0] == 0
    out = tmp_path / "gptq"
    code, _, err = cli("quantize", "smollm2-135m", "--method", "gptq", "--calib", str(calib),
                       "--group-size", "64", "--out", str(out))
    assert code == 0, err
    tok = AutoTokenizer.from_pretrained(demo_model)
    windows = token_windows(tok, held, 512, 16)

    def load(path: Path) -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    fp = model_perplexity(load(demo_model), windows)
    ours = model_perplexity(load(out), windows)
    rtn_model = load(demo_model)
    for mod in rtn_model.model.layers.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.weight.data = fake_quantize(mod.weight.data, 4, 64, True)
    rtn = model_perplexity(rtn_model, windows)
    assert ours < rtn, (fp, ours, rtn)
    assert ours < 1.30 * fp, (fp, ours, rtn)
    manifest = json.loads((out / "quantkit.json").read_text())
    assert manifest["parameters"]["act_order"] is True and len(manifest["layer_errors"]) == 30
