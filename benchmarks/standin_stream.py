#!/usr/bin/env python3
"""A stand-in OpenAI chat server that streams tokens on a fixed schedule and records when it really sent each one.

It measures the client, not a model: every request gets its first token `--ttft-ms` after it arrived and the next
ones `--itl-ms` apart, on absolute deadlines (a late tick does not push the later ones back), over keep-alive
HTTP/1.1 with chunked server-sent events, as vLLM answers. For each request it records, on the machine's monotonic
clock (CLOCK_MONOTONIC, shared by every process), when the request was read and when each token was written;
`GET /stats` returns them keyed by the last message's text, `POST /reset` forgets them. The client's TTFT and ITL
minus these are the timing error the client adds. Standard library only, one process, one event loop: run it
as its own process so its CPU is not the client's.

    python benchmarks/standin_stream.py --port 8399 --ttft-ms 100 --itl-ms 50
"""
from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import time

_DONE = b"data: [DONE]\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Stream:
    """One request being answered: its schedule and what was really sent."""

    def __init__(self, key: str, writer: asyncio.StreamWriter, tokens: int, arrived: int, usage: bool, rid: int) -> None:
        self.key = key
        self.writer = writer
        self.tokens = tokens
        self.arrived = arrived
        self.usage = usage
        self.rid = rid
        self.sent: list[int] = []
        self.done = asyncio.get_running_loop().create_future()


class StandIn:
    def __init__(self, ttft_ms: float, itl_ms: float, model: str) -> None:
        self.ttft_ns = int(ttft_ms * 1e6)
        self.itl_ns = int(itl_ms * 1e6)
        self.model = model
        self.stats: dict[str, dict] = {}
        self._heap: list[tuple[int, int, Stream]] = []
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._ids = itertools.count()

    def schedule(self, stream: Stream) -> None:
        due = stream.arrived + self.ttft_ns + self.itl_ns * len(stream.sent)
        heapq.heappush(self._heap, (due, next(self._order), stream))
        self._wake.set()

    async def ticker(self) -> None:
        """One loop writes every token that is due: 2,000 streams cost one timer, not 2,000."""
        while True:
            if not self._heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            due = self._heap[0][0]
            now = time.monotonic_ns()
            if due > now:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), (due - now) / 1e9)
                except asyncio.TimeoutError:
                    pass
                continue
            while self._heap and self._heap[0][0] <= time.monotonic_ns():
                _, _, stream = heapq.heappop(self._heap)
                self._send_token(stream)

    def _send_token(self, stream: Stream) -> None:
        index = len(stream.sent)
        last = index + 1 == stream.tokens
        event = {"id": f"chatcmpl-{stream.rid}", "object": "chat.completion.chunk", "model": self.model,
                 "choices": [{"index": 0, "delta": {"content": f" t{index}"}, "finish_reason": "length" if last else None}]}
        data = _event(event)
        if last:
            if stream.usage:
                data += _event({"id": f"chatcmpl-{stream.rid}", "object": "chat.completion.chunk", "model": self.model,
                                "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": stream.tokens,
                                                         "total_tokens": stream.tokens + 8}})
            data += _DONE
        try:
            stream.writer.write(_chunk(data) + (b"0\r\n\r\n" if last else b""))
        except (ConnectionError, RuntimeError):
            stream.done.set_result(False) if not stream.done.done() else None
            return
        stream.sent.append(time.monotonic_ns())
        if last:
            self.stats[stream.key] = {"arrived_ns": stream.arrived, "sent_ns": stream.sent}
            if not stream.done.done():
                stream.done.set_result(True)
        else:
            self.schedule(stream)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                arrived = time.monotonic_ns()
                if method == "POST" and path.endswith("/chat/completions"):
                    request = json.loads(body)
                    key = str(request["messages"][-1]["content"])
                    tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
                    usage = bool((request.get("stream_options") or {}).get("include_usage"))
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                    stream = Stream(key, writer, max(1, tokens), arrived, usage, next(self._ids))
                    self.schedule(stream)
                    if not await stream.done:
                        return
                    await writer.drain()
                    continue
                if path == "/stats":
                    payload, status = json.dumps(self.stats).encode(), b"200 OK"
                elif path == "/reset" and method == "POST":
                    self.stats.clear()
                    payload, status = b"{}", b"200 OK"
                elif path == "/health":
                    payload, status = b"", b"200 OK"
                elif path == "/v1/models":
                    payload, status = json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode(), b"200 OK"
                elif path == "/metrics":
                    payload, status = b"", b"200 OK"
                else:
                    payload, status = b'{"error": "not found"}', b"404 Not Found"
                writer.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(payload), payload))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def serve(port: int, ttft_ms: float, itl_ms: float, model: str) -> None:
    standin = StandIn(ttft_ms, itl_ms, model)
    server = await asyncio.start_server(standin.handle, "127.0.0.1", port, backlog=4096, limit=1 << 20)
    print(f"stand-in: http://127.0.0.1:{port} ttft {ttft_ms} ms, itl {itl_ms} ms", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), standin.ticker())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=50.0)
    parser.add_argument("--model", default="stand-in")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port, args.ttft_ms, args.itl_ms, args.model))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
