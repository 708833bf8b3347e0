"""Citations (design §8): the read envelope, chat handles, following cited lines to HEAD."""
