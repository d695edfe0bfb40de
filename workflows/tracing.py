"""Traces that follow a signal into the work it causes.

temporalio's TracingInterceptor puts every span of a workflow in the trace of the workflow's
start, and a signal's span only links to its sender. A controller partition is started
once, when the region's worker starts, so every tick of its life would land in that one
trace, and `sco demand set` would end in a trace of its own with nothing under it.

`SignalTracingInterceptor` makes a signal's `HandleSignal` span a child of its sender's
span and keeps that context; `following_signal(name)` runs the work the signal woke the
workflow for (a controller tick after `demand_changed`) in it. One trace then runs from
the signal through the tick's activities and the acquisitions it starts to their creates.

Spans are made only when the workflow is not replaying (as temporalio's own are), and no
command changes, so histories replay with or without tracing. The workers turn it on
(workers/tracing.py); without the interceptor `following_signal` does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import opentelemetry.context
import opentelemetry.trace
from temporalio.api.common.v1 import Payload
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.worker import HandleSignalInput, WorkflowInterceptorClassInput

# The text-map carrier temporalio puts in the `_tracer-data` header.
Carrier = dict[str, Any]


@contextmanager
def attached_context(context: opentelemetry.context.Context) -> Iterator[None]:
    """`context` is the current OpenTelemetry context for the block.

    Not a plain attach/detach pair: a block abandoned by an evicted workflow is finalized
    wherever garbage collection runs, in another `contextvars.Context`, where the token is
    not valid and `opentelemetry.context.detach` would log "Failed to detach context" for
    nothing. So the detach is the reset it performs, done only where the context is still
    current and the token belongs (temporalio's interceptor does the same in a private
    helper of its own, which is not its API).
    """
    token = opentelemetry.context.attach(context)
    try:
        yield
    finally:
        if context is opentelemetry.context.get_current():
            # ValueError: the token was made in another contextvars.Context.
            with contextlib.suppress(ValueError):
                token.var.reset(token)


class _Headers:
    """What `_completed_span` writes the new span's context to (as it does an outbound call's)."""

    def __init__(self) -> None:
        self.headers: Mapping[str, Payload] = {}


class SignalTracingInterceptor(TracingInterceptor):
    """temporalio's TracingInterceptor, with signals continuing their sender's trace."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)  # registers the span extern function
        return SignalTracingWorkflowInboundInterceptor


class SignalTracingWorkflowInboundInterceptor(TracingWorkflowInboundInterceptor):
    def __init__(self, next: Any) -> None:
        super().__init__(next)
        # Signal name -> the context of the first such signal not yet followed.
        self._pending: dict[str, Carrier] = {}

    async def handle_signal(self, input: HandleSignalInput) -> None:
        header = input.headers.get(self.header_key)
        if not header:
            await super().handle_signal(input)
            return
        sender: Carrier = self.payload_converter.from_payloads([header])[0]
        context = self._set_on_context(self.text_map_propagator.extract(sender))
        with attached_context(context):
            carrier = self._span_carrier(
                f"HandleSignal:{input.signal}", opentelemetry.trace.SpanKind.SERVER
            )
            if carrier:
                self._pending.setdefault(input.signal, carrier)
            await self.next.handle_signal(input)

    def _span_carrier(self, name: str, kind: opentelemetry.trace.SpanKind) -> Carrier | None:
        """A completed span under the current context, and the context with it as parent
        (None when replaying or when there is no parent to continue)."""
        out = _Headers()
        self._completed_span(name, add_to_outbound=out, kind=kind)
        payload = out.headers.get(self.header_key)
        if payload is None:
            return None
        carrier: Carrier = self.payload_converter.from_payloads([payload])[0]
        return carrier

    @contextmanager
    def follow(self, signal: str, span: str) -> Iterator[None]:
        sender = self._pending.pop(signal, None)
        if sender is None:
            yield
            return
        with attached_context(self._set_on_context(self.text_map_propagator.extract(sender))):
            carrier = self._span_carrier(span, opentelemetry.trace.SpanKind.INTERNAL) or sender
        with attached_context(self._set_on_context(self.text_map_propagator.extract(carrier))):
            yield


@contextmanager
def following_signal(signal: str, span: str) -> Iterator[None]:
    """Run the block (activities, child workflows) in the trace of the first `signal` received
    since the last such block, under a span named `span`; as is without one, or when
    tracing is off."""
    interceptor = TracingWorkflowInboundInterceptor._from_context()
    if not isinstance(interceptor, SignalTracingWorkflowInboundInterceptor):
        yield
        return
    with interceptor.follow(signal, span):
        yield
