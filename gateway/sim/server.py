"""The simulator's HTTP side: vLLM's routes over one Engine, and the in-process starter.

Every response carries `x-backend-instance: <name>` so a test or a load generator can
tell which instance answered. A request the engine answers at once (``--instant``) is
answered without creating a task; the others run as their connection's task, which is
cancelled when the client disconnects, and the cancellation aborts the sequence and
unpins its blocks, as vLLM does.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.sim import metrics, protocol, tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.embeddings import embeddings_response
from gateway.sim.engine import Engine, Sequence
from gateway.sim.http import Connection, Request, Response, Result, headers_block
from gateway.sim.protocol import GenerateRequest, SimError
from gateway.sim.responses import ResponsesReply, parse_responses

INSTANCE_HEADER = "x-backend-instance"
VERSION = f"{protocol.VLLM_VERSION}+sim"
_SSE = b"text/event-stream; charset=utf-8"
_DONE = b"data: [DONE]\n\n"
_NOT_FOUND = Response(404, b'{"detail":"Not Found"}')
_NOT_ALLOWED = Response(405, b'{"detail":"Method Not Allowed"}')


def _json(body: Any, status: int = 200) -> Response:
    return Response(status, orjson.dumps(body))


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _tokens(reply: protocol.Reply, seq: Sequence, tokens: list[int], sent: int) -> bytes:
    """Events for tokens, which follow the sent first ones; the last carries finish_reason.

    A chat stream opens with the assistant's role and empty content, sent (as vLLM does)
    with the first token, after prefill: time to the first byte is time to first token.
    """
    out = bytearray(_event(reply.opening()) if reply.chat and not sent else b"")
    for n, i in enumerate(tokens, sent + 1):
        finish = seq.finish_reason if n == len(seq.output) else None
        out += _event(reply.chunk(tokenizer.GENERATED_TOKENS[i], finish))
    return bytes(out)


def _closing(reply: protocol.Reply, seq: Sequence, req: GenerateRequest) -> bytes:
    usage = _event(reply.usage_chunk(seq)) if req.include_usage else b""
    return usage + _DONE


@dataclass(frozen=True, slots=True)
class Events:
    """How one endpoint renders an answer: whole, or streamed token by token."""

    whole: Callable[[Sequence], dict[str, Any]]
    tokens: Callable[[Sequence, list[int], int], bytes]
    """Events for new tokens, given how many were sent before them."""
    closing: Callable[[Sequence], bytes]


class SimServer:
    """One simulated vLLM instance: its engine, metrics and routes."""

    def __init__(self, config: SimConfig, name: str, engine: Engine) -> None:
        self.config = config
        self.name = name
        self.engine = engine
        self.registry = metrics.registry_for(engine)
        self.started = protocol.now()
        self.fingerprint = protocol.fingerprint(config)
        self.routes: dict[str, tuple[str, Callable[[Request], Result]]] = {
            "/v1/chat/completions": ("POST", self.chat),
            "/v1/completions": ("POST", self.completions),
            "/v1/responses": ("POST", self.responses),
            "/v1/embeddings": ("POST", self.embeddings),
            "/tokenize": ("POST", self.tokenize),
            "/v1/chat/completions/render": ("POST", self.render_chat),
            "/v1/models": ("GET", self.models),
            "/health": ("GET", self.health),
            "/health_generate": ("GET", self.health),
            "/ping": ("GET", self.health),
            "/version": ("GET", self.version),
            "/metrics": ("GET", self.metrics),
            "/server_info": ("GET", self.server_info),
            "/get_server_info": ("GET", self.server_info),
            "/model_info": ("GET", self.model_info),
            "/get_model_info": ("GET", self.model_info),
        }

    def dispatch(self, request: Request) -> Result:
        """Route a request; a refused request gets vLLM's error body and status."""
        route = self.routes.get(request.path)
        if route is None:
            return _NOT_FOUND
        method, handler = route
        if request.method != method:
            return _NOT_ALLOWED
        try:
            return handler(request)
        except SimError as exc:
            return _json(exc.body(), exc.status)

    def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            raise protocol.invalid_json(request.body) from None
        return protocol.require_object(body)

    # -- generation -------------------------------------------------------------------

    def chat(self, request: Request) -> Result:
        req = protocol.parse_chat(self._body(request), self.config)
        return self._generate(request, req, chat=True)

    def completions(self, request: Request) -> Result:
        req = protocol.parse_completion(self._body(request), self.config)
        return self._generate(request, req, chat=False)

    def responses(self, request: Request) -> Result:
        body = self._body(request)
        req = parse_responses(body, self.config)
        reply = ResponsesReply(self.config.model, body)

        def tokens(seq: Sequence, new: list[int], sent: int) -> bytes:
            deltas = b"".join(reply.delta(tokenizer.GENERATED_TOKENS[i]) for i in new)
            return deltas if sent else reply.first() + deltas

        return self._answer(request, req, Events(reply.whole, tokens, reply.closing),
                            opening=reply.opening)  # fmt: skip

    def _generate(self, request: Request, req: GenerateRequest, chat: bool) -> Result:
        reply = protocol.Reply(chat, self.config.model, self.fingerprint, req.include_usage)
        events = Events(
            reply.whole,
            lambda seq, new, sent: _tokens(reply, seq, new, sent),
            lambda seq: _closing(reply, seq, req),
        )
        return self._answer(request, req, events)

    def _answer(
        self, request: Request, req: GenerateRequest, events: Events,
        opening: Callable[[], bytes] = bytes,
    ) -> Result:  # fmt: skip
        """Run the request on the engine; answer whole or as a stream of ``events``.
        ``opening`` goes out as soon as a stream starts, before prefill."""
        seq = self.engine.submit(req.prompt, req.max_tokens)
        if seq.finish_reason is None:
            if req.stream:
                return self._stream(request, events, seq, opening())
            return self._wait(events, seq)
        # Instant mode: the answer is complete, so it goes out in one write, no task.
        if not req.stream:
            return _json(events.whole(seq))
        sse = opening() + events.tokens(seq, seq.output, 0) + events.closing(seq)
        return Response(200, sse, _SSE)

    async def _wait(self, events: Events, seq: Sequence) -> Response:
        try:
            while seq.finish_reason is None:
                await seq.tokens()
        finally:
            self.engine.abort(seq)  # a no-op unless the client left before the end
        return _json(events.whole(seq))

    async def _stream(
        self, request: Request, events: Events, seq: Sequence, opening: bytes
    ) -> None:
        try:
            stream = request.stream(_SSE)
            if opening:
                await stream.write(opening)
            sent = 0
            while new := await seq.tokens():
                await stream.write(events.tokens(seq, new, sent))
                sent += len(new)
            await stream.write(events.closing(seq))
            stream.end()
        finally:
            self.engine.abort(seq)  # a no-op unless the client left before the end

    # -- the rest of the surface ----------------------------------------------------------

    def embeddings(self, request: Request) -> Result:
        body = self._body(request)
        protocol.check_model(body, self.config)
        result = embeddings_response(body, self.config, protocol.now())
        self.engine.stats.prompt_tokens += result["usage"]["prompt_tokens"]
        return _json(result)

    def tokenize(self, request: Request) -> Result:
        body = self._body(request)
        parse = protocol.parse_chat if "messages" in body else protocol.parse_completion
        tokens = parse(body, self.config).prompt
        max_len = self.config.max_model_len
        return _json(
            {"count": len(tokens), "max_model_len": max_len, "tokens": tokens, "token_strs": None}
        )

    def render_chat(self, request: Request) -> Result:
        """vLLM's render endpoint: the prompt's token ids, as a GenerateRequest body."""
        body = self._body(request)
        req = protocol.parse_chat(body, self.config)
        return _json(
            {
                "request_id": protocol.random_id(),
                "token_ids": req.prompt,
                "features": None,
                "sampling_params": {"max_tokens": req.max_tokens or self.config.default_max_tokens},
                "model": self.config.model,
                "stream": req.stream,
                "stream_options": body.get("stream_options"),
                "cache_salt": None,
                "priority": 0,
                "kv_transfer_params": None,
            }
        )

    def models(self, request: Request) -> Result:
        return _json(protocol.models(self.config, self.started))

    def health(self, request: Request) -> Result:
        return Response(200, b"")

    def version(self, request: Request) -> Result:
        return _json({"version": VERSION})

    def metrics(self, request: Request) -> Result:
        return Response(
            200, metrics.render(self.registry), b"text/plain; version=0.0.4; charset=utf-8"
        )

    def server_info(self, request: Request) -> Result:
        """What vLLM's /server_info and SGLang's /get_server_info report, merged."""
        c, e = self.config, self.engine
        return _json(
            {
                "model_path": c.model,
                "tokenizer_path": c.model,
                "served_model_name": c.model,
                "context_length": c.max_model_len,
                "max_model_len": c.max_model_len,
                "page_size": c.block_size,
                "block_size": c.block_size,
                "num_gpu_blocks": c.cache_blocks,
                "max_total_num_tokens": c.cache_blocks * c.block_size,
                "max_running_requests": c.max_num_seqs,
                "max_num_seqs": c.max_num_seqs,
                "max_num_batched_tokens": c.max_num_batched_tokens,
                "chunked_prefill_size": c.max_num_batched_tokens,
                "enable_prefix_caching": True,
                "disable_radix_cache": False,
                "dp_size": 1,
                "tp_size": 1,
                "version": VERSION,
                "instance": self.name,
                "internal_states": [{"num_running": len(e.running), "num_waiting": len(e.waiting)}],
            }
        )

    def model_info(self, request: Request) -> Result:
        """SGLang's /get_model_info shape."""
        return _json(
            {
                "model_path": self.config.model,
                "tokenizer_path": self.config.model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "max_model_len": self.config.max_model_len,
            }
        )


@dataclass(eq=False)
class RunningSimulator:
    """A simulator serving inside the caller's event loop; aclose() stops it."""

    url: str
    port: int
    name: str
    server: SimServer
    _listener: asyncio.Server
    _connections: set[Connection]

    async def aclose(self) -> None:
        self._listener.close()
        tasks = [c.task for c in self._connections if c.task is not None]
        for conn in list(self._connections):
            conn.transport.close()  # connection_lost cancels its task
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._listener.wait_closed()
        await self.server.engine.aclose()


async def start_simulator(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0
) -> RunningSimulator:
    """Serve one instance on host:port (0: a free port) in the running loop."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    name = config.name or f"sim-{port}"
    engine = Engine(config)
    server = SimServer(config, name, engine)
    # vLLM answers through uvicorn, which names itself; the instance header is the
    # simulator's own (vLLM sends `vary` instead, which the simulator does not).
    headers = headers_block([("server", "uvicorn"), (INSTANCE_HEADER, name)])
    connections: set[Connection] = set()
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        lambda: Connection(server.dispatch, headers, connections), sock=sock, backlog=1024
    )
    engine.start()
    display = f"[{host}]" if ":" in host else host
    return RunningSimulator(f"http://{display}:{port}", port, name, server, listener, connections)
