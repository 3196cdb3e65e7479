"""memq's benchmarks: each prints its figures and its ratio to a baseline measured in the same run.

Run them with ``make bench`` (``python -m bench``) or a part of them with
``python -m bench --only P1,P7 --quick``. Timings live here, never in the tests.
"""
