"""The store (design §3): revisions written through drafts under the workspace write lock,
recorded history, projection into Postgres rows, titles and listings.
"""
