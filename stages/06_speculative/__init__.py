"""Stage 06: speculative decoding. Proposers guess, one pass verifies, every token stays the reference's."""
import sys

from stages import speculative

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.speculative (stages/speculative.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = speculative
