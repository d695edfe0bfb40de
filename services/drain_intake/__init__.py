"""The drain intake: node agents' drain reports from NATS into the ledger."""
