// @modelcontextprotocol/server-everything as a stdio server behind
// `mcprelay serve -- node .../server-everything/dist/index.js stdio`: one
// child per session. The TypeScript SDK client (with sampling) talks to the
// relay; the tests kill children and the relay itself with SIGKILL.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateMessageRequestSchema } from '@modelcontextprotocol/sdk/types.js';

import { interopDir, startRelay, textOf } from '../lib/harness.mjs';

const everythingMain = path.join(interopDir, 'node_modules', '@modelcontextprotocol', 'server-everything', 'dist', 'index.js');
const stdioCommand = ['--', process.execPath, everythingMain, 'stdio'];
const seq = (n) => Array.from({ length: n }, (_, i) => i + 1);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The PIDs of the live processes whose parent is pid. */
function childrenOf(pid) {
  const out = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[1]) === pid && fields[0] !== 'Z') out.push(Number(d));
    } catch { /* gone */ }
  }
  return out;
}

function alive(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch { return false; }
}

async function until(cond, ms, what) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(50);
  }
}

/** A TypeScript SDK client that answers sampling requests. */
async function samplingClient(url) {
  const client = new Client({ name: 'mcprelay-interop-stdio', version: '0.0.0' }, { capabilities: { sampling: {} } });
  client.setRequestHandler(CreateMessageRequestSchema, async () => ({
    role: 'assistant', content: { type: 'text', text: 'interop says hi' }, model: 'interop-test',
  }));
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  return { client, transport };
}

/** Opens a session with raw HTTP; returns its id. */
async function rawSession(url) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '0' } } }),
  });
  await res.text();
  assert.equal(res.status, 200);
  return res.headers.get('mcp-session-id');
}

describe('server-everything as a stdio child per session', () => {
  let relay;
  let peer;
  before(async () => {
    relay = await startRelay(['--store', 'memory', ...stdioCommand]);
    peer = await samplingClient(relay.url);
  });
  after(async () => {
    await peer?.client.close();
    await relay?.proc.stop();
  });

  test('its tools are listed through the relay', async () => {
    assert.equal(peer.client.getServerVersion()?.name, 'mcp-servers/everything');
    const names = (await peer.client.listTools()).tools.map((t) => t.name);
    for (const want of ['echo', 'trigger-long-running-operation', 'trigger-sampling-request']) {
      assert.ok(names.includes(want), `tools/list lacks ${want}: ${names}`);
    }
  });

  test('tools/call echo', async () => {
    assert.equal(textOf(await peer.client.callTool({ name: 'echo', arguments: { message: 'over stdio' } })), 'Echo: over stdio');
  });

  test('progress of a long-running operation, in order', async () => {
    const progress = [];
    const result = await peer.client.callTool(
      { name: 'trigger-long-running-operation', arguments: { duration: 1, steps: 5 } },
      undefined, { onprogress: (p) => progress.push(p.progress), timeout: 30000 });
    assert.deepEqual(progress, seq(5));
    assert.match(textOf(result), /Long running operation completed/);
  });

  test('a sampling round trip through the client', async () => {
    const result = await peer.client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'ping', maxTokens: 10 } });
    assert.match(JSON.stringify(result), /interop says hi/);
  });

  test('a resource subscription', async () => {
    const { resources } = await peer.client.listResources();
    assert.ok(resources.length > 0, 'no resources');
    await peer.client.subscribeResource({ uri: resources[0].uri });
    await peer.client.unsubscribeResource({ uri: resources[0].uri });
  });

  test('the child killed with SIGKILL mid-call: -32001, and the same session answers the next call', async () => {
    const sid = peer.transport.sessionId;
    const progress = [];
    const call = peer.client.callTool(
      { name: 'trigger-long-running-operation', arguments: { duration: 10, steps: 10 } },
      undefined, { onprogress: (p) => progress.push(p.progress), timeout: 30000 });
    await until(() => progress.length > 0, 15000, 'the first progress');
    const kids = childrenOf(relay.proc.pid);
    assert.equal(kids.length, 1, `children of the relay: ${kids}`);
    process.kill(kids[0], 'SIGKILL');
    await assert.rejects(call, (e) => e.code === -32001, 'the call fails with the request-lost error');
    assert.equal(peer.transport.sessionId, sid, 'the session is kept');
    assert.equal(textOf(await peer.client.callTool({ name: 'echo', arguments: { message: 'after the kill' } })), 'Echo: after the kill');
    const now = childrenOf(relay.proc.pid);
    assert.equal(now.length, 1, `a new child serves the session: ${now}`);
    assert.notEqual(now[0], kids[0]);
  });
});

describe('stdio children and the relay\'s life', () => {
  test('200 sessions opened then deleted leave no child', async () => {
    const relay = await startRelay(['--store', 'memory', ...stdioCommand]);
    try {
      // Four rounds of 50 (under the default --max-children, 64).
      for (let round = 0; round < 4; round++) {
        const ids = [];
        for (let i = 0; i < 50; i += 10) {
          ids.push(...await Promise.all(seq(10).map(() => rawSession(relay.url))));
        }
        assert.equal(childrenOf(relay.proc.pid).length, 50, 'one child per session');
        await Promise.all(ids.map((id) => fetch(relay.url, { method: 'DELETE', headers: { 'mcp-session-id': id } })
          .then((r) => assert.equal(r.status, 204))));
        await until(() => childrenOf(relay.proc.pid).length === 0, 15000, 'every child to be stopped');
      }
    } finally {
      await relay.proc.stop();
    }
  });

  test('the relay killed with SIGKILL leaves no child behind', async () => {
    const relay = await startRelay(['--store', 'memory', ...stdioCommand]);
    await Promise.all(seq(3).map(() => rawSession(relay.url)));
    const kids = childrenOf(relay.proc.pid);
    assert.equal(kids.length, 3);
    process.kill(relay.proc.pid, 'SIGKILL');
    await until(() => kids.every((k) => !alive(k)), 10000, 'the orphaned children to die');
    await relay.proc.stop();
  });
});
