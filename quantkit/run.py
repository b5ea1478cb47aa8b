"""`run()`: a recipe's calibrate -> quantize -> validate -> report, reusing finished steps.

A step is reused when its output exists and was made from the same inputs: the recipe section,
the upstream step's output identity and quantkit's version, recorded in `.quantkit-runs/NAME.json`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

from quantkit import __version__, console
from quantkit.recipe import Recipe, as_dict, load_recipe

STATE_DIR = Path(".quantkit-runs")


def run(*, recipe: Path, force: bool = False) -> dict[str, Any]:
    """Run every step of the recipe; return the steps (reused or not, seconds) and the results."""
    r = load_recipe(recipe)
    state_file = STATE_DIR / f"{r.name}.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() and not force else {}
    steps: dict[str, Any] = {}

    def step(name: str, inputs: Any, output: Path, identity: Callable[[], str],
             work: Callable[[], Any]) -> str:
        key = _key([inputs, __version__])
        prev = state.get(name, {})
        if prev.get("key") == key and output.exists() and prev.get("identity") == _safe(identity):
            console.log(f"{name}: reusing {output} (inputs unchanged)")
            steps[name] = {"reused": True, "output": str(output), "seconds": 0.0}
            return str(prev["identity"])
        console.log(f"{name}: running -> {output}")
        t = time.time()
        work()
        ident = identity()
        state[name] = {"key": key, "identity": ident}
        STATE_DIR.mkdir(exist_ok=True)
        state_file.write_text(json.dumps(state, indent=2))
        steps[name] = {"reused": False, "output": str(output), "seconds": round(time.time() - t, 1)}
        return ident

    out = r.outputs
    calib_id = step("calibrate", [r.model, as_dict(r.calibration)], Path(out.calib),
                    lambda: _file_sha(Path(out.calib) / "samples.jsonl"),
                    lambda: _calibrate(r))
    art_id = step("quantize", [calib_id, r.model, as_dict(r.quantize)], Path(out.artifact),
                  lambda: _file_sha(Path(out.artifact) / "quantkit.json"),
                  lambda: _quantize(r))
    step("validate", [art_id, r.model, as_dict(r.validate)], Path(out.report),
         lambda: _file_sha(Path(out.report) / "results.json"), lambda: _validate(r))
    from quantkit.report import write_report

    write_report(Path(out.report))  # cheap, and picks up a newer report layout
    results = json.loads((Path(out.report) / "results.json").read_text())
    return {"recipe": str(recipe), "name": r.name, "steps": steps, "gate": results["gate"],
            "results": results}


def _calibrate(r: Recipe) -> None:
    from quantkit.calib import calibrate

    c = r.calibration
    calibrate(model=r.model, sources=list(c.sources), out=Path(r.outputs.calib), samples=c.samples,
              min_tokens=c.min_tokens, max_tokens=c.max_tokens, seed=c.seed,
              exclude=[Path(e) for e in c.exclude], target=Path(c.target) if c.target else None,
              force=True)


def _quantize(r: Recipe) -> None:
    from quantkit.quantize import quantize

    q = r.quantize
    quantize(model=r.model, method=q.method, calib=Path(r.outputs.calib),
             out=Path(r.outputs.artifact), bits=q.bits, group_size=q.group_size, sym=q.sym,
             act_order=q.act_order, damp=q.damp, device=q.device, quant_type=q.quant_type,
             imatrix=q.imatrix, force=True)


def _validate(r: Recipe) -> None:
    from quantkit.validate import validate

    v = r.validate
    validate(artifact=Path(r.outputs.artifact), baseline=r.model, out=Path(r.outputs.report),
             tasks=list(v.tasks) or None, domain_set=Path(v.domain_set) if v.domain_set else None,
             limit=v.limit, thresholds_data=v.thresholds or None,
             mmlu_data=Path(v.mmlu_data) if v.mmlu_data else None, samples=v.samples,
             temperature=v.temperature, top_p=v.top_p, max_tokens=v.max_tokens, seed=v.seed,
             threads=v.threads, humaneval_limit=v.humaneval_limit,
             humaneval_max_tokens=v.humaneval_max_tokens, force=True)


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _file_sha(path: Path) -> str:
    from quantkit.fsutil import sha256_file

    return sha256_file(path)


def _safe(identity: Callable[[], str]) -> str | None:
    try:
        return identity()
    except OSError:
        return None
