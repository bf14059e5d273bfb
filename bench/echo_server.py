"""A no-op server on the ``aaren.v1`` proto: the transport ceiling for ``bench/service.py``.

Its ``Stream`` answers every ``StreamRequest`` at once with a ``StreamResponse`` holding, for each
event, an ``EventResult`` with a dummy ``Forecast`` of the same shape the real service sends
(``--quantiles`` gap quantiles, ``--marks`` top marks, ``--values`` value forecasts, the model
ref), so the response bytes match but there is no model, no store, no batching. The gRPC server
options are those of ``server/app.py``, and so is its event loop (``--event-loop``, by default uvloop
where it is installed: ``aaren.event_loop``). The other methods are left unimplemented.

Run from the repository root (``bench/service.py`` starts it as a subprocess)::

    python bench/echo_server.py --address 127.0.0.1:0

It prints ``echo: listening on port N`` once it accepts calls, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

from aaren import event_loop
from aaren.server.settings import ServerSettings
from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

__all__ = ["EchoServicer", "dummy_forecast", "server_options"]


def server_options(max_message_bytes: int | None = None) -> list[tuple[str, int]]:
    """The grpc.aio server options ``AarenServer.start`` uses."""
    if max_message_bytes is None:
        max_message_bytes = ServerSettings.model_fields["max_message_bytes"].default
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max(max_message_bytes, 64 * 1024 * 1024)),
        ("grpc.so_reuseport", 0),
    ]


def dummy_forecast(
    *, n_quantiles: int = 3, n_marks: int = 3, n_values: int = 2, model_name: str = "", model_version: str = ""
) -> pb.Forecast:
    """A forecast with the real one's shape; non-round numbers so every double is on the wire in full."""
    levels = [(i + 1) / (n_quantiles + 1) for i in range(n_quantiles)]
    return pb.Forecast(
        session_id="",
        seq=0,
        last_time=0.0,
        next_time=pb.TimeForecast(
            mean=1.2345678901234,
            quantiles=[pb.Quantile(q=q, value=0.3141592653589 * (i + 1)) for i, q in enumerate(levels)],
            expected_time=0.0,
        ),
        marks=[pb.MarkProbability(mark=m, probability=0.271828182845 / (m + 1)) for m in range(n_marks)],
        values=[pb.ValueForecast(mean=0.5772156649 + v, std=1.6180339887 + v) for v in range(n_values)],
        model=pb.ModelRef(name=model_name, version=model_version),
    )


class EchoServicer(pb_grpc.ForecastServiceServicer):
    """Answers each stream message with one dummy forecast per event (or, in last-per-session mode,
    per session and acks for the rest), in the request's order."""

    def __init__(self, template: pb.Forecast) -> None:
        self.template = template

    async def Stream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamResponse]:
        template = self.template
        async for request in request_iterator:
            if request.layout == pb.RESPONSE_LAYOUT_COLUMNS:
                yield self._columns(request)
                continue
            response = pb.StreamResponse(request_id=request.request_id)
            results = response.results
            last_only = request.forecast_mode == pb.FORECAST_MODE_LAST_PER_SESSION
            last = {event.session_id: i for i, event in enumerate(request.events)} if last_only else {}
            for i, event in enumerate(request.events):
                result = results.add(session_id=event.session_id, seq=event.seq)
                if last_only and last[event.session_id] != i:  # as the service: an ack, no forecast
                    result.ack.last_seq = event.seq
                    continue
                forecast = result.forecast
                forecast.CopyFrom(template)
                forecast.session_id = event.session_id
                forecast.seq = event.seq
                forecast.last_time = event.time
                forecast.next_time.expected_time = event.time + template.next_time.mean
            yield response

    def _columns(self, request: pb.StreamRequest) -> pb.StreamResponse:
        """The same answer with the forecasts as columns (RESPONSE_LAYOUT_COLUMNS), built as the
        service builds it: Python lists, one packed ``extend`` per column."""
        t = self.template
        response = pb.StreamResponse(request_id=request.request_id)
        last_only = request.forecast_mode == pb.FORECAST_MODE_LAST_PER_SESSION
        last = {event.session_id: i for i, event in enumerate(request.events)} if last_only else {}
        index, sids, seqs, times, expected = [], [], [], [], []
        quantiles = [q.value for q in t.next_time.quantiles]
        marks, probs = [m.mark for m in t.marks], [m.probability for m in t.marks]
        means, stds = [v.mean for v in t.values], [v.std for v in t.values]
        col_q, col_m, col_p, col_vm, col_vs = [], [], [], [], []
        for i, event in enumerate(request.events):
            if last_only and last[event.session_id] != i:
                response.results.add(session_id=event.session_id, seq=event.seq).ack.last_seq = event.seq
                continue
            index.append(i)
            sids.append(event.session_id)
            seqs.append(event.seq)
            times.append(event.time)
            expected.append(event.time + t.next_time.mean)
            col_q += quantiles
            col_m += marks
            col_p += probs
            col_vm += means
            col_vs += stds
        block = response.forecast_columns
        block.event_index.extend(index)
        block.session_id.extend(sids)
        block.seq.extend(seqs)
        block.last_time.extend(times)
        block.mean_gap.extend([t.next_time.mean] * len(index))
        block.expected_time.extend(expected)
        block.quantile_levels.extend(q.q for q in t.next_time.quantiles)
        block.gap_quantiles.extend(col_q)
        block.top_k = len(marks)
        block.marks.extend(col_m)
        block.mark_probabilities.extend(col_p)
        block.value_means.extend(col_vm)
        block.value_stds.extend(col_vs)
        block.model.CopyFrom(t.model)
        return response


async def serve(args: argparse.Namespace) -> None:
    server = grpc.aio.server(options=server_options(args.max_message_bytes))
    template = dummy_forecast(
        n_quantiles=args.quantiles,
        n_marks=args.marks,
        n_values=args.values,
        model_name=args.model_name,
        model_version=args.model_version,
    )
    pb_grpc.add_ForecastServiceServicer_to_server(EchoServicer(template), server)
    port = server.add_insecure_port(args.address)
    if port == 0:
        raise OSError(f"could not bind {args.address!r}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"echo: listening on port {port}", flush=True)
    await stop.wait()
    await server.stop(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:0", help="host:port to bind (port 0: a free one)")
    parser.add_argument("--quantiles", type=int, default=3, help="gap quantiles per forecast")
    parser.add_argument("--marks", type=int, default=3, help="top marks per forecast")
    parser.add_argument("--values", type=int, default=2, help="value forecasts per forecast")
    parser.add_argument("--model-name", default="aaren-random", help="model name in every forecast")
    parser.add_argument("--model-version", default="random-seed0", help="model version in every forecast")
    parser.add_argument("--max-message-bytes", type=int, default=None, help="default: the server's default")
    parser.add_argument(
        "--event-loop", choices=event_loop.LOOPS, default="auto", help="as aaren serve's (default: auto, uvloop)"
    )
    args = parser.parse_args()
    event_loop.run(serve(args), args.event_loop)


if __name__ == "__main__":
    main()
