"""The MCP server: a turn's tools for agents, over stdio or HTTP (design §5)."""
