"""The engine commands quantkit builds and the checks around them. vLLM cannot run on these
machines (no NVIDIA GPU), so its command, compatibility check and kernel check are tested here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantkit.config import ServeConfig, build, load_recipe
from quantkit.contract import ArtifactRecord, BaselineRecord, GateDecision
from quantkit.engines.choice import checkpoint_of, choose_engine
from quantkit.errors import BadInput
from quantkit.gpu import gpu_present
from quantkit.results import Results
from quantkit.serve.engines.llama_cpp import llama_server_launch
from quantkit.serve.engines.vllm import kernel_env, kernel_from_log, kernel_warning, vllm_command
from quantkit.serve.target import Target, find_validation, resolve_target
from quantkit.serve.vllm_checks import check_vllm_compat

CT = {"quant_method": "compressed-tensors", "format": "pack-quantized", "version": "0.12.2"}


def _hf_target(tmp_path: Path, quant: dict | None = None) -> Target:
    (tmp_path / "config.json").write_text(json.dumps(
        {"max_position_embeddings": 2048, "quantization_config": quant or CT}))
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    return resolve_target(tmp_path)


def test_vllm_command_carries_the_recipe_and_never_forces_quantization(tmp_path):
    t = _hf_target(tmp_path)
    opts = ServeConfig(max_num_seqs=64, gpu_memory_utilization=0.9, block_size=16, api_key="k",
                       draft_model="org/draft-1b", num_speculative_tokens=6)
    cmd = vllm_command("/envs/vllm/bin/python", t, opts, 9000, 4096)
    assert cmd[:4] == ["/envs/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"]
    assert "--quantization" not in cmd and "-q" not in cmd
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert flags["--gpu-memory-utilization"] == "0.9" and flags["--block-size"] == "16"
    assert flags["--max-num-seqs"] == "64" and flags["--max-model-len"] == "4096"
    assert flags["--served-model-name"] == t.name and flags["--host"] == "127.0.0.1"
    assert "--enable-chunked-prefill" in cmd
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "model": "org/draft-1b", "num_speculative_tokens": 6}
    off = vllm_command("vllm", t, ServeConfig(enable_chunked_prefill=False), 9000, 4096)
    assert off[:2] == ["vllm", "serve"] and "--no-enable-chunked-prefill" in off


def test_a_draft_model_must_share_the_vocabulary(tmp_path):
    """vLLM drafts token ids: a draft folder with another vocabulary is refused before any
    start, naming both sizes; a missing folder is refused; a hub id is vLLM's to check."""
    from quantkit.errors import BadInput
    from quantkit.serve.engines.vllm import check_draft

    (tmp_path / "art").mkdir()
    _hf_target(tmp_path / "art")
    hf = json.loads((tmp_path / "art" / "config.json").read_text())
    (tmp_path / "art" / "config.json").write_text(json.dumps({**hf, "vocab_size": 128256}))
    t = resolve_target(tmp_path / "art")
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    with pytest.raises(BadInput, match="vocabulary of 32000 tokens, the served model 128256"):
        check_draft(t, ServeConfig(draft_model=str(draft)))
    (draft / "config.json").write_text(json.dumps({"vocab_size": 128256}))
    assert "4 tokens drafted" in check_draft(t, ServeConfig(draft_model=str(draft)))[0]
    with pytest.raises(BadInput, match="does not exist"):
        check_draft(t, ServeConfig(draft_model=str(tmp_path / "nope")))
    assert "hub id" in check_draft(t, ServeConfig(draft_model="org/draft-1b"))[0]
    assert check_draft(t, ServeConfig()) == []


W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
      "actorder": "weight", "dynamic": False}
FP8_W = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}
FP8_TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
FP8_STATIC = {**FP8_TOKEN, "strategy": "tensor", "dynamic": False}
CTW = {**CT, "config_groups": {"group_0": {"targets": ["Linear"], "weights": W4,
                                           "input_activations": None}}, "ignore": ["lm_head"]}


def test_vllm_installed_in_this_python_serves_through_it(tmp_path, monkeypatch):
    """vLLM in quantkit's own Python but no `vllm` program on PATH (the `vllm` extra in a venv
    run by its path; vLLM on PYTHONPATH, as on the device, where `auto --load` served its
    candidates on transformers for want of it): `vllm serve` runs as this Python's module."""
    import importlib
    import sys

    from quantkit.serve.engines.vllm import vllm_executable, vllm_probe

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert vllm_probe(ServeConfig()) is not None  # no vLLM anywhere: the probe says so
    with pytest.raises(BadInput, match="nor in this Python"):
        vllm_executable(ServeConfig())
    site = tmp_path / "site"  # an installed distribution named vllm (its metadata), as pip leaves
    (site / "vllm-0.26.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.26.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert vllm_probe(ServeConfig()) is None
    assert vllm_executable(ServeConfig()) == sys.executable
    (tmp_path / "m").mkdir()
    t = _hf_target(tmp_path / "m")
    assert vllm_command(sys.executable, t, ServeConfig(), 9000, 2048)[:3] == [
        sys.executable, "-m", "vllm.entrypoints.cli.main"]
    # --vllm-python still wins over this Python
    other = tmp_path / "envs" / "bin" / "python"
    other.parent.mkdir(parents=True)
    other.write_text("")
    assert vllm_executable(ServeConfig(vllm_python=str(other))) == str(other)


def test_vllm_compat_checks_the_fields_vllm_reads():
    ships = {"vllm": "0.26.0", "compressed-tensors": "0.17.0"}
    assert check_vllm_compat({**CTW, "version": "0.17.0"}, ships) == []
    # a newer stamp is not a refusal: the fields decide (0.20-written artifacts load in 0.17)
    notes = check_vllm_compat({**CTW, "version": "0.20.1"}, ships)
    assert len(notes) == 1 and "0.20.1" in notes[0] and "0.17.0" in notes[0]

    def scheme(**w):
        return {**CTW, "config_groups": {"group_0": {"weights": {**W4, **w}}}}

    bad = [({**CT, "format": "sparse-bitmask"}, "format 'sparse-bitmask'"),
           ({"quant_method": "gptq"}, "compressed-tensors"),
           (CT, "no config_groups"),
           (scheme(num_bits=3), "3-bit"),
           (scheme(type="float"), "float 4-bit"),
           (scheme(group_size=256), "group size 256"),
           (scheme(strategy="tensor"), "strategy 'tensor'"),
           (scheme(actorder="sideways"), "actorder"),
           ({**CTW, "config_groups": {"g": {"weights": W4, "input_activations": {"num_bits": 8}}}},
            "None 8-bit activations are not FP8"),
           ({**CTW, "config_groups": {"g": {"weights": {**W4, "group_size": 64},
                                            "input_activations": FP8_TOKEN}}}, "groups of 128"),
           ({**CTW, "config_groups": {"g": {"weights": W4, "input_activations": FP8_STATIC}}},
            "tensor static are not"),
           ({**CTW, "config_groups": {"g": {"weights": {**FP8_W, "strategy": "group"},
                                            "input_activations": FP8_TOKEN}}},
            "not E4M3 per channel")]
    for cfg, words in bad:
        with pytest.raises(BadInput, match=words):
            check_vllm_compat(cfg, ships)
    with pytest.raises(BadInput, match="not a multiple of group size 128"):
        check_vllm_compat(CTW, ships, {"model.layers.0.mlp.down_proj": 200})
    assert "asymmetric" in check_vllm_compat(scheme(symmetric=False), {**ships,
                                             "compressed-tensors": "9.9"})[0]
    assert check_vllm_compat(scheme(strategy="channel", group_size=None), ships) == []


def test_fp8_and_w4a8_schemes_pass_with_a_note():
    ships = {"vllm": "0.26.0", "compressed-tensors": "0.17.0"}
    for weights, acts, fmt, words in ((FP8_W, FP8_TOKEN, "float-quantized", "CUTLASS FP8"),
                                      (FP8_W, FP8_STATIC, "float-quantized", "CUTLASS FP8"),
                                      (W4, FP8_TOKEN, "pack-quantized", "W4A8 kernel on Hopper")):
        cfg = {**CT, "format": fmt, "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": weights, "input_activations": acts}}}
        assert [n for n in check_vllm_compat(cfg, ships) if words in n]


def test_the_artifacts_own_manifest_is_checked(tiny_artifact):
    cfg = json.loads((tiny_artifact / "config.json").read_text())["quantization_config"]
    installed = __import__("compressed_tensors").__version__
    assert check_vllm_compat(cfg, {"vllm": "x", "compressed-tensors": installed}) == []
    notes = check_vllm_compat(cfg, {"vllm": "0.26.0", "compressed-tensors": "0.17.0"})
    assert [n for n in notes if "every field it reads was checked" in n]


def test_kernel_follows_the_load():
    assert ServeConfig(max_num_seqs=8).vllm_kernel == "marlin"
    assert ServeConfig(max_num_seqs=16).vllm_kernel == "marlin"
    assert ServeConfig(max_num_seqs=32).vllm_kernel == "machete"
    assert ServeConfig(max_num_seqs=256).vllm_kernel == "machete"
    assert ServeConfig(max_num_seqs=8, kernel="machete").vllm_kernel == "machete"
    # a server sized for 64 that mostly sees one user: Marlin (1.50x bf16 there, Machete 1.29x)
    assert ServeConfig(max_num_seqs=64, expected_concurrency=2).vllm_kernel == "marlin"
    assert ServeConfig(max_num_seqs=64, expected_concurrency=48).vllm_kernel == "machete"
    with pytest.raises(BadInput, match="outside 1 to --max-num-seqs 8"):
        ServeConfig(max_num_seqs=8, expected_concurrency=9).check()
    assert kernel_env(ServeConfig(max_num_seqs=8)) == {
        "VLLM_DISABLED_KERNELS": "MacheteLinearKernel"}
    assert kernel_env(ServeConfig(max_num_seqs=128)) == {
        "VLLM_DISABLED_KERNELS": "MarlinLinearKernel"}
    # --kernel vllm leaves the choice to vLLM: nothing is disabled, whatever the load
    assert kernel_env(ServeConfig(max_num_seqs=8, kernel="vllm")) == {}
    assert kernel_env(ServeConfig(max_num_seqs=128, kernel="vllm")) == {}
    assert "Marlin is faster" in str(kernel_warning("Machete", ServeConfig(max_num_seqs=4)))
    assert kernel_warning("Marlin", ServeConfig(max_num_seqs=4)) is None
    with pytest.raises(BadInput, match="unknown --kernel"):
        build(ServeConfig, None, {"kernel": "exllama"})


def test_dual_kernel_is_asked_of_quantkits_vllm_plugin(monkeypatch):
    from quantkit.serve import vllm_plugin

    dual = ServeConfig(max_num_seqs=64, kernel="dual")
    env = kernel_env(dual)
    # the plugin acts on its variable; the other keys vLLM's compile cache apart from an
    # unsteered run's (a graph compiled for another kernel is never loaded) and matches no kernel
    assert env == {"QUANTKIT_VLLM_KERNEL": "dual", "VLLM_DISABLED_KERNELS": "quantkit-dual"}
    assert kernel_warning("QuantkitDual", dual) is None
    assert "its plugin did not load" in str(kernel_warning("Machete", dual))
    # in a vLLM process without the variable the plugin does nothing (and imports no vLLM)
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    assert vllm_plugin.register() is None
    # Marlin up to the largest token count before which it was always the faster
    marlin = {1: 0.010, 8: 0.011, 16: 0.013, 32: 0.020, 64: 0.030}
    machete = {1: 0.012, 8: 0.012, 16: 0.012, 32: 0.018, 64: 0.022}
    assert vllm_plugin.choose_switch(marlin, machete) == 8
    assert vllm_plugin.choose_switch(machete, marlin) == 0
    assert vllm_plugin.choose_switch(marlin, {m: 1.0 for m in marlin}) == 64


def test_w4a8_tiles_kernel_is_asked_of_the_same_plugin(monkeypatch):
    """`--kernel w4a8-tiles`: the plugin's W4A8 kernel (vLLM's CUTLASS W4A8, its schedule chosen
    per token count from timings at load); vLLM's own schedule unless another is clearly faster."""
    from quantkit.serve import vllm_plugin

    tiles = ServeConfig(max_num_seqs=64, kernel="w4a8-tiles")
    assert kernel_env(tiles) == {"QUANTKIT_VLLM_KERNEL": "w4a8-tiles",
                                 "VLLM_DISABLED_KERNELS": "quantkit-w4a8-tiles"}
    assert kernel_warning("QuantkitW4A8Tiles", tiles) is None
    assert kernel_warning("QuantkitW4A8Tiles", ServeConfig(max_num_seqs=4)) is None  # the doctor's
    assert "--kernel w4a8-tiles asked for quantkit's kernel, vLLM uses CutlassW4A8" in str(
        kernel_warning("CutlassW4A8", tiles))
    monkeypatch.setenv(vllm_plugin.ENV, "w4a8")  # a value the plugin has no kernel for
    assert vllm_plugin.register() is None
    # the H100's qkv (2026-12-07, us): at 64 tokens 128x64 beats the heuristic by 1.9x; at 1 token
    # the best is 1% faster, inside the margin, so vLLM's own choice stays
    times = {1: {None: 31.6, "128x16_1x1x1": 31.3, "256x16_1x1x1": 38.7},
             64: {None: 72.0, "128x64_1x1x1": 38.4, "128x16_1x1x1": 52.1},
             256: {None: 90.0, "128x128_1x1x1": 60.0}}
    plan = vllm_plugin.choose_schedules(times)
    assert plan == {1: None, 64: "128x64_1x1x1", 256: "128x128_1x1x1"}
    assert vllm_plugin.choose_schedules(times, margin=0.0)[1] == "128x16_1x1x1"
    # a step's token count takes the plan of the smallest count timed at or above it
    assert [vllm_plugin.schedule_for(plan, n) for n in (1, 2, 64, 65, 256, 257)] == [
        None, "128x64_1x1x1", "128x64_1x1x1", "128x128_1x1x1", "128x128_1x1x1", None]
    assert vllm_plugin.W4A8_GRID == tuple(sorted(vllm_plugin.W4A8_GRID))


def test_a_plugin_kernel_asked_of_an_artifact_it_cannot_take_is_noted():
    """--kernel dual takes weight-only int artifacts, w4a8-tiles W4A8 ones; asked of another
    scheme, vLLM serves with its own kernel and the launch says so (a note: `auto`'s candidates
    of several formats share one --kernel)."""
    from quantkit.serve.engines.vllm import kernel_fit
    from quantkit.serve.vllm_checks import scheme_of

    w4a8 = {**CT, "config_groups": {"group_0": {"weights": W4, "input_activations": FP8_TOKEN}}}
    fp8 = {**CT, "config_groups": {"group_0": {"weights": FP8_W, "input_activations": FP8_TOKEN}}}
    assert [scheme_of(c) for c in (CTW, w4a8, fp8, None)] == [
        "weight-only int", "W4A8", "FP8", "unquantized"]
    dual, tiles = ServeConfig(kernel="dual"), ServeConfig(kernel="w4a8-tiles")
    assert kernel_fit(dual, CTW) == [] and kernel_fit(tiles, w4a8) == []
    assert kernel_fit(ServeConfig(), fp8) == [] and kernel_fit(ServeConfig(kernel="marlin"), None) == []
    assert kernel_fit(tiles, CTW) == ["--kernel w4a8-tiles runs W4A8 artifacts; this one is "
                                      "weight-only int: vLLM chooses its own kernel"]
    assert "this one is W4A8" in kernel_fit(dual, w4a8)[0]
    assert "this one is FP8" in kernel_fit(dual, fp8)[0]


@pytest.mark.parametrize("line,kernel,warns", [
    ("INFO 05-01 [compressed_tensors_wNa16.py:113] Using MacheteLinearKernel for "
     "CompressedTensorsWNA16", "Machete", False),
    ("INFO Using MarlinLinearKernel for CompressedTensorsWNA16", "Marlin", False),
    ("INFO Using ExllamaLinearKernel for CompressedTensorsWNA16", "Exllama", True),
    ("INFO Using ConchLinearKernel for GPTQMarlinLinearMethod", "Conch", True),
    # W4A8's one Hopper kernel (vLLM 0.26's line, H100 2026-12-07): no Marlin/Machete to ask for
    ("(EngineCore pid=3283) INFO 12-07 10:27:45 [compressed_tensors_w4a8_fp8.py:103] Using "
     "CutlassW4A8LinearKernel for CompressedTensorsW4A8Fp8", "CutlassW4A8", False),
    ("INFO loading weights took 3.2 s", None, False),
])
def test_kernel_check_reads_vllms_log(line, kernel, warns):
    assert kernel_from_log(line) == kernel
    if kernel:
        assert (kernel_warning(kernel) is not None) == warns
        if kernel == "CutlassW4A8":  # at any load: no other kernel takes W4A8 to swap it for
            assert all(kernel_warning(kernel, ServeConfig(max_num_seqs=n)) is None
                       for n in (4, 128))


def _gguf(path: Path) -> Path:
    """A real GGUF with no tensors: the header and architecture `resolve_target` checks."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(2048)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_llama_server_gets_batching_slots_gpu_layers_and_metrics(tmp_path):
    t = resolve_target(_gguf(tmp_path / "m.gguf"))
    launch = llama_server_launch(Path("/x/llama-server"), t,
                                 ServeConfig(max_num_seqs=4, api_key="k"), 9000, 2048)
    cmd = launch.cmd
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-c") + 1] == str(4 * 2048)
    for flag in ("--kv-unified", "-cb", "--metrics", "-fa"):
        assert flag in cmd
    assert cmd[cmd.index("-ngl") + 1] == "999" and cmd[cmd.index("--api-key") + 1] == "k"
    assert launch.batching and launch.metrics_path == "/metrics"


def test_engine_must_fit_the_format(tmp_path):
    f = _gguf(tmp_path / "m.gguf")
    gguf = checkpoint_of(resolve_target(f).path)
    for engine in ("vllm", "transformers"):
        with pytest.raises(BadInput, match="cannot run a GGUF artifact"):
            choose_engine(gguf, engine, "serve", ServeConfig(engine=engine))
    hf = _hf_target(tmp_path / "hf" if (tmp_path / "hf").mkdir() is None else tmp_path)
    ct = checkpoint_of(hf.path)
    with pytest.raises(BadInput, match="cannot run a compressed-tensors artifact"):
        choose_engine(ct, "llama.cpp", "serve", ServeConfig(engine="llama.cpp"))
    with pytest.raises(BadInput, match="unknown engine"):
        choose_engine(ct, "tgi", "serve", ServeConfig())
    with pytest.raises(BadInput, match="unknown --engine 'tgi'"):
        ServeConfig(engine="tgi").check()
    with pytest.raises(BadInput, match="vLLM is not installed|does not exist"):
        choose_engine(ct, "vllm", "serve", ServeConfig(vllm_python=str(tmp_path / "nope/python")))
    fake_env = tmp_path / "python"
    fake_env.write_text("")
    if not gpu_present():
        with pytest.raises(BadInput, match="needs an NVIDIA GPU"):
            choose_engine(ct, "vllm", "serve", ServeConfig(vllm_python=str(fake_env)))


def test_validation_lookup_takes_the_newest_result_for_this_sha(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    t = _hf_target(art)
    reports = tmp_path / "reports"

    def write(name: str, sha: str, verdict: str, created: str, **change) -> None:
        (reports / name).mkdir(parents=True)
        res = Results(quantkit_version="0.1.0", created=created, artifact=ArtifactRecord(sha256=sha),
                      baseline=BaselineRecord(), engine="transformers", settings={}, thresholds={},
                      tasks={}, gate=GateDecision(verdict, [], ["domain.ppl_increase"]
                                                  if verdict == "fail" else []),
                      timings={})
        (reports / name / "results.json").write_text(json.dumps({**res.to_dict(), **change}))

    reports.mkdir()
    with pytest.raises(BadInput, match="no validation"):
        find_validation(t, reports)
    write("other", "0" * 64, "pass", "2026-12-01T00:00:00")
    with pytest.raises(BadInput, match="no validation"):
        find_validation(t, reports)
    # another quantkit's (schema 1) or a damaged results.json is no validation of ours
    write("older-schema", t.sha256(), "pass", "2026-12-01T00:00:00", schema_version=1)
    (reports / "damaged").mkdir()
    (reports / "damaged" / "results.json").write_text("{not json")
    with pytest.raises(BadInput, match="no validation"):
        find_validation(t, reports)
    write("old", t.sha256(), "pass", "2026-11-01T00:00:00")
    assert find_validation(t, reports)["verdict"] == "pass"
    write("new", t.sha256(), "fail", "2026-11-30T00:00:00")
    with pytest.raises(BadInput, match="failed on domain.ppl_increase"):
        find_validation(t, reports)


def test_targets(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        resolve_target(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(BadInput, match="not a .gguf"):
        resolve_target(tmp_path / "notes.txt")
    with pytest.raises(BadInput, match="neither"):
        resolve_target(tmp_path)


def test_recipe_serve_section_feeds_the_config_and_flags_override(cli, tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[2]
    path = root / "recipes/llama-3.1-8b-instruct-gptq.yaml"
    recipe = load_recipe(path)
    # what `quantkit serve --recipe R --port 9001` builds (a flag left out is None)
    opts = build(ServeConfig, recipe.serve, {"port": 9001, "max_num_seqs": None})
    art = Path(recipe.outputs.artifact)
    assert art == Path("artifacts/llama-3.1-8b-instruct-gptq") and opts.engine == "vllm"
    assert Path(recipe.outputs.report).parent == Path("reports") and opts.port == 9001
    assert (opts.max_num_seqs, opts.ctx_size, opts.block_size) == (64, 8192, 16)
    assert opts.draft_model == "meta-llama/Llama-3.2-1B-Instruct" and opts.enable_chunked_prefill
    t = Target(art, art, "compressed-tensors", art.name)
    cmd = vllm_command("vllm", t, opts, 9100, opts.ctx_size)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens"] == 4
    opts = build(ServeConfig, None, {"engine": None})
    assert opts.engine == "auto" and opts == ServeConfig() and opts.ctx_size is None
    # the CLI takes the artifact from the recipe's outputs, and needs one from somewhere
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("serve", "--recipe", str(path), "--port", "9001")
    assert code == 2 and "artifact artifacts/llama-3.1-8b-instruct-gptq does not exist" in err
    code, _, err = cli("serve")
    assert code == 2 and "no artifact to serve given" in err


@pytest.mark.parametrize("content", [b"", b"GGUF\x03\x00\x00\x00garbage"])
def test_empty_or_corrupt_gguf_is_bad_input(tmp_path, cli, content):
    f = tmp_path / "broken.gguf"
    f.write_bytes(content)
    code, _, err = cli("serve", str(f), "--allow-unvalidated", "--port", "8799")
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "not a readable GGUF" in errors[0]


def test_corrupt_config_and_out_of_range_numbers_exit_2(tmp_path, cli):
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = cli("serve", str(tmp_path), "--allow-unvalidated", "--engine", "transformers",
                       "--port", "8799")
    assert code == 2 and "not a readable compressed-tensors model" in err
    for flag, value in (("--port", "70000"), ("--max-num-seqs", "0"), ("--ctx-size", "4"),
                        ("--gpu-memory-utilization", "1.5")):
        code, _, err = cli("serve", str(tmp_path), "--allow-unvalidated", flag, value)
        assert code == 2 and flag in err, (flag, err)


def test_doctor_reports_the_kernel_for_the_load():
    from quantkit.loadtest.doctor import check_quantized

    fast = check_quantized({"kernels": ["Marlin"], "max_num_seqs": 4}, "vllm")
    assert fast["status"] == "pass" and "Marlin" in fast["reason"]
    slow = check_quantized({"kernels": ["Machete"], "max_num_seqs": 4}, "vllm")
    assert slow["status"] == "warn" and "Marlin is faster" in slow["reason"]
    assert check_quantized({"kernels": ["Machete"], "max_num_seqs": 256}, "vllm")["status"] == "pass"
    assert check_quantized({"kernels": ["Exllama"]}, "vllm")["status"] == "warn"
    assert check_quantized({}, "vllm")["status"] == "warn"


def test_root_is_where_a_client_loads_the_tokenizer(tmp_path, tiny_model):
    """/v1/models' `root` (vLLM's field, read by `vllm bench serve`): the HF folder served; for a
    GGUF artifact the folder it was quantized from, while that is on disk; else the file."""
    from quantkit.artifact import Manifest, Source

    (tmp_path / "hf").mkdir()
    hf = _hf_target(tmp_path / "hf")
    assert hf.root == str(hf.path.resolve())
    art = tmp_path / "art"
    art.mkdir()
    _gguf(art / "model-Q4_K_M.gguf")
    for source, root in ((tiny_model, tiny_model.resolve()),
                         (tmp_path / "gone", (art / "model-Q4_K_M.gguf").resolve())):
        Manifest(checkpoint="gguf", method="gguf", calibration={}, parameters={}, versions={},
                 source=Source(spec="m", path=str(source), weights_sha256="0" * 64,
                               architecture="LlamaForCausalLM", parameters=1),
                 wall_time_s=1.0, size_bytes={"before": 1, "after": 1},
                 file="model-Q4_K_M.gguf").write(art)
        assert resolve_target(art).root == str(root)


def test_w8a16_served_for_more_users_than_it_was_measured_faster_is_noted():
    """W8A16 measured 1.12x bf16 at 32 users and 0.88x at 64 (H100s, docs/BENCHMARKS.md): served
    for a load above 32 (--expected-concurrency, else --max-num-seqs), the launch says so; W4A16,
    FP8, an unquantized model and W8A16 at 32 or fewer users get no note."""
    from quantkit.serve.engines.vllm import load_fit

    w8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    w8a16 = {**CT, "config_groups": {"group_0": {"targets": ["Linear"], "weights": w8}}}
    fp8 = {**CT, "config_groups": {"group_0": {"weights": FP8_W, "input_activations": FP8_TOKEN}}}
    many, few = ServeConfig(max_num_seqs=64), ServeConfig(max_num_seqs=64, expected_concurrency=8)
    [note] = load_fit(many, w8a16)
    assert note.startswith("W8A16 serves more slowly than bf16 at this load (--max-num-seqs 64)")
    assert "--expected-concurrency 48" in load_fit(
        ServeConfig(max_num_seqs=64, expected_concurrency=48), w8a16)[0]
    assert load_fit(few, w8a16) == [] and load_fit(ServeConfig(max_num_seqs=32), w8a16) == []
    assert load_fit(many, CTW) == [] and load_fit(many, fp8) == [] and load_fit(many, None) == []
