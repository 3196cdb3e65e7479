"""memq inside the agent frameworks people run: DeerFlow and LangChain v1.

Nothing here is imported by memq's core. ``memq.integrations.deerflow`` imports DeerFlow's
``MemoryManager`` when it is loaded, so it only loads inside a DeerFlow process;
``memq.integrations.langchain`` needs the ``memq[langchain]`` extra. ``deerflow_format`` (pure
conversions to DeerFlow's document shape) has no such dependency.
"""

from __future__ import annotations
