"""The ways in: the command line (`cli`), the HTTP API (`http`) and MCP (`mcp`) (design §13).

Adapters turn requests into calls on :class:`kb.KnowledgeBase` and its hand-outs, and results into
text or JSON. Nothing below imports them.
"""
