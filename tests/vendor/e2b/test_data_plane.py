"""The SDK's data plane (envd) against the simulator run with `--exec local`: commands with
exit codes, streaming, background processes, signals, env vars and stdin; files written,
read, listed, tested, made, moved and removed, in both upload encodings envd reads."""

import pytest
from e2b import CommandExitException, FileType, NotFoundException, Sandbox

from conftest import wait_until


def test_exit_codes_and_output(sandbox):
    done = sandbox.commands.run("echo out; echo err >&2")
    assert (done.exit_code, done.stdout, done.stderr) == (0, "out\n", "err\n")
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("echo partial; echo broken >&2; exit 3")
    assert raised.value.exit_code == 3
    assert raised.value.stdout == "partial\n"
    assert raised.value.stderr == "broken\n"
    assert raised.value.error == "exit status 3"


def test_output_streams_as_it_comes(sandbox):
    lines, errors = [], []
    done = sandbox.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.05; done; echo warn >&2",
        on_stdout=lines.append,
        on_stderr=errors.append,
    )
    assert "".join(lines) == "line1\nline2\nline3\n"
    assert "".join(errors) == "warn\n"
    assert done.stdout == "line1\nline2\nline3\n"


def test_env_vars_and_working_directory(sandbox):
    sandbox.files.write("/home/user/work/here.txt", "in work")
    # The simulator runs commands on the host in a scratch directory per sandbox, so `pwd` shows
    # the host's path; what is relative to the working directory is the sandbox's.
    done = sandbox.commands.run(
        'printf "%s:%s" "$ONE" "$(cat here.txt)"', envs={"ONE": "1 & 2"}, cwd="/home/user/work"
    )
    assert done.stdout == "1 & 2:in work"


def test_background_processes_are_listed_and_killed(sandbox):
    handle = sandbox.commands.run("sleep 30", background=True)
    assert handle.pid > 0
    listed = wait_until(
        "the process is listed",
        lambda: [p for p in sandbox.commands.list() if p.pid == handle.pid],
    )
    assert listed[0].cmd == "/bin/bash"
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as raised:
        handle.wait()
    assert raised.value.error == "signal: killed"
    assert [p for p in sandbox.commands.list() if p.pid == handle.pid] == []
    # Killing what is gone says so.
    assert sandbox.commands.kill(handle.pid) is False


def test_stdin_reaches_a_process(sandbox):
    handle = sandbox.commands.run(
        'read first; read second; echo "got:$first,$second"', background=True, stdin=True
    )
    sandbox.commands.send_stdin(handle.pid, "hello\n")
    sandbox.commands.send_stdin(handle.pid, b"world\n")
    done = handle.wait()
    assert done.stdout == "got:hello,world\n"


def test_a_running_process_can_be_reconnected(sandbox):
    handle = sandbox.commands.run("sleep 0.3; echo late", background=True)
    again = sandbox.commands.connect(handle.pid)
    assert again.wait().stdout == "late\n"


@pytest.mark.parametrize(
    "envd_version", ["0.6.4", "0.5.0"], ids=["octet-stream-upload", "multipart-upload"]
)
def test_files_round_trip(start_sim, envd_version):
    start_sim("--envd-version", envd_version)
    sbx = Sandbox.create()
    try:
        info = sbx.files.write("/home/user/notes/a.txt", "hello ë\n")
        assert info.path == "/home/user/notes/a.txt"
        assert sbx.files.read("/home/user/notes/a.txt") == "hello ë\n"
        sbx.files.write("/home/user/bin.dat", bytes(range(256)))
        assert bytes(sbx.files.read("/home/user/bin.dat", format="bytes")) == bytes(range(256))
        # What the SDK wrote, a command reads.
        assert sbx.commands.run("cat /home/user/notes/a.txt").stdout == "hello ë\n"

        assert sbx.files.exists("/home/user/notes/a.txt") is True
        assert sbx.files.exists("/home/user/nothing-here") is False
        assert sbx.files.make_dir("/home/user/d/e") is True
        assert sbx.files.make_dir("/home/user/d/e") is False
        entries = {e.name: e for e in sbx.files.list("/home/user")}
        assert entries["notes"].type == FileType.DIR
        assert entries["bin.dat"].type == FileType.FILE
        assert entries["bin.dat"].size == 256

        stat = sbx.files.get_info("/home/user/notes/a.txt")
        assert (stat.name, stat.type, stat.size) == ("a.txt", FileType.FILE, len("hello ë\n".encode()))
        moved = sbx.files.rename("/home/user/notes/a.txt", "/home/user/d/b.txt")
        assert moved.path == "/home/user/d/b.txt"
        assert sbx.files.exists("/home/user/notes/a.txt") is False
        assert sbx.files.read("/home/user/d/b.txt") == "hello ë\n"
        sbx.files.remove("/home/user/d")
        assert sbx.files.exists("/home/user/d/b.txt") is False
        with pytest.raises(NotFoundException):
            sbx.files.read("/home/user/d/b.txt")
        with pytest.raises(NotFoundException):
            sbx.files.get_info("/home/user/d")
    finally:
        sbx.kill()
