"""An OpenAI-compatible gateway for vLLM backends.

The request's way through lives in :mod:`gateway.pipeline`; each stage is a module
under :mod:`gateway.stages`.
"""

__version__ = "0.1.0"
