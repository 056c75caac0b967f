"""Stage 05: streaming. A background engine loop, an iterator API and an OpenAI-compatible server."""
from .engine import LLM, QueueFull, RequestStream, StreamChunk

__all__ = ["LLM", "QueueFull", "RequestStream", "StreamChunk"]
