"""What the worker's tasks need, per process: the Redis and queue clients, the metrics recorder,
the extraction pipeline, the gates before each model call (budgets, shared rate limit), the price
table and the batch lane, each built lazily once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from memq.core.clock import now_ms
from memq.core.connection import RedisClient, redis_client
from memq.core.metrics import MetricsRecorder
from memq.core.settings import MemqSettings
from worker.cost import PriceTable
from worker.gates import RunGates
from worker.queue import QueueClient
from worker.response_format import FormatChoice
from worker.settle import Settlement

if TYPE_CHECKING:
    from storage.base import PendingRead
    from worker.batch import BatchLane
    from worker.batch_queue import BatchQueue
    from worker.pipeline import ExtractionPipeline


class WorkerRuntime:
    """Redis client, queue client, metrics recorder and extraction pipeline, built lazily once
    per process.

    Lazy because a prefork worker forks after the app is built: connections and the LLM client
    must be created in the child that uses them (the pid check rebuilds after a fork).
    """

    def __init__(
        self,
        settings: MemqSettings,
        *,
        pipeline_factory: Callable[[MemqSettings, RedisClient], ExtractionPipeline] | None = None,
    ) -> None:
        self.settings = settings
        # What the endpoint is asked to constrain answers to, learnt once per process (a forked
        # child learns again) and sent by the synchronous calls and the batch lane alike.
        self.formats = FormatChoice(settings.llm_response_format)
        self._pipeline_factory = pipeline_factory or build_pipeline
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._redis: RedisClient | None = None
        self._queue: QueueClient | None = None
        self._metrics: MetricsRecorder | None = None
        self._pipeline: ExtractionPipeline | None = None
        self._gates: RunGates | None = None
        self.prices = PriceTable.from_settings(settings)
        self._batches: BatchQueue | None = None
        self._lane: BatchLane | None = None

    @property
    def client(self) -> RedisClient:
        return self._base()[0]

    @property
    def queue(self) -> QueueClient:
        return self._base()[1]

    @property
    def metrics(self) -> MetricsRecorder:
        return self._base()[2]

    @property
    def pipeline(self) -> ExtractionPipeline:
        with self._lock:
            self._check_fork()
            if self._pipeline is None:
                client, _, metrics = self._base_locked()
                if self._pipeline_factory is build_pipeline:  # its LLM figures go with the run's
                    self._pipeline = build_pipeline(
                        self.settings, client, metrics=metrics, formats=self.formats
                    )
                else:
                    self._pipeline = self._pipeline_factory(self.settings, client)
            return self._pipeline

    def pending_memory(self, context_id: str) -> PendingRead | None:
        """:meth:`ExtractionPipeline.pending_memory`, once the pipeline is built (None before:
        building it takes a while, and the first run's lease is renewed before that)."""
        with self._lock:
            self._check_fork()
            pipeline = self._pipeline
        return None if pipeline is None else pipeline.pending_memory(context_id)

    @property
    def gates(self) -> RunGates:
        """The token budgets and the shared rate limit, asked before each model call."""
        with self._lock:
            self._check_fork()
            if self._gates is None:
                self._gates = RunGates(self.settings, self._base_locked()[0])
            return self._gates

    def settlement(self, clock: Callable[[], int]) -> Settlement:
        """Where an answered run of either lane is spent, settled, counted and logged."""
        return Settlement(self.metrics, self.gates.budget, self.prices, clock)

    @property
    def batches(self) -> BatchQueue:
        """The batch lane's queue operations (its scripts registered once per process)."""
        from worker.batch_queue import BatchQueue

        with self._lock:
            self._check_fork()
            if self._batches is None:
                self._batches = BatchQueue(self.settings, self._base_locked()[0])
            return self._batches

    def batch_lane(self) -> BatchLane:
        """The gatherer and poller of batch jobs (the ``memq.batch`` task)."""
        from worker.batch import BatchLane
        from worker.batch_api import OpenAIBatchEndpoint

        pipeline, batches, settlement = self.pipeline, self.batches, self.settlement(now_ms)
        with self._lock:
            if self._lane is None:
                self._lane = BatchLane(
                    self.settings,
                    self._base_locked()[1],
                    batches,
                    pipeline,
                    OpenAIBatchEndpoint(self.settings),
                    settlement=settlement,
                )
            return self._lane

    def _base(self) -> tuple[RedisClient, QueueClient, MetricsRecorder]:
        with self._lock:
            self._check_fork()
            return self._base_locked()

    def _base_locked(self) -> tuple[RedisClient, QueueClient, MetricsRecorder]:
        if self._redis is None or self._queue is None or self._metrics is None:
            # Worker-side calls ride out a short Redis restart (a few seconds) instead of failing
            # the run's settlement and leaving its context to wait for its lease.
            self._redis = redis_client(self.settings, outage_retries=8)
            self._queue = QueueClient(self.settings, self._redis)
            # A run's LLM request figures are written with its extraction's, in one round trip.
            self._metrics = MetricsRecorder.for_settings(
                self.settings, self._redis, hold_llm_requests=True
            )
            self._pid = os.getpid()
        return self._redis, self._queue, self._metrics

    def _check_fork(self) -> None:
        if self._pid is not None and self._pid != os.getpid():
            self._redis = self._queue = self._pipeline = self._metrics = self._gates = None
            self._batches = self._lane = None
            self._pid = None


def build_pipeline(
    settings: MemqSettings,
    client: RedisClient,
    *,
    metrics: MetricsRecorder | None = None,
    formats: FormatChoice | None = None,
) -> ExtractionPipeline:
    """The production pipeline: configured storage and LLM (imported here, not at module load,
    so the ticker and the app factory never load the LLM client); ``metrics`` records the LLM
    requests (the runtime's own recorder, which writes them with the run's figures); ``formats``:
    the process's choice of response format."""
    from storage import get_storage
    from worker.embeddings import build_fact_embedding
    from worker.llm import build_update_model
    from worker.pipeline import ExtractionPipeline
    from worker.ratelimit import SharedRateLimit

    limiter = SharedRateLimit.for_settings(settings, client)
    metrics = metrics or MetricsRecorder.for_settings(settings, client)
    return ExtractionPipeline(
        settings,
        get_storage(settings, redis=client),
        build_update_model(
            settings,
            observe=metrics.llm_request,
            on_limits=None if limiter is None else limiter.observe,
            formats=formats,
        ),
        embedding=build_fact_embedding(settings, metrics.count),
    )
