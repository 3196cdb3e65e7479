"""`memq reembed`: embed the facts of existing memories with the configured embedding model.

For memories written before an embedding model was configured, after a model change, or after an
endpoint outage left facts without vectors. Each (user, agent) memory gets the vectors it lacks
(:func:`worker.embeddings.embed_missing`: one request per ``embedding_batch_size`` texts), so a
run that stops — interrupted, or out of token budget — is resumed by running it again: what was
stored is not sent twice. Requests share the workers' rate limit (``MEMQ_LLM_RATE_LIMIT_RPM`` /
``_TPM``, counted apart for the embedding model) and count against the token budgets
(``MEMQ_LLM_BUDGET_TOKENS_PER_USER`` / ``_TOTAL``) like extraction; a spent budget stops the run
with the time it renews. ``--drop-other-models`` also removes the vectors of other models.
"""

from __future__ import annotations

import argparse
import time

from memq.commands.common import CommandContext, CommandError, add_user_argument, shown
from memq.core.errors import RunDeferred


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "reembed",
        help="embed existing memories' facts with MEMQ_EMBEDDING_MODEL (resumable)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # --user U or --anonymous: only that user; neither: every user.
    add_user_argument(parser, option=True, optional=True)
    parser.add_argument(
        "--drop-other-models",
        action="store_true",
        help="also remove the vectors of other embedding models",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.core.clock import now_ms
    from memq.core.keys import KeySchema
    from worker.budget import TokenBudget
    from worker.embeddings import OpenAIEmbedder, embed_missing
    from worker.ratelimit import Admission, RatePlan, SharedRateLimit, limit_scope

    settings = context.settings
    if not settings.embedding_model:
        raise CommandError("no embedding model is configured: set MEMQ_EMBEDDING_MODEL")
    storage = context.storage
    budget = TokenBudget.for_settings(settings, context.redis)
    plan = RatePlan.from_settings(settings)
    limiter = (
        None
        if plan is None
        else SharedRateLimit(
            plan,
            context.redis,
            KeySchema(settings.key_prefix, settings.shards).rate_limit(
                limit_scope(settings.effective_embedding_base_url, settings.embedding_model)
            ),
        )
    )
    embedder = OpenAIEmbedder(settings)
    users = [args.user] if args.user is not None else storage.list_users()
    total_texts = total_tokens = 0
    try:
        for user in users:
            agents = storage.list_agents(user)
            if args.user is not None and not agents:
                raise CommandError(f"no memory stored for user {shown(user)}")
            for agent in agents:

                def gate(tokens: int, user: str = user) -> None:
                    if budget is not None:
                        budget.check(user)  # RunDeferred: spent until the next window
                    while limiter is not None:
                        admission, at = limiter.acquire(tokens)
                        if admission is Admission.ADMITTED:
                            return
                        time.sleep(max(0, at - now_ms()) / 1000)  # the slot it was given

                try:
                    texts, tokens = embed_missing(
                        storage,
                        user,
                        agent,
                        embedder,
                        gate=gate,
                        keep_other_models=not args.drop_other_models,
                    )
                except RunDeferred as exc:
                    renews = time.gmtime(exc.retry_at_ms / 1000)
                    print(
                        f"stopped at user {shown(user)}: {exc}; run `memq reembed` again after "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', renews)} to go on"
                    )
                    return 3
                if budget is not None:
                    budget.spend(user, tokens)
                total_texts += texts
                total_tokens += tokens
                if texts:
                    print(f"{shown(user)} / {shown(agent or '-')}: {texts} facts embedded")
    finally:
        embedder.close()
    print(
        f"{total_texts} facts embedded with {settings.embedding_model} "
        f"({total_tokens} tokens); every memory has its vectors"
    )
    return 0
