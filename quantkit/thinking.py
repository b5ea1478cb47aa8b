"""Whether a model thinks before it answers, read from its chat template and vocabulary: the
switch that turns thinking on or off, the markers around the thinking, whether it is on by
default; the template arguments for a mode, and the answer split from the thinking.

The template is rendered, not pattern-matched: a switch is a template argument that changes the
generation prompt, and "on by default" means the prompt with the switch unset is the prompt with
it on. No torch, no transformers: jinja2 renders it as transformers does."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from quantkit.errors import BadInput

MODES = ("auto", "on", "off")
# Template arguments that switch thinking (Qwen3/GLM/SmolLM3, DeepSeek-V3.1) or set its effort (gpt-oss).
BOOL_SWITCHES = ("enable_thinking", "thinking")
EFFORT_SWITCHES = ("reasoning_effort",)
SYSTEM_FLAGS = (("/think", "/no_think"),)
# Known (start, end) pairs; the end is what the answer follows.
MARKERS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"), ("<seed:think>", "</seed:think>"),
           ("<|channel|>analysis<|message|>", "<|channel|>final<|message|>"),
           ("◁think▷", "◁/think▷"), ("<|begin_of_thought|>", "<|end_of_thought|>"))
# What sits between the thinking and `end` in a format that closes a channel first (gpt-oss).
_TAILS = {"<|channel|>final<|message|>": "<|end|><|start|>assistant"}
REASONING_FIELDS = ("reasoning_content", "thinking")  # message fields a template may render itself
_PROBE_Q, _PROBE_A, _PROBE_R = "Q7x", "A7x", "R7x"
# A chat message here is a dict[str, str]: role, content, and the reasoning field a template
# renders (`Thinking.reasoning_field`, a key known only once the template is read). Template
# arguments are dict[str, bool]: the switch's name (known only then too) -> on.


class ThinkingRecord(TypedDict):
    """`Thinking` as JSON (`Thinking.to_dict`): its fields, the flags as a list, its modes."""

    thinks: bool
    switch: str | None
    start: str | None
    end: str | None
    default_on: bool
    always: bool
    flags: list[str] | None
    reasoning_field: str | None
    modes: list[str]


@dataclass(frozen=True)
class Thinking:
    """What a chat template says about thinking. `switch`: the template argument that turns it on
    or off (or, with `always`, sets its effort); `flags`: system-prompt flags (on, off) the
    template reads; `start`/`end`: the markers; `default_on`: thinking with the switch unset;
    `always`: no way to turn it off; `reasoning_field`: the message field the template renders
    as thinking (otherwise reasoning goes into the content between the markers)."""

    thinks: bool
    switch: str | None = None
    start: str | None = None
    end: str | None = None
    default_on: bool = False
    always: bool = False
    flags: tuple[str, str] | None = None
    reasoning_field: str | None = None

    def modes(self) -> tuple[str, ...]:
        """The modes this template has."""
        if not self.thinks:
            return ("auto", "off")
        if self.always:
            return ("auto", "on")
        return MODES if (self.switch or self.flags) else ("auto",)

    def template_kwargs(self, mode: str) -> dict[str, bool]:
        """`apply_chat_template` keyword arguments for `mode` (auto: the template's default)."""
        if mode not in MODES:
            raise BadInput(f"thinking mode {mode!r} is not one of {', '.join(MODES)}",
                           "use auto (the template's default), on or off")
        if mode not in self.modes():
            what = ("has no thinking mode" if not self.thinks else
                    "always thinks" if self.always else "has no switch for thinking")
            raise BadInput(f"thinking mode {mode!r}: this model's chat template {what}",
                           f"use {' or '.join(self.modes())}")
        if mode == "auto" or not self.thinks or self.always or self.switch is None:
            return {}
        return {self.switch: mode == "on"}

    def with_mode(self, messages: list[dict[str, str]], mode: str
                  ) -> tuple[list[dict[str, str]], dict[str, bool]]:
        """Messages and template arguments for `mode`: the argument where the template has
        one, else its system-prompt flag."""
        kwargs = self.template_kwargs(mode)
        if mode == "auto" or kwargs or not self.flags or self.always or not self.thinks:
            return messages, kwargs
        flag = self.flags[0] if mode == "on" else self.flags[1]
        if messages and messages[0].get("role") == "system":
            first = {**messages[0], "content": f"{messages[0].get('content', '')} {flag}".strip()}
            return [first, *messages[1:]], kwargs
        return [{"role": "system", "content": flag}, *messages], kwargs

    def opens(self, prompt: str) -> bool:
        """Whether `prompt` ends inside an open thinking block (the template pre-filled start)."""
        if not self.thinks or not self.start:
            return False
        at = prompt.rfind(self.start)
        return at >= 0 and (not self.end or prompt.find(self.end, at) < 0)

    def split(self, text: str, prompt: str = "") -> tuple[str, str, bool]:
        """(thinking, answer, closed) of a generated `text`: the answer is what follows the end
        marker; `prompt` tells whether the template pre-filled the start marker. A text that
        never opened thinking is all answer; one that opened and never closed is all thinking."""
        if not self.thinks or not self.end:
            return "", text.strip(), True
        opened = self.opens(prompt)
        at_start = text.find(self.start) if self.start else -1
        at_end = text.find(self.end)
        if at_end >= 0 and (opened or 0 <= at_start < at_end):
            begin = at_start + len(self.start or "") if 0 <= at_start < at_end else 0
            thought = text[begin:at_end].removesuffix(_TAILS.get(self.end, "\0"))
            return thought.strip(), text[at_end + len(self.end):].strip(), True
        if opened or at_start >= 0:
            return text[at_start + len(self.start or "") if at_start >= 0 else 0:].strip(), "", False
        return "", text.strip(), True

    def to_dict(self) -> ThinkingRecord:
        """JSON-ready fields (inspect --json, the calibration manifest)."""
        return {"thinks": self.thinks, "switch": self.switch, "start": self.start,
                "end": self.end, "default_on": self.default_on, "always": self.always,
                "flags": list(self.flags) if self.flags else None,
                "reasoning_field": self.reasoning_field, "modes": list(self.modes())}

    def describe(self) -> str:
        """One line for a person."""
        if not self.thinks:
            return "no thinking mode"
        markers = f"{self.start}...{self.end}" if self.start else "markers unknown"
        if self.always:
            how = (f"always thinks, effort set by {self.switch}" if self.switch
                   else "always thinks (the prompt opens its thinking)")
        else:
            how = f"{'on' if self.default_on else 'off'} by default"
            how += (f", switch {self.switch}" if self.switch else "")
            how += (f", system-prompt flags {self.flags[0]} and {self.flags[1]}" if self.flags else "")
        return f"yes: {how}; markers {markers}"


NOT_THINKING = Thinking(False)


def detect(template: str | None, vocab: Collection[str] = ()) -> Thinking:
    """What `template` (a chat template's jinja source) and `vocab` (token strings) say about
    thinking; a template that does not render is read as having no thinking mode."""
    if not template:
        return NOT_THINKING
    from jinja2.exceptions import TemplateError

    try:
        compiled = _compile(template)
    except TemplateError:
        return NOT_THINKING
    start, end = _markers(template, vocab)
    unset = _prompt(compiled, {})
    if unset is None:
        return NOT_THINKING
    field = _reasoning_field(compiled)
    for name in _in_order(template, BOOL_SWITCHES):
        on, off = _prompt(compiled, {name: True}), _prompt(compiled, {name: False})
        if on is not None and off is not None and on != off:
            default_on = unset == on if unset in (on, off) else not _closed_empty(unset, start, end)
            return Thinking(True, name, start, end, default_on, False, _flags(compiled, template), field)
    for name in _in_order(template, EFFORT_SWITCHES):
        low, high = _prompt(compiled, {name: "low"}), _prompt(compiled, {name: "high"})
        if low is not None and high is not None and low != high and start:
            return Thinking(True, name, start, end, True, True, None, field)
    flags = _flags(compiled, template)
    if flags:
        on = _prompt(compiled, {}, system=flags[0])
        return Thinking(True, None, start, end, on == _prompt(compiled, {}), False, flags, field)
    if start and Thinking(True, start=start, end=end).opens(unset):
        return Thinking(True, None, start, end, True, True, None, field)
    return NOT_THINKING


def read_template(folder: Path) -> str | None:
    """A model folder's chat template: chat_template.jinja, else tokenizer_config.json's
    (a string, or the one named "default" of a list)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, list):
            value = next((t.get("template") for t in value if isinstance(t, dict)
                          and t.get("name") == "default"), None)
        if isinstance(value, str):
            return value
    return None


def read_vocab(folder: Path) -> set[str]:
    """The token strings a model folder's tokenizer.json names (added tokens and vocabulary)."""
    try:
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    words = {t.get("content") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        words |= set(vocab)
    return {w for w in words if isinstance(w, str)}


def model_thinking(folder: Path) -> Thinking:
    """What a model folder's chat template and tokenizer say about thinking."""
    return detect(read_template(folder), read_vocab(folder))


def tokenizer_thinking(tok: Any) -> Thinking:
    """What a loaded tokenizer's chat template and vocabulary say about thinking."""
    template = tok.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str):
        return NOT_THINKING
    return detect(template, tok.get_vocab())


def render_with_reasoning(apply: Any, th: Thinking, messages: list[tuple[str, str]],
                          reasoning: tuple[str | None, ...]) -> str:
    """A chat rendered with thinking on, each assistant turn's reasoning inside the model's
    markers: in the message field the template renders itself (Qwen3's reasoning_content,
    gpt-oss's thinking), else as start + reasoning + end before the answer. Where the template
    drops that from the last turn (DeepSeek's strip everything before the end marker), the turn
    is spliced after the generation prompt as the model writes it. `apply` is a tokenizer's
    apply_chat_template."""
    plain, kwargs = th.with_mode([{"role": r, "content": c} for r, c in messages], "on")
    msgs = []
    for (role, content), thought in zip(messages, reasoning):
        m = {"role": role, "content": content}
        if thought and role == "assistant":
            if th.reasoning_field:
                m[th.reasoning_field] = thought
            else:
                m["content"] = f"{th.start}\n{thought.strip()}\n{th.end}\n\n{content}"
        msgs.append(m)
    msgs = th.with_mode(msgs, "on")[0]
    text = str(apply(msgs, tokenize=False, **kwargs))
    last = reasoning[-1]
    if not last or messages[-1][0] != "assistant" or last.strip() in text:
        return text
    answer = messages[-1][1]
    prompt = str(apply(plain[:-1], tokenize=False, add_generation_prompt=True, **kwargs))
    whole = str(apply(plain, tokenize=False, **kwargs))
    at = whole.rfind(answer) if answer else -1
    closing = whole[at + len(answer):] if at >= 0 else ""
    opening = "" if th.opens(prompt) else f"{th.start}\n"
    return f"{prompt}{opening}{last.strip()}\n{th.end}\n\n{answer}{closing}"


# -- rendering as transformers does ---------------------------------------------------------------

def _compile(template: str) -> Any:
    from datetime import datetime

    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}` blocks (assistant-mask templates) render their body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _render(compiled: Any, messages: list[dict[str, str]], generation: bool,
            kwargs: Mapping[str, bool | str]) -> str | None:
    try:
        return str(compiled.render(messages=messages, add_generation_prompt=generation,
                                   bos_token="", eos_token="", **kwargs))
    except Exception:  # noqa: BLE001 - a probe the template refuses (raise_exception, types) is no answer
        return None


def _prompt(compiled: Any, kwargs: Mapping[str, bool | str], system: str | None = None
            ) -> str | None:
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": _PROBE_Q}]
    return _render(compiled, msgs, True, kwargs)


def _reasoning_field(compiled: Any) -> str | None:
    for field in REASONING_FIELDS:
        msgs = [{"role": "user", "content": _PROBE_Q},
                {"role": "assistant", "content": _PROBE_A, field: _PROBE_R}]
        text = _render(compiled, msgs, False, {})
        if text and _PROBE_R in text:
            return field
    return None


def _flags(compiled: Any, template: str) -> tuple[str, str] | None:
    """System-prompt flags the template reads: the prompts differ beyond the flags' own text."""
    for on, off in SYSTEM_FLAGS:
        if on not in template or off not in template:
            continue
        a, b = _prompt(compiled, {}, system=on), _prompt(compiled, {}, system=off)
        if a is not None and b is not None and a.replace(on, "") != b.replace(off, ""):
            return on, off
    return None


def _in_order(template: str, names: Iterable[str]) -> list[str]:
    """The names the template uses as variables, in the order it first uses them."""
    found = {n: m.start() for n in names
             if (m := re.search(rf"(?<![\w.'\"]){re.escape(n)}(?![\w'\"])", template))}
    return sorted(found, key=found.__getitem__)


def _markers(template: str, vocab: Collection[str]) -> tuple[str | None, str | None]:
    for start, end in MARKERS:
        if start in template or end in template:
            return start, end
    for start, end in MARKERS:
        if start in vocab and end in vocab:
            return start, end
    m = re.search(r"<(/?)([\w:.-]*think[\w.-]*)>", template)
    if m:
        return f"<{m.group(2)}>", f"</{m.group(2)}>"
    return None, None


def _closed_empty(prompt: str, start: str | None, end: str | None) -> bool:
    """Whether `prompt` ends with an empty, closed thinking block (thinking off)."""
    if not start or not end:
        return False
    return re.search(re.escape(start) + r"\s*" + re.escape(end) + r"\s*$", prompt) is not None
