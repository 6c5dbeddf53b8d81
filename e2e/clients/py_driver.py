"""Client driver for the official Python MCP SDK, under mcp 2.x (2.3.0) or mcp 1.x (1.30.0).

    <venv>/bin/python py_driver.py [--legacy] -- <server command and args...>

Under mcp 2.x it uses `mcp.Client` in mode "auto" (probes `server/discover`, falls back to the
initialize handshake); `--legacy` selects mode "legacy". Under mcp 1.x it uses `stdio_client` +
`ClientSession.initialize()` (legacy only). Notifications are observed the way an application
sees them: through the session's `message_handler`; the SDK itself never refetches tools.

`--elicitation` passes an elicitation callback (so the SDK declares the capability) that
answers `elicitation/create` as the test scripts it: each request is reported as
`{"event":"elicitation",...}`, then answered by the policy set with the `elicitation_policy`
op (`accept` with `choice`, `decline`, `cancel`, or `hold`, the default: wait for an
`answer_elicitation` op, or never answer).

Speaks the line protocol of e2e/README.md ("Driver protocol"), the same as the TypeScript
drivers: one JSON command per stdin line, one JSON result or event per stdout line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import AsyncExitStack
from datetime import timedelta
from importlib.metadata import version as dist_version
from typing import Any

import anyio

MCP_VERSION = dist_version("mcp")
MCP_MAJOR = int(MCP_VERSION.split(".")[0])

if MCP_MAJOR >= 2:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp.shared.exceptions import MCPError as SdkMcpError

    TIMEOUT_CODE = -32001
else:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.shared.exceptions import McpError as SdkMcpError

    TIMEOUT_CODE = 408  # mcp 1.x reports a read timeout as httpx REQUEST_TIMEOUT
CONNECTION_CLOSED_CODE = -32000


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


class DriverCancelled(Exception):
    """Raised into a command that `cancel` or `close` stopped."""


def classify(err: BaseException) -> dict[str, Any]:
    if isinstance(err, SdkMcpError):
        code, message, data = err.error.code, err.error.message, err.error.data
        if code == CONNECTION_CLOSED_CODE and message.lower().startswith("connection closed"):
            kind = "transport"
        elif code == TIMEOUT_CODE and "timed out" in message.lower():
            kind = "timeout"
        else:
            kind = "protocol"
        out: dict[str, Any] = {"kind": kind, "message": message, "code": code}
        if data is not None:
            out["data"] = data
        return out
    if isinstance(err, DriverCancelled):
        return {"kind": "cancelled", "message": str(err)}
    if isinstance(err, TimeoutError):
        return {"kind": "timeout", "message": str(err) or "timed out"}
    transport_errors = (
        OSError,
        anyio.ClosedResourceError,
        anyio.BrokenResourceError,
        anyio.EndOfStream,
    )
    if isinstance(err, transport_errors):
        return {"kind": "transport", "message": f"{type(err).__name__}: {err}"}
    if isinstance(err, BaseExceptionGroup) and err.exceptions:
        return classify(err.exceptions[0])
    return {"kind": "other", "message": f"{type(err).__name__}: {err}"}


class Events:
    """Counts notifications since the last successful `wait_event`."""

    def __init__(self) -> None:
        self.pending: dict[str, int] = {}
        self.arrived: dict[str, anyio.Event] = {}

    def record(self, name: str, **extra: Any) -> None:
        emit({"event": name, **extra})
        self.pending[name] = self.pending.get(name, 0) + 1
        self.arrived.setdefault(name, anyio.Event()).set()

    async def wait(self, name: str, timeout_s: float) -> int:
        if not self.pending.get(name):
            self.arrived[name] = anyio.Event()
            with anyio.move_on_after(timeout_s):
                await self.arrived[name].wait()
        return self.pending.pop(name, 0)


class Elicitor:
    """The person at the host, as the test scripts them."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.policy: dict[str, Any] = {"action": "hold"}
        self.held: list[tuple[anyio.Event, dict[str, Any]]] = []

    @staticmethod
    def result(p: dict[str, Any]) -> Any:
        from mcp import types

        if p.get("action") == "accept":
            return types.ElicitResult(action="accept", content={"decision": p.get("choice")})
        return types.ElicitResult(action=p.get("action"))

    async def callback(self, context: Any, params: Any) -> Any:
        schema = getattr(params, "requestedSchema", None) or getattr(params, "requested_schema", None)
        if hasattr(schema, "model_dump"):  # mcp 2.x: a model, not a dict
            schema = schema.model_dump(by_alias=True, exclude_none=True)
        self.events.record(
            "elicitation",
            message=getattr(params, "message", None),
            requestedSchema=schema,
        )
        policy = self.policy
        if policy.get("action") == "hold":
            done = anyio.Event()
            slot: dict[str, Any] = {}
            self.held.append((done, slot))
            await done.wait()
            policy = slot
        return Elicitor.result(policy)

    def op(self, cmd: dict[str, Any]) -> dict[str, Any] | None:
        if cmd["op"] == "elicitation_policy":
            self.policy = {"action": cmd.get("action"), "choice": cmd.get("choice")}
            return {"ok": True}
        if cmd["op"] == "answer_elicitation":
            if not self.held:
                return {"ok": False}
            done, slot = self.held.pop(0)
            slot.update(action=cmd.get("action"), choice=cmd.get("choice"))
            done.set()
            return {"ok": True}
        return None


class Driver:
    def __init__(self, command: str, args: list[str], legacy: bool, elicitation: bool = False) -> None:
        # The server inherits the driver's whole environment (the SDK passes a minimal one).
        self.params = StdioServerParameters(command=command, args=args, env=dict(os.environ))
        self.legacy = legacy
        self.events = Events()
        self.session: Any = None  # mcp 2.x: Client; mcp 1.x: ClientSession
        self.connect_info: dict[str, Any] | None = None
        self.connect_error: BaseException | None = None
        self.connected = anyio.Event()
        self.close_requested = anyio.Event()
        self.owner_done = anyio.Event()
        self.owner_scope: anyio.CancelScope | None = None
        self.inflight: dict[anyio.CancelScope, dict[str, Any]] = {}
        self.elicitor = Elicitor(self.events) if elicitation else None
        extra: dict[str, Any] = {}
        if self.elicitor is not None:
            extra["elicitation_callback"] = self.elicitor.callback
        self.session_extra = extra

    async def message_handler(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.events.record("transport_error", message=f"{type(message).__name__}: {message}")
            return
        inner = getattr(message, "root", message)
        if getattr(inner, "method", None) == "notifications/tools/list_changed":
            self.events.record("tools_list_changed")

    async def own_connection(self) -> None:
        """Enters and exits the SDK contexts in one task, as anyio requires."""
        try:
            with anyio.CancelScope() as scope:
                self.owner_scope = scope
                async with AsyncExitStack() as stack:
                    if MCP_MAJOR >= 2:
                        client = Client(
                            self.params,
                            message_handler=self.message_handler,
                            mode="legacy" if self.legacy else "auto",
                            **self.session_extra,
                        )
                        self.session = await stack.enter_async_context(client)
                        caps = client.server_capabilities
                        info = client.server_info
                        self.connect_info = {
                            "protocolVersion": client.protocol_version,
                            "serverInfo": dump(info) if info is not None else None,
                            "capabilities": dump(caps) if caps is not None else None,
                        }
                    else:
                        read, write = await stack.enter_async_context(stdio_client(self.params))
                        session = await stack.enter_async_context(
                            ClientSession(read, write, message_handler=self.message_handler, **self.session_extra)
                        )
                        init = await session.initialize()
                        self.session = session
                        self.connect_info = {
                            "protocolVersion": init.protocolVersion,
                            "serverInfo": dump(init.serverInfo),
                            "capabilities": dump(init.capabilities),
                        }
                    self.connected.set()
                    await self.close_requested.wait()
        except BaseException as err:  # noqa: BLE001 - every SDK failure becomes an answer
            if self.connect_info is None:
                self.connect_error = err
            if not isinstance(err, Exception):
                raise
        finally:
            self.connected.set()
            self.owner_done.set()

    async def connect(self, tg: anyio.abc.TaskGroup, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.owner_scope is not None or self.connected.is_set():
            raise RuntimeError("connect was already sent")
        started = time.monotonic()
        tg.start_soon(self.own_connection)
        with anyio.move_on_after(cmd.get("timeoutMs", 30000) / 1000):
            await self.connected.wait()
        if not self.connected.is_set():
            if self.owner_scope is not None:
                self.owner_scope.cancel()
            await self.owner_done.wait()
            raise TimeoutError(f"connect did not finish within {cmd.get('timeoutMs', 30000)} ms")
        if self.connect_error is not None:
            raise self.connect_error
        assert self.connect_info is not None
        return {**self.connect_info, "elapsedMs": round((time.monotonic() - started) * 1000)}

    def require_session(self) -> Any:
        if self.session is None:
            raise RuntimeError('not connected: send {"op":"connect"} first')
        return self.session

    async def list_tools(self, cmd: dict[str, Any]) -> dict[str, Any]:
        session = self.require_session()
        if MCP_MAJOR >= 2 and "cacheMode" in cmd:
            result = await session.list_tools(cache_mode=cmd["cacheMode"])
        else:
            result = await session.list_tools()
        return {"tools": [dump(t) for t in result.tools]}

    async def call_tool(self, cmd: dict[str, Any]) -> dict[str, Any]:
        session = self.require_session()
        name = cmd.get("name")
        if not isinstance(name, str):
            raise ValueError('call_tool needs "name"')
        timeout = cmd.get("timeoutMs")
        if timeout is None:
            read_timeout = None
        elif MCP_MAJOR >= 2:
            read_timeout = timeout / 1000
        else:
            read_timeout = timedelta(milliseconds=timeout)
        result = await session.call_tool(name, cmd.get("arguments") or {}, read_timeout_seconds=read_timeout)
        raw = dump(result)
        out: dict[str, Any] = {"isError": bool(raw.get("isError")), "content": raw.get("content", [])}
        if "structuredContent" in raw:
            out["structuredContent"] = raw["structuredContent"]
        if "_meta" in raw:
            out["_meta"] = raw["_meta"]
        return out

    async def handle(self, tg: anyio.abc.TaskGroup, cmd: dict[str, Any]) -> None:
        op = cmd["op"]
        reply: dict[str, Any] = {"op": op}
        scope = anyio.CancelScope()
        self.inflight[scope] = cmd
        cancelled_by: list[str] = []
        cmd["_cancel"] = cancelled_by
        try:
            with scope:
                try:
                    if op == "connect":
                        reply.update(ok=True, **(await self.connect(tg, cmd)))
                    elif op == "list_tools":
                        reply.update(ok=True, **(await self.list_tools(cmd)))
                    elif op == "call_tool":
                        reply.update(ok=True, **(await self.call_tool(cmd)))
                    elif op == "wait_event":
                        event = cmd.get("event", "tools_list_changed")
                        n = await self.events.wait(event, cmd.get("timeoutMs", 5000) / 1000)
                        reply.update(ok=n > 0, event=event, **({"count": n} if n else {}))
                    elif op == "cancel":
                        found = False
                        for other_scope, other in list(self.inflight.items()):
                            if other is not cmd and "id" in other and other["id"] == cmd.get("target"):
                                other["_cancel"].append("cancelled by the driver")
                                other_scope.cancel()
                                found = True
                        reply.update(ok=found, target=cmd.get("target"))
                    elif self.elicitor is not None and (answer := self.elicitor.op(cmd)) is not None:
                        reply.update(answer)
                    else:
                        raise ValueError(f"unknown op {op!r}")
                except Exception as err:  # noqa: BLE001 - an SDK error is an answer, not a crash
                    reply.update(ok=False, error=classify(err))
            if scope.cancelled_caught or (scope.cancel_called and "ok" not in reply):
                reply = {"op": op, "ok": False, "error": classify(DriverCancelled(cancelled_by[0] if cancelled_by else "cancelled"))}
        finally:
            del self.inflight[scope]
            cmd.pop("_cancel", None)
        if "id" in cmd:
            reply["id"] = cmd["id"]
        emit(reply)

    async def shutdown(self, close_cmd: dict[str, Any] | None) -> None:
        # Close the connection first so in-flight calls fail the way the SDK reports a closed
        # connection; anything still pending afterwards is answered as cancelled by close.
        self.close_requested.set()
        if self.owner_scope is not None:
            with anyio.move_on_after(10):
                await self.owner_done.wait()
            if not self.owner_done.is_set():
                self.owner_scope.cancel()
        for scope, cmd in list(self.inflight.items()):
            cmd["_cancel"].append("cancelled: the driver is closing")
            scope.cancel()
        await anyio.sleep(0)
        while self.inflight:
            await anyio.sleep(0.01)
        if close_cmd is not None:
            reply: dict[str, Any] = {"op": "close", "ok": True}
            if "id" in close_cmd:
                reply["id"] = close_cmd["id"]
            emit(reply)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            stdin = anyio.wrap_file(sys.stdin)
            close_cmd = None
            async for line in stdin:
                if not line.strip():
                    continue
                try:
                    cmd = json.loads(line)
                    if not isinstance(cmd, dict) or not isinstance(cmd.get("op"), str):
                        raise ValueError('a command is an object with "op"')
                except ValueError as err:
                    emit({"op": "invalid", "ok": False, "error": {"kind": "other", "message": f"bad command line: {err}"}})
                    continue
                if cmd["op"] == "close":
                    close_cmd = cmd
                    break
                if cmd.get("nowait") is True:
                    tg.start_soon(self.handle, tg, cmd)
                else:
                    await self.handle(tg, cmd)
            await self.shutdown(close_cmd)
            tg.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.stderr.write("usage: py_driver.py [--legacy] [--elicitation] -- <server command and args...>\n")
        return 2
    sep = argv.index("--")
    options, server = argv[:sep], argv[sep + 1 :]
    unknown = [o for o in options if o not in ("--legacy", "--elicitation")]
    if unknown:
        sys.stderr.write(f"py_driver.py: unknown option {unknown[0]}\n")
        return 2
    driver = Driver(server[0], server[1:], legacy="--legacy" in options, elicitation="--elicitation" in options)
    anyio.run(driver.run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
