"""The AWL MCP gateway: enforces a Work Order on every tool call and holds staged writes."""

__all__: list[str] = []
