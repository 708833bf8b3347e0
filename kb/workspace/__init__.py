"""Services over one workspace's store (design §2.1, §11, §14): artifacts and their blob store,
push remotes, fsck, and the workspace lifecycle (listing, deleting).
"""
