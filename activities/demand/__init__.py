"""Demand intake: what the schedulers have pending, as normalised units per contract."""
