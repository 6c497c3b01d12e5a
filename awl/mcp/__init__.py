"""MCP plumbing shared by the gateway and the servers: frame checks, the HTTP transport and
the tool results (``results``: one mapping of a refusal to a tool error).

It knows documents (errors and limits) and nothing of stores or desks.
"""
