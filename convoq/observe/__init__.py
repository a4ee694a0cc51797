"""Operations: Prometheus metrics and OpenTelemetry traces, below every other layer.

- :mod:`convoq.observe.metrics`: the metrics the client, the workers and the gateway
  update, and the ways to expose them (an HTTP server, an ASGI app, one response body).
- :mod:`convoq.observe.tracing`: spans around submit, the kick, the worker's acquire, each
  turn, model call, tool call and commit; the W3C ``traceparent`` that carries a trace
  from the client to the worker. Without ``opentelemetry-api`` installed every call is a
  no-op and nothing is imported.

This package imports nothing else of convoq, so anything may import it.
"""
