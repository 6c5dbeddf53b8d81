// Line protocol shared by the TypeScript client drivers (see e2e/README.md, "Driver protocol").
//
// A driver owns one SDK Client connected over stdio to the server command given after `--`.
// It reads one JSON command per line on stdin and writes one JSON line per result or event on
// stdout. Commands run in order; one marked `"nowait": true` runs in the background, so a test
// can start a slow call and then cancel it, wait for an event, or close mid-call. Every command
// gets exactly one result line (echoing its "id" when it had one). SDK errors never crash the
// driver.
//
// This module knows nothing about a particular SDK: each driver passes an adapter
// { connect(timeoutMs), listTools(cmd, signal), callTool(cmd, signal), close(), classify(err) }.

import { createInterface } from 'node:readline';

class DriverCancelled extends Error {}
const CANCELLED = new DriverCancelled('cancelled by the driver');

// An SDK may leave a rejected promise of its own unobserved (e.g. after an abort): log it, never
// let it take the driver down.
process.on('unhandledRejection', (reason) => {
  process.stderr.write(`driver: unobserved SDK rejection: ${reason?.stack ?? String(reason)}\n`);
});

/** Splits `[options] -- <server command...>`; exits 2 on a malformed command line. */
export function parseArgs(argv, knownFlags) {
  const sep = argv.indexOf('--');
  if (sep < 0 || sep === argv.length - 1) {
    usage('missing `-- <server command and args...>`');
  }
  const flags = {};
  for (const opt of argv.slice(0, sep)) {
    if (!knownFlags.includes(opt)) usage(`unknown option ${opt}`);
    flags[opt] = true;
  }
  const [command, ...args] = argv.slice(sep + 1);
  return { flags, command, args };

  function usage(why) {
    process.stderr.write(`driver: ${why}\nusage: <driver> [${knownFlags.join('] [')}] -- <server command and args...>\n`);
    process.exit(2);
  }
}

/** The server inherits the driver's whole environment (SDKs pass a minimal one by default). */
export function inheritedEnv() {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (typeof v === 'string') env[k] = v;
  return env;
}

export function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

/** Removes the SDK's "MCP error <code>: " prefix so messages read the same in every driver. */
export function wireMessage(message, code) {
  const prefix = `MCP error ${code}: `;
  return typeof message === 'string' && message.startsWith(prefix) ? message.slice(prefix.length) : String(message);
}

/** Event bookkeeping for `wait_event`: counts arrivals since the last successful wait. */
export class Events {
  constructor() {
    this.pending = new Map();
    this.waiters = new Map();
  }
  record(name, extra = {}) {
    emit({ event: name, ...extra });
    this.pending.set(name, (this.pending.get(name) ?? 0) + 1);
    for (const wake of this.waiters.get(name) ?? []) wake();
    this.waiters.delete(name);
  }
  async wait(name, timeoutMs, signal) {
    const take = () => {
      const n = this.pending.get(name) ?? 0;
      this.pending.delete(name);
      return n;
    };
    let n = take();
    if (n > 0) return n;
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      const list = this.waiters.get(name) ?? [];
      list.push(done);
      this.waiters.set(name, list);
      signal.addEventListener('abort', done, { once: true });
    });
    n = take();
    return n;
  }
}

/**
 * The person at the host, as the test scripts them: answers `elicitation/create` requests.
 * Each request is reported as `{"event":"elicitation","message":…,"requestedSchema":…}`, then
 * answered by the current policy (`elicitation_policy` op): `accept` with `choice` (the form's
 * `decision` field), `decline`, `cancel`, or `hold` (the default: wait for an
 * `answer_elicitation` op with the same fields, or never answer).
 */
export class Elicitor {
  constructor(events) {
    this.events = events;
    this.policy = { action: 'hold' };
    this.held = [];
  }
  async handle(params) {
    this.events.record('elicitation', { message: params?.message, requestedSchema: params?.requestedSchema });
    if (this.policy.action === 'hold') return new Promise((resolve) => this.held.push(resolve));
    return Elicitor.result(this.policy);
  }
  static result(p) {
    return p.action === 'accept' ? { action: 'accept', content: { decision: p.choice } } : { action: p.action };
  }
  /** The elicitation ops; null for any other op. */
  op(cmd) {
    if (cmd.op === 'elicitation_policy') {
      this.policy = { action: cmd.action, choice: cmd.choice };
      return { ok: true };
    }
    if (cmd.op === 'answer_elicitation') {
      const resolve = this.held.shift();
      if (!resolve) return { ok: false };
      resolve(Elicitor.result(cmd));
      return { ok: true };
    }
    return null;
  }
}

export function runDriver(adapter, events) {
  let connectPromise = null;
  const inflight = new Map(); // AbortController -> command
  let closing = false; // guards against a second shutdown (close line, then stdin EOF)

  const answer = (cmd, body) => {
    const line = { op: cmd.op, ...body };
    if (cmd.id !== undefined) line.id = cmd.id;
    emit(line);
  };
  const fail = (cmd, err) => answer(cmd, { ok: false, error: err === CANCELLED ? cancelledError() : adapter.classify(err) });

  async function handle(cmd) {
    const ctl = new AbortController();
    inflight.set(ctl, cmd);
    try {
      if (cmd.op !== 'connect' && cmd.op !== 'wait_event' && cmd.op !== 'cancel') {
        if (!connectPromise) throw new Error('not connected: send {"op":"connect"} first');
        await connectPromise.catch(() => {});
      }
      switch (cmd.op) {
        case 'connect': {
          if (connectPromise) throw new Error('connect was already sent');
          const started = Date.now();
          connectPromise = adapter.connect(cmd.timeoutMs ?? 30000);
          const info = await connectPromise;
          answer(cmd, { ok: true, ...info, elapsedMs: Date.now() - started });
          break;
        }
        case 'list_tools': {
          const tools = await abortable(adapter.listTools(cmd, ctl.signal), ctl.signal);
          answer(cmd, { ok: true, tools });
          break;
        }
        case 'call_tool': {
          if (typeof cmd.name !== 'string') throw new Error('call_tool needs "name"');
          const r = await abortable(adapter.callTool(cmd, ctl.signal), ctl.signal);
          const body = { ok: true, isError: r.isError === true, content: r.content ?? [] };
          if (r.structuredContent !== undefined) body.structuredContent = r.structuredContent;
          if (r._meta !== undefined) body._meta = r._meta;
          answer(cmd, body);
          break;
        }
        case 'wait_event': {
          const event = cmd.event ?? 'tools_list_changed';
          const n = await events.wait(event, cmd.timeoutMs ?? 5000, ctl.signal);
          answer(cmd, n > 0 ? { ok: true, event, count: n } : { ok: false, event });
          break;
        }
        case 'cancel': {
          let found = false;
          for (const [c, other] of inflight) {
            if (other !== cmd && other.id !== undefined && other.id === cmd.target) {
              c.abort(CANCELLED);
              found = true;
            }
          }
          answer(cmd, { ok: found, target: cmd.target });
          break;
        }
        default: {
          const r = adapter.op ? await adapter.op(cmd) : null;
          if (r === null || r === undefined) throw new Error(`unknown op ${JSON.stringify(cmd.op)}`);
          answer(cmd, r);
          break;
        }
      }
    } catch (err) {
      fail(cmd, ctl.signal.aborted ? ctl.signal.reason : err);
    } finally {
      inflight.delete(ctl);
    }
  }

  async function shutdown(closeCmd) {
    if (closing) return;
    closing = true;
    // Close the connection first so in-flight calls fail the way an SDK reports a closed
    // connection; anything still pending afterwards is answered as cancelled by close.
    await Promise.race([adapter.close().catch(() => {}), new Promise((r) => setTimeout(r, 10000))]);
    await reapSpawned();
    for (const [c] of inflight) c.abort(CANCELLED);
    await new Promise((r) => setImmediate(r));
    if (closeCmd) answer(closeCmd, { ok: true });
    process.stdout.write('', () => process.exit(0));
  }

  // Commands run one after another; `"nowait": true` starts a command and moves on at once, so
  // a test can close, cancel or wait for an event while a call is still in flight.
  const queue = [];
  let wake = null;
  let eof = false;
  const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
  rl.on('line', (line) => {
    if (!line.trim()) return;
    let cmd;
    try {
      cmd = JSON.parse(line);
      if (cmd === null || typeof cmd !== 'object' || typeof cmd.op !== 'string') throw new Error('a command is an object with "op"');
    } catch (err) {
      emit({ op: 'invalid', ok: false, error: { kind: 'other', message: `bad command line: ${err.message}` } });
      return;
    }
    queue.push(cmd);
    wake?.();
  });
  rl.on('close', () => {
    eof = true;
    wake?.();
  });
  (async () => {
    for (;;) {
      if (queue.length === 0) {
        if (eof) return shutdown(null);
        await new Promise((r) => (wake = r));
        wake = null;
        continue;
      }
      const cmd = queue.shift();
      if (cmd.op === 'close') return shutdown(cmd);
      if (cmd.nowait === true) void handle(cmd);
      else await handle(cmd);
    }
  })();
}

function cancelledError() {
  return { kind: 'cancelled', message: 'cancelled by the driver' };
}

// Rejects as soon as the signal aborts, even if the SDK call does not watch the signal.
function abortable(promise, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    signal.addEventListener('abort', () => reject(signal.reason), { once: true });
    promise.then(resolve, reject);
  });
}

/**
 * Watches every inbound JSON-RPC message without changing the SDK's handling of it. Installed
 * when the SDK starts the transport (after the SDK has set `onmessage`), so the initialize
 * response is seen too.
 */
export function tapInbound(transport, observe) {
  const start = transport.start.bind(transport);
  transport.start = async () => {
    const original = transport.onmessage;
    transport.onmessage = (message, extra) => {
      try {
        observe(message);
      } catch {
        // observation must never disturb the SDK
      }
      return original?.call(transport, message, extra);
    };
    return start();
  };
}

// Every server process the SDK spawned (the session child and, for the v2 client, its probe
// sibling). After a failed connect an SDK may start its own close without awaiting it, and the
// driver exiting would cut that short and orphan the server: reap what is left, the same way
// the SDKs do (SIGTERM, 2 s, SIGKILL).
const spawned = new Set();

/** Records the pid of every process started through `TransportClass` (patched on its prototype,
 * so the class stays the SDK's own and the v2 sibling probe still applies). */
export function trackSpawns(TransportClass) {
  const start = TransportClass.prototype.start;
  TransportClass.prototype.start = async function patchedStart(...a) {
    try {
      return await start.apply(this, a);
    } finally {
      if (typeof this.pid === 'number') spawned.add(this.pid);
    }
  };
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function reapSpawned() {
  const left = [...spawned].filter(alive);
  if (left.length === 0) return;
  for (const pid of left) {
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      // already gone
    }
  }
  for (let waited = 0; waited < 2000 && left.some(alive); waited += 50) await new Promise((r) => setTimeout(r, 50));
  for (const pid of left.filter(alive)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}
