"""The `kb` command line (design §13): one click group, commands grouped by concept."""
