"""Planning: which pools reclaimable instances should be launched in, and for whom."""
