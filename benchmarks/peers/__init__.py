"""The same workloads written for the frameworks people compare Runlet with.

See ``benchmarks/peers/run.py`` for the driver and ``docs/performance.md`` for the results.
"""
