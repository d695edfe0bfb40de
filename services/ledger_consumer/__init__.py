"""The ledger consumer: lifecycle and decision events from Kafka into ClickHouse."""
