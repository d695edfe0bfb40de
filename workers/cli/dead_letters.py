"""`sco outbox dead-letters | retry`: events that could not go on, and resending one."""

from __future__ import annotations

import dataclasses

import typer

from activities.fleet import dead_letters
from workers.cli.common import console, errors_as_exit, fail, fleet_db, print_json, settings
from workers.settings import Settings


def list_dead_letters(
    all_: bool = typer.Option(False, "--all", help="Include dead letters already retried."),
    json_out: bool = typer.Option(False, "--json", help="The dead letters as JSON."),
) -> None:
    """Events the outbox relay could not publish, messages the ledger consumer could not
    parse and drain reports the drain intake refused, with the reason."""
    with fleet_db(settings()) as db, db.connection() as conn:
        letters = dead_letters.list_dead_letters(conn, include_retried=all_)
    if json_out:
        print_json(
            [
                {k: v for k, v in dataclasses.asdict(d).items() if k != "value"}
                | {"value_bytes": len(d.value)}
                for d in letters
            ]
        )
        return
    from rich.table import Table

    table = Table("id", "source", "topic", "key", "attempts", "at", "reason", "retried")
    for d in letters:
        table.add_row(
            str(d.id),
            d.source + (f" #{d.outbox_id}" if d.outbox_id else f" {d.location}"),
            d.topic,
            d.key,
            str(d.attempts),
            f"{d.created_at:%Y-%m-%d %H:%M:%S}",
            d.reason,
            f"{d.retried_at:%H:%M:%S}" if d.retried_at else "",
        )
    console.print(table)
    console.print(f"{len(letters)} dead letters")


def retry(
    dead_letter_id: int = typer.Argument(..., help="The dead letter's id."),
    json_out: bool = typer.Option(False, "--json", help="The answer as JSON."),
) -> None:
    """Resend a dead letter: an outbox row goes back to the relay (next in order); a
    ledger message is produced to its topic again for the consumer."""
    from workers.cli import bounds

    bounds.whole("DEAD_LETTER_ID", dead_letter_id, low=1, high=2**63 - 1)
    s = settings()
    with fleet_db(s) as db, db.connection() as conn:
        try:
            letter = dead_letters.get(conn, dead_letter_id)
        except dead_letters.DeadLetterNotFound as exc:
            fail(str(exc))
        if letter.retried_at is not None:
            fail(f"dead letter {dead_letter_id} was retried at {letter.retried_at:%H:%M:%S}")
        if letter.source == "drain":
            fail(
                f"dead letter {dead_letter_id}: a drain report the intake refused is not "
                "resent (it would be refused again); the reason says what the node sent"
            )
        if letter.outbox_id is not None:
            dead_letters.retry_outbox(conn, dead_letter_id)
            conn.commit()
            if json_out:
                print_json({"id": dead_letter_id, "requeued_outbox_id": letter.outbox_id})
                return
            console.print(f"dead letter {dead_letter_id}: outbox id {letter.outbox_id} requeued")
            return
        from confluent_kafka import KafkaException

        with errors_as_exit(KafkaException):
            _produce_again(s, letter)
        dead_letters.mark_retried(conn, dead_letter_id)
        conn.commit()
    if json_out:
        print_json({"id": dead_letter_id, "produced_to": letter.topic})
        return
    console.print(f"dead letter {dead_letter_id}: produced to {letter.topic} again")


def _produce_again(s: Settings, letter: dead_letters.DeadLetter) -> None:
    from confluent_kafka import Producer

    from activities.kafka import producer_config
    from workers.client_security import kafka_config

    producer = Producer({**producer_config(s.kafka.bootstrap_servers), **kafka_config(s.kafka)})
    failures: list[str] = []
    producer.produce(
        letter.topic,
        key=letter.key.encode() or None,
        value=letter.value,
        on_delivery=lambda err, _msg: failures.append(str(err)) if err else None,
    )
    if producer.flush(8) > 0 or failures:
        fail(f"dead letter {letter.id}: Kafka did not take it: {'; '.join(failures) or 'timeout'}")
