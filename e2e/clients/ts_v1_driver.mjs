// Client driver for the TypeScript SDK v1 (@modelcontextprotocol/sdk 1.32.2), legacy era only.
//
//   node ts_v1_driver.mjs [--list-changed-auto] -- <server command and args...>
//
// --list-changed-auto passes `listChanged: {tools: {onChanged}}` to the Client: the SDK then
// refetches tools/list by itself (debounced ~300 ms, only when the server advertised
// tools.listChanged) and the driver reports `{"event":"tools_refetched","tools":[names]}`.
// Without it the app-level handler only reports `{"event":"tools_list_changed"}` and the SDK
// refetches nothing. --elicitation declares `capabilities.elicitation` and answers
// `elicitation/create` as the test scripts it (Elicitor in driver_common.mjs). Line protocol:
// driver_common.mjs and e2e/README.md.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ElicitRequestSchema, ErrorCode, McpError, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { Elicitor, Events, inheritedEnv, parseArgs, runDriver, tapInbound, trackSpawns, wireMessage } from './driver_common.mjs';

const { flags, command, args } = parseArgs(process.argv.slice(2), ['--list-changed-auto', '--elicitation']);
const autoRefresh = flags['--list-changed-auto'] === true;
const elicit = flags['--elicitation'] === true;
const events = new Events();
const elicitor = new Elicitor(events);

const options = { capabilities: elicit ? { elicitation: {} } : {} };
if (autoRefresh) {
  options.listChanged = {
    tools: {
      onChanged: (error, tools) => {
        if (error) events.record('tools_refetch_failed', { message: error.message });
        else events.record('tools_refetched', { tools: (tools ?? []).map((t) => t.name) });
      },
    },
  };
}
const client = new Client({ name: 'e2e-ts-v1', version: '1.32.2' }, options);
if (!autoRefresh) {
  // The app's own handler: what a host without listChanged options does.
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => events.record('tools_list_changed'));
}
if (elicit) client.setRequestHandler(ElicitRequestSchema, (request) => elicitor.handle(request.params));
trackSpawns(StdioClientTransport);
const transport = new StdioClientTransport({ command, args, env: inheritedEnv(), stderr: 'inherit' });
let protocolVersion; // v1 keeps the negotiated version private: read it off the wire
tapInbound(transport, (msg) => {
  if (protocolVersion === undefined && typeof msg?.result?.protocolVersion === 'string') {
    protocolVersion = msg.result.protocolVersion;
  }
  // With listChanged options the SDK owns the notification handler; report arrival here.
  if (autoRefresh && msg?.method === 'notifications/tools/list_changed') events.record('tools_list_changed');
});

runDriver(
  {
    async connect(timeoutMs) {
      await client.connect(transport, { timeout: timeoutMs });
      return {
        protocolVersion,
        serverInfo: client.getServerVersion(),
        capabilities: client.getServerCapabilities(),
      };
    },
    async listTools(_cmd, signal) {
      const r = await client.listTools(undefined, { signal });
      return r.tools;
    },
    async callTool(cmd, signal) {
      const opts = { signal };
      if (cmd.timeoutMs !== undefined) opts.timeout = cmd.timeoutMs;
      return client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }, undefined, opts);
    },
    close: () => client.close(),
    op: (cmd) => elicitor.op(cmd),
    classify(err) {
      if (err instanceof McpError) {
        if (err.code === ErrorCode.RequestTimeout && /timed out/i.test(err.message)) {
          return { kind: 'timeout', message: wireMessage(err.message, err.code), code: err.code };
        }
        if (err.code === ErrorCode.ConnectionClosed && /connection closed/i.test(err.message)) {
          return { kind: 'transport', message: wireMessage(err.message, err.code), code: err.code };
        }
        const e = { kind: 'protocol', message: wireMessage(err.message, err.code), code: err.code };
        if (err.data !== undefined) e.data = err.data;
        return e;
      }
      const message = err instanceof Error ? err.message : String(err);
      if (/not connected|EPIPE|ECONNRESET|spawn/i.test(message)) return { kind: 'transport', message };
      return { kind: 'other', message };
    },
  },
  events,
);
