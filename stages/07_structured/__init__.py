"""Stage 07: structured output. A JSON schema, a regex, a choice or a grammar masks the tokens that may come next."""
import sys

from stages import structured

# A name beginning with a digit cannot follow an import statement, so this folder's modules are loaded once, as
# stages.structured (stages/structured.py, whose package path is this folder), and this name is that module.
sys.modules[__name__] = structured
