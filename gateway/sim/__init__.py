"""A vLLM-compatible backend simulator: vLLM's OpenAI dialect over a modelled engine.

Prompts are tokenized, cut into chained-hash blocks and scheduled by a continuous-batching
loop over an LRU prefix cache, so time to first token and ``cached_tokens`` behave like a
real vLLM server's; see :mod:`gateway.sim.engine`.
"""

from gateway.sim.config import SimConfig
from gateway.sim.server import RunningSimulator, start_simulator

__all__ = ["RunningSimulator", "SimConfig", "start_simulator"]
