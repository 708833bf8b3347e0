"""The job queue (design §7, §14): Procrastinate tasks, the worker, the periodic sweep."""
