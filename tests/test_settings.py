from __future__ import annotations

from pathlib import Path

import pytest

from memq.core.errors import ConfigError
from memq.core.settings import load_settings


def test_defaults_match_the_documented_ones() -> None:
    s = load_settings()
    assert s.key_prefix == "memq"
    assert s.debounce_seconds == 30
    assert s.max_delay_seconds == 300
    assert s.tick_seconds == 1.0
    assert s.max_facts == 200
    assert s.effective_broker_url == s.redis_url
    assert s.resolved_llm_provider == "rules"


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQ_DEBOUNCE_SECONDS", "2.5")
    monkeypatch.setenv("MEMQ_GUARANTEED_CATEGORIES", "correction, goal")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    s = load_settings()
    assert s.debounce_seconds == 2.5
    assert s.guaranteed_categories == ("correction", "goal")
    assert s.llm_api_key is not None and s.llm_api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(s)
    assert s.resolved_llm_provider == "openai"


def test_yaml_memory_section_accepts_deerflow_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "memory:\n  debounce_seconds: 12\n  max_injection_tokens: 1500\n"
        "  token_counting: char\n  model_name: qwen\n  storage_class: null\n"
    )
    monkeypatch.setenv("MEMQ_CONFIG", str(config))
    monkeypatch.setenv("MEMQ_DEBOUNCE_SECONDS", "7")  # env beats the file
    s = load_settings()
    assert s.debounce_seconds == 7
    assert s.injected_memory_max_tokens == 1500
    assert s.token_counting is False
    assert s.llm_model == "qwen"


def test_bad_values_are_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_delay_seconds"):
        load_settings(debounce_seconds=60, max_delay_seconds=10)
    broken = tmp_path / "broken.yaml"
    broken.write_text("memory: [1, 2")
    monkeypatch.setenv("MEMQ_CONFIG", str(broken))
    with pytest.raises(ConfigError, match="YAML"):
        load_settings()


def test_a_run_time_limit_shorter_than_the_llm_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"run_time_limit_seconds .* shorter than llm_timeout"):
        load_settings(run_time_limit_seconds=5, llm_timeout_seconds=30)


def test_the_run_budget_covers_every_model_attempt_and_the_hard_limit_follows() -> None:
    settings = load_settings(llm_timeout_seconds=60, llm_max_retries=2)
    assert settings.run_budget_seconds >= 60 * 3
    assert settings.run_budget_seconds < settings.run_hard_limit_seconds
    assert load_settings(run_time_limit_seconds=90).run_budget_seconds == 90


def test_doctor_warns_on_a_budget_shorter_than_a_run_that_uses_every_retry() -> None:
    from memq.commands.doctor import check_timing

    [check] = check_timing(load_settings(run_time_limit_seconds=40, llm_timeout_seconds=30))
    assert check.status == "warn" and "MEMQ_RUN_TIME_LIMIT_SECONDS=40" in check.detail
    assert check_timing(load_settings())[0].status == "ok"


def test_errors_name_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQ_DEBOUNCE_SECONDS", "abc")
    with pytest.raises(ConfigError, match=r"MEMQ_DEBOUNCE_SECONDS: not a number: 'abc'"):
        load_settings()
    monkeypatch.delenv("MEMQ_DEBOUNCE_SECONDS")
    monkeypatch.setenv("MEMQ_SHARDS", "many")
    with pytest.raises(ConfigError, match=r"MEMQ_SHARDS: not a whole number: 'many'"):
        load_settings()


@pytest.mark.parametrize("url", ["localhost:6379", "http://localhost:6379", "user:pw@host:6379"])
def test_a_redis_url_without_a_redis_scheme_says_what_it_needs(url: str) -> None:
    with pytest.raises(ConfigError, match="MEMQ_REDIS_URL: needs redis:// or rediss://") as info:
        load_settings(redis_url=url)
    assert "pw" not in str(info.value)  # the value may hold a password: never repeated


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost:6379/0",
        "rediss://h:6380",
        "redis+cluster://h:7000",
        "rediss+cluster://h:7000",
        "redis+sentinel://h:26379/mymaster",
        "unix:///run/redis.sock",
    ],
)
def test_redis_schemes_accepted(url: str) -> None:
    shards = {"shards": 192} if "+cluster" in url else {}
    assert load_settings(redis_url=url, **shards).redis_url == url


@pytest.mark.parametrize("url", ["redis+cluster://h:7000", "rediss+cluster://u:pw@h:7000/0"])
def test_a_cluster_url_without_a_shard_count_is_refused_naming_memq_shards(url: str) -> None:
    # With the default of one shard every queue key shares one hash tag: one master of the
    # cluster holds all of them.
    with pytest.raises(ConfigError, match="MEMQ_SHARDS") as info:
        load_settings(redis_url=url)
    assert "\n" not in str(info.value) and "pw" not in str(info.value)


def test_a_cluster_url_with_a_shard_count_from_the_environment_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMQ_REDIS_URL", "redis+cluster://h:7000")
    monkeypatch.setenv("MEMQ_SHARDS", "1")  # said explicitly: the operator's choice
    assert load_settings().shards == 1


def test_storage_defaults_to_redis_and_folders_are_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMQ_STORAGE_DIR", "mem")
    s = load_settings()
    assert s.storage == "redis"
    assert s.storage_dir == tmp_path / "mem" and s.storage_dir.is_absolute()
    assert s.data_dir == tmp_path / ".memq"
