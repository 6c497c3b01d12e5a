"""MCP plumbing shared by the gateway and the servers: frame checks and the HTTP transport.

It knows documents (errors and limits) and nothing of stores or desks.
"""
