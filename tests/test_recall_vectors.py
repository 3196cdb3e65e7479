"""Recall by meaning: fact vectors beside the document (both backends), the workers' batched
embeddings, the hybrid ranking every recall uses, and the query embedding's timeout and fallback.

Real parts: the scripted OpenAI-compatible server's ``/v1/embeddings`` (deterministic hashed
embeddings), the real `openai` client in the worker, httpx at recall, a real redis-server, and a
hung endpoint (accepts, never answers) for the fallback.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from memq.core.identity import ContextKey
from memq.core.metrics import read_counts
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from memq.testing.hung_server import HungServer
from memq.testing.waiting import wait_for
from producer.injector import MemoryInjector
from producer.query_embedding import QueryEmbedder, query_embedder
from prompts.injection import format_memory_for_injection
from storage import get_storage
from storage.document import Fact, MemoryDocument
from storage.management import MemoryManager
from storage.search import meaning_for, score_facts, search_facts
from storage.vectors import content_key, unit, with_vectors
from tests.support.openai_server import Reply, ScriptedOpenAI
from worker.embeddings import OpenAIEmbedder, embed_missing
from worker.llm import OpenAIUpdateModel
from worker.pipeline import ExtractionPipeline

MODEL = "scripted-embedding"
USER, AGENT = "alice@example.com", "a/b%c.d"  # odd-but-legal ids
PHOTO = "Takes photographs of birds on weekends"
FACTS = [
    "Works as a backend engineer in Berlin",
    PHOTO,
    "Prefers tea over coffee",
    "Has a dog called Rex",
]
QUERY = "what photography does she do"  # no word in common with PHOTO after stemming


def settings_for(make_settings: Any, server: ScriptedOpenAI, **extra: Any) -> MemqSettings:
    values: dict[str, Any] = {
        "llm_provider": "openai",
        "llm_base_url": server.base_url,
        "llm_max_retries": 0,
        "embedding_model": MODEL,
        "token_counting": False,
    }
    values.update(extra)
    return make_settings(**values)  # type: ignore[no-any-return]


def document_of(texts: list[str]) -> MemoryDocument:
    return MemoryDocument(facts=[Fact(content=t, confidence=0.9) for t in texts])


def update_json(*contents: str) -> str:
    facts = [{"content": c, "category": "knowledge", "confidence": 0.9} for c in contents]
    return json.dumps({"user": {}, "history": {}, "newFacts": facts, "factsToRemove": []})


def test_bm25_alone_misses_the_fact_that_meaning_finds(
    make_settings: Any, openai_server: ScriptedOpenAI
) -> None:
    settings = settings_for(make_settings, openai_server)
    document = document_of(FACTS)
    embedder = OpenAIEmbedder(settings)
    answer = embedder.embed(FACTS)
    document.embeddings = with_vectors({}, MODEL, dict(zip(FACTS, answer.vectors, strict=True)))
    query = query_embedder(settings)
    assert query is not None
    meaning = meaning_for(document.embeddings, MODEL, query.embed(QUERY))
    assert meaning is not None

    assert PHOTO not in [f.content for f in search_facts(document.facts, QUERY, top_k=1)]
    found = search_facts(document.facts, QUERY, top_k=1, meaning=meaning)
    assert [f.content for f in found] == [PHOTO]
    # Another model's vectors are never compared with this query's.
    other = meaning_for(document.embeddings, "another-model", query.embed(QUERY))
    assert PHOTO not in [f.content for f in search_facts(document.facts, QUERY, meaning=other)]
    query.close()


@pytest.mark.parametrize("backend", ["redis", "file"])
def test_extraction_embeds_new_facts_in_one_batched_call(
    make_settings: Any, openai_server: ScriptedOpenAI, backend: str
) -> None:
    settings = settings_for(make_settings, openai_server, storage=backend)
    storage = get_storage(settings)
    from worker.embeddings import FactEmbedding

    pipeline = ExtractionPipeline(
        settings,
        storage,
        OpenAIUpdateModel(settings),
        embedding=FactEmbedding(OpenAIEmbedder(settings)),
    )
    openai_server.script(Reply(content=update_json(*FACTS)))
    context = ConversationContext(
        key=ContextKey.create("t/1", USER, AGENT),
        messages=(Message("user", " ".join(FACTS)), Message("assistant", "Noted.")),
        trace_id="trace-1",
    )
    report = pipeline.run(context)
    assert report.outcome == "updated"

    stored = storage.load(USER, AGENT)
    assert sorted(f.content for f in stored.facts) == sorted(FACTS)
    assert openai_server.embeddings.requests == [sorted(FACTS, key=FACTS.index)]
    vectors = stored.embeddings[MODEL]
    assert set(vectors.vectors) == {content_key(t) for t in FACTS}

    # The vectors ride along in an export and come back with the import; removing a fact
    # drops its vector (a forgotten fact keeps nothing).
    manager = MemoryManager(storage, embedder=query_embedder(settings))
    exported = manager.export(USER, agent_name=AGENT)
    assert MODEL in exported["embeddings"]
    assert "embeddings" not in stored.to_json()  # what agents and pages read: no base64
    manager.import_document(USER, exported, agent_name="copy")
    assert manager.document(USER, agent_name="copy").embeddings[MODEL] == vectors
    photo = next(f for f in stored.facts if f.content == PHOTO)
    assert manager.search(USER, QUERY, agent_name=AGENT, limit=1) == [photo]
    manager.delete_fact(USER, photo.id, agent_name=AGENT)
    left = storage.load(USER, AGENT).embeddings[MODEL].vectors
    assert content_key(PHOTO) not in left and len(left) == len(FACTS) - 1

    # Nothing missing: no further request.
    assert embed_missing(storage, USER, AGENT, OpenAIEmbedder(settings)) == (0, 0)
    assert len(openai_server.embeddings.requests) == 2  # the facts, then the search query


def test_failed_embedding_keeps_the_extraction_and_is_counted(
    make_settings: Any, openai_server: ScriptedOpenAI, redis_client: Any
) -> None:
    from worker.runtime import build_pipeline

    settings = settings_for(make_settings, openai_server)
    openai_server.embeddings.status = 500
    openai_server.script(Reply(content=update_json(PHOTO)))
    context = ConversationContext(
        key=ContextKey.create("t1", USER, None),
        messages=(Message("user", PHOTO), Message("assistant", "Nice.")),
        trace_id="trace-1",
    )
    report = build_pipeline(settings, redis_client).run(context)
    assert report.outcome == "updated"
    stored = get_storage(settings, redis=redis_client).load(USER, None)
    assert [f.content for f in stored.facts] == [PHOTO] and not stored.embeddings
    assert read_counts(redis_client, settings)["embedding_failures"] == 1


def test_query_embedding_is_cached(make_settings: Any, openai_server: ScriptedOpenAI) -> None:
    embedder = query_embedder(settings_for(make_settings, openai_server))
    assert embedder is not None
    first, again = embedder.embed(QUERY), embedder.embed(QUERY)
    assert first is not None and again is first
    assert openai_server.embeddings.inputs == [QUERY]
    embedder.close()


def test_hung_endpoint_falls_back_to_words_within_the_timeout(
    make_settings: Any, openai_server: ScriptedOpenAI, redis_client: Any
) -> None:
    settings = settings_for(make_settings, openai_server, embedding_timeout_seconds=0.2)
    storage = get_storage(settings, redis=redis_client)
    document = document_of(FACTS)
    document.embeddings = with_vectors(
        {}, MODEL, dict(zip(FACTS, OpenAIEmbedder(settings).embed(FACTS).vectors, strict=True))
    )
    storage.save(USER, None, document)
    with HungServer() as hung:
        hung_settings = settings.model_copy(
            update={"embedding_base_url": f"http://127.0.0.1:{hung.port}/v1"}
        )
        embedder = query_embedder(hung_settings, redis_client)
        assert isinstance(embedder, QueryEmbedder)
        injector = MemoryInjector(hung_settings, storage, embedder=embedder)
        block = injector.block(USER, None, query="tea")
        # Ranked by words: the tea fact is there, the agent got its block, nothing raised.
        assert "Prefers tea over coffee" in block
        assert embedder.fallbacks == {"timeout": 1}
        # Backing off: the next turn does not wait on the endpoint again.
        injector.block(USER, None, query="dog")
        assert embedder.fallbacks == {"timeout": 1, "backoff": 1}
        assert hung.connections == 1
        deadline_counts = _wait_for_count(redis_client, settings, "recall_fallbacks", 2)
        assert deadline_counts == 2
        embedder.close()


def _wait_for_count(client: Any, settings: MemqSettings, name: str, want: int) -> int:
    wait_for(
        lambda: read_counts(client, settings).get(name, 0) >= want, what=f"{want} {name} counted"
    )
    return read_counts(client, settings).get(name, 0)


def test_unit_refuses_empty_and_zero_vectors() -> None:
    assert unit([]) is None and unit([0.0, 0.0]) is None
    vector = unit([3.0, 4.0])
    assert vector is not None and abs(float(vector[0]) - 0.6) < 1e-6


def _reembed_env(
    monkeypatch: pytest.MonkeyPatch, settings: MemqSettings, server: ScriptedOpenAI, **extra: Any
) -> None:
    for name in ("redis_url", "key_prefix", "storage_dir", "data_dir"):
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(getattr(settings, name)))
    monkeypatch.setenv("MEMQ_EMBEDDING_MODEL", MODEL)
    monkeypatch.setenv("MEMQ_EMBEDDING_BASE_URL", server.base_url)
    for name, value in extra.items():
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(value))


def test_reembed_embeds_existing_memories_and_resumes(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memq.cli import main

    settings = make_settings()
    storage = get_storage(settings)
    storage.save(USER, None, document_of(FACTS[:2]))
    storage.save("bob", AGENT, document_of(FACTS[2:]))
    # A token budget the first memory's request spends: the run stops at the second user, says
    # when to go on, and the next run (with room again) sends only what is still missing.
    _reembed_env(monkeypatch, settings, openai_server, llm_budget_tokens_total=5)
    assert main(["reembed"]) == 3
    assert "run `memq reembed` again" in capsys.readouterr().out
    done_first = openai_server.embeddings.inputs
    assert sorted(done_first) == sorted(FACTS[:2])

    monkeypatch.delenv("MEMQ_LLM_BUDGET_TOKENS_TOTAL")
    assert main(["reembed"]) == 0
    assert "2 facts embedded" in capsys.readouterr().out
    assert sorted(openai_server.embeddings.inputs) == sorted(FACTS)  # nothing sent twice
    for user, agent, texts in ((USER, None, FACTS[:2]), ("bob", AGENT, FACTS[2:])):
        stored = storage.load(user, agent).embeddings[MODEL].vectors
        assert set(stored) == {content_key(t) for t in texts}

    assert main(["reembed"]) == 0  # all done: no request
    assert len(openai_server.embeddings.requests) == 2


def test_reembed_without_a_model_is_one_line(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memq.cli import main

    settings = make_settings()
    for name in ("redis_url", "key_prefix", "storage_dir", "data_dir"):
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(getattr(settings, name)))
    assert main(["reembed"]) != 0
    err = capsys.readouterr().err
    assert "MEMQ_EMBEDDING_MODEL" in err and len(err.strip().splitlines()) == 1


def test_http_search_and_context_rank_by_meaning(
    make_settings: Any, openai_server: ScriptedOpenAI, serve_for: Any
) -> None:
    """The same ranking through a real `memq serve`: search and the block before a turn."""
    import httpx

    from tests.support.serve import Keys, bearer

    settings = settings_for(make_settings, openai_server, llm_provider="rules")
    storage = get_storage(settings)
    # Many unrelated facts and a small budget: the block holds only the best-ranked few.
    texts = [*(f"Mentioned item number {i} at lunch" for i in range(40)), *FACTS]
    document = document_of(texts)
    answer = OpenAIEmbedder(settings).embed(texts)
    document.embeddings = with_vectors({}, MODEL, dict(zip(texts, answer.vectors, strict=True)))
    storage.save("app1-carol", None, document)
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=30, headers=bearer(Keys().agent)) as http:
        searched = http.post("/v1/users/app1-carol/facts/search", json={"query": QUERY, "limit": 1})
        assert searched.status_code == 200, searched.text
        assert [f["content"] for f in searched.json()["facts"]] == [PHOTO]
        block = http.post(
            "/v1/users/app1-carol/context", json={"query": QUERY, "max_tokens": 60}
        ).json()["block"]
        assert PHOTO in block


def test_batch_lane_settlement_embeds_like_the_synchronous_lane(
    make_settings: Any, openai_server: ScriptedOpenAI
) -> None:
    """The batch lane settles a job's answer through the pipeline's ``apply_answer`` (as
    worker/batch.py does), after the prompt was prepared hours before: its facts get vectors in
    the same one batched request, with no model call of the synchronous kind."""
    from worker.embeddings import FactEmbedding
    from worker.model import ModelAnswer
    from worker.pipeline import Prepared

    settings = settings_for(make_settings, openai_server, storage="file")
    storage = get_storage(settings)
    pipeline = ExtractionPipeline(
        settings,
        storage,
        OpenAIUpdateModel(settings),
        embedding=FactEmbedding(OpenAIEmbedder(settings)),
    )
    context = ConversationContext(
        key=ContextKey.create("batch-1", USER, None),
        messages=(Message("user", " ".join(FACTS)), Message("assistant", "Noted.")),
        trace_id="trace-1",
    )
    prepared = pipeline.prepare(context)
    assert isinstance(prepared, Prepared)
    answer = ModelAnswer(text=update_json(*FACTS), model="scripted")
    report = pipeline.apply_answer(
        context,
        answer,
        pipeline.run_info(context, prepared, "scripted"),
        watermark=prepared.selection.watermark,
    )
    assert report.outcome == "updated"
    assert openai_server.call_count == 0  # no chat call: the answer came from the batch job
    assert openai_server.embeddings.requests == [FACTS]
    stored = storage.load(USER, None)
    assert set(stored.embeddings[MODEL].vectors) == {content_key(t) for t in FACTS}


def test_unreadable_vectors_are_dropped_never_the_document() -> None:
    good = with_vectors({}, MODEL, {PHOTO: [1.0, 0.0]})
    raw = {
        "facts": [{"content": PHOTO}],
        "embeddings": {
            MODEL: good[MODEL].model_dump(),
            "broken": {"dimensions": "many", "vectors": 3},
            "odd": {"dimensions": 2, "vectors": {"k": 1, content_key(PHOTO): "AAA="}},
        },
    }
    document = MemoryDocument.model_validate(raw)
    assert [f.content for f in document.facts] == [PHOTO]
    assert set(document.embeddings) == {MODEL, "odd"}
    assert list(document.embeddings["odd"].vectors) == [content_key(PHOTO)]


def axis(index: int, dimensions: int = 8) -> list[float]:
    return [1.0 if i == index else 0.0 for i in range(dimensions)]


def mix(*parts: tuple[float, list[float]]) -> list[float]:
    return [sum(weight * vector[i] for weight, vector in parts) for i in range(len(parts[0][1]))]


def meaning_over(texts: list[str], vectors: list[list[float]], query: list[float]) -> Any:
    stored = with_vectors({}, MODEL, dict(zip(texts, vectors, strict=True)))
    return meaning_for(stored, MODEL, unit(query))


def test_what_every_fact_of_the_memory_shares_does_not_decide_by_meaning() -> None:
    # Every fact of one user leans the same way (the user's name, their tone: axis 0); the query
    # names the user too and asks about a dog (axis 1). The raw cosine prefers the facts that
    # lean furthest the common way (0.83 against 0.69 for the dog); measured from the memory's
    # own mean, the fact about the dog is the one the question is about.
    dog = "Has a dog called Rex"
    others = ["Lives in Berlin", "Works as a nurse", "Plays the cello", "Speaks Dutch"]
    vectors = [mix((0.3, axis(0)), (1.0, axis(1)))]
    vectors += [mix((1.0, axis(0)), (0.4, axis(2 + i))) for i in range(len(others))]
    meaning = meaning_over([dog, *others], vectors, mix((1.0, axis(0)), (0.5, axis(1))))
    facts = document_of([dog, *others]).facts
    # No word in common with any fact: meaning alone ranks.
    found = search_facts(facts, "pets at home?", top_k=1, meaning=meaning)
    assert [f.content for f in found] == [dog]


@pytest.mark.parametrize("count", [1, 2, 3])
def test_a_memory_whose_vectors_are_all_alike_ranks_by_its_words(count: int) -> None:
    # One fact, or facts with the same vector: nothing is left after centring, and the query is
    # the memory's mean. Meaning then says nothing (no NaN, no crash) and BM25 decides.
    texts = ["Prefers tea over coffee", "Has a dog called Rex", "Works in Berlin"][:count]
    meaning = meaning_over(texts, [axis(0)] * count, axis(0))
    facts = document_of(texts).facts
    found = [f.content for f in search_facts(facts, "is she in Berlin", top_k=3, meaning=meaning)]
    assert len(found) == count  # with meaning every fact is ranked
    assert found[0] == ("Works in Berlin" if count == 3 else texts[0])


def learnt_in(thread: str | None, *texts: str) -> list[Fact]:
    return [Fact(content=text, confidence=0.9, source_thread_id=thread) for text in texts]


def test_a_fact_from_the_conversation_the_question_is_about_comes_before_others() -> None:
    # LoCoMo's "When did Joanna make a chocolate tart with raspberries?": its evidence says
    # "Joanna tried her newest dairy-free recipe", sharing only the name with the question, as do
    # the facts of other conversations. What sets it apart is the conversation it was said in,
    # whose other fact names the tart. Meaning is made blind here (every vector alike) so the
    # conversation alone decides between the facts that share only the name.
    tart = "Joanna baked a chocolate raspberry tart for the party"
    recipe = "Joanna tried her newest dairy-free recipe"
    facts = [
        *learnt_in("thread/2", "Joanna adopted a puppy", "Joanna went hiking"),
        *learnt_in("thread/3", "Joanna read a novel"),
        *learnt_in("thread/1", tart, recipe),
    ]
    texts = [f.content for f in facts]
    meaning = meaning_over(texts, [axis(0)] * len(facts), axis(1))
    question = "When did Joanna make a chocolate tart with raspberries?"
    found = search_facts(facts, question, top_k=2, meaning=meaning)
    assert [f.content for f in found] == [tart, recipe]
    # The block ranks through the same scores: the recipe is the second line of a tight block.
    block = format_memory_for_injection(
        MemoryDocument(facts=facts),
        55,
        count_tokens=lambda s: len(s) // 4,
        query=question,
        meaning=meaning,
    )
    assert recipe in block and "puppy" not in block


def test_facts_from_one_conversation_or_none_rank_as_by_meaning_and_words_alone() -> None:
    texts = ["Prefers tea over coffee", "Has a dog called Rex", "Works in Berlin"]
    vectors = [axis(0), axis(1), axis(2)]
    meaning = meaning_over(texts, vectors, mix((1.0, axis(1)), (0.2, axis(2))))
    query = "does she work with dogs"
    scores = {
        thread: [s.score for s in score_facts(learnt_in(thread, *texts), query, meaning)]
        for thread in (None, "only-thread")
    }
    assert scores[None] == scores["only-thread"]


def said_on(day: str, text: str, event: str | None = None) -> Fact:
    return Fact(content=text, confidence=0.9, said_at=f"{day}T15:00:00Z", event_date=event)


def test_a_fact_said_in_the_time_the_question_names_comes_first() -> None:
    # LoCoMo's "What injury did Evan suffer from in August 2023?": the evidence was said that
    # month ("Evan twisted his knee last Friday") and shares only the name with the question; a
    # fact said in October shares "suffered" and "injury". Meaning is made blind here (every
    # vector alike), so what the question's month says about when the fact was said decides.
    knee = said_on("2023-08-26", "Evan twisted his knee last Friday")
    son = said_on("2023-10-14", "Evan's son suffered an ankle injury playing soccer")
    hike = said_on("2023-06-02", "Evan went hiking in the Rockies")
    # Said later, but about something that happened in August: its event's month counts too.
    wrist = said_on("2023-11-20", "Evan broke his wrist falling off a ladder", event="2023-08")
    facts = [son, hike, knee, wrist]
    meaning = meaning_over([f.content for f in facts], [axis(0)] * len(facts), axis(1))
    question = "What injury did Evan suffer from in August 2023?"
    found = search_facts(facts, question, top_k=3, meaning=meaning)
    assert [f.content for f in found[:2]] == [knee.content, wrist.content]
    assert found[2] is son
    # The same question without its month ranks by its words: the son's injury first.
    undated = search_facts(facts, "What injury did Evan suffer from?", top_k=1, meaning=meaning)
    assert undated == [son]


def test_a_question_that_names_no_time_ranks_as_if_the_facts_knew_none() -> None:
    texts = ["Prefers tea over coffee", "Has a dog called Rex", "Works in Berlin"]
    meaning = meaning_over(texts, [axis(0), axis(1), axis(2)], mix((1.0, axis(1)), (0.2, axis(2))))
    days = ("2023-05-01", "2023-06-01", "2024-01-09")
    dated = [said_on(day, text) for day, text in zip(days, texts, strict=True)]
    undated = [Fact(content=t, confidence=0.9, created_at=None) for t in texts]
    for question in ("does she work with dogs", "what did she do last May"):
        assert [s.score for s in score_facts(dated, question, meaning)] == [
            s.score for s in score_facts(undated, question, meaning)
        ]


def test_an_event_in_the_last_month_of_the_calendar_never_breaks_a_dated_question() -> None:
    # A document may hold any event date memq reads ("9999-12", imported or answered by a model);
    # the month after it is no date at all, and recall must still answer.
    far = said_on("2023-01-05", "Plans a trip for the year 9999", event="9999-12")
    near = said_on("2023-12-10", "Went skating with her sister")
    facts = [far, near]
    meaning = meaning_over([f.content for f in facts], [axis(0)] * len(facts), axis(1))
    found = search_facts(facts, "What did she do in December 2023?", top_k=2, meaning=meaning)
    assert found[0] is near
