"""The sampling check's flags for a model that thinks, beside validate/sampling.py's: the ways a
quantized reasoning model breaks that a short direct answer does not show. A long thinking dilutes
a loop in its whole (the repeated share of the output stays low while one stretch of it cycles),
INT4 reasoning chains collapse into runs of one character ("!!!!"), and a damaged model stops
closing its thinking, or closes it and answers nothing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantkit.validate.served import Thought

# a stretch of LOOP_SPAN tokens more than LOOP_SHARE of whose 4-grams came earlier in it is
# cycling; sampled reasoning repeats its terms (the numbers, "so", "the answer") well under that
LOOP_SPAN = 64
LOOP_STEP = 16
LOOP_SHARE = 0.5
# one character 24 times running: longer than a table rule or a heading underline in prose
CHAR_RUN = 24
_RUN = re.compile(r"(\S)\1{" + str(CHAR_RUN - 1) + ",}")


def span_loop(ids: Sequence[int], span: int = LOOP_SPAN, n: int = 4) -> float:
    """The largest share of repeated n-grams within any `span` tokens of `ids` (windows
    LOOP_STEP apart; one window where `ids` is shorter)."""
    if len(ids) < n + 1:
        return 0.0
    best = 0.0
    for start in range(0, max(len(ids) - span, 0) + 1, LOOP_STEP):
        window = ids[start:start + span]
        grams = [tuple(window[i:i + n]) for i in range(len(window) - n + 1)]
        best = max(best, 1 - len(set(grams)) / len(grams))
    return best


def think_flags(text: str, token_ids: Sequence[int], read: Thought) -> list[str]:
    """What went wrong in one output of a thinking model: "loop" (a stretch that cycles),
    "char_run" (one character CHAR_RUN times), "unclosed_thinking" (not closed within the
    budget), "empty_answer" (closed, then nothing)."""
    out = []
    if len(token_ids) >= LOOP_SPAN and span_loop(token_ids) > LOOP_SHARE:
        out.append("loop")
    if _RUN.search(text):
        out.append("char_run")
    if not read["think_closed"]:
        out.append("unclosed_thinking")
    elif not read["answer"].strip():
        out.append("empty_answer")
    return out
