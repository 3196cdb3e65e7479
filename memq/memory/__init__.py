"""What an extraction does to a memory document, as plain functions on the document model.

The update a model proposes (:mod:`memq.memory.update`), applying it (:mod:`memq.memory.apply`), the
upload scrub, the staleness and consolidation guardrails, and the correction / reinforcement
signals in a conversation. No I/O and no model text: the prompt that asks for an update and the
parser that reads one live in ``prompts/``; the storage that persists the result in ``storage/``.
"""
