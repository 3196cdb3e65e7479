"""memq's settings: one frozen object, built once at an entry point and passed down.

Sources, strongest first: keyword arguments, ``MEMQ_*`` environment variables, the ``memory:``
section of the YAML file named by ``MEMQ_CONFIG`` (DeerFlow's field names accepted), then defaults.
Nothing in memq reads the environment at import time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from memq.core.errors import ConfigError
from memq.core.redis_urls import BrokerTarget, broker_target, parse_redis_url, url_kind
from memq.core.settings_errors import describe_setting_error
from memq.core.settings_sources import (
    private_redis_url,
    split_csv,
    unknown_settings,
    yaml_memory_section,
)

log = logging.getLogger("memq.settings")

# The LLM client sleeps through a Retry-After up to this long between attempts (longer waits go
# back to the queue); the run budget counts one such wait per retry.
INLINE_RETRY_WAIT_SECONDS = 10.0
# Prompt building, the storage's lock and save, the queue's settlement: seconds, not minutes.
RUN_SLACK_SECONDS = 15.0
# Between the soft time limit (an exception the run settles as a failure) and the hard one.
HARD_LIMIT_GRACE_SECONDS = 5.0

# Where the `openai` SDK sends requests when no base URL is given; the embeddings endpoint defaults
# to it the same way (a user who names only a key and a model means OpenAI).
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"

# Cluster and Sentinel schemes are accepted now so configurations written for them stay valid.
REDIS_SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "unix")


LLMResponseFormat = Literal["auto", "json_schema", "json_object", "none"]


class MemqSettings(BaseSettings):
    """Every knob of memq, with units in the names. See README's configuration table."""

    model_config = SettingsConfigDict(
        env_prefix="MEMQ_", frozen=True, extra="ignore", populate_by_name=True
    )

    # --- switches
    enabled: bool = True
    injection_enabled: bool = True

    # --- Redis and Celery
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str | None = None
    # A sentinel:// broker: the master name its Sentinels monitor (Celery's `master_name`).
    broker_master_name: str | None = None
    key_prefix: str = Field(default="memq", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    shards: int = Field(default=1, ge=1, le=1024)
    redis_max_connections: int = Field(default=256, ge=1)

    # --- queue timing
    debounce_seconds: float = Field(default=30.0, ge=0.0, le=3600.0)
    max_delay_seconds: float = Field(default=300.0, gt=0.0, le=86400.0)
    tick_seconds: float = Field(default=1.0, gt=0.0, le=60.0)
    lease_seconds: float = Field(default=180.0, gt=0.0)
    max_attempts: int = Field(default=5, ge=1, le=100)
    claim_batch: int = Field(default=100, ge=1, le=1000)
    max_inflight: int = Field(default=2000, ge=1)
    max_inflight_per_user: int = Field(default=16, ge=1)
    retry_backoff_seconds: float = Field(default=5.0, ge=0.0)
    retry_backoff_max_seconds: float = Field(default=300.0, ge=0.0)
    # None: derived from the LLM timeout and retries (see `run_budget_seconds`).
    run_time_limit_seconds: float | None = Field(default=None, gt=0.0)
    dead_retention_days: float = Field(default=7.0, gt=0.0, le=3650.0)
    context_retention_days: float = Field(default=30.0, gt=0.0, le=3650.0)

    # --- producer
    producer_timeout_seconds: float = Field(default=0.25, gt=0.0, le=10.0)
    injector_timeout_seconds: float = Field(default=0.5, gt=0.0, le=10.0)
    spool_max_contexts: int = Field(default=1000, ge=0)
    # The spool's bound in bytes of messages (the oldest contexts go first past it).
    spool_max_bytes: int = Field(default=50_000_000, ge=10_000)
    # Where a producer keeps its spool on disk, so a process that ends during an outage (MCP
    # stdio, the CLI, a serverless agent) loses nothing: the next process started with the same
    # folder replays it. Unset: `<data_dir>/spool` when the data folder exists, else in memory.
    spool_dir: Path | None = None
    spool_durable: bool = True
    producer_max_chars: int = Field(default=200_000, ge=1000)
    producer_max_messages: int = Field(default=1000, ge=2, le=100_000)
    pending_max_bytes: int = Field(default=1_000_000, ge=10_000)
    # The hard cap of one context's stored messages, checked before enqueue.lua decodes anything:
    # past it the oldest messages are cut (and counted on the context), so one runaway thread can
    # never make every producer call of its shard slow.
    context_max_bytes: int = Field(default=2_000_000, ge=10_000)

    # --- LLM
    llm_provider: Literal["auto", "openai", "rules"] = "auto"
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("llm_api_key", "MEMQ_LLM_API_KEY", "OPENAI_API_KEY"),
    )
    llm_model: str = "gpt-4o-mini"
    llm_timeout_seconds: float = Field(default=30.0, gt=0.0)
    llm_max_retries: int = Field(default=2, ge=0, le=10)
    # What extraction asks the endpoint to constrain its answer to: the answer's JSON schema
    # (structured outputs), JSON mode, or nothing; `auto` tries the schema and steps down, once
    # per process, when the endpoint refuses it.
    llm_response_format: LLMResponseFormat = "auto"
    llm_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    # --- LLM cost: cache routing, service tier, price table, shared rate limit
    llm_prompt_cache_key: bool = True
    llm_prompt_layout: Literal["cache_friendly", "compact"] = "cache_friendly"
    llm_service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    llm_flex_fallback: bool = True
    llm_price_input_per_million: float | None = Field(default=None, ge=0.0)
    llm_price_cached_input_per_million: float | None = Field(default=None, ge=0.0)
    llm_price_output_per_million: float | None = Field(default=None, ge=0.0)
    llm_batch_discount: float = Field(default=0.5, ge=0.0, le=1.0)
    llm_rate_limit_rpm: float | None = Field(default=None, gt=0.0)
    llm_rate_limit_tpm: float | None = Field(default=None, gt=0.0)
    llm_rate_limit_burst_seconds: float = Field(default=1.0, gt=0.0, le=60.0)
    llm_budget_tokens_per_user: int | None = Field(default=None, ge=1)
    llm_budget_tokens_total: int | None = Field(default=None, ge=1)
    llm_budget_window_seconds: float = Field(default=86_400.0, ge=1.0, le=31 * 86_400.0)
    # The batch lane: work that can wait goes out in OpenAI Batch API jobs at batch prices.
    llm_batch_enabled: bool = False
    llm_batch_completion_window: str = Field(default="24h", pattern=r"^[1-9][0-9]{0,2}h$")
    llm_batch_max_requests: int = Field(default=1000, ge=1, le=50_000)
    llm_batch_gather_seconds: float = Field(default=60.0, ge=0.0, le=86400.0)
    llm_batch_poll_seconds: float = Field(default=60.0, gt=0.0, le=3600.0)

    # --- embeddings (recall by meaning; off while no model is named)
    embedding_model: str | None = Field(default=None, min_length=1, max_length=200)
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None
    embedding_timeout_seconds: float = Field(default=0.3, gt=0.0, le=10.0)
    embedding_query_cache_size: int = Field(default=1024, ge=0, le=1_000_000)
    embedding_batch_size: int = Field(default=256, ge=1, le=2048)

    # --- extraction
    max_facts: int = Field(default=200, ge=10, le=5000)
    fact_max_chars: int = Field(default=1000, ge=50, le=100_000)
    fact_confidence_threshold: float = Field(default=0.7, ge=0.0, le=1.0)
    conversation_max_tokens: int = Field(default=6000, ge=200)
    memory_slice_max_tokens: int | None = Field(default=None, ge=200)
    message_max_chars: int = Field(default=2000, ge=100)
    context_messages: int = Field(default=2, ge=0, le=50)
    watermark_ttl_days: int = Field(default=30, ge=1, le=3650)
    staleness_review_enabled: bool = True
    staleness_age_days: int = Field(default=90, ge=1, le=3650)
    staleness_min_candidates: int = Field(default=3, ge=1, le=50)
    staleness_max_removals_per_cycle: int = Field(default=10, ge=1, le=50)
    staleness_max_candidates_shown: int = Field(default=20, ge=1, le=200)
    staleness_protected_categories: Annotated[tuple[str, ...], NoDecode] = ("correction",)
    consolidation_enabled: bool = False
    consolidation_min_facts: int = Field(default=8, ge=3, le=30)
    consolidation_max_groups_per_cycle: int = Field(default=3, ge=1, le=10)
    consolidation_max_sources: int = Field(default=8, ge=2, le=20)
    # --- provenance
    fact_max_sources: int = Field(default=5, ge=1, le=50)
    superseded_max_facts: int = Field(default=50, ge=0, le=5000)
    grounding_requires_user: bool = True

    # --- storage
    # Redis by default: every agent process and worker of a deployment, on any host and in any
    # working directory, then reads the same memory. File storage is for one host only.
    storage: Literal["file", "redis"] = "redis"
    storage_dir: Path = Path(".memq/memory")
    storage_lock_timeout_seconds: float = Field(default=10.0, gt=0.0)
    history_max_entries: int = Field(default=500, ge=0)
    storage_cache_max_documents: int = Field(default=1000, ge=0)

    # --- injection
    injected_memory_max_tokens: int = Field(default=2000, ge=50, le=32000)
    token_counting: bool = True
    guaranteed_categories: Annotated[tuple[str, ...], NoDecode] = ("correction",)
    guaranteed_token_budget: int = Field(default=500, ge=0, le=8000)

    # --- running it
    data_dir: Path = Path(".memq")
    # The private Redis of `memq up`: "always" fsyncs every write (a kill -9 or power loss loses no
    # acknowledged turn, at a throughput cost); "everysec" may lose about the last second.
    redis_appendfsync: Literal["everysec", "always"] = "everysec"
    # Its `maxmemory` in MiB (writes are refused past it, never evicted); unset: a quarter of RAM.
    redis_maxmemory_mb: int | None = Field(default=None, ge=16)
    flower_address: str = "127.0.0.1"
    flower_port: int = Field(default=5555, ge=0, le=65535)
    flower_user: str = "memq"
    flower_password: SecretStr | None = None
    worker_concurrency: int = Field(default=4, ge=1)
    exporter_address: str = "127.0.0.1"
    exporter_port: int = Field(default=9808, ge=0, le=65535)

    # --- `memq serve` (HTTP API and MCP over streamable HTTP)
    serve_host: str = "127.0.0.1"
    serve_port: int = Field(default=8790, ge=0, le=65535)
    # API keys: a JSON file (0600) and/or the JSON itself in the environment; see
    # docs/operations.md. Without any key the server only binds a loopback address.
    serve_api_keys_file: Path | None = None
    serve_api_keys: SecretStr | None = None
    # A request body above this is refused with 413 before it is read whole.
    serve_max_body_bytes: int = Field(default=2_000_000, ge=1000, le=100_000_000)
    # Addresses whose X-Forwarded-For / X-Forwarded-Proto uvicorn trusts (a reverse proxy).
    serve_forwarded_allow_ips: str = "127.0.0.1"
    serve_root_path: str = ""
    # Host names `memq serve` answers to besides loopback ones (DNS-rebinding protection):
    # `name` (any port) or `name:port`, comma-separated. See memq/server/hosts.py.
    serve_allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    # The inspector at /ui: its session cookies are signed with this secret. Unset: a random one
    # per process (sessions end when it restarts; several processes behind one address need it).
    serve_session_secret: SecretStr | None = None
    serve_session_max_age_seconds: int = Field(default=28_800, ge=60, le=2_592_000)
    # Slow clients: a request's line and headers must arrive within this (slowloris), an idle
    # keep-alive connection is closed after the other, and past `serve_limit_concurrency` open
    # connections and requests uvicorn answers 503 at once.
    serve_header_timeout_seconds: float = Field(default=10.0, gt=0.0, le=300.0)
    serve_keep_alive_seconds: int = Field(default=5, ge=1, le=300)
    serve_limit_concurrency: int = Field(default=1000, ge=10)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        scheme, sep, _ = value.partition("://")
        if not sep or scheme.lower() not in REDIS_SCHEMES:
            # The value itself is not echoed: a URL may carry a password.
            raise ValueError(
                "needs redis:// or rediss:// (for example redis://localhost:6379/0); "
                f"also accepted: {', '.join(s + '://' for s in REDIS_SCHEMES[2:])}"
            )
        return value

    @field_validator("storage_dir", "data_dir", "serve_api_keys_file", "spool_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        # Resolved once, here: a process that later changes directory, or one started elsewhere
        # and handed these settings, still means the same folder.
        return Path(os.path.abspath(value.expanduser()))

    @field_validator(
        "guaranteed_categories",
        "staleness_protected_categories",
        "serve_allowed_hosts",
        mode="before",
    )
    @classmethod
    def _csv(cls, value: Any) -> Any:
        return split_csv(value)

    @field_validator("token_counting", mode="before")
    @classmethod
    def _token_counting(cls, value: Any) -> Any:
        # DeerFlow spells it `tiktoken` / `char`.
        if isinstance(value, str) and value.strip().lower() in {"tiktoken", "char"}:
            return value.strip().lower() == "tiktoken"
        return value

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _redis_url_form(cls, value: str | None) -> str | None:
        if value is not None:
            parse_redis_url(value)  # a malformed cluster/Sentinel URL: one clear line now
        return value

    @model_validator(mode="after")
    def _coherent(self) -> MemqSettings:
        if self.max_delay_seconds < self.debounce_seconds:
            raise ValueError(
                f"max_delay_seconds ({self.max_delay_seconds}) must be >= debounce_seconds "
                f"({self.debounce_seconds})"
            )
        limit = self.run_time_limit_seconds
        if limit is not None and limit < self.llm_timeout_seconds:
            raise ValueError(
                f"run_time_limit_seconds ({limit:g}) is shorter than llm_timeout_seconds "
                f"({self.llm_timeout_seconds:g}): every slow model call would be killed"
            )
        return self

    @model_validator(mode="after")
    def _pending_cap(self) -> MemqSettings:
        # A single hand-off must fit, or every turn of a long thread would skip the debounce.
        if self.pending_max_bytes < self.producer_max_chars:
            raise ValueError(
                f"pending_max_bytes ({self.pending_max_bytes}) must be >= producer_max_chars "
                f"({self.producer_max_chars})"
            )
        # A hand-off of producer_max_chars characters is at most 4 bytes each in UTF-8.
        if self.context_max_bytes < max(self.pending_max_bytes, 4 * self.producer_max_chars):
            raise ValueError(
                f"context_max_bytes ({self.context_max_bytes}) must be >= pending_max_bytes "
                f"({self.pending_max_bytes}) and >= 4 x producer_max_chars "
                f"({4 * self.producer_max_chars})"
            )
        return self

    @model_validator(mode="after")
    def _private_redis(self) -> MemqSettings:
        # No Redis configured: the one `memq up` runs for this data folder, when it has one.
        # Set without entering `model_fields_set`: `memq up` still sees no configured Redis.
        if "redis_url" not in self.model_fields_set:
            url = private_redis_url(self.data_dir)
            if url is not None:
                object.__setattr__(self, "redis_url", url)
        return self

    @model_validator(mode="after")
    def _cluster_shards(self) -> MemqSettings:
        # One shard is one hash tag, hence one slot: on a cluster every queue key would sit on
        # one master. The right count depends on the masters, which settings cannot see.
        if url_kind(self.redis_url) == "cluster" and "shards" not in self.model_fields_set:
            raise ValueError(
                "a redis+cluster:// URL needs MEMQ_SHARDS set (about 64 per master, e.g. 192 "
                "for 3 masters): with the default of 1 every queue key sits on one master"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_values = yaml_memory_section(os.environ.get("MEMQ_CONFIG"))
        return (
            init_settings,
            env_settings,
            InitSettingsSource(settings_cls, init_kwargs=yaml_values),
        )

    # --- derived values
    @property
    def broker(self) -> BrokerTarget:
        """The Celery broker: raises :class:`ConfigError` when none can work (a Redis Cluster
        cannot be one); only Celery's side asks, so producers on a cluster need no broker."""
        return broker_target(self.broker_url, self.redis_url, self.broker_master_name)

    @property
    def effective_broker_url(self) -> str:
        return self.broker.url

    @property
    def spool_folder(self) -> Path | None:
        """The folder of the durable spool, or None when the spool lives in the process only."""
        if not self.spool_durable:
            return None
        if self.spool_dir is not None:
            return self.spool_dir
        return self.data_dir / "spool" if self.data_dir.is_dir() else None

    @property
    def debounce_ms(self) -> int:
        return int(self.debounce_seconds * 1000)

    @property
    def max_delay_ms(self) -> int:
        return int(self.max_delay_seconds * 1000)

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @property
    def derived_run_budget_seconds(self) -> float:
        """The longest an extraction can take when every model call uses its whole timeout and
        every retry its longest inline wait, plus slack for the prompt, storage and Redis."""
        calls = self.llm_max_retries + 1
        return (
            self.llm_timeout_seconds * calls
            + INLINE_RETRY_WAIT_SECONDS * self.llm_max_retries
            + RUN_SLACK_SECONDS
        )

    @property
    def run_budget_seconds(self) -> float:
        """How long one run may last: the Celery soft time limit, and the end of lease renewal.

        The lease is renewed until ``run_hard_limit_seconds`` has passed, so it can only expire
        after the prefork pool has stopped the run: a run is never killed while its claim is
        renewable, nor still running (unpaused) once its claim can be taken over.
        """
        if self.run_time_limit_seconds is not None:
            return self.run_time_limit_seconds
        return self.derived_run_budget_seconds

    @property
    def run_hard_limit_seconds(self) -> float:
        """Celery's hard time limit: the soft one plus time to settle the failure."""
        budget = self.run_budget_seconds
        return budget + min(HARD_LIMIT_GRACE_SECONDS, max(1.0, budget / 10))

    @property
    def dead_retention_ms(self) -> int:
        return int(self.dead_retention_days * 86_400_000)

    @property
    def context_retention_ms(self) -> int:
        return int(self.context_retention_days * 86_400_000)

    @property
    def watermark_ttl_ms(self) -> int:
        return self.watermark_ttl_days * 86_400_000

    @property
    def llm_batch_active(self) -> bool:
        """The batch lane runs only against a real endpoint (the offline rules have no batches)."""
        return self.llm_batch_enabled and self.resolved_llm_provider == "openai"

    @property
    def llm_batch_window_ms(self) -> int:
        """The completion window in milliseconds ("24h" → 86 400 000)."""
        return int(self.llm_batch_completion_window.removesuffix("h")) * 3_600_000

    @property
    def effective_embedding_base_url(self) -> str:
        """The embeddings endpoint: its own URL, else the LLM's, else the `openai` SDK's."""
        return self.embedding_base_url or self.llm_base_url or OPENAI_DEFAULT_BASE_URL

    @property
    def effective_embedding_api_key(self) -> SecretStr | None:
        return self.embedding_api_key or self.llm_api_key

    @property
    def resolved_llm_provider(self) -> Literal["openai", "rules"]:
        """`auto` means: a real model when an endpoint or key is configured, else the rules."""
        if self.llm_provider != "auto":
            return self.llm_provider
        return "openai" if (self.llm_base_url or self.llm_api_key) else "rules"


def load_settings(**overrides: Any) -> MemqSettings:
    """Build the settings once at an entry point; bad values become :class:`ConfigError`, and
    every unknown ``MEMQ_*`` variable or YAML key is reported (a WARNING line each)."""
    try:
        settings = MemqSettings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(describe_error(error) for error in exc.errors(include_url=False))
        raise ConfigError(f"invalid memq settings: {problems}") from None
    for line in unknown_setting_lines():
        log.warning("%s", line)
    return settings


def unknown_setting_lines() -> list[str]:
    """What :func:`load_settings` reports: the environment's and the YAML file's unknown names."""
    return unknown_settings(MemqSettings.model_fields, os.environ, os.environ.get("MEMQ_CONFIG"))


def describe_error(error: Mapping[str, Any]) -> str:
    """One problem, named by its environment variable (see :func:`describe_setting_error`)."""
    return describe_setting_error(error, MemqSettings.model_fields)
