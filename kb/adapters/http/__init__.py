"""`kb serve`'s HTTP JSON API and the client the CLI uses with ``KB_SERVER_URL`` (design §13)."""
