"""The event-log front end: events from a log (Redis Streams, NATS JetStream), forecasts to a log.

``aaren consume`` (and ``aaren serve --consume-source``) runs ``consumer.LogConsumer``: it reads
event messages (``messages``), answers them through the aaren.v1 codec over the engine core (or a
server at ``--target``), publishes each forecast once and acknowledges each message once it is
done with (docs/architecture.md section 3, "From an event log").
"""
