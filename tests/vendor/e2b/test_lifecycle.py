"""The SDK's control plane against the simulator: create (metadata, env vars, timeout), list
(filters with values that need escaping, paging), info, timeout, pause, connect, kill, metrics
and snapshots, with E2B's errors from the simulator's state."""

from datetime import datetime, timedelta, timezone

import pytest
from e2b import (
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from conftest import ROUTE


def every_page(paginator):
    """Every item of a paginator, and how many pages it took."""
    items, pages = [], 0
    while paginator.has_next:
        items += paginator.next_items()
        pages += 1
    return items, pages


def test_create_takes_metadata_env_vars_and_timeout(sim):
    before = datetime.now(timezone.utc)
    sbx = Sandbox.create(
        metadata={"owner": "zoë", "k": "a b&c=d"},
        envs={"GREETING": "hi there", "TRICKY": "x=1&y=2"},
        timeout=120,
    )
    calls = sim.calls()
    # The SDK's own route: v2 from e2b 2.51 on, v1 before.
    assert calls.get(f"create-{ROUTE}") == 1, calls
    assert sum(v for k, v in calls.items() if k.startswith("create-")) == 1, calls

    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.metadata == {"owner": "zoë", "k": "a b&c=d"}
    assert info.state == SandboxState.RUNNING
    assert info.template_id
    ttl = (info.end_at - before).total_seconds()
    assert 110 <= ttl <= 130, ttl

    # The sandbox's variables reach its commands; a command's own override them.
    out = sbx.commands.run('printf "%s|%s" "$GREETING" "$TRICKY"')
    assert out.stdout == "hi there|x=1&y=2"
    out = sbx.commands.run('printf "%s" "$GREETING"', envs={"GREETING": "mine"})
    assert out.stdout == "mine"


def test_list_filters_by_escaped_metadata_and_state_and_pages(sim):
    wanted = Sandbox.create(metadata={"owner": "zoë", "k": "a b&c=d", "p": "x/y+z %41"})
    near = Sandbox.create(metadata={"owner": "zoe", "k": "a b&c=d", "p": "x/y+z %41"})
    other = Sandbox.create(metadata={"owner": "bob"})

    found, _ = every_page(
        Sandbox.list(query=SandboxQuery(metadata={"owner": "zoë", "k": "a b&c=d", "p": "x/y+z %41"}))
    )
    assert [s.sandbox_id for s in found] == [wanted.sandbox_id]
    found, _ = every_page(Sandbox.list(query=SandboxQuery(metadata={"k": "a b&c=d"})))
    assert {s.sandbox_id for s in found} == {wanted.sandbox_id, near.sandbox_id}
    found, _ = every_page(Sandbox.list(query=SandboxQuery(metadata={"k": "a b"})))
    assert found == []

    # One sandbox a page: three pages, every sandbox once.
    found, pages = every_page(Sandbox.list(limit=1))
    assert pages == 3
    assert sorted(s.sandbox_id for s in found) == sorted(
        s.sandbox_id for s in (wanted, near, other)
    )

    other.pause()
    paused, _ = every_page(Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])))
    assert [s.sandbox_id for s in paused] == [other.sandbox_id]
    assert paused[0].state == SandboxState.PAUSED
    running, _ = every_page(Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])))
    assert {s.sandbox_id for s in running} == {wanted.sandbox_id, near.sandbox_id}


def test_set_timeout_moves_the_end(sandbox):
    before = datetime.now(timezone.utc)
    sandbox.set_timeout(30)
    end = sandbox.get_info().end_at
    assert timedelta(seconds=20) <= end - before <= timedelta(seconds=40)
    Sandbox.set_timeout(sandbox.sandbox_id, 600)
    end = Sandbox.get_info(sandbox.sandbox_id).end_at
    assert timedelta(seconds=590) <= end - before <= timedelta(seconds=610)


def test_pause_then_connect_resumes_with_files_kept(sim, sandbox):
    sandbox.files.write("/home/user/kept.txt", "still here")
    assert sandbox.pause() in (True, None)
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
    # A second pause is E2B's 409: the SDK reads it as "already paused".
    assert Sandbox.pause(sandbox.sandbox_id) is False

    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    assert resumed.sandbox_id == sandbox.sandbox_id
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
    assert resumed.files.read("/home/user/kept.txt") == "still here"
    calls = sim.calls()
    assert calls.get(f"connect-{ROUTE}") == 1, calls
    # Connecting to a running sandbox keeps it running.
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.commands.run("echo ok").stdout == "ok\n"


def test_kill_removes_the_sandbox(sandbox):
    sid = sandbox.sandbox_id
    assert sandbox.kill() in (True, None)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sid)
    assert Sandbox.kill(sid) is False
    found, _ = every_page(Sandbox.list())
    assert sid not in [s.sandbox_id for s in found]
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sid)


def test_metrics_of_a_sandbox_that_has_been_running(sim):
    started = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    seeded = sim.seed(templateID="base", state="running", startedAt=started, cpuCount=2)
    metrics = Sandbox.get_metrics(seeded["sandboxID"])
    assert len(metrics) > 10
    assert all(m.cpu_count == 2 for m in metrics)
    assert all(0 <= m.cpu_used_pct <= 100 for m in metrics)
    assert all(0 < m.mem_used <= m.mem_total for m in metrics)
    assert all(0 < m.disk_used <= m.disk_total for m in metrics)
    times = [m.timestamp for m in metrics]
    assert times == sorted(times)
    window = Sandbox.get_metrics(
        seeded["sandboxID"],
        start=datetime.now(timezone.utc) - timedelta(minutes=10),
        end=datetime.now(timezone.utc),
    )
    assert 0 < len(window) < len(metrics)


def test_snapshots_are_made_listed_used_and_deleted(sandbox):
    sandbox.files.write("/home/user/in-snapshot.txt", "x")
    snap = sandbox.create_snapshot()
    assert snap.snapshot_id
    mine, _ = every_page(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id))
    assert [s.snapshot_id for s in mine] == [snap.snapshot_id]
    # The sandbox goes on running after its snapshot.
    assert sandbox.get_info().state == SandboxState.RUNNING
    # A snapshot is a template (its id is the template's, tagged): a sandbox can start from it.
    child = Sandbox.create(template=snap.snapshot_id)
    assert child.get_info().template_id == snap.snapshot_id.split(":")[0]
    child.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    mine, _ = every_page(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id))
    assert mine == []


def test_an_unknown_template_and_a_wrong_key_are_refused(sim):
    with pytest.raises((NotFoundException, SandboxException)) as raised:
        Sandbox.create(template="no-such-template")
    assert "no-such-template" in str(raised.value)
    from e2b import AuthenticationException

    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_wrong_key_000000000000")


def test_what_the_simulator_does_not_serve_fails_loudly(sim, sandbox):
    # Forking and changing the network are E2B routes the simulator lacks: E2B's 404 JSON, never
    # a made-up success.
    with pytest.raises(Exception):
        sandbox.fork()
    status, body = sim.request(
        "POST", f"/sandboxes/{sandbox.sandbox_id}/fork", {}, headers={"X-API-Key": "e2b_vendor_suite_0123456789abcdef"}
    )
    assert status == 404 and body["code"] == 404 and body["message"], body
