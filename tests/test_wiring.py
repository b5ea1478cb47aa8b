"""The wiring between the CLI, the recipe and the stages: one config per stage, one default per
option, a flag and a recipe key for every option, an explicit flag over the recipe's value."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from quantkit import config as rc
from quantkit.cli import app
from quantkit.errors import QuantkitError

# command -> (config class, recipe section, the stage function the command calls)
STAGES = {
    "calibrate": (rc.CalibrateConfig, "calibration", "quantkit.calib.calibrate"),
    "quantize": (rc.QuantizeConfig, "quantize", "quantkit.quantize.quantize"),
    "validate": (rc.ValidateConfig, "validate", "quantkit.validate.validate"),
    "serve": (rc.ServeConfig, "serve", "quantkit.serve.serve"),
    "bench": (rc.BenchConfig, "bench", "quantkit.loadtest.bench"),
}
# parameters that say where inputs and outputs are, or how to run, not how the stage works
NOT_CONFIG = {"model", "out", "calib", "artifact", "baseline", "recipe", "force", "resume",
              "reports", "log_file", "allow_unvalidated"}
# a valid value other than the default, for every option
VALUES: dict[str, dict[str, Any]] = {
    "calibrate": {"sources": ("builtin:stdlib-docs@0.7", "builtin:stdlib-code@0.3"),
                  "samples": 130, "min_tokens": 256, "max_tokens": 1024, "seed": 3,
                  "exclude": ("recipes/data/demo-domain.jsonl",),
                  "target": "recipes/data/demo-domain.jsonl", "self_traces": 4,
                  "trace_temperature": 0.6, "trace_top_p": 0.9, "trace_max_tokens": 64},
    "quantize": {"method": "awq", "bits": 8, "group_size": 64, "sym": False, "act_order": False,
                 "damp": 0.05, "clip": "mse", "device": "cpu", "batch_tokens": 2048, "quant_type": "Q5_K_M",
                 "imatrix": False, "threads": 1, "heldout": "README.md", "activations": "disk"},
    "validate": {"tasks": ("domain", "sampling"), "task_path": ("recipes/tasks",),
                 "engine": "transformers",
                 "domain_set": "recipes/data/demo-domain.jsonl",
                 "limit": 2, "humaneval_limit": 3, "humaneval_max_tokens": 100, "sandbox": "basic",
                 "mmlu_data": "cais/mmlu", "samples": 8, "temperature": 0.7, "top_p": 0.8,
                 "max_tokens": 50, "seed": 4, "threads": 1, "long_context_samples": 5,
                 "thinking": "off", "thinking_budget": 512, "seeds": 2,
                 "thresholds": {"domain": {"ppl_increase": 0.1}}},
    "serve": {"engine": "vllm", "host": "127.0.0.2", "port": 8123, "api_key": "k",
              "max_num_seqs": 3, "ctx_size": 1024, "gpu_memory_utilization": 0.8,
              "block_size": 32, "enable_chunked_prefill": False, "draft_model": "d",
              "num_speculative_tokens": 5, "vllm_python": "/opt/vllm/bin/python", "threads": 1,
              "extra_args": ("--foo", "bar"), "kernel": "machete", "expected_concurrency": 2},
    "bench": {"url": "http://127.0.0.1:9", "requests": 7, "concurrency": "1,3", "mix": "short:1",
              "max_tokens": "16", "api_key": "k", "model": "m", "endpoint": "completions",
              "p99_ttft_target": 2.5, "p99_e2e_target": 9.0, "timeout": 30.0, "seed": 2,
              "warmup": 2, "min_seconds": 1.5, "repeats": 5},
}

# options valid only together with other defaults (GPTQ at 4 bits, and --awq-scales apart from
# --hessians original): each set is checked on its own, their union covers every option
MORE_VALUES: dict[str, list[dict[str, Any]]] = {
    "quantize": [{"method": "gptq", "w8_groups": "10%", "sensitivity_tokens": 256, "expert_floor": 64,
                  "stream": False,
                  "awq_scales": True}, {"method": "gptq", "hessians": "original"},
                 {"method": "fp8", "static": True, "kv_cache": "fp8", "activations": "fp8,memory"}],
    "serve": [{"engine": "vllm", "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
               "kv_cache_dtype": "fp8"}],
}
VALUE_SETS = [(c, v) for c in VALUES for v in [VALUES[c], *MORE_VALUES.get(c, [])]]
SET_IDS = [f"{c}-{i}" for c, v in VALUE_SETS for i in [[VALUES[c], *MORE_VALUES.get(c, [])].index(v)]]


class Captured(QuantkitError):
    """Raised by the stand-in stage once it has recorded the config the CLI built."""


def _params(command: str) -> dict[str, Any]:
    click_cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in click_cmd.params}


def _flags(command: str, values: dict[str, Any], tmp: Path) -> list[str]:
    """The command-line flags that set `values` (as a user would type them)."""
    params, out = _params(command), []
    for name, value in values.items():
        p = params[name]
        if isinstance(value, bool):
            out.append(p.opts[0] if value else (p.secondary_opts or p.opts)[0])
        elif name == "thresholds":  # a YAML file on the command line
            f = tmp / "t.yaml"
            f.write_text(yaml.safe_dump(value))
            out += [p.opts[0], str(f)]
        elif name == "tasks":
            out += [p.opts[0], ",".join(value)]
        elif isinstance(value, tuple):
            for v in value:
                out += [p.opts[0], str(v)]
        else:
            out += [p.opts[0], str(value)]
    return out


def _recipe(tmp: Path, section: str, values: dict[str, Any]) -> Path:
    data = {"version": 1, "name": "w", "model": "smollm2-135m",
            "calibration": {"sources": ["builtin:stdlib-docs"]}, "quantize": {"method": "gptq"},
            "outputs": {"calib": str(tmp / "c"), "artifact": str(tmp / "a"),
                        "report": str(tmp / "r")}}
    data[section] = {**data.get(section, {}),
                     **{k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}}
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _built(command: str, args: list[str], monkeypatch: pytest.MonkeyPatch, cli: Any) -> Any:
    """The config the CLI hands to the stage for these arguments."""
    module, fn = STAGES[command][2].rsplit(".", 1)
    seen: dict[str, Any] = {}

    def stage(*_a: Any, cfg: Any, **_kw: Any) -> None:
        seen["cfg"] = cfg
        raise Captured("captured")

    monkeypatch.setattr(f"{module}.{fn}", stage)
    code, _, err = cli(command, *args)
    assert "cfg" in seen, err
    assert code == 3 and "captured" in err
    return seen["cfg"]


def _positional(command: str, tmp: Path) -> list[str]:
    return {"calibrate": ["smollm2-135m", "--out", str(tmp / "o")],
            "quantize": ["smollm2-135m", "--calib", str(tmp / "c"), "--out", str(tmp / "o")],
            "validate": [str(tmp / "a"), "--baseline", "smollm2-135m", "--out", str(tmp / "o")],
            "serve": [str(tmp / "a")], "bench": ["--out", str(tmp / "o")]}[command]


@pytest.mark.parametrize("command", STAGES)
def test_every_option_has_one_flag_and_one_recipe_key(command: str) -> None:
    cls, section, _ = STAGES[command]
    fields = {f.name for f in dataclasses.fields(cls)}
    flags = {p for p in _params(command) if p in fields or p not in NOT_CONFIG}
    assert flags == fields, f"flags without a config field: {flags - fields}; " \
                            f"config fields without a flag: {fields - flags}"
    assert rc.SECTIONS[section] is cls  # the recipe section is the same dataclass
    sets = [VALUES[command], *MORE_VALUES.get(command, [])]
    assert set().union(*sets) == fields  # these tests set every option
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        owner = next(v for v in sets if f.name in v)  # the set that tests this option
        assert owner[f.name] != default, f"{f.name}: pick a non-default test value"


@pytest.mark.parametrize("command,values", VALUE_SETS, ids=SET_IDS)
def test_cli_and_recipe_build_the_same_config(command: str, values: dict[str, Any],
                                              tmp_path: Path, cli: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cls, section, _ = STAGES[command]
    expected = cls(**values)
    # all options as flags
    assert _built(command, _positional(command, tmp_path) + _flags(command, values, tmp_path),
                  monkeypatch, cli) == expected
    # all options from the recipe section
    r = _recipe(tmp_path, section, values)
    assert rc.load_recipe(r).__getattribute__(section) == expected
    assert _built(command, _positional(command, tmp_path) + ["--recipe", str(r)],
                  monkeypatch, cli) == expected
    # no flag, no recipe key: the config's own default
    if command not in ("calibrate",):  # calibrate needs a source
        base = _built(command, _positional(command, tmp_path) + (
            ["--method", "gptq"] if command == "quantize" else
            ["--url", "http://127.0.0.1:9"] if command == "bench" else []), monkeypatch, cli)
        assert base == dataclasses.replace(cls(), **(
            {"method": "gptq"} if command == "quantize" else
            {"url": "http://127.0.0.1:9"} if command == "bench" else {}))


@pytest.mark.parametrize("command", STAGES)
def test_a_flag_given_overrides_the_recipe(command: str, tmp_path: Path, cli: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cls, section, _ = STAGES[command]
    values = VALUES[command]
    r = _recipe(tmp_path, section, values)
    name = {"calibrate": "samples", "quantize": "bits", "validate": "seed", "serve": "port",
            "bench": "requests"}[command]
    new = {"samples": 200, "bits": 4, "seed": 9, "port": 8200, "requests": 3}[name]
    cfg = _built(command, _positional(command, tmp_path) + ["--recipe", str(r)]
                 + _flags(command, {name: new}, tmp_path), monkeypatch, cli)
    assert cfg == dataclasses.replace(cls(**values), **{name: new})


def test_recipe_is_checked_whole_before_any_step(tmp_path: Path, cli: Any) -> None:
    """A bad validate: section stops `run` before calibration writes anything."""
    out = {"calib": str(tmp_path / "c"), "artifact": str(tmp_path / "a"),
           "report": str(tmp_path / "r")}
    cases = [({"validate": {"samples": "many"}}, "validate.samples"),
             ({"validate": {"temperature": 5.0}}, "--temperature 5.0 is out of range"),
             ({"validate": {"thresholds": {"mmlu": {"retention": "high"}}}}, "mmlu.retention"),
             ({"validate": {"tasks": ["domain"]}}, "needs a domain test set"),
             ({"quantize": {"method": "gptq", "bits": 3}}, "--bits 3"),
             ({"serve": {"port": 0}}, "--port 0"),
             ({"bench": {"endpoint": "x"}}, "--endpoint"),
             ({"validate": {"domain_set": str(tmp_path / "nope.jsonl"), "tasks": ["domain"]}},
              "nope.jsonl")]
    for extra, words in cases:
        data = {"version": 1, "name": "w", "model": "smollm2-135m",
                "calibration": {"sources": ["builtin:stdlib-docs"]},
                "quantize": {"method": "gptq"}, "outputs": out, **extra}
        if "quantize" in extra:
            data["quantize"] = extra["quantize"]
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump(data))
        code, _, err = cli("run", str(path))
        assert code == 2, (extra, err)
        assert words in err and err.count("error:") == 1, (extra, err)
        assert not any((tmp_path / k).exists() for k in ("c", "a", "r")), extra


def test_recipe_bytes_and_types(tmp_path: Path, cli: Any) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"version: 1\nname: \xff\xfe\n")
    code, _, err = cli("run", str(path))
    assert code == 2 and "not UTF-8" in err
    path.write_text("version: 1\nname: [a]\nmodel: m\n")
    code, _, err = cli("run", str(path))
    assert code == 2 and "name must be a non-empty string" in err
