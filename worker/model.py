"""What the pipeline asks of an update model, whichever it is: a rendered prompt in, the model's
answer text and its token usage out.

Two implementations: the OpenAI-compatible client (``worker.llm``) and the offline rules
(``worker.offline``). This module imports neither, so the rules never load the `openai` SDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from prompts.update_prompt import UpdatePrompt


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    attempts: int = 1


class UpdateModel(Protocol):
    def propose(self, prompt: UpdatePrompt) -> ModelAnswer: ...

    def close(self) -> None: ...
