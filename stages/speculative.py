"""Stage 06, speculative decoding (the folder stages/06_speculative/), under a name an import statement can spell.

The folder is this module's package path: ``from stages.speculative.engine import build`` loads
stages/06_speculative/engine.py, once, as ``stages.speculative.engine``. Its number orders the lessons
(``python -m stages.06_speculative``); this name is how another stage, a test or an instrument imports it."""
from pathlib import Path

__path__ = [str(Path(__file__).with_name("06_speculative"))]

from common.speculative_config import SpeculativeConfig  # noqa: E402
from stages.speculative.defaults import STAGE_DEFAULT  # noqa: E402
from stages.speculative.engine import LLM, build, paged_cache, speculative_policy, speculative_proposers  # noqa: E402
from stages.speculative.proposer import Proposer  # noqa: E402
from stages.speculative.scheduler import SpeculativeScheduler  # noqa: E402

__all__ = ["SpeculativeConfig", "STAGE_DEFAULT", "LLM", "build", "paged_cache",
           "speculative_policy", "speculative_proposers", "Proposer", "SpeculativeScheduler"]
