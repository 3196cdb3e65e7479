"""A worked example of one extraction, appended to the update prompt's static instructions.

Two reasons: a model answers the schema more reliably after one complete example, and providers
cache prompt prefixes only from 1,024 tokens on — with the example, the static part of every
extraction prompt (identical for every user of a deployment, and first in the prompt) reaches
that length, so the provider serves it from its cache instead of billing it in full each time.
Pure data; the example's answer is checked against the answer parser by the tests, so it cannot
drift from the schema.
"""

from __future__ import annotations

WORKED_EXAMPLE = """\
Example (illustration only: the people and projects in it are not the user's).
Memory before: a fact {"id": "f1", "content": "Uses Python 3.10 for the billing service", \
"category": "context", "confidence": 0.9}.
Conversation:
Date: 2023-05-08 (Monday)
[m1] User: How do I profile a slow endpoint?
[m2] Assistant: Run py-spy top against the worker's pid.
[m3] User: Thanks. We moved billing to Python 3.12 last week, by the way. Also, your last answer \
used asyncio.run inside a running loop again; that crashes our FastAPI app, await the coroutine \
instead.
[m4] Assistant: Sorry about that. Awaiting it directly works. Noted on 3.12.
[m5] User: How do I draw a bar chart? I'm presenting the migration at the team offsite in March.
Answer:
{
  "newFacts": [
    {"content": "The billing service runs on Python 3.12", "category": "context", \
"confidence": 0.95, "sourceError": null, "cites": ["m3"], "eventDate": null},
    {"content": "In the user's FastAPI app, await coroutines directly: asyncio.run inside a \
running event loop crashes it", "category": "correction", "confidence": 0.97, \
"sourceError": "Called asyncio.run inside a running event loop", "cites": ["m3"], \
"eventDate": null},
    {"content": "Presents the billing migration at the team offsite in March", \
"category": "goal", "confidence": 0.9, "sourceError": null, "cites": ["m5"], "eventDate": null}
  ],
  "factsToRemove": ["f1"],
  "user": {
    "workContext": {"summary": "Backend engineer running the billing service (Python 3.12, \
FastAPI).", "shouldUpdate": true},
    "personalContext": {"summary": "", "shouldUpdate": false},
    "topOfMind": {"summary": "Migrating billing to Python 3.12; a talk on it at the team \
offsite in March.", "shouldUpdate": true}
  },
  "history": {
    "recentMonths": {"summary": "Moved the billing service from Python 3.10 to 3.12.", \
"shouldUpdate": true},
    "earlierContext": {"summary": "", "shouldUpdate": false},
    "longTermBackground": {"summary": "", "shouldUpdate": false}
  },
  "staleFactsToRemove": [],
  "factsToConsolidate": []
}
Why: 3.12 contradicts f1, so f1 is removed and the new version added; the user's correction is \
a "correction" fact with the mistake as "sourceError"; the questions (profiling, a chart), the \
thanks and the apology are not recorded, while what the user says in passing about their work \
is; each fact cites the messages it comes from."""
