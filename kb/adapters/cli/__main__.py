"""`python -m kb.adapters.cli`: the same as the `kb` command."""

from kb.adapters.cli.main import main

main()
