"""The path of one aaren.v1 event through the server, file by file and function by function.

    python -m bench.event_path                    # one process, memory store, bundled default model
    python -m bench.event_path --markdown         # the path as a Markdown table (docs/architecture.md)

A real server runs in this process (``--frontends 0``) on its own event loop thread; a gRPC client
streams a few warm-up events of one session, then one more event while ``sys.setprofile`` records,
on the server's thread, every call into a function of the project (``aaren/``, ``server/``,
``aaren_core/``; generated protobuf code, dataclass ``__init__``s and third-party code are not ours
and are left out). From those calls it prints:

- the path: each call that enters another file than its caller's (``file:function``);
- ``files``: how many project files the event crosses;
- ``hops``: calls from one project file into another;
- ``re-entries``: calls back into a file the event had already left, i.e. a call from project code
  into a file whose frames were not on the stack at that moment (a return to the caller is not a
  hop): a part calling back up or around, like a batcher calling into its core;
- ``loop turns``: how many times the server's event loop resumed a project coroutine or callback
  from the loop itself (a new stack starting in project code), and ``resumed``: how many of those
  resumed a file the event had already left (an asynchronous pipeline resumes its loop at every
  ``await`` that waits: these are the loop's turns, not calls back).

It counts calls, not time: the figures do not move with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import grpc

from aaren.v1 import aaren_pb2 as pb
from aaren.v1 import aaren_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tuple(str(ROOT / room) + "/" for room in ("aaren", "server", "aaren_core"))
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def _ours(code: types.CodeType) -> str | None:
    name = code.co_filename
    if not name.startswith(PROJECT) or name.endswith(GENERATED):
        return None
    return str(Path(name).relative_to(ROOT))


@dataclasses.dataclass
class Calls:
    """The recorded hops: ``(file, function, caller file or None)``, and the loop turns."""

    hops: list[tuple[str, str, str | None]] = dataclasses.field(default_factory=list)
    turns: int = 0

    @property
    def files(self) -> list[str]:
        seen: dict[str, None] = {}
        for file, _, _ in self.hops:
            seen.setdefault(file, None)
        return list(seen)


class Recorder:
    """``sys.setprofile`` hook: keeps a stack of project files and notes every file change."""

    def __init__(self) -> None:
        self.path = Calls()
        self._stack: list[str | None] = []
        self.reentries = 0
        self.resumed = 0
        self._entered: set[str] = set()

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            file = _ours(frame.f_code)
            caller = next((f for f in reversed(self._stack) if f is not None), None)
            if file is not None and file != caller:
                if caller is None:
                    self.path.turns += 1
                if file in self._entered and file not in self._stack:
                    if caller is None:
                        self.resumed += 1
                    else:
                        self.reentries += 1
                self._entered.add(file)
                self.path.hops.append((file, frame.f_code.co_qualname, caller))
            self._stack.append(file)
        elif event == "return" and self._stack:
            self._stack.pop()


def _event(seq: int) -> pb.StreamRequest:
    return pb.StreamRequest(
        events=[pb.Event(session_id="path", seq=seq, time=float(seq), mark=0, values=[0.0] * _WIDTH)]
    )


_WIDTH = 0


def trace(checkpoint: str | None, warmup: int = 5) -> Recorder:
    from aaren.server.app import AarenServer
    from aaren.server.settings import ServerSettings

    global _WIDTH
    settings = {"address": "127.0.0.1:0", "metrics_port": -1, "device": "cpu", "frontends": 0}
    settings["store_check_interval_s"] = 3600
    if checkpoint:
        settings["checkpoint"] = checkpoint
    server = AarenServer(ServerSettings(**settings))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(120)
    recorder = Recorder()
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        stub = pb_grpc.ForecastServiceStub(channel)
        _WIDTH = len(stub.DescribeModel(pb.DescribeModelRequest()).value_names)
        requests: list[pb.StreamRequest] = []
        ready = threading.Condition()

        def gen() -> Any:
            i = 0
            while True:
                with ready:
                    while len(requests) <= i:
                        ready.wait()
                    request = requests[i]
                if request is None:
                    return
                i += 1
                yield request

        def send(request: pb.StreamRequest | None) -> None:
            with ready:
                requests.append(request)
                ready.notify_all()

        replies = stub.Stream(gen())
        for seq in range(1, warmup + 1):
            send(_event(seq))
            next(replies)
        time.sleep(0.2)
        asyncio.run_coroutine_threadsafe(_set(recorder), loop).result(10)
        send(_event(warmup + 1))
        next(replies)
        asyncio.run_coroutine_threadsafe(_set(None), loop).result(10)
        send(None)
        for _ in replies:
            pass
        channel.close()
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(1.0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    return recorder


async def _set(hook: Recorder | None) -> None:
    # Installed from inside the server's loop thread: setprofile is per thread.
    sys.setprofile(hook)


def report(recorder: Recorder, markdown: bool) -> str:
    path = recorder.path
    files = path.files
    lines = []
    if markdown:
        lines += ["| # | file | function | from |", "|---:|---|---|---|"]
        for i, (file, func, caller) in enumerate(path.hops, 1):
            lines.append(f"| {i} | `{file}` | `{func}` | {f'`{caller}`' if caller else 'event loop'} |")
    else:
        for i, (file, func, caller) in enumerate(path.hops, 1):
            lines.append(f"{i:3d}  {file}:{func}   <- {caller or 'event loop'}")
    lines.append("")
    lines.append(
        f"files {len(files)}, hops {len(path.hops)}, re-entries {recorder.reentries}, "
        f"loop turns {path.turns} (resumed {recorder.resumed})"
    )
    lines.append("files: " + ", ".join(files))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="serve this checkpoint (default: the bundled repository)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    print(report(trace(args.checkpoint), args.markdown))


if __name__ == "__main__":
    main()
