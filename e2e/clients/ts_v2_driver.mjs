// Client driver for the TypeScript client v2 (@modelcontextprotocol/client 2.4.0) with
// `versionNegotiation: {mode: "auto"}`: connect() first spawns the server command a second time
// as a short-lived probe sibling (server/discover), kills it, then starts the real session
// process and speaks the era it found (initialize handshake on a legacy server).
//
//   node ts_v2_driver.mjs [--list-changed-auto] [--legacy] -- <server command and args...>
//
// --list-changed-auto passes `listChanged: {tools: {onChanged}}` (on a modern connection the
// client then opens `subscriptions/listen` by itself) and reports
// `{"event":"tools_refetched","tools":[names]}`. --legacy uses mode "legacy" (no probe).
// Line protocol: driver_common.mjs and e2e/README.md.

import { Client, ProtocolError, SdkError, SdkErrorCode } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { Events, inheritedEnv, parseArgs, runDriver, tapInbound, trackSpawns, wireMessage } from './driver_common.mjs';

const { flags, command, args } = parseArgs(process.argv.slice(2), ['--list-changed-auto', '--legacy']);
const autoRefresh = flags['--list-changed-auto'] === true;
const events = new Events();

const options = { capabilities: {}, versionNegotiation: { mode: flags['--legacy'] ? 'legacy' : 'auto' } };
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
const client = new Client({ name: 'e2e-ts-v2', version: '2.4.0' }, options);
if (!autoRefresh) {
  client.setNotificationHandler('notifications/tools/list_changed', () => events.record('tools_list_changed'));
}
// The base StdioClientTransport exactly: a subclass would make the client probe in place.
trackSpawns(StdioClientTransport);
const transport = new StdioClientTransport({ command, args, env: inheritedEnv(), stderr: 'inherit' });
tapInbound(transport, (msg) => {
  if (autoRefresh && msg?.method === 'notifications/tools/list_changed') events.record('tools_list_changed');
});

runDriver(
  {
    async connect(timeoutMs) {
      await client.connect(transport, { timeout: timeoutMs });
      return {
        protocolVersion: client.getNegotiatedProtocolVersion(),
        era: client.getProtocolEra(),
        serverInfo: client.getServerVersion(),
        capabilities: client.getServerCapabilities(),
      };
    },
    async listTools(cmd, signal) {
      const opts = { signal };
      if (cmd.cacheMode !== undefined) opts.cacheMode = cmd.cacheMode;
      const r = await client.listTools(undefined, opts);
      return r.tools;
    },
    async callTool(cmd, signal) {
      const opts = { signal };
      if (cmd.timeoutMs !== undefined) opts.timeout = cmd.timeoutMs;
      return client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }, opts);
    },
    close: () => client.close(),
    classify(err) {
      if (err instanceof ProtocolError) {
        const e = { kind: 'protocol', message: wireMessage(err.message, err.code), code: err.code };
        if (err.data !== undefined) e.data = err.data;
        return e;
      }
      if (err instanceof SdkError) {
        const kind =
          err.code === SdkErrorCode.RequestTimeout
            ? 'timeout'
            : err.code === SdkErrorCode.ConnectionClosed || err.code === SdkErrorCode.NotConnected || err.code === SdkErrorCode.SendFailed
              ? 'transport'
              : 'other';
        const e = { kind, message: err.message, sdkCode: err.code };
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
