"""Test doubles shared by the tests, the benchmarks and the soak: a scripted OpenAI-compatible
server, real Celery worker/beat subprocesses, private redis-servers, and waiting on a condition.

Nothing in memq imports this package; it needs no pytest (the fixtures live in ``tests/``).
"""
