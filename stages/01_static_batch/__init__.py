"""Stage 01: static batching. A batch runs until its longest request ends."""
import sys

from stages import static_batch

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.static_batch (stages/static_batch.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = static_batch
