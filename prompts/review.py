"""The review sections of the update prompt: old facts for the staleness review, large
same-category groups for consolidation. What qualifies, and which proposals are applied, is
decided in ``memory.staleness`` and ``memory.consolidation``; this module only renders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from memq.core.settings import MemqSettings
from memq.core.timestamps import day_of
from memq.memory.consolidation import Group
from prompts.escaping import one_line
from storage.document import Fact

STALENESS_TEMPLATE = """\
## Staleness review
The facts below were recorded more than {age_days} days ago. For each one decide KEEP or REMOVE.
- KEEP what is still likely true: stable traits, long-held preferences, background, expertise.
- REMOVE what the conversation or time has plausibly made obsolete: a finished or abandoned project,
  a previous job or location, a migrated tool, a goal that was met.
- When in doubt, KEEP. Only REMOVE with a concrete reason.
Put each REMOVE into "staleFactsToRemove" as {{"id": "<fact id>", "reason": "<the signal>"}}; leave
KEEP decisions out.
<stale_facts>
{lines}
</stale_facts>"""

CONSOLIDATION_HEADER = """\
## Memory consolidation
Some categories hold many facts. Where several facts below describe the same aspect of the user, you
may merge them into one fact that keeps every concrete detail (names, numbers, versions). Do not
merge facts about different aspects; when unsure, SKIP. Its confidence must not exceed the highest
confidence of its sources. At most {max_groups} merges. Put each merge into "factsToConsolidate" as
{{"sourceIds": ["<id>", "<id>"], "consolidated": \
{{"content": "…", "category": "…", "confidence": 0.9}}}}."""


def render_staleness_section(candidates: Sequence[Fact], settings: MemqSettings) -> str:
    lines = "\n".join(
        f"- [{one_line(f.id)} | {one_line(f.category)} | {f.confidence:.2f} | "
        f"{_day(f.when_said())}] {one_line(f.content)}"
        for f in candidates
    )
    return STALENESS_TEMPLATE.format(age_days=settings.staleness_age_days, lines=lines)


def render_consolidation_section(groups: Sequence[Group], settings: MemqSettings) -> str:
    blocks = [CONSOLIDATION_HEADER.format(max_groups=settings.consolidation_max_groups_per_cycle)]
    for group in groups[: settings.consolidation_max_groups_per_cycle]:
        shown = group.facts[: settings.consolidation_max_sources]
        lines = "\n".join(
            f"- [{one_line(f.id)} | {f.confidence:.2f}] {one_line(f.content)}" for f in shown
        )
        blocks.append(
            f'<consolidation_candidates category="{one_line(group.category).replace(chr(34), "")}" '
            f'count="{len(shown)}">\n{lines}\n</consolidation_candidates>'
        )
    return "\n".join(blocks)


def _day(moment: datetime | None) -> str:
    return "?" if moment is None else day_of(moment)
