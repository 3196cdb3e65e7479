"""`memq eval`: memory quality, cost and latency on the public LoCoMo and LongMemEval benchmarks.

The data-set readers (:mod:`.locomo`, :mod:`.longmemeval`), the prompts of the answer and judge
models (:mod:`.prompts`), the estimate (:mod:`.estimate`), the scoring (:mod:`.scoring`) and the
report (:mod:`.report`) are pure functions on the typed data of :mod:`.dataset`; only
:mod:`.runner` talks to Redis, the workers and the models. No data set is shipped or downloaded.
"""
