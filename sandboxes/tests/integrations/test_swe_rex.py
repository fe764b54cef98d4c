"""The SWE-ReX deployment and runtime on Sandman (issue 14, items 1 and 3), against a live
server with the real controller, local provider and execd: a session keeps its shell
state, a second session is a shell of its own (its ``startup_source`` sourced first), an
interrupt stops only that session's running command, failures raise SWE-ReX's own
exceptions, ``execute`` runs apart from the session with stderr apart, files round-trip
byte for byte, and ``stop()`` releases the sandbox."""

from __future__ import annotations

import asyncio
import time

import pytest
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from sandboxes.integrations.swe_rex import SandmanDeployment
from sandboxes.models import Sandbox
from sandboxes.tests.api_support import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_a_swe_rex_session_on_a_sandman_sandbox(controller, live_server, tmp_path):
    _, token = make_user("rex-user")
    deployment = SandmanDeployment(
        base_url=live_server.url, token=token, spec={"cpu": "500m", "memory": "256Mi"}
    )
    (tmp_path / "up" / "sub").mkdir(parents=True)
    (tmp_path / "up" / "sub" / "f.txt").write_text("uploaded\n")

    async def scenario() -> int:
        await deployment.start()
        rt = deployment.runtime
        assert await deployment.is_alive()
        await rt.create_session(CreateBashSessionRequest())
        with pytest.raises(SessionExistsError):
            await rt.create_session(CreateBashSessionRequest())
        await rt.write_file(WriteFileRequest(path="/tmp/env.sh", content="export VENV=on\n"))
        await rt.create_session(
            CreateBashSessionRequest(session="second", startup_source=["/tmp/env.sh"])
        )
        await rt.run_in_session(BashAction(command="cd /tmp && export A=1"))
        kept = await rt.run_in_session(BashAction(command="pwd; echo $A"))
        assert (kept.output, kept.exit_code) == ("/tmp\n1\n", 0)
        silent = await rt.run_in_session(BashAction(command="false", check="silent"))
        assert silent.exit_code == 1
        with pytest.raises(NonZeroExitCodeError):
            await rt.run_in_session(BashAction(command="exit_code_7() { return 7; }; exit_code_7"))
        with pytest.raises(BashIncorrectSyntaxError):
            await rt.run_in_session(BashAction(command='echo "open'))
        with pytest.raises(CommandTimeoutError):
            await rt.run_in_session(BashAction(command="sleep 5", timeout=0.5))
        alone = await rt.execute(Command(command=["echo", "a b"]))
        assert (alone.stdout, alone.exit_code) == ("a b\n", 0)
        shell = await rt.execute(Command(command="pwd; echo ${A:-none}", shell=True, cwd="/"))
        assert shell.stdout == "/\n1\n"  # sees the session's exports, not its cwd
        env = await rt.execute(Command(command="echo $ONLY", shell=True, env={"ONLY": "x"}))
        assert env.stdout == "x\n"
        await rt.write_file(WriteFileRequest(path="/tmp/w/new.txt", content="héllo\n"))
        read = await rt.read_file(ReadFileRequest(path="/tmp/w/new.txt"))
        assert read.content == "héllo\n"
        await rt.upload(UploadRequest(source_path=str(tmp_path / "up"), target_path="/tmp/up"))
        got = await rt.run_in_session(BashAction(command="cat /tmp/up/sub/f.txt"))
        assert got.output == "uploaded\n"
        other = await rt.run_in_session(
            BashAction(command="echo ${A:-unset} $VENV; B=2", session="second")
        )
        assert other.output == "unset on\n"  # its own shell, its startup sourced
        split = await rt.execute(Command(command="echo o; echo e >&2", shell=True))
        assert (split.stdout, split.stderr) == ("o\n", "e\n")
        long = asyncio.create_task(
            rt.run_in_session(
                BashAction(
                    command="sleep 300; echo after", session="second", check="silent", timeout=60
                )
            )
        )
        until = time.monotonic() + 30
        while not any(
            s["name"] == "second" and s["busy"]
            for s in await asyncio.to_thread(rt.sandbox.sessions)
        ):
            assert time.monotonic() < until, "the long command never started"
            await asyncio.sleep(0.02)
        await rt.run_in_session(BashInterruptAction(session="second"))
        stopped = await long
        assert stopped.exit_code == 130 and "after" not in stopped.output
        kept = await rt.run_in_session(BashAction(command="echo $B", session="second"))
        assert kept.output == "2\n"  # the interrupt kept the session's shell
        await rt.run_in_session(BashInterruptAction())  # nothing runs: a no-op
        after = await rt.run_in_session(BashAction(command="echo ${A:-reset}"))
        assert after.output == "1\n"
        await rt.close_session(CloseBashSessionRequest(session="second"))
        assert [s["name"] for s in await asyncio.to_thread(rt.sandbox.sessions)] == ["default"]
        sandbox_id = rt.sandbox.sandbox_id
        await deployment.stop()
        return sandbox_id

    sandbox_id = asyncio.run(scenario())
    assert Sandbox.objects.get(pk=sandbox_id).released_at is not None
