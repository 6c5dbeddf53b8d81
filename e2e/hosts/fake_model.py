#!/usr/bin/env python3
"""A small fake model API for driving real agent hosts in the end-to-end tests.

Serves, on an ephemeral 127.0.0.1 port, the three wire formats the hosts speak:
  - Anthropic Messages (Claude Code):      POST /v1/messages (SSE or JSON), /v1/messages/count_tokens
  - OpenAI Responses (Codex CLI):          POST /v1/responses (SSE)
  - Gemini generateContent (Gemini CLI):   POST /v1beta/models/M:streamGenerateContent?alt=sse,
                                           :generateContent, :countTokens

Scripted by a JSON file: {"tool_suffix": "list_items", "arguments": {}, "final_text": "done"}.
Each new user prompt is answered with a call of the tool whose name (as the host exposes it,
e.g. `mcp__inventory__list_items`) ends with `tool_suffix`; a request whose last message carries a
tool result is recorded and answered with `final_text`. A prompt whose tools do not include such a
tool is recorded (`tool_missing`) and answered with text. Side requests without tools (titles,
quota probes, classifiers) get plain text.

Everything is recorded as JSON lines in the log file (every request with its path and the tool
definitions it carried, every tool call asked for, every tool result). The port is written to the
port file once listening. Bounded: exits after `--idle` seconds without a request, after
`--lifetime` seconds in all, or when its parent process dies. Request bodies are capped.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 16 * 1024 * 1024
LOCK = threading.Lock()
STATE = {"last": time.monotonic(), "n": 0}


def log(rec):
    rec["t"] = round(time.time(), 3)
    line = json.dumps(rec, sort_keys=True)
    with LOCK:
        with open(ARGS.log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def next_id(prefix):
    with LOCK:
        STATE["n"] += 1
        return f"{prefix}{STATE['n']}"


def find_revision(value, depth=0):
    """The first JSON object carrying a `revision` key anywhere in value (strings parsed)."""
    if depth > 12:
        return None
    if isinstance(value, dict):
        if "revision" in value and "items" in value or "revision" in value and "sku" in value:
            return value
        for v in value.values():
            r = find_revision(v, depth + 1)
            if r is not None:
                return r
    elif isinstance(value, list):
        for v in value:
            r = find_revision(v, depth + 1)
            if r is not None:
                return r
    elif isinstance(value, str):
        # JSON text, possibly after a host's own preamble ("Wall time: …\nOutput:\n{…}").
        dec = json.JSONDecoder()
        start = value.find("{")
        tries = 0
        while start != -1 and tries < 50:
            tries += 1
            try:
                obj, _ = dec.raw_decode(value, start)
                r = find_revision(obj, depth + 1)
                if r is not None:
                    return r
            except ValueError:
                pass
            start = value.find("{", start + 1)
    return None


def pick_tool(names):
    suffix = SCRIPT.get("tool_suffix", "list_items")
    hits = [n for n in names if n == suffix or n.endswith("_" + suffix) or n.endswith("." + suffix)]
    return hits[0] if hits else None


def text_of(value, depth=0):
    """All text in a tool result, joined (for the log)."""
    if depth > 12:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if "text" in value and isinstance(value["text"], str):
            return value["text"]
        return "\n".join(t for t in (text_of(v, depth + 1) for v in value.values()) if t)
    if isinstance(value, list):
        return "\n".join(t for t in (text_of(v, depth + 1) for v in value) if t)
    return ""


def record_result(api, tool, raw, is_error):
    log({
        "event": "tool_result", "api": api, "tool": tool, "isError": bool(is_error),
        "found": find_revision(raw), "text": text_of(raw)[:20000], "raw": raw,
    })


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("body too large")
        data = self.rfile.read(n) if n else b""
        if not data and self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            total = 0
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                total += size
                if total > MAX_BODY:
                    raise ValueError("body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            data = b"".join(chunks)
        if self.headers.get("Content-Encoding", "").lower() in ("gzip", "zstd", "br", "deflate"):
            enc = self.headers.get("Content-Encoding").lower()
            if enc == "gzip":
                import gzip
                data = gzip.decompress(data)
            elif enc == "deflate":
                import zlib
                data = zlib.decompress(data)
            elif enc == "zstd":
                try:
                    import zstandard  # not in stdlib before 3.14
                    data = zstandard.ZstdDecompressor().decompress(data)
                except ImportError:
                    try:
                        from compression import zstd  # Python 3.14
                        data = zstd.decompress(data)
                    except ImportError:
                        raise ValueError("zstd request body: no decompressor")
        return json.loads(data) if data else {}

    def _send_json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events):
        """events: list of (event name or None, payload)."""
        out = []
        for name, payload in events:
            if name:
                out.append(f"event: {name}\n")
            out.append(f"data: {json.dumps(payload)}\n\n")
        data = "".join(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        STATE["last"] = time.monotonic()
        log({"event": "request", "method": "GET", "path": self.path, "known": False})
        if self.path.startswith("/v1/models") or "/models" in self.path:
            self._send_json({"data": [], "models": []})
        else:
            self._send_json({"error": {"message": "not found"}}, 404)

    def do_HEAD(self):
        STATE["last"] = time.monotonic()
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        STATE["last"] = time.monotonic()
        try:
            body = self._body()
        except Exception as e:  # noqa: BLE001 - recorded, answered 400
            log({"event": "bad_request", "path": self.path, "error": str(e)})
            self._send_json({"error": {"message": str(e)}}, 400)
            return
        path = self.path.split("?")[0]
        if SCRIPT.get("dump_bodies"):
            log({"event": "body", "path": self.path, "body": body})
        try:
            if path.endswith("/messages/count_tokens"):
                log({"event": "request", "api": "anthropic", "path": self.path, "kind": "count_tokens"})
                self._send_json({"input_tokens": 10})
            elif path.endswith("/messages"):
                self.anthropic(body)
            elif path.endswith("/responses"):
                self.openai_responses(body)
            elif ":streamGenerateContent" in path or ":generateContent" in path:
                self.gemini(body, stream=":streamGenerateContent" in path)
            elif ":countTokens" in path:
                log({"event": "request", "api": "gemini", "path": self.path, "kind": "count_tokens"})
                self._send_json({"totalTokens": 10})
            else:
                log({"event": "request", "method": "POST", "path": self.path, "known": False,
                     "keys": sorted(body)[:20] if isinstance(body, dict) else None})
                self._send_json({"error": {"message": "unknown path"}}, 404)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ----- Anthropic Messages ------------------------------------------------------------------
    def anthropic(self, body):
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        defs = [{"name": t.get("name"), "description": t.get("description"),
                 "deferred": bool(t.get("defer_loading"))} for t in tools]
        msgs = body.get("messages") or []
        last = msgs[-1] if msgs else {}
        content = last.get("content")
        blocks = content if isinstance(content, list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        mcp = [d for d in defs if pick_tool([d["name"] or ""])]
        log({"event": "request", "api": "anthropic", "path": self.path, "model": body.get("model"),
             "stream": bool(body.get("stream")), "nTools": len(tools), "tools": mcp,
             "toolNames": [d["name"] for d in defs], "turn": "result" if results else "prompt",
             "nMessages": len(msgs)})
        model = body.get("model") or "fake"
        # Which tool each tool_use id called (from the assistant turns of the history).
        called = {}
        for m in msgs:
            if isinstance(m, dict) and isinstance(m.get("content"), list):
                for b in m["content"]:
                    if isinstance(b, dict) and b.get("type") == "tool_use":
                        called[b.get("id")] = b.get("name")
        waiters = SCRIPT.get("wait_tools", ["WaitForMcpServers"])
        waited = sum(1 for n in called.values() if n in waiters)
        results = [r for r in results if called.get(r.get("tool_use_id")) not in waiters]
        if SCRIPT.get("steps") is not None and tools:
            # Every tool result since the model's last turn (a host may add a message after it).
            since = []
            for m in reversed(msgs):
                if not isinstance(m, dict) or m.get("role") == "assistant":
                    break
                if isinstance(m.get("content"), list):
                    since = [b for b in m["content"] if isinstance(b, dict)
                             and b.get("type") == "tool_result"] + since
            results = [r for r in since if called.get(r.get("tool_use_id")) not in waiters]
            return self.anthropic_steps(body, model, called, waiters, waited, results,
                                        [d["name"] or "" for d in defs])
        if results:
            for r in results:
                record_result("anthropic", called.get(r.get("tool_use_id")), r.get("content"),
                              r.get("is_error"))
            return self.anthropic_reply(body, model, text=SCRIPT.get("final_text", "done"))
        names = [d["name"] or "" for d in defs]
        tool = pick_tool(names) if tools else None
        if tools and tool is None:
            # Claude Code 2.1.197 starts the turn before its MCP servers are connected and
            # offers a tool to wait for them: a model that needs the server's tools calls it.
            waiter = next((w for w in waiters if w in names), None)
            if waiter and waited < SCRIPT.get("max_waits", 8):
                log({"event": "wait_call", "api": "anthropic", "tool": waiter})
                return self.anthropic_reply(body, model, tool=waiter, arguments={})
            log({"event": "tool_missing", "api": "anthropic", "toolNames": names})
        if tool is None:
            return self.anthropic_reply(body, model, text=SCRIPT.get("no_tool_text", "no tool"))
        log({"event": "tool_call", "api": "anthropic", "tool": tool})
        return self.anthropic_reply(body, model, tool=tool)

    def anthropic_steps(self, body, model, called, waiters, waited, results, names):
        """A scripted turn: `steps` is a list of tool uses made one after the other, each
        `{"tool": NAME, "input": {...}}` (a host tool such as Bash) or `{"tool_suffix": S,
        "input": {...}}` (an MCP tool found by suffix); each result is recorded with the step's
        index; after the last, `final_text`."""
        for r in results:
            log({"event": "step_result", "step": sum(1 for n in called.values() if n not in waiters) - 1,
                 "tool": called.get(r.get("tool_use_id")), "isError": bool(r.get("is_error")),
                 "text": text_of(r.get("content"))[:20000]})
            record_result("anthropic", called.get(r.get("tool_use_id")), r.get("content"),
                          r.get("is_error"))
        steps = SCRIPT["steps"]
        done = sum(1 for n in called.values() if n not in waiters)
        if done >= len(steps):
            return self.anthropic_reply(body, model, text=SCRIPT.get("final_text", "done"))
        step = steps[done]
        if "tool" in step:
            tool = step["tool"] if step["tool"] in names else None
        else:
            suffix = step["tool_suffix"]
            hits = [n for n in names if n.endswith("_" + suffix) or n.endswith("." + suffix)]
            tool = hits[0] if hits else None
        if tool is None:
            waiter = next((w for w in waiters if w in names), None)
            if waiter and "tool_suffix" in step and waited < SCRIPT.get("max_waits", 8):
                log({"event": "wait_call", "api": "anthropic", "tool": waiter})
                return self.anthropic_reply(body, model, tool=waiter, arguments={})
            log({"event": "tool_missing", "api": "anthropic", "step": done, "toolNames": names})
            return self.anthropic_reply(body, model, text=SCRIPT.get("no_tool_text", "no tool"))
        log({"event": "tool_call", "api": "anthropic", "tool": tool, "step": done})
        return self.anthropic_reply(body, model, tool=tool, arguments=step.get("input", {}))

    def anthropic_reply(self, body, model, text=None, tool=None, arguments=None):
        mid = next_id("msg_fake_")
        usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        if tool:
            block = {"type": "tool_use", "id": next_id("toolu_fake_"), "name": tool,
                     "input": SCRIPT.get("arguments", {}) if arguments is None else arguments}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": text}
            stop = "end_turn"
        if not body.get("stream"):
            return self._send_json({"id": mid, "type": "message", "role": "assistant", "model": model,
                                    "content": [block], "stop_reason": stop, "stop_sequence": None,
                                    "usage": usage})
        start = dict(block)
        if tool:
            start["input"] = {}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start["text"] = ""
            delta = {"type": "text_delta", "text": text}
        self._sse([
            ("message_start", {"type": "message_start", "message": {
                "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ])

    # ----- OpenAI Responses -------------------------------------------------------------------
    def openai_responses(self, body):
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        names = []
        defs = []

        def walk(ts, prefix=""):
            for t in ts:
                if not isinstance(t, dict):
                    continue
                if isinstance(t.get("tools"), list):  # a namespace of tools
                    walk(t["tools"], prefix + (t.get("name") or "") + ".")
                    continue
                n = prefix + (t.get("name") or (t.get("function") or {}).get("name") or t.get("type") or "")
                names.append(n)
                if pick_tool([n]):
                    defs.append({"name": n, "description": t.get("description")})
        walk(tools)
        items = body.get("input") or []
        last = items[-1] if items else {}
        results = [i for i in items[-1:] if isinstance(i, dict) and i.get("type") == "function_call_output"]
        log({"event": "request", "api": "responses", "path": self.path, "model": body.get("model"),
             "nTools": len(tools), "tools": defs, "toolNames": names,
             "turn": "result" if results else "prompt", "nInput": len(items)})
        if results:
            # Every trailing function_call_output (parallel calls) is recorded.
            for i in reversed(items):
                if not (isinstance(i, dict) and i.get("type") == "function_call_output"):
                    break
                out = i.get("output")
                record_result("responses", i.get("call_id"), out, isinstance(out, dict) and out.get("success") is False)
            return self.responses_reply(body, text=SCRIPT.get("final_text", "done"))
        tool = pick_tool(names) if tools else None
        if tools and tool is None:
            log({"event": "tool_missing", "api": "responses", "toolNames": names})
        if tool is None:
            return self.responses_reply(body, text=SCRIPT.get("no_tool_text", "no tool"))
        log({"event": "tool_call", "api": "responses", "tool": tool})
        return self.responses_reply(body, tool=tool)

    def responses_reply(self, body, text=None, tool=None):
        rid = next_id("resp_fake_")
        model = body.get("model") or "fake"
        if tool:
            ns, _, name = tool.rpartition(".")
            # A tool inside a namespace (Codex: `mcp__inventory` holding `list_items`) is called
            # with its own name and a `namespace` field (Codex answers "unsupported call" to the
            # joined name `mcp__inventory__list_items`).
            mode = SCRIPT.get("namespace_call", "field")
            if ns and mode == "joined":
                name = ns + "__" + name if not ns.endswith("_") else ns + name
            item = {"type": "function_call", "id": next_id("fc_fake_"), "call_id": next_id("call_fake_"),
                    "name": name, "arguments": json.dumps(SCRIPT.get("arguments", {})), "status": "completed"}
            if ns and mode == "field":
                item["namespace"] = ns
        else:
            item = {"type": "message", "id": next_id("msg_fake_"), "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
        resp = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
                "status": "in_progress", "output": []}
        events = [("response.created", {"type": "response.created", "response": resp}),
                  ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                                  "item": dict(item, status="in_progress")})]
        if text is not None:
            events.append(("response.output_text.delta", {"type": "response.output_text.delta",
                                                           "item_id": item["id"], "output_index": 0,
                                                           "content_index": 0, "delta": text}))
        done = dict(resp, status="completed", output=[item], usage=usage)
        events += [("response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                                  "item": item}),
                   ("response.completed", {"type": "response.completed", "response": done})]
        self._sse(events)

    # ----- Gemini -------------------------------------------------------------------------------
    def gemini(self, body, stream):
        decls = []
        for t in body.get("tools") or []:
            if isinstance(t, dict):
                decls.extend(d for d in t.get("functionDeclarations") or [] if isinstance(d, dict))
        names = [d.get("name") or "" for d in decls]
        defs = [{"name": d.get("name"), "description": d.get("description")} for d in decls
                if pick_tool([d.get("name") or ""])]
        contents = body.get("contents") or []
        last = contents[-1] if contents else {}
        parts = [p for p in last.get("parts") or [] if isinstance(p, dict)]
        results = [p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)]
        log({"event": "request", "api": "gemini", "path": self.path, "stream": stream,
             "nTools": len(decls), "tools": defs, "toolNames": names,
             "turn": "result" if results else "prompt", "nContents": len(contents)})
        if results:
            for r in results:
                resp = r.get("response")
                record_result("gemini", r.get("name"), resp,
                              isinstance(resp, dict) and "error" in resp and "output" not in resp)
            return self.gemini_reply(stream, text=SCRIPT.get("final_text", "done"))
        tool = pick_tool(names) if decls else None
        if decls and tool is None:
            log({"event": "tool_missing", "api": "gemini", "toolNames": names})
        if tool is None:
            gc = body.get("generationConfig") or body.get("config") or {}
            if gc.get("responseMimeType") == "application/json":
                # Classifiers (model routing, next speaker) want JSON; an empty object makes
                # them fall back to their defaults.
                return self.gemini_reply(stream, text="{}")
            return self.gemini_reply(stream, text=SCRIPT.get("no_tool_text", "no tool"))
        log({"event": "tool_call", "api": "gemini", "tool": tool})
        return self.gemini_reply(stream, tool=tool)

    def gemini_reply(self, stream, text=None, tool=None):
        part = ({"functionCall": {"name": tool, "args": SCRIPT.get("arguments", {})}} if tool
                else {"text": text})
        chunk = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                                 "index": 0}],
                 "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
                 "modelVersion": "fake", "responseId": next_id("gem_fake_")}
        if stream:
            self._sse([(None, chunk)])
        else:
            self._send_json(chunk)


def watchdog(server, parent):
    started = time.monotonic()
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        why = None
        if os.getppid() != parent:
            why = "parent died"
        elif now - STATE["last"] > ARGS.idle:
            why = f"idle {ARGS.idle}s"
        elif now - started > ARGS.lifetime:
            why = f"lifetime {ARGS.lifetime}s"
        if why:
            log({"event": "exit", "why": why})
            os._exit(0)


def main():
    global ARGS, SCRIPT
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--idle", type=float, default=120)
    p.add_argument("--lifetime", type=float, default=900)
    ARGS = p.parse_args()
    with open(ARGS.script, encoding="utf-8") as f:
        SCRIPT = json.load(f)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    tmp = ARGS.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, ARGS.port_file)
    log({"event": "listening", "port": port})
    threading.Thread(target=watchdog, args=(server, os.getppid()), daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
