"""``dlwatch mcp``: a Model Context Protocol server over stdio, so that a
coding agent asks dlwatch for the live figures, the hints and the profiles
of this user's jobs instead of guessing from logs (docs/mcp.md).

``tools`` holds what each tool does, over the collector's contracts and
without the SDK; ``server`` lists them with the SDK (the optional ``mcp``
package), which nothing else in dlwatch needs.
"""
