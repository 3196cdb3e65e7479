"""Re-export: the scripted OpenAI-compatible server lives in :mod:`memq.testing.openai_server`."""

from __future__ import annotations

from memq.testing.openai_server import EMPTY_UPDATE, ScriptedOpenAI
from memq.testing.replies import Reply, completion_body

__all__ = ["EMPTY_UPDATE", "Reply", "ScriptedOpenAI", "completion_body"]
