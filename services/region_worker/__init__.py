"""The region worker: every workflow and activity of one region's task queue."""
