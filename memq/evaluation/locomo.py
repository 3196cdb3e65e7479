"""LoCoMo (snap-research/locomo, ``locomo10.json``): a list of samples, each with

- ``sample_id``; ``conversation``: ``speaker_a``, ``speaker_b``, then ``session_<n>`` (a list of
  turns ``{"speaker", "dia_id", "text"}``, image turns with a ``blip_caption``) and
  ``session_<n>_date_time``;
- ``qa``: ``{"question", "answer", "evidence": [dia ids], "category"}``; category 5
  (adversarial) questions have an ``adversarial_answer`` instead: they ask about something the
  conversation never says, and the right answer says so;
- ``observation``: ``session_<n>_observation`` → speaker → ``[[fact, dia id(s)], …]``.

Categories as the data set numbers them (the mapping the published numbers use): 1 multi-hop,
2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memq.evaluation.dataset import (
    Conversation,
    DatasetError,
    EvalSet,
    Observation,
    Question,
    Session,
    Turn,
    id_list,
    text_field,
)

CATEGORIES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
ADVERSARIAL = CATEGORIES[5]
# LoCoMo's own expected answer to an adversarial question.
NOT_MENTIONED = "Not mentioned in the conversation"

_SESSION = re.compile(r"session_(\d+)")


def read_locomo(data: Any) -> EvalSet:
    """The parsed ``locomo10.json`` (a list of samples; one sample object is accepted too)."""
    samples = [data] if isinstance(data, Mapping) else data
    if not isinstance(samples, list):
        raise DatasetError("a LoCoMo file is a JSON list of samples")
    conversations: list[Conversation] = []
    questions: list[Question] = []
    observations: list[Observation] = []
    seen: set[str] = set()
    for index, sample in enumerate(samples):
        where = f"sample {index + 1}"
        if not isinstance(sample, Mapping):
            raise DatasetError(f"{where}: expected an object with `conversation` and `qa`")
        conv_id = text_field(sample.get("sample_id", f"sample-{index + 1}"), f"{where}.sample_id")
        where = f"sample {conv_id!r:.60}"
        if conv_id in seen:
            raise DatasetError(f"{where}: the sample_id appears twice")
        seen.add(conv_id)
        conversation = _conversation(conv_id, sample.get("conversation"), where)
        conversations.append(conversation)
        questions += _questions(conv_id, sample.get("qa", []), where)
        observations += _observations(conversation, sample.get("observation", {}), where)
    return EvalSet("locomo", tuple(conversations), tuple(questions), tuple(observations))


def _conversation(conv_id: str, raw: Any, where: str) -> Conversation:
    if not isinstance(raw, Mapping):
        raise DatasetError(f"{where}: `conversation` must be an object")
    speakers = tuple(
        text_field(raw.get(name), f"{where}.conversation.{name}")
        for name in ("speaker_a", "speaker_b")
    )
    numbers = sorted(
        int(found.group(1))
        for key in raw
        if (found := _SESSION.fullmatch(str(key))) and isinstance(raw[key], list)
    )
    sessions = []
    for number in numbers:
        name = f"session_{number}"
        date = raw.get(f"{name}_date_time", "")
        read = (
            _turn(turn, f"{where}.{name}[{i}]", f"D{number}:{i + 1}")
            for i, turn in enumerate(raw[name])
        )
        turns = tuple(turn for turn in read if turn.text.strip())  # a blank turn says nothing
        if turns:
            sessions.append(Session(name, text_field(date, f"{where}.{name}_date_time"), turns))
    if not sessions:
        raise DatasetError(f"{where}: the conversation has no sessions")
    return Conversation(conv_id, tuple(sessions), speakers, named_speakers=True)


def _turn(raw: Any, where: str, default_id: str) -> Turn:
    if not isinstance(raw, Mapping):
        raise DatasetError(f"{where}: a turn must be an object with `speaker` and `text`")
    text = text_field(raw.get("text", ""), f"{where}.text")
    caption = raw.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        text = f"{text} [shares a photo: {caption.strip()}]".strip()
    return Turn(
        text_field(raw.get("dia_id", default_id), f"{where}.dia_id"),
        text_field(raw.get("speaker"), f"{where}.speaker"),
        text,
    )


def _questions(conv_id: str, raw: Any, where: str) -> list[Question]:
    if not isinstance(raw, list):
        raise DatasetError(f"{where}: `qa` must be a list")
    found = []
    for index, item in enumerate(raw):
        here = f"{where}.qa[{index}]"
        if not isinstance(item, Mapping):
            raise DatasetError(f"{here}: expected an object")
        category = CATEGORIES.get(item.get("category"))  # type: ignore[arg-type]
        if category is None:
            raise DatasetError(f"{here}: category must be one of 1-5")
        adversarial = category == ADVERSARIAL
        if adversarial:
            answer = NOT_MENTIONED
        elif "answer" in item:
            answer = text_field(item["answer"], f"{here}.answer")
        else:
            raise DatasetError(f"{here}: no `answer`")
        found.append(
            Question(
                id=f"{conv_id}#q{index + 1}",
                conversation_id=conv_id,
                category=category,
                question=text_field(item.get("question"), f"{here}.question"),
                answer=answer,
                abstention=adversarial,
                date=None,
                evidence=id_list(item.get("evidence", [])),
            )
        )
    return found


def _observations(conversation: Conversation, raw: Any, where: str) -> list[Observation]:
    if not isinstance(raw, Mapping):
        raise DatasetError(f"{where}: `observation` must be an object")
    found = []
    for key, by_speaker in raw.items():
        session_id = str(key).removesuffix("_observation")
        if not isinstance(by_speaker, Mapping):
            continue  # some copies hold an empty list or a note here: no observations
        for speaker, items in by_speaker.items():
            if speaker not in conversation.subjects or not isinstance(items, list):
                continue
            for item in items:
                if isinstance(item, list) and item and isinstance(item[0], str):
                    evidence = id_list(item[1]) if len(item) > 1 else ()
                    found.append(
                        Observation(conversation.id, speaker, session_id, item[0], evidence)
                    )
    return found
