"""The plug points: a task and a method registered in the test itself, with no other change, are
reachable from the CLI, a recipe, the gate, the report and `quantkit auto`'s grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml
from data.toy_plugin.quantkit_toy_plugin.method import rtn_layer
from data.toy_plugin.quantkit_toy_plugin.options import AgreeOptions, RTNOptions
from data.toy_plugin.quantkit_toy_plugin.task import METRICS, agreement

from quantkit.errors import BadInput


@pytest.fixture
def toys() -> Iterator[None]:
    from quantkit.methods import METHODS, Method, register_method
    from quantkit.tasks import TASKS, Task, register_task

    # registered after the config is built: their options run on their defaults (no flags)
    register_task(Task("toy", run=agreement, title="Toy agreement", metrics=METRICS,
                       options=AgreeOptions))
    register_method(Method("rtn", "round-to-nearest", layer=rtn_layer,
                           ladder=("W4g32", "W8"), options=RTNOptions))
    yield
    TASKS.unregister("toy")
    METHODS.unregister("rtn")


def test_toy_method_and_task_from_the_cli_recipe_gate_and_report(toys, cli, tiny_model, corpus,
                                                                  tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    calib, art, out = tmp_path / "calib", tmp_path / "art", tmp_path / "report"
    code, _, err = cli("calibrate", str(tiny_model), "--source", str(corpus["prose"]),
                       "--samples", "8", "--min-tokens", "64", "--max-tokens", "128",
                       "--out", str(calib))
    assert code == 0, err
    # the method: the CLI's --method, quantize()'s dispatch, the artifact's manifest
    code, _, err = cli("quantize", str(tiny_model), "--method", "rtn", "--group-size", "32",
                       "--calib", str(calib), "--out", str(art))
    assert code == 0, err
    manifest = json.loads((art / "quantkit.json").read_text())
    assert manifest["method"] == "rtn" and manifest["checkpoint"] == "compressed-tensors"
    assert manifest["parameters"]["rtn_clip"] == 1.0  # its own option, on its default
    # the task: the CLI's --tasks, the gate's thresholds, the summary and the report
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("toy: {agreement: 0.0}\n")
    code, stdout, err = cli("validate", str(art), "--baseline", str(tiny_model), "--tasks", "toy",
                            "--thresholds", str(thresholds), "--out", str(out))
    assert code == 0, err
    res = json.loads((out / "results.json").read_text())
    assert list(res["tasks"]) == ["toy"] and res["gate"]["verdict"] == "pass"
    assert res["gate"]["checks"][0]["metric"] == "agreement"
    assert "toy.agreement" in stdout and "toy.retention" in stdout
    html = (out / "report.html").read_text()
    assert "Toy agreement" in html and 'id="toy"' in html
    # a recipe names both; auto's grammar parses the method's candidates
    from quantkit.config import AutoConfig, load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "version": 1, "name": "toy", "model": str(tiny_model),
        "calibration": {"sources": [str(corpus["prose"])]},
        "quantize": {"method": "rtn", "group_size": 32},
        "validate": {"tasks": ["toy"], "thresholds": {"toy": {"agreement": 0.5}}},
        "auto": {"method": "rtn"},
        "outputs": {"calib": str(calib), "artifact": str(art), "report": str(out)}}))
    r = load_recipe(recipe)
    assert r.quantize.method == "rtn" and r.validate.run_tasks == ["toy"]
    assert r.auto is not None and r.auto.ladder == ("W4g32", "W8")
    assert AutoConfig(method="rtn", candidates=("W4g64+10%",)).ladder == ("W4g64+10%",)


def test_unknown_names_say_what_is_known(cli, tmp_path):
    from quantkit.config import QuantizeConfig
    from quantkit.methods import METHODS

    with pytest.raises(BadInput, match=r"unknown method 'gptqq' \(did you mean 'gptq'\?\)"):
        QuantizeConfig(method="gptqq").check()
    assert list(METHODS) == ["gptq", "awq", "fp8", "gguf"]
    code, _, err = cli("quantize", "smollm2-135m", "--method", "awk", "--calib", str(tmp_path),
                       "--out", str(tmp_path / "o"))
    assert code == 2 and "did you mean 'awq'" in err and "gptq, awq, fp8, gguf" in err
    assert not (tmp_path / "o").exists()


def test_help_lists_the_registries_without_torch():
    import subprocess
    import sys

    code = ("import sys, quantkit.cli, typer.main; quantkit.cli.app(['validate', '--help'], "
            "standalone_mode=False); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin",
                              **{k: v for k, v in __import__("os").environ.items()
                                 if k.startswith(("PYTHON", "HOME"))}})
    assert out.stdout.strip().endswith("False"), out.stderr[-2000:]
    assert "mmlu,humaneval,domain,sampling" in out.stdout and "--task-path" in out.stdout


def test_options_follow_the_methods_traits_not_their_names(toys):
    """What a method supports is declared on it: the toy method (no traits) is refused every
    option another method's quantizer honours, takes what the layer-by-layer engine gives every
    layerwise method, and FP8's fixed bits, group and activations come from its entry."""
    from quantkit.config import QuantizeConfig
    from quantkit.methods import METHODS, Method

    refused = {"act_order": (True, "--act-order applies to GPTQ only"),
               "hessians": ("original", "--hessians applies to GPTQ only"),
               "awq_scales": (True, "--awq-scales applies to GPTQ only"),
               "activations": ("fp8", "--activations fp8 does not apply to --method rtn"),
               "w8_groups": ("2", "--w8-groups applies to GPTQ/AWQ at --bits 4"),
               "static": (True, "--static applies to --method fp8")}
    for option, (value, said) in refused.items():
        with pytest.raises(BadInput, match=said):
            QuantizeConfig(method="rtn", **{option: value}).check()
    QuantizeConfig(method="rtn", kv_cache="fp8", activations="disk").check()
    assert not QuantizeConfig(method="rtn").uses_act_order
    assert QuantizeConfig(method="gptq").uses_act_order
    fp8 = QuantizeConfig(method="fp8", bits=4, group_size=32)
    assert (fp8.weight_bits, fp8.weight_group_size, fp8.activation_format) == (8, -1, "fp8")
    assert [n for n in METHODS if METHODS[n].moe] == ["gptq", "awq", "gguf"]
    with pytest.raises(ValueError, match="unknown trait 'act-order'"):
        Method("bad", "bad", layer=rtn_layer, supports=frozenset({"act-order"}))


def test_method_options_join_the_config_once_per_family():
    """A method's own options are fields of the config after its own (the same dataclass named by
    a family of methods joins once); a built-in's option that clashes is a TypeError."""
    import dataclasses

    from quantkit.config.options import read, with_options
    from quantkit.methods import Method
    from quantkit.methods.gptq import GPTQOptions
    from quantkit.registry import Registry

    methods: Registry[Method] = Registry("method", "--method")
    for name in ("a", "b"):
        methods.register(name, Method(name, name, layer=rtn_layer, options=GPTQOptions))
    methods.register("c", Method("c", "c", layer=rtn_layer, options=RTNOptions))

    @dataclasses.dataclass(frozen=True)
    class Config:
        bits: int = 4

    joined = with_options(methods, "quantize")(Config)
    assert [f.name for f in dataclasses.fields(joined)] == [
        "bits", "act_order", "damp", "clip", "awq_scales", "hessians", "rtn_clip"]
    cfg = joined(damp=0.05, rtn_clip=0.8)  # type: ignore[call-arg]
    assert read(GPTQOptions, cfg).damp == 0.05 and read(RTNOptions, cfg) == RTNOptions(0.8)

    @dataclasses.dataclass(frozen=True)
    class Clashing:
        bits: int = 8

    methods.register("d", Method("d", "d", layer=rtn_layer, options=Clashing))
    with pytest.raises(TypeError, match="method d: option bits is left out: quantize has an "
                                        "option of that name"):
        with_options(methods, "quantize")(Config)


def test_a_failed_gates_report_asks_the_method_what_to_try_instead(toys):
    from quantkit.methods import instead

    assert instead("gptq", {"act_order": True}) == "AWQ"
    assert instead("gptq", {"act_order": False}) == "GPTQ with act_order, or AWQ,"
    assert instead("awq", {}) == "GPTQ with act_order"
    assert instead("rtn", {}) == instead("no-longer-installed", {}) == "GPTQ or AWQ"
