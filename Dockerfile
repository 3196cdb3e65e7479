# One image for every memq process (worker, beat, flower, the CLI); docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY storage ./storage
COPY prompts ./prompts
COPY producer ./producer
COPY worker ./worker
COPY memq ./memq
RUN pip install . \
    && useradd --create-home --uid 10001 memq \
    && mkdir -p /data && chown memq /data

USER memq
ENV MEMQ_DATA_DIR=/data \
    MEMQ_STORAGE_DIR=/data/memory
VOLUME ["/data"]

CMD ["celery", "-A", "worker.app", "worker", "--loglevel=INFO"]
