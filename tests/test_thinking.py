"""quantkit/thinking.py on real chat templates (tests/data/chat_templates/, see its README): the
switch, markers and default of Qwen3, SmolLM3, DeepSeek-R1-Distill, DeepSeek-V3.1 and gpt-oss,
no thinking for SmolLM2 and the tests' template; modes, and the answer split from the thinking."""

from __future__ import annotations

from pathlib import Path

import pytest
from _models import CHAT_TEMPLATE

from quantkit.errors import BadInput
from quantkit.thinking import NOT_THINKING, Thinking, detect, model_thinking, read_template

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.mark.parametrize("name, switch, start, end, default_on, always, field", [
    ("qwen3", "enable_thinking", "<think>", "</think>", True, False, "reasoning_content"),
    ("smollm3", "enable_thinking", "<think>", "</think>", True, False, None),
    ("deepseek-v3.1", "thinking", "<think>", "</think>", False, False, None),
    ("deepseek-r1-distill", None, "<think>", "</think>", True, True, None),
    ("gpt-oss", "reasoning_effort", "<|channel|>analysis<|message|>",
     "<|channel|>final<|message|>", True, True, "thinking"),
])
def test_real_templates(name, switch, start, end, default_on, always, field):
    th = detect(template(name))
    assert th.thinks and (th.switch, th.start, th.end) == (switch, start, end)
    assert (th.default_on, th.always, th.reasoning_field) == (default_on, always, field)


def test_smollm3_reads_system_prompt_flags():
    assert detect(template("smollm3")).flags == ("/think", "/no_think")
    assert detect(template("qwen3")).flags is None  # Qwen3's /think is the model's, not the template's


def test_models_without_thinking(demo_model):
    assert detect(CHAT_TEMPLATE) == NOT_THINKING
    assert detect(None) == NOT_THINKING and detect("{% broken") == NOT_THINKING
    assert model_thinking(demo_model) == NOT_THINKING  # SmolLM2: behaves as before everywhere
    assert NOT_THINKING.template_kwargs("auto") == {} and NOT_THINKING.modes() == ("auto", "off")
    assert NOT_THINKING.split(" <think>x</think> y ") == ("", "<think>x</think> y", True)


def test_mode_arguments_and_modes_a_template_lacks():
    qwen3, v31, r1, oss = (detect(template(n)) for n in
                           ("qwen3", "deepseek-v3.1", "deepseek-r1-distill", "gpt-oss"))
    assert qwen3.template_kwargs("auto") == {}
    assert qwen3.template_kwargs("on") == {"enable_thinking": True}
    assert qwen3.template_kwargs("off") == {"enable_thinking": False}
    assert v31.template_kwargs("on") == {"thinking": True}
    assert r1.template_kwargs("on") == {} and oss.template_kwargs("on") == {}
    for th, mode in ((r1, "off"), (oss, "off"), (NOT_THINKING, "on"), (qwen3, "maybe")):
        with pytest.raises(BadInput) as err:
            th.template_kwargs(mode)
        assert err.value.message and err.value.hint


def test_system_flag_switch_for_a_template_without_an_argument():
    th = Thinking(True, None, "<think>", "</think>", True, flags=("/think", "/no_think"))
    msgs = [{"role": "user", "content": "hi"}]
    assert th.with_mode(msgs, "off") == ([{"role": "system", "content": "/no_think"}, *msgs], {})
    sys = [{"role": "system", "content": "Be brief."}, *msgs]
    assert th.with_mode(sys, "on")[0][0]["content"] == "Be brief. /think"
    assert th.with_mode(msgs, "auto") == (msgs, {})


def test_rendering_matches_transformers(tiny_model):
    """The generation prompts thinking.py compares are the ones transformers renders."""
    from transformers import AutoTokenizer

    from quantkit.thinking import _compile, _prompt

    tok = AutoTokenizer.from_pretrained(tiny_model)
    msgs = [{"role": "user", "content": "Q7x"}]
    for name in ("qwen3", "deepseek-v3.1", "smollm3", "deepseek-r1-distill"):
        tok.chat_template = template(name)
        th = detect(template(name))
        for mode in th.modes():
            kwargs = th.template_kwargs(mode)
            ours = _prompt(_compile(template(name)), kwargs)
            theirs = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                             bos_token="", **kwargs)
            assert ours == theirs.replace(tok.bos_token or "\0", ""), (name, mode)


def test_split_after_the_end_marker():
    qwen3 = detect(template("qwen3"))
    assert qwen3.split("<think>\nadd 2 and 2\n</think>\n\n4") == ("add 2 and 2", "4", True)
    assert qwen3.split("<think>\nadd 2 and 2 and") == ("add 2 and 2 and", "", False)
    assert qwen3.split("4") == ("", "4", True)  # never opened: all answer (thinking off)
    r1 = detect(template("deepseek-r1-distill"))
    prompt = "<｜User｜>2+2?<｜Assistant｜><think>\n"  # the template pre-filled the start marker
    assert r1.opens(prompt) and not r1.opens("<think>\n\n</think>\n\n")
    assert r1.split("add\n</think>\n\n4", prompt) == ("add", "4", True)
    assert r1.split("add and add", prompt) == ("add and add", "", False)
    oss = detect(template("gpt-oss"))
    text = "<|channel|>analysis<|message|>add<|end|><|start|>assistant<|channel|>final<|message|>4"
    assert oss.split(text) == ("add", "4", True)


def test_template_files_of_a_model_folder(tmp_path):
    import json

    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "x"},
                           {"name": "default", "template": template("qwen3")}]}))
    assert read_template(tmp_path) == template("qwen3")
    assert model_thinking(tmp_path).switch == "enable_thinking"
    (tmp_path / "chat_template.jinja").write_text(CHAT_TEMPLATE)  # the file wins, as transformers reads it
    assert model_thinking(tmp_path) == NOT_THINKING


def test_inspect_shows_thinking(cli, tiny_model, tmp_path):
    import json
    import shutil

    code, text, _ = cli("inspect", str(tiny_model))
    assert code == 0 and "thinking: no thinking mode" in text.splitlines()
    model = tmp_path / "qwen3-style"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").write_text(template("qwen3"))
    code, text, _ = cli("inspect", str(model))
    assert code == 0 and ("thinking: yes: on by default, switch enable_thinking; markers "
                          "<think>...</think>") in text.splitlines()
    code, out, _ = cli("--json", "inspect", str(model))
    th = json.loads(out)["thinking"]
    assert th["thinks"] and th["switch"] == "enable_thinking" and th["modes"] == ["auto", "on", "off"]
