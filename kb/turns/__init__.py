"""Turns (design §5): private per-turn worktrees whose edits land as one revision."""
