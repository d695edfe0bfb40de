"""The outbox relay: committed lifecycle events from fleet state to Kafka."""
