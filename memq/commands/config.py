"""`memq config`: the effective settings (secrets masked), and the README's settings table.

The README table is generated from the settings model (`memq config --markdown`) and a test checks
that README and model agree, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from memq.commands.common import CommandContext, format_table
from memq.core.redis_urls import mask_url
from memq.core.settings import MemqSettings, unknown_setting_lines

# One line per setting; a setting without a line fails `settings_markdown` (and so the README test).
DESCRIPTIONS: dict[str, str] = {
    "enabled": "master switch: producers enqueue nothing when off",
    "injection_enabled": "MemoryInjector returns an empty block when off",
    "redis_url": (
        "Redis holding the queue and (with the default `storage=redis`) the memory: `redis://`, "
        "`redis+cluster://h:p,h:p` (Redis Cluster), `redis+sentinel://h:p,h:p/master`; "
        "unset → `memq up`/`demo` start a private one"
    ),
    "broker_url": (
        "Celery broker: plain Redis or `sentinel://h:p;sentinel://h:p` (never a cluster); "
        "defaults to `redis_url` (its Sentinels for `redis+sentinel://`)"
    ),
    "broker_master_name": "master name of a `sentinel://` broker",
    "key_prefix": "prefix of every Redis key (one prefix per memq deployment)",
    "shards": (
        "queue shards, each one hash tag (on a cluster 64-256, spread evenly over the masters; "
        "a cluster URL without it is refused)"
    ),
    "redis_max_connections": "connection pool size per process",
    "debounce_seconds": "quiet time after the last enqueue before a context is extracted",
    "max_delay_seconds": "a busy thread waits at most this long after its first pending turn",
    "tick_seconds": "beat period of `memq.tick` (claim due contexts, reap expired leases)",
    "lease_seconds": "a claimed context returns to `due` if not finished by then",
    "max_attempts": "failed extractions before a context moves to the dead letters",
    "claim_batch": "contexts claimed per tick",
    "max_inflight": "cap on contexts in flight at once (back-pressure on the LLM)",
    "max_inflight_per_user": (
        "cap on one user's contexts in flight at once (split over the shards), so one tenant's "
        "backlog never holds up another's"
    ),
    "retry_backoff_seconds": "base delay before a retry after a transient LLM failure",
    "retry_backoff_max_seconds": "longest delay before such a retry",
    "run_time_limit_seconds": "time budget of one extraction (Celery soft time limit; the lease "
    "is renewed until it ends); unset: LLM timeout × attempts + retry waits + 15 s",
    "dead_retention_days": "how long a dead letter (and the conversation it holds) is kept",
    "context_retention_days": "how long a context nobody extracts is kept after its last "
    "enqueue (a worker outage longer than this loses it)",
    "producer_timeout_seconds": "Redis timeout of a producer call (the agent never waits longer)",
    "injector_timeout_seconds": (
        "Redis timeout of the memory read before each agent turn (then skipped for a back-off)"
    ),
    "spool_max_contexts": "contexts a producer keeps for a later retry while Redis is unreachable",
    "spool_max_bytes": "bytes of messages a producer's spool keeps (the oldest contexts go first)",
    "spool_dir": (
        "folder of the producer's spool on disk (a process that ends during an outage loses "
        "nothing); unset → `<data_dir>/spool` when the data folder exists"
    ),
    "spool_durable": "keep the spool on disk when a folder is known (off: in memory only)",
    "producer_max_chars": (
        "size cap of one enqueue, in characters of the JSON sent (ids and escapes count); a "
        "message over half of it keeps its tail"
    ),
    "producer_max_messages": "at most this many (the newest) messages per enqueue",
    "pending_max_bytes": (
        "a context whose accumulated, not yet extracted messages exceed this (JSON bytes) is due "
        "at once instead of debounced"
    ),
    "context_max_bytes": (
        "hard cap of one context's stored messages (JSON bytes), checked before enqueue.lua "
        "decodes: the oldest are cut and counted (`cut_messages` on the context)"
    ),
    "embedding_model": (
        "embedding model for recall by meaning (OpenAI-compatible `/v1/embeddings`); unset: "
        "recall ranks by words alone and nothing is embedded"
    ),
    "embedding_base_url": "embeddings endpoint (`…/v1`); unset: `MEMQ_LLM_BASE_URL`",
    "embedding_api_key": "API key of the embeddings endpoint; unset: the LLM's key",
    "embedding_timeout_seconds": (
        "longest wait for the query's embedding at recall; past it (or while the endpoint is "
        "failing) recall ranks by words alone, counted as `recall_fallbacks`"
    ),
    "embedding_query_cache_size": "recent query embeddings kept per process (0: none)",
    "embedding_batch_size": "fact texts per embeddings request of the workers and `memq reembed`",
    "llm_provider": "`auto` (a model if an endpoint or key is set, else rules), `openai`, `rules`",
    "llm_base_url": "OpenAI-compatible endpoint (`…/v1`)",
    "llm_api_key": "API key (`MEMQ_LLM_API_KEY` or `OPENAI_API_KEY`)",
    "llm_model": "model used for extraction",
    "llm_timeout_seconds": "timeout of one LLM call",
    "llm_max_retries": "retries inside the openai client before the task retries",
    "llm_response_format": (
        "`response_format` of extraction calls: `json_schema` (structured outputs, the answer "
        "model's strict schema), `json_object` (JSON mode), `none`; `auto` asks for the schema "
        "and steps down, once per worker process, when the endpoint refuses it (llama-cpp-python "
        "then gets its `json_object` + `schema` form)"
    ),
    "llm_temperature": "sampling temperature of the extraction call",
    "llm_prompt_cache_key": (
        "send a stable, hashed `prompt_cache_key` per (user, agent) so the provider's prompt "
        "cache serves a user's consecutive extractions; off for endpoints that reject the field"
    ),
    "memory_slice_max_tokens": (
        "past this many tokens of facts, an extraction shows only the protected categories and "
        "the facts most relevant to the new messages, within this budget (unset: all facts)"
    ),
    "llm_prompt_layout": (
        "`cache_friendly`: the update prompt's static part ends with a worked example (1,024+ "
        "tokens, what a provider caches) and the memory shows facts (append-only) before the "
        "summaries (rewritten often); `compact`: the layout before the cost engine, ~500 "
        "tokens shorter, summaries first"
    ),
    "llm_service_tier": (
        "`service_tier` sent with each call (unset: none sent); `flex` is billed at batch prices "
        "and may be refused with a 429"
    ),
    "llm_flex_fallback": (
        "after the retries of a refused `flex` call, try once more at the default tier"
    ),
    "llm_price_input_per_million": (
        "price table, $ per million input tokens (unset: no bill is kept)"
    ),
    "llm_price_cached_input_per_million": (
        "$ per million cached input tokens (unset: the input price)"
    ),
    "llm_price_output_per_million": "$ per million output tokens",
    "llm_batch_discount": "share of the price taken off flex and batch calls (0.5 = half price)",
    "llm_rate_limit_rpm": (
        "requests per minute to the model, shared by every worker process (unset: no limit); a "
        "run over it goes back to `due` at the next free slot"
    ),
    "llm_rate_limit_tpm": "tokens per minute to the model, shared likewise (unset: no limit)",
    "llm_budget_tokens_per_user": (
        "LLM tokens (prompt + completion) one user may spend per budget window; over it, that "
        "user's contexts wait in `due` for the next window (unset: no budget)"
    ),
    "llm_budget_tokens_total": (
        "LLM tokens the whole deployment may spend per budget window; over it, every context "
        "waits for the next window (unset: no budget)"
    ),
    "llm_budget_window_seconds": "the budget window (default a day, aligned to UTC midnight)",
    "llm_rate_limit_burst_seconds": (
        "the limit is enforced over this period (providers quantize: 60 RPM as 1 per second)"
    ),
    "llm_batch_enabled": (
        "batch lane: due contexts that were not flushed go out in OpenAI Batch API jobs "
        "(batch prices, results within the completion window); flushes stay synchronous"
    ),
    "llm_batch_completion_window": "completion window of each batch job (OpenAI accepts `24h`)",
    "llm_batch_max_requests": "requests (contexts) gathered into one batch job at most",
    "llm_batch_gather_seconds": (
        "longest a context waits to be gathered into a batch job (sooner when one is full)"
    ),
    "llm_batch_poll_seconds": "how often the ticker asks for the status of a batch job out",
    "max_facts": "fact cap per memory document",
    "fact_max_chars": "longest fact (content or mistake): cut at extraction and import, "
    "refused by hand",
    "fact_confidence_threshold": "minimum confidence of an extracted fact",
    "conversation_max_tokens": "token budget of the conversation in the update prompt",
    "message_max_chars": "each message is cut to this length in the prompt",
    "context_messages": "already-extracted messages repeated as context before the new ones",
    "watermark_ttl_days": "how long a thread's extraction watermark is kept after its last run",
    "fact_max_sources": "sources kept per fact (the newest; each is one time it was learnt)",
    "superseded_max_facts": "contradicted and stale facts kept per document (the newest)",
    "grounding_requires_user": (
        "refuse a fact whose only sources are assistant messages unless the user confirmed it "
        "in the same run"
    ),
    "staleness_review_enabled": "ask the model to review old facts",
    "staleness_age_days": "age at which a fact becomes a staleness candidate",
    "staleness_min_candidates": "candidates needed before the review runs",
    "staleness_max_removals_per_cycle": "cap on staleness removals per extraction",
    "staleness_max_candidates_shown": "candidates shown to the model per extraction",
    "staleness_protected_categories": "categories never reviewed or consolidated (comma-separated)",
    "consolidation_enabled": "ask the model to merge near-duplicate facts",
    "consolidation_min_facts": "facts of one category needed before consolidation",
    "consolidation_max_groups_per_cycle": "merges per extraction",
    "consolidation_max_sources": "facts merged into one at most",
    "storage": (
        "`redis` (shared by every process and host using this Redis) or `file` (one JSON file "
        "per user and agent, on this host only)"
    ),
    "storage_dir": "folder of the file storage; a relative path is made absolute at load",
    "storage_lock_timeout_seconds": (
        "how long one update may wait for other writers of the same (user, agent) document: "
        "the file lock (file storage) or retries after a concurrent save (Redis storage, which "
        "takes no lock)"
    ),
    "storage_cache_max_documents": "file storage: parsed documents a process keeps in memory "
    "(least recently used dropped first; 0 = no cache)",
    "history_max_entries": "change-history entries kept per document",
    "injected_memory_max_tokens": "token budget of the injected `<user_memory>` block",
    "token_counting": "count tokens with tiktoken (`true`) or a character estimate (`false`)",
    "guaranteed_categories": "categories injected first from their own budget (comma-separated)",
    "guaranteed_token_budget": "that budget, in tokens",
    "data_dir": (
        "data folder of `memq up` (the private Redis and its AOF); a relative path is made "
        "absolute at load"
    ),
    "redis_maxmemory_mb": (
        "`maxmemory` of the private Redis, in MiB (writes refused past it, never evicted); "
        "unset → a quarter of the RAM"
    ),
    "redis_appendfsync": (
        "AOF fsync of the private Redis: `everysec` (may lose the last second on a crash of the "
        "host) or `always` (fsync per write, slower)"
    ),
    "flower_address": "address Flower binds to in `memq up`",
    "flower_port": "port of Flower in `memq up`",
    "flower_user": "Flower basic-auth user",
    "flower_password": "Flower basic-auth password; unset → `memq up` prints a generated one once",
    "worker_concurrency": "concurrency of each Celery worker",
    "exporter_address": "address `memq exporter` (Prometheus metrics) binds to",
    "exporter_port": "port of `memq exporter`",
    "serve_host": "bind address of `memq serve`; a non-loopback one needs API keys",
    "serve_port": "port of `memq serve` (HTTP API and MCP at `/mcp`)",
    "serve_api_keys_file": (
        "JSON file of `memq serve`'s API keys (SHA-256 digests, scopes, user-id prefixes); "
        "`memq api-key new` writes it"
    ),
    "serve_api_keys": "the same JSON in the environment (a secret: never printed)",
    "serve_max_body_bytes": "request bodies above this get 413 before they are read whole",
    "serve_forwarded_allow_ips": (
        "proxies whose `X-Forwarded-For`/`-Proto` `memq serve` trusts (comma-separated, `*`: any)"
    ),
    "serve_allowed_hosts": (
        "host names `memq serve` answers to besides loopback ones (comma-separated, `name` or "
        "`name:port`); others get 421 (DNS-rebinding protection; checked on a non-loopback bind "
        "only when set)"
    ),
    "serve_root_path": "the path prefix a reverse proxy serves memq under (e.g. `/memq`)",
    "serve_session_secret": (
        "signs the inspector's (`/ui`) session cookies; unset → random per process (set it when "
        "several `memq serve` processes share one address)"
    ),
    "serve_session_max_age_seconds": "an inspector login lasts this long",
    "serve_header_timeout_seconds": (
        "a request line and headers must arrive within this, else the connection is closed "
        "(slow clients)"
    ),
    "serve_keep_alive_seconds": "an idle keep-alive connection of `memq serve` is closed after it",
    "serve_limit_concurrency": (
        "open connections and requests of `memq serve` past which it answers 503 at once"
    ),
}

README_BEGIN = "<!-- settings-table:begin (generated by `memq config --markdown`) -->"
README_END = "<!-- settings-table:end -->"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("config", help="print the effective settings (secrets masked)")
    parser.add_argument(
        "--markdown", action="store_true", help="print the README's table of every MEMQ_* default"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a setting is invalid or a MEMQ_* variable or YAML key is unknown",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    if args.markdown:
        print(settings_markdown())
        return 0
    if args.check:
        context.settings  # noqa: B018 - builds them: an invalid value fails here, one line
        unknown = unknown_setting_lines()
        for line in unknown:
            print(line, file=sys.stderr)
        if unknown:
            return 1
        print("memq config: every setting is known and valid")
        return 0
    settings = context.settings
    rows = [
        (f"MEMQ_{name.upper()}", _show(name, getattr(settings, name)))
        for name in MemqSettings.model_fields
    ]
    print(format_table(("setting", "value"), rows, wrap=90))
    return 0


def _show(name: str, value: Any) -> str:
    if isinstance(value, SecretStr):
        return "***"
    if name in ("redis_url", "broker_url", "llm_base_url") and isinstance(value, str):
        return mask_url(value)
    return _format_default(value)


def _format_default(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, Path):
        return value.as_posix()
    return str(value)


def settings_markdown() -> str:
    """The README table, between its markers: every field of :class:`MemqSettings`."""
    missing = [n for n in MemqSettings.model_fields if n not in DESCRIPTIONS]
    if missing:
        raise ValueError(f"settings without a description in memq.commands.config: {missing}")
    lines = [README_BEGIN, "| variable | default | meaning |", "| --- | --- | --- |"]
    for name, info in MemqSettings.model_fields.items():
        default = "(unset)" if info.default is None else f"`{_format_default(info.default)}`"
        lines.append(f"| `MEMQ_{name.upper()}` | {default} | {DESCRIPTIONS[name]} |")
    lines.append(README_END)
    return "\n".join(lines)
