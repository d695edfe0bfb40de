"""The estate simulator: SCO's own pure policy code (planner, fallback arbiter, exclusion
cycle, floor spread) driven through weeks of a modelled three-region estate in simulated
time, next to the simple placement policies operators compare it with.

Pure and deterministic for a seed: no I/O, no clock, no Temporal. The caller loads the
regions and contracts and renders the result (``sco sim estate``, bench/estate_bench.py).
"""
