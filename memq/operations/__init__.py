"""The operation layer: every operation a door offers (hand-off, recall, facts, provenance,
export/import, forget, queue), written once with the scope it needs, its caps and its errors.

The doors — HTTP routes, MCP tools, inspector pages, CLI commands, the DeerFlow backend, the
LangChain middleware — parse their input, call :class:`memq.operations.service.MemqService` with
the caller's :class:`memq.operations.access.Principal`, and render the answer. Which scope each
operation needs is the one table in :mod:`memq.operations.table`.
"""
