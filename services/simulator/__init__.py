"""The simulated cloud of one region, served over NATS."""
