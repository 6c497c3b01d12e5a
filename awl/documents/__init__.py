"""Documents and the checks on them: models, schemas, numbered checks, the order lifecycle.

The bottom layer: pure functions and immutable values, no files, no network, no MCP. Every
other layer may import it; it imports none of them.
"""
