"""Engines carry their capabilities and install probes (`EngineSpec`), and one `choose_engine`
decides which engine runs an artifact, in process for validation or as a server for serving.
Toy engines are registered here for real and unregistered after each test."""

from __future__ import annotations

import pytest

from quantkit.config import ServeConfig
from quantkit.engines.choice import (
    ENGINES,
    EngineSpec,
    able,
    checkpoint_of,
    choose_engine,
    register_engine,
)
from quantkit.errors import BadInput

HF = dict(adapter="quantkit.engines.hf:TransformersEngine",
          launch="quantkit.serve.engines.transformers:transformers_launch")
ABSENT = "quantkit-no-such-library"


@pytest.fixture
def register():
    """Register toy engines for one test; they are gone afterwards."""
    added: list[str] = []

    def add(spec: EngineSpec) -> EngineSpec:
        added.append(spec.name)
        return register_engine(spec)

    yield add
    for name in added:
        ENGINES.unregister(name)


def test_the_built_in_engines_declare_what_they_can_do():
    vllm, hf, gguf = ENGINES["vllm"], ENGINES["transformers"], ENGINES["llama.cpp"]
    assert vllm.gpu and vllm.kv_cache_fp8 and vllm.tensor_parallel and vllm.kernels
    assert vllm.logprobs == "top-k" and hf.logprobs == gguf.logprobs == "full"
    assert hf.decompresses and not (vllm.decompresses or gguf.decompresses)
    assert able("kv_cache_fp8") == able("tensor_parallel") == ("vllm",)
    assert gguf.checkpoints == ("gguf",) and checkpoint_of("m/x.gguf") == "gguf"
    assert checkpoint_of("m/folder") == "compressed-tensors"
    with pytest.raises(ValueError, match="logprobs 'some'"):
        EngineSpec("bad", "quantkit", ("gguf",), logprobs="some", **HF)


def test_each_mode_asks_its_own_probe_and_auto_takes_the_first_that_answers(register):
    """An engine whose in-process probe says missing is skipped for validation, and taken for
    serving where its server probe answers; one asked for by name fails with its probe's words."""
    register(EngineSpec("toy-server-only", "quantkit", ("toy-ckpt",), **HF,
                        probe=lambda: ("toy-server-only has no in-process adapter here",
                                       "use --engine toy-anywhere"),
                        server_probe=lambda opts: None))
    register(EngineSpec("toy-anywhere", "quantkit", ("toy-ckpt",), **HF))
    assert choose_engine("toy-ckpt", "auto", "validate") == "toy-anywhere"
    assert choose_engine("toy-ckpt", "auto", "serve", ServeConfig()) == "toy-server-only"
    with pytest.raises(BadInput) as exc:
        choose_engine("toy-ckpt", "toy-server-only", "validate")
    assert exc.value.message == "toy-server-only has no in-process adapter here"
    assert exc.value.hint == "use --engine toy-anywhere"
    with pytest.raises(BadInput, match="cannot run a GGUF artifact") as exc:
        choose_engine("gguf", "toy-anywhere", "validate")
    assert "use --engine llama.cpp (or auto)" in exc.value.hint


def test_an_engine_without_a_probe_needs_its_library_in_both_modes(register):
    spec = register(EngineSpec("toy-absent", ABSENT, ("toy-ckpt",), **HF))
    for mode in ("validate", "serve"):
        message, hint = spec.missing(mode)
        assert message == f"--engine toy-absent needs {ABSENT}, which is not installed here"
        assert hint.startswith(f"pip install {ABSENT}")
    with pytest.raises(BadInput, match="no engine here runs a toy-ckpt artifact: --engine "
                                       "toy-absent needs"):
        choose_engine("toy-ckpt", "auto", "validate")


@pytest.mark.parametrize("command", ["validate", "serve"])
def test_a_registered_engine_that_is_not_installed_fails_early_with_exit_2(
        command, register, cli, tiny_artifact, tiny_model, tmp_path):
    """Before any model loads or any server starts: one error line naming the engine and its
    library, one hint, exit 2 (not a failure at load time, exit 3), nothing written."""
    register(EngineSpec("toy-absent", ABSENT, ("compressed-tensors",), **HF))
    out, log = tmp_path / "report", tmp_path / "engine.log"
    args = (["validate", str(tiny_artifact), "--baseline", str(tiny_model), "--out", str(out)]
            if command == "validate" else
            ["serve", str(tiny_artifact), "--allow-unvalidated", "--port", "8937",
             "--log-file", str(log)])
    code, _, err = cli(*args, "--engine", "toy-absent")
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --engine toy-absent needs {ABSENT}, which is not installed here"]
    assert f"hint: pip install {ABSENT}" in err
    assert not out.exists() and not log.exists()


def test_options_an_engine_cannot_honour_are_refused_naming_it(register, cli, tiny_artifact):
    """The FP8 KV cache, a split over GPUs and a kernel choice are asked of the engine's spec, not
    its name."""
    register(EngineSpec("toy-16bit", "quantkit", ("compressed-tensors",), **HF))
    register(EngineSpec("toy-fp8", "quantkit", ("compressed-tensors",), **HF, kv_cache_fp8=True))
    ServeConfig(engine="toy-fp8", kv_cache_dtype="fp8").check()
    with pytest.raises(BadInput, match="toy-fp8 serves on one device"):
        ServeConfig(engine="toy-fp8", tensor_parallel_size=2).check()
    with pytest.raises(BadInput, match="toy-fp8 has no kernel to choose") as exc:
        ServeConfig(engine="toy-fp8", kernel="marlin").check()
    assert "leave --kernel out" in exc.value.hint
    register(EngineSpec("toy-kernels", "quantkit", ("compressed-tensors",), **HF, kernels=True))
    ServeConfig(engine="toy-kernels", kernel="marlin").check()
    code, _, err = cli("serve", str(tiny_artifact), "--allow-unvalidated", "--engine", "toy-16bit",
                       "--kv-cache-dtype", "fp8")
    assert code == 2, err
    assert ("error: --kv-cache-dtype fp8 needs an engine with an FP8 KV cache (vllm, toy-fp8); "
            "toy-16bit keeps its KV cache in 16 bits") in err
    assert "hint: " in err


def test_doctor_reads_the_capabilities_of_the_engine_it_finds(register):
    from quantkit.loadtest.doctor import check_parallel_layout, check_quantized

    register(EngineSpec("toy-split", "quantkit", ("compressed-tensors",), **HF,
                        tensor_parallel=True, decompresses=True))
    split = check_parallel_layout({"tensor_parallel_size": 2}, "toy-split", {"count": 2})
    assert split["status"] == "pass" and "toy-split splits each layer over 2" in split["reason"]
    assert "toy-split decompresses" in check_quantized({}, "toy-split")["reason"]
    unknown = check_parallel_layout({}, "llama_cpp.server", {"count": 2})
    assert unknown["status"] == "warn" and "one device" in unknown["reason"]


def test_an_engines_own_options_join_the_serve_config_and_stay_its_own(cli, tiny_artifact,
                                                                     tmp_path):
    """vLLM's own options (`EngineSpec.options`) are flags and recipe keys of `quantkit serve`
    like the shared ones; set while another engine serves, one is refused by name before anything
    starts, and a command that starts `quantkit serve` hands on those set."""
    import dataclasses

    from quantkit.serve.engines.vllm import VllmOptions

    names = [f.name for f in dataclasses.fields(ServeConfig)]
    assert names[-2:] == ["enable_chunked_prefill", "vllm_python"]
    cfg = ServeConfig(vllm_python="/opt/vllm/bin/python", enable_chunked_prefill=False)
    assert cfg.options("vllm") == VllmOptions(False, "/opt/vllm/bin/python")
    assert cfg.options("transformers") is None
    assert cfg.own_flags() == ["--no-enable-chunked-prefill", "--vllm-python",
                               "/opt/vllm/bin/python"]
    assert ServeConfig().own_flags() == []
    with pytest.raises(BadInput, match="--vllm-python is an option of the vllm engine; "
                                       "transformers does not take it") as exc:
        ServeConfig(vllm_python="/opt/vllm/bin/python").check_engine("transformers")
    assert exc.value.hint == "use --engine vllm (or auto), or leave --vllm-python out"
    log = tmp_path / "serve.log"
    code, _, err = cli("serve", str(tiny_artifact), "--allow-unvalidated", "--engine",
                       "transformers", "--no-enable-chunked-prefill", "--log-file", str(log))
    assert code == 2, err
    assert ("error: --enable-chunked-prefill is an option of the vllm engine; transformers does "
            "not take it") in err
    assert not log.exists()


def test_an_engine_mode_is_recorded_and_keys_the_original_results(
        register, cli, tiny_artifact, tiny_model, tmp_path, monkeypatch):
    """An engine whose results can depend on how it runs (vLLM: how its engines start) names
    that `mode`: results.json records it, and the original's cached results answer only for the
    same mode. Engines that name none keep the keys they had."""
    import json

    monkeypatch.setenv("QUANTKIT_HOME", str(tmp_path / "home"))
    mode = {"now": "steady"}
    register(EngineSpec("toy-moded", "quantkit", ("compressed-tensors",), **HF,
                        mode=lambda: mode["now"]))
    assert ENGINES["toy-moded"].run_mode() == "steady" and ENGINES["transformers"].run_mode() is None

    def validate(out: str) -> tuple[dict, str]:
        code, _, err = cli("validate", str(tiny_artifact), "--baseline", str(tiny_model),
                           "--engine", "toy-moded", "--tasks", "sampling", "--samples", "2",
                           "--max-tokens", "8", "--out", str(tmp_path / out))
        assert code in (0, 1), err
        return json.loads((tmp_path / out / "results.json").read_text()), err

    first, _ = validate("a")
    assert first["settings"]["engine_mode"] == "steady" and first["engine"] == "toy-moded"
    again, err = validate("b")
    assert "baseline results from the cache" in err
    mode["now"] = "hasty"
    other, err = validate("c")
    assert other["settings"]["engine_mode"] == "hasty"
    assert "baseline results from the cache" not in err
