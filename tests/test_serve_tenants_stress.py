"""A short sample of the tenants stress (tests/support/tenant_stress.py; runs and figures:
``bin/stress_serve_tenants.py``): three tenants, two client threads each, turn after turn on one
real ``kb serve`` while a slow writer now and then holds one tenant's write lock. Every turn sees
its own writes, every commit's answer is the truth about its own workspace, none is applied twice,
and no tenant's path reaches another's workspace (design §3, §5, §16)."""

from __future__ import annotations

import pytest
from support.serving import start_serve, stop_serve
from support.tenant_stress import stress_tenants

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")


def test_tenants_side_by_side_each_get_the_truth_about_their_own_turns(kb, kb_env, tmp_path):
    tenants = []
    for ws in (1, 2, 3):
        kb.create_workspace(ws)
        tenants.append((ws, kb.tokens().create(f"tenant-{ws}", "write", [ws])[1]))
    log = tmp_path / "serve.log"
    process, url = start_serve(kb_env, log)
    try:
        report = stress_tenants(kb, url, tenants, seconds=6, threads=2, seed=1)
    finally:
        output = stop_serve(process, log)
    assert not report.faults, report.faults
    assert report.counts["landed"] > 10 and report.counts["lock holds"] > 0, report.counts
    assert "Traceback" not in output, output
