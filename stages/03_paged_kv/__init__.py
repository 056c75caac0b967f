"""Stage 03: paged KV cache: paging (block_manager), prefix caching (prefix_cache), preemption (preemption)
and chunked prefill (scheduler), assembled by the engine."""
import sys

from stages import paged_kv

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.paged_kv (stages/paged_kv.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = paged_kv
