"""Runlet benchmarks: each workload for Runlet and for a hand-written floor, side by side.

Run ``python benchmarks/run.py`` (``--help`` for options). The figures that matter are
the ratios Runlet / floor measured in the same process, not the absolute times.
"""
