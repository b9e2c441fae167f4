"""The prompt template: plain text, no chat markup.

A prompt is the DAPO-style single user message whose content carries the instruction and
the question; the policy's answer ends with a line ``Answer: <integer>``, the format DAPO's
rule-based verifier reads. ``render_prompt`` turns the message list into the text the
engines tokenize (the tokenizer adds the bos token; the chat template saved with it renders
the same text, so ``apply_chat_template`` agrees).
"""

from __future__ import annotations

from pivot.errors import ConfigError

INSTRUCTION = "Solve. End with the line: Answer: <integer>"
ANSWER_PREFIX = "Answer:"
ASSISTANT_TAG = "Response:"

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT_TAG + "{% endif %}"
)
"""Jinja twin of ``render_prompt`` (with the bos token, since apply_chat_template adds none)."""


def problem_content(question: str) -> str:
    """The user message for ``question``."""
    return f"{INSTRUCTION}\nProblem: {question}"


def render_prompt(messages: list[dict[str, str]]) -> str:
    """Renders a message list as the prompt text the policy continues.

    Every message's content goes on its own line, followed by the response tag. Roles are
    not printed: the tiny models were only ever trained on single user turns.
    """
    if not messages:
        raise ConfigError("render_prompt: the prompt has no messages")
    return "".join(f"{m['content']}\n" for m in messages) + ASSISTANT_TAG


def question_of(content: str) -> str:
    """The question inside a user message: the text after ``Problem:`` if present."""
    marker = "Problem:"
    i = content.rfind(marker)
    return content[i + len(marker):].strip() if i >= 0 else content.strip()


def format_response(value: int) -> str:
    """The response the policy is trained to write: the answer line alone.

    It starts with a space because it follows the ``Response:`` tag directly. (A worked
    line before it was tried; the tiny models learned it too slowly to fit the build.)
    """
    return f" {ANSWER_PREFIX} {value}"
