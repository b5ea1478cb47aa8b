"""CPU: the architecture table. Per dense architecture, a tiny random-weight model built by
transformers' own class (tests/_models.py's `build`, as tests/quantize/test_architectures.py
makes them, with the tests' BPE tokenizer), quantized with GPTQ and AWQ (W4 g32) from one
calibration set, reloaded in transformers, and its mean per-token KL to the original next to
that of a copy with scrambled scales (mixture-of-experts models: also a copy with experts 0 and 1
swapped in every layer), and for those the tokens each expert was routed.

usage: python bench/arch_table.py OUT.json [KIND ...]   (default: the dense architectures)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "quantize"))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    from _damage import scramble_scales, swap_experts
    from _models import DENSE, MOE, TIED, build, tiny_tokenizer
    from _models import kl as _kl

    from quantkit.calib import calibrate, load_calibration_set
    from quantkit.config import CalibrateConfig, QuantizeConfig
    from quantkit.quantize import quantize
    from quantkit.quantize.structure import read_structure

    out = Path(sys.argv[1])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny_tokenizer(work / "tok")
        src = work / "stdlib"
        src.mkdir()
        import sysconfig

        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[40:100]:
            (src / p.name).write_text(p.read_text(errors="replace"))
        for kind in sys.argv[2:] or DENSE:
            model = build(kind, work / "tok", work / kind / "model", **MOE.get(kind, {}),
                          tie_word_embeddings=kind in TIED)
            calib = work / kind / "calib"
            calibrate(model=str(model), out=calib, cfg=CalibrateConfig(
                sources=(str(src),), samples=16, min_tokens=64, max_tokens=128))
            samples = load_calibration_set(calib).input_ids[:4]
            family = read_structure(model)
            row = {"architecture": kind, "groups": ["/".join(g) for g in family.sequential],
                   "awq_folds": [m.prev for m in family.awq],
                   **({"experts_read": family.experts.describe()} if family.experts else {})}
            for method in ("gptq", "awq"):
                art = work / kind / method
                t = time.time()
                quantize(model=str(model), calib=calib, out=art,
                         cfg=QuantizeConfig(method=method, group_size=32))
                row[f"{method}_s"] = round(time.time() - t, 1)
                if kind in MOE:
                    manifest = json.loads((art / "quantkit.json").read_text())
                    row["experts"] = {k: v for k, v in manifest["experts"].items()
                                      if k not in ("layers", "under_floor_by_layer")}
                    swap_experts(art, work / kind / f"{method}-swapped")
                    row[f"{method}_swapped_kl"] = round(_kl(
                        model, work / kind / f"{method}-swapped", samples), 5)
                row[f"{method}_kl"] = round(_kl(model, art, samples), 5)
                scramble_scales(art, work / kind / f"{method}-damaged")
                row[f"{method}_damaged_kl"] = round(_kl(model, work / kind / f"{method}-damaged",
                                                        samples), 5)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
