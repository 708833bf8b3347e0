"""Legacy knowledge bases (design §9, §10): seeding from legacy rows, span fill, drift checks."""
