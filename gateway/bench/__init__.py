"""The load generator: seeded workloads replayed against OpenAI-compatible URLs.

- :mod:`gateway.bench.workloads`: shared-prefix, multi-turn, mixed, tiny (from a seed);
- :mod:`gateway.bench.runner`: ``run`` one target or ``compare`` several at once;
- :mod:`gateway.bench.client`: one timed, streamed request (aiohttp, SSE by hand);
- :mod:`gateway.bench.report`: figures, table, JSON, ratios; ``gateway bench`` is
  :mod:`gateway.bench.cli`.

Nothing is imported here, so ``gateway bench`` loads only what it uses.
"""
