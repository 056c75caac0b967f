"""Stage 02: continuous batching. A freed slot is refilled at every step."""
import sys

from stages import continuous_batch

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.continuous_batch (stages/continuous_batch.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = continuous_batch
