"""A small LoCoMo-shaped data set the repository can ship (LoCoMo itself is licensed for
non-commercial use only, so it is never committed): :func:`sample` builds, deterministically, the
``locomo10.json`` structure :func:`memq.evaluation.locomo.read_locomo` reads — conversations of two
speakers in dated sessions, each speaker's observations citing the turns that state them, and
questions whose evidence is those turns, in LoCoMo's categories (1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop).

Like LoCoMo's, many questions share few words with their evidence ("What does Maya do to relax?"
over "Maya goes hiking in the Alps every weekend"), and each conversation carries filler facts
that share the speakers' names and everyday words, so a ranking has to find the fact by meaning.
"""

from __future__ import annotations

import random
from typing import Any

PEOPLE = (("Maya", "Tom"), ("Lena", "Omar"), ("Iris", "Ravi"))
# (observation, question, category): {a} is the speaker; a question about two observations
# (multi-hop) lists both.
TOPICS: tuple[tuple[tuple[str, ...], str, int], ...] = (
    (("{a} goes hiking in the Alps every weekend",), "What does {a} do to relax?", 4),
    (("{a} adopted a rescue greyhound named Pixel",), "What kind of pet does {a} have?", 4),
    (("{a} works as a nurse at the city hospital",), "What is {a}'s profession?", 4),
    (("{a} is learning to play the cello",), "Which instrument is {a} studying?", 4),
    (("{a} moved to Lisbon in the spring",), "When did {a} relocate?", 2),
    (("{a} ran a half marathon last Sunday",), "When did {a} take part in a race?", 2),
    (("{a} started a pottery class in March",), "When did {a} begin working with clay?", 2),
    (
        ("{a} volunteers at an animal shelter", "{a} wants to become a veterinarian"),
        "Why might {a} enjoy spending time with animals?",
        1,
    ),
    (
        ("{a} grew up near the sea", "{a} loves sailing with her father"),
        "What connects {a}'s childhood and her hobbies?",
        1,
    ),
    (("{a} reads a lot of science fiction novels",), "Would {a} enjoy a book by Asimov?", 3),
    (("{a} is vegetarian and cooks lentil curry",), "Would {a} order a steak?", 3),
    (("{a} finds crowded places overwhelming",), "Would {a} like a big music festival?", 3),
)
FILLER = (
    "{a} said the weather was nice today",
    "{a} mentioned that the week had been busy",
    "{a} thanked {b} for the chat",
    "{a} asked {b} how the family was doing",
    "{a} talked about watching a film with friends",
    "{a} said the coffee at work is terrible",
    "{a} mentioned a new phone",
    "{a} told {b} about a funny video",
    "{a} said she was tired after a long day",
    "{a} mentioned visiting a museum once",
)

THINGS = (
    "a new coffee shop",
    "the traffic in town",
    "a podcast about history",
    "her neighbour's garden",
    "a bus strike",
    "a birthday party",
    "the price of groceries",
    "an old school friend",
    "a rainy afternoon",
    "a board game night",
    "fixing a bicycle",
    "a documentary about space",
    "her favourite bakery",
    "a noisy flat upstairs",
    "a trip to the dentist",
    "a concert ticket",
    "learning some Spanish words",
    "a broken washing machine",
    "a work deadline",
    "a quiz show on television",
)
WHENS = ("yesterday", "last week", "this morning", "at lunch", "over the weekend")


def sample(conversations: int = 3, seed: int = 30) -> list[dict[str, Any]]:
    """The data set: ``conversations`` LoCoMo samples (at most len(PEOPLE))."""
    rng = random.Random(seed)
    samples = []
    for number, (first, second) in enumerate(PEOPLE[:conversations], start=1):
        conversation: dict[str, Any] = {"speaker_a": first, "speaker_b": second}
        observation: dict[str, Any] = {}
        qa: list[dict[str, Any]] = []
        sessions: list[list[dict[str, Any]]] = [[] for _ in range(4)]
        facts: list[tuple[int, str, str, str, int, int]] = []  # session, speaker, text, ...
        for topic_index, (texts, question, category) in enumerate(TOPICS):
            for speaker, other in ((first, second), (second, first)):
                ids = []
                for text in texts:
                    session = rng.randrange(4)
                    turn = len(sessions[session]) + 1
                    dia_id = f"D{session + 1}:{turn}"
                    said = text.format(a=speaker, b=other)
                    sessions[session].append({"speaker": speaker, "dia_id": dia_id, "text": said})
                    facts.append((session, speaker, said, dia_id, topic_index, category))
                    ids.append(dia_id)
                qa.append(
                    {
                        "question": question.format(a=speaker),
                        "answer": texts[0].format(a=speaker, b=other),
                        "evidence": ids,
                        "category": category,
                    }
                )
        for speaker, other in ((first, second), (second, first)):
            chatter = [
                f"{{a}} mentioned {thing} {when}"
                for thing in THINGS
                for when in WHENS
                if rng.random() < 0.5
            ]
            for text in (*FILLER, *chatter):
                session = rng.randrange(4)
                turn = len(sessions[session]) + 1
                dia_id = f"D{session + 1}:{turn}"
                said = text.format(a=speaker, b=other)
                sessions[session].append({"speaker": speaker, "dia_id": dia_id, "text": said})
                facts.append((session, speaker, said, dia_id, -1, 0))
        for index, turns in enumerate(sessions, start=1):
            conversation[f"session_{index}"] = turns
            conversation[f"session_{index}_date_time"] = f"1:00 pm on {index} May, 2023"
            observation[f"session_{index}_observation"] = {
                speaker: [
                    [text, dia]
                    for s, who, text, dia, _, _ in facts
                    if s == index - 1 and who == speaker
                ]
                for speaker in (first, second)
            }
        samples.append(
            {
                "sample_id": f"sample-{number}",
                "conversation": conversation,
                "observation": observation,
                "qa": qa,
            }
        )
    return samples
