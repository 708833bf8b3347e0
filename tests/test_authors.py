"""design §3: whoever a caller names as a revision's author or committer, the commit holds it in
git's form (``Name <email>``), so the real ``git fsck --strict`` accepts the workspace's
repository: ``A <a> <b>``, names holding ``<`` ``>`` or a newline, an empty name and an email with
spaces made commits fsck refused (badDate, badEmail, missingSpaceBeforeEmail)."""

from __future__ import annotations

import subprocess

import pytest

from kb.errors import InvalidInput
from kb.git.repository import format_identity

HOSTILE = [
    "A <a> <b>",
    "a<b <c@x>",
    "N <a@x",
    "Ann\n<a@x>",
    "Ann <a@x>\nextra",
    " <a@x>",
    "<a@x>",
    "",
    "   ",
    "Bob <b ob@x>",
    "Bob <  >",
    "<>",
    "Eve <e@x> 1700000000 +0000",
    "Zoë",
    "x\x00y <z@x>",
]


def test_commits_by_hostile_authors_pass_git_fsck_strict(kb):
    kb.create_workspace(1)
    for n, who in enumerate(HOSTILE):
        if "\n" in who or "\x00" in who:  # refused at the facade, with what to do
            with pytest.raises(InvalidInput), kb.transaction(1, "x", author=who) as tx:
                tx.write(f"/documents/N{n}.md", f"# N{n}\n")
            continue
        with kb.transaction(1, f"by {who!r}", author=who, committer=who) as tx:
            tx.write(f"/documents/N{n}.md", f"# N{n}\n")
    path = kb.store(1).path
    checked = subprocess.run(["git", "-C", str(path), "fsck", "--strict"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    authors = [r.author for r in kb.history(1, None, 100)]
    assert "Zoë" in authors and "Bob <bob@x>" in authors and "A a <b>" in authors  # a plain name as given


@pytest.mark.parametrize("who", HOSTILE)
def test_an_identity_is_one_name_and_one_email(who):
    name, _, email = format_identity(who).decode().rpartition(" <")
    assert name.strip() == name and name and not set(name) & set("<>\n\x00")
    assert email.endswith(">") and not set(email[:-1]) & set("<> \n\x00")
