"""The simulator's HTTP side: aiohttp handlers over one Engine, and the in-process starter.

Every response carries `x-backend-instance: <name>` so a test or a load generator can
tell which instance answered. Handlers are cancelled when their client disconnects
(aiohttp's handler_cancellation), and the cancellation aborts the sequence, unpinning
its blocks, as vLLM does.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.sim import metrics, protocol, tokenizer
from gateway.sim.config import SimConfig
from gateway.sim.embeddings import embeddings_response
from gateway.sim.engine import Engine, Sequence
from gateway.sim.protocol import SimError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INSTANCE_HEADER = "x-backend-instance"
_DONE = b"data: [DONE]\n\n"


class SimServer:
    """One simulated vLLM instance: its engine, metrics and routes."""

    def __init__(self, config: SimConfig, name: str, engine: Engine) -> None:
        self.config = config
        self.name = name
        self.engine = engine
        self.registry = metrics.registry_for(engine)
        self.started = protocol.now()
        self._json_headers = {INSTANCE_HEADER: name, "Content-Type": "application/json"}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024 * 1024)
        app.on_response_prepare.append(self._tag)
        post, get = self._post_routes(), self._get_routes()
        app.add_routes(
            [web.post(p, h) for p, h in post.items()] + [web.get(p, h) for p, h in get.items()]
        )
        return app

    def _post_routes(self) -> dict[str, Handler]:
        return {
            "/v1/chat/completions": self.chat,
            "/v1/completions": self.completions,
            "/v1/embeddings": self.embeddings,
            "/tokenize": self.tokenize,
            "/v1/chat/completions/render": self.render_chat,
        }

    def _get_routes(self) -> dict[str, Handler]:
        return {
            "/v1/models": self.models,
            "/health": self.health,
            "/health_generate": self.health,
            "/metrics": self.metrics,
            "/server_info": self.server_info,
            "/get_server_info": self.server_info,
            "/model_info": self.model_info,
            "/get_model_info": self.model_info,
        }

    # -- plumbing ---------------------------------------------------------------------

    async def _tag(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[INSTANCE_HEADER] = self.name

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except SimError as exc:
            return self._json(exc.body(), exc.status)
        except web.HTTPException as exc:
            return self._json(SimError(exc.reason, exc.status).body(), exc.status)

    def _json(self, body: Any, status: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, headers=self._json_headers)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise SimError(f"Invalid JSON body: {exc}") from exc
        body = protocol.require_object(body)
        protocol.check_model(body, self.config)
        return body

    # -- generation -------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        return await self._generate(request, protocol.parse_chat(body, self.config), chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        return await self._generate(
            request, protocol.parse_completion(body, self.config), chat=False
        )

    async def _generate(
        self, request: web.Request, req: protocol.GenerateRequest, chat: bool
    ) -> web.StreamResponse:
        seq = self.engine.submit(req.prompt, req.max_tokens)
        try:
            if req.stream:
                return await self._stream(request, seq, req.include_usage, chat)
            while seq.finish_reason is None:
                await seq.tokens()
            build = protocol.chat_response if chat else protocol.completion_response
            return self._json(build(protocol.random_id(), protocol.now(), self.config.model, seq))
        finally:
            # Cancelled by a disconnect, or failed to write: vLLM aborts the request.
            self.engine.abort(seq)

    async def _stream(
        self, request: web.Request, seq: Sequence, include_usage: bool, chat: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        rid, created, model = protocol.random_id(), protocol.now(), self.config.model
        if chat:
            first = protocol.chat_chunk(
                rid, created, model, {"role": "assistant", "content": ""}, None
            )
            await response.write(_event(first))
        sent = 0
        while True:
            new = await seq.tokens()
            if not new:
                break
            out = bytearray()
            for i in new:
                sent += 1
                text = tokenizer.GENERATED_TOKENS[i]
                finish = (
                    seq.finish_reason if sent == len(seq.output) and seq.finish_reason else None
                )
                if chat:
                    out += _event(
                        protocol.chat_chunk(rid, created, model, {"content": text}, finish)
                    )
                else:
                    out += _event(protocol.completion_chunk(rid, created, model, text, finish))
            await response.write(bytes(out))
        if include_usage:
            obj, prefix = (
                ("chat.completion.chunk", "chatcmpl-") if chat else ("text_completion", "cmpl-")
            )
            await response.write(
                _event(protocol.usage_chunk(prefix + rid, obj, created, model, seq))
            )
        await response.write(_DONE)
        await response.write_eof()
        return response

    # -- the rest of the surface ----------------------------------------------------------

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        result = embeddings_response(body, self.config, protocol.now())
        self.engine.stats.prompt_tokens += result["usage"]["prompt_tokens"]
        return self._json(result)

    def _prompt_tokens(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            return protocol.parse_chat(body, self.config).prompt
        return protocol.parse_completion(body, self.config).prompt

    async def tokenize(self, request: web.Request) -> web.StreamResponse:
        tokens = self._prompt_tokens(await self._body(request))
        return self._json(
            {
                "count": len(tokens),
                "max_model_len": self.config.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def render_chat(self, request: web.Request) -> web.StreamResponse:
        """vLLM's render endpoint: the prompt's token ids, as a GenerateRequest body."""
        body = await self._body(request)
        req = protocol.parse_chat(body, self.config)
        return self._json(
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

    async def models(self, request: web.Request) -> web.StreamResponse:
        return self._json(protocol.models(self.config, self.started))

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=metrics.render(self.registry),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        """What vLLM's /server_info and SGLang's /get_server_info report, merged."""
        c = self.config
        return self._json(
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
                "version": "0.32.0-sim",
                "instance": self.name,
                "internal_states": [
                    {
                        "num_running": len(self.engine.running),
                        "num_waiting": len(self.engine.waiting),
                    }
                ],
            }
        )

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        """SGLang's /get_model_info shape."""
        return self._json(
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


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


@dataclass(eq=False)
class RunningSimulator:
    """A simulator serving on loopback inside the caller's event loop."""

    url: str
    port: int
    name: str
    server: SimServer
    _runner: web.AppRunner

    async def aclose(self) -> None:
        await self._runner.cleanup()
        await self.server.engine.aclose()


async def start_simulator(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0
) -> RunningSimulator:
    """Serve one instance on host:port (0: a free port) in the running loop."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    name = config.name or f"sim-{port}"
    engine = Engine(config)
    server = SimServer(config, name, engine)
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    engine.start()
    try:
        await web.SockSite(runner, sock, backlog=1024).start()
    except BaseException:
        with contextlib.suppress(Exception):
            await runner.cleanup()
        await engine.aclose()
        sock.close()
        raise
    display = f"[{host}]" if ":" in host else host
    return RunningSimulator(f"http://{display}:{port}", port, name, server, runner)
