"""git plumbing (design §2, §5): the workspace repository, its index file and working tree,
turn worktrees, packing, and the three-way text merge.
"""
