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
    cached_tokens: int = 0  # of the prompt tokens, served from the provider's prompt cache
    service_tier: str = ""  # the tier that served the call, when the provider says


class UpdateModel(Protocol):
    def propose(self, prompt: UpdatePrompt, *, cache_key: str | None = None) -> ModelAnswer:
        """``cache_key``: a stable, opaque key per (user, agent) the endpoint may route its
        prompt cache by (implementations without a cache ignore it)."""
        ...

    def close(self) -> None: ...
