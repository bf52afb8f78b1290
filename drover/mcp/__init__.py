"""drover as an MCP server: agents call the ops as tools (`drover mcp serve`), registered in one command
(`drover mcp install claude|codex`).

- server.py: the stdio server (the official `mcp` SDK's MCPServer), one tool per op, results the op's document.
- caller.py: who is calling -- the agent session that started the server, named on proof, never by an argument.
- install.py: `drover mcp install`, through the engine's own `claude mcp add` / `codex mcp add`.
"""
