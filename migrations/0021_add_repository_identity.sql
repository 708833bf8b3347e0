-- Design §3: a workspace's repository has an identity (a random id written at creation into its
-- git config as ``kb.repositoryid``) recorded here; kb refuses to touch a repository whose
-- identity is not the recorded one. ``diverged`` holds why the workspace's repository cannot be
-- converged (it lacks a revision Postgres recorded, or is another repository): every job and
-- reader refuses the workspace with HistoryDiverged until an operator restores the repository,
-- and nothing is deleted meanwhile.
ALTER TABLE kb.workspaces ADD COLUMN repository_id text;
ALTER TABLE kb.workspaces ADD COLUMN diverged text;
