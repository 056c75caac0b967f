"""Stage 05: streaming. A background engine loop, an iterator API and an OpenAI-compatible server."""
import sys

from stages import streaming

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.streaming (stages/streaming.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = streaming
