"""The stages, in lesson order (stages/01_static_batch/ ... stages/07_structured/), each also under a name an import
statement can spell, its door (stages/paged_kv.py for stages/03_paged_kv/, and so on):

    from stages.static_batch import LLM          # stages/01_static_batch/
    from stages.continuous_batch import LLM      # stages/02_continuous_batch/
    from stages.paged_kv.block_manager import BlockManager   # stages/03_paged_kv/block_manager.py
    from stages.kernels.model import KernelLlama             # stages/04_kernels/model.py
    from stages.streaming import LLM             # stages/05_streaming/
    from stages.speculative.scheduler import SpeculativeScheduler   # stages/06_speculative/scheduler.py
    from stages.structured import LLM            # stages/07_structured/

A folder's number keeps the lesson order (``python -m stages.03_paged_kv``), but a name that begins with a digit
cannot follow ``import``. So each folder is the package path of a small module with a plain name, and every module of
the folder is loaded through it, once: ``stages.paged_kv.scheduler`` is stages/03_paged_kv/scheduler.py. A stage that
builds on another imports its parts this way, in plain sight; the numbered package only hands the same names on.
Import a stage's modules by the plain name alone: ``stages.03_paged_kv.scheduler`` would load the file a second time,
as another module (tests/test_layout.py refuses such an import).
"""
STAGES = {  # the plain name -> the numbered package (its folder under stages/)
    "static_batch": "stages.01_static_batch",
    "continuous_batch": "stages.02_continuous_batch",
    "paged_kv": "stages.03_paged_kv",
    "kernels": "stages.04_kernels",
    "streaming": "stages.05_streaming",
    "speculative": "stages.06_speculative",
    "structured": "stages.07_structured",
}
