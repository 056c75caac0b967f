"""Stage 03, the paged KV cache (the folder stages/03_paged_kv/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.paged_kv.engine import build`` loads
stages/03_paged_kv/engine.py, once, as ``stages.paged_kv.engine``. Its number orders the lessons
(``python -m stages.03_paged_kv``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("03_paged_kv"))]

from stages.paged_kv.block_manager import BlockManager  # noqa: E402
from stages.paged_kv.engine import LLM, BlockAudit, build  # noqa: E402
from stages.paged_kv.kv_budget import kv_blocks  # noqa: E402
from stages.paged_kv.paged_cache import PagedKVCache  # noqa: E402
from stages.paged_kv.prefix_cache import PrefixCache  # noqa: E402
from stages.paged_kv.scheduler import Scheduler  # noqa: E402

__all__ = ["BlockManager", "LLM", "BlockAudit", "build", "kv_blocks", "PagedKVCache", "PrefixCache", "Scheduler"]
