// A third-party server behind the relay: @modelcontextprotocol/server-everything
// (streamableHttp mode, bound to 127.0.0.1 by lib/loopback.mjs) reached with
// `mcprelay serve --upstream`. The TypeScript SDK client talks to the relay
// through the cutting proxy; mcp-inspector-cli talks to the relay directly.

import assert from 'node:assert/strict';
import net from 'node:net';
import os from 'node:os';
import { after, before, describe, test } from 'node:test';

import { connectClient, resumes, runInspector, startCutProxy, startEverything, startRelay, textOf } from '../lib/harness.mjs';

const seq = (n) => Array.from({ length: n }, (_, i) => i + 1);

/** Resolves true when something accepts a TCP connection on host:port. */
function reachable(host, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port, timeout: 2000 });
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('timeout', () => { s.destroy(); resolve(false); });
    s.once('error', () => resolve(false));
  });
}

describe('server-everything behind mcprelay', () => {
  let everything;
  let relay;
  let proxy;
  let peer;
  before(async () => {
    everything = await startEverything();
    relay = await startRelay(['--upstream', everything.url]);
    proxy = await startCutProxy(relay.port);
    peer = await connectClient(proxy.url);
  });
  after(async () => {
    await peer?.client.close();
    proxy?.close();
    await relay?.proc.stop();
    await everything?.proc.stop();
  });

  test('server-everything listens on loopback only', async (t) => {
    assert.match(everything.proc.output(), new RegExp(`loopback: listening on 127\\.0\\.0\\.1:${everything.port}\\b`));
    const others = Object.values(os.networkInterfaces()).flat()
      .filter((a) => a && !a.internal && !a.address.startsWith('fe80:')).map((a) => a.address);
    if (others.length === 0) t.diagnostic('no non-loopback interface to probe');
    for (const addr of others) {
      assert.equal(await reachable(addr, everything.port), false, `server-everything answers on ${addr}:${everything.port}`);
    }
  });

  test('its tools are listed through the relay', async () => {
    assert.equal(peer.client.getServerVersion()?.name, 'mcp-servers/everything');
    const { tools } = await peer.client.listTools();
    const names = tools.map((t) => t.name);
    for (const want of ['echo', 'get-sum', 'trigger-long-running-operation']) {
      assert.ok(names.includes(want), `tools/list lacks ${want}: ${names}`);
    }
  });

  const calls = [
    { name: 'echo', args: { message: 'hello through the relay' }, want: 'Echo: hello through the relay' },
    { name: 'get-sum', args: { a: 2, b: 40 }, want: 'The sum of 2 and 40 is 42.' },
  ];
  for (const c of calls) {
    test(`tools/call ${c.name}`, async () => {
      assert.equal(textOf(await peer.client.callTool({ name: c.name, arguments: c.args })), c.want);
    });
  }

  // trigger-long-running-operation sends one progress event per step.
  const long = [
    { name: 'long-running with progress', duration: 1, steps: 5, cuts: [] },
    { name: 'long-running with progress, stream cut mid-event', duration: 2, steps: 8, cuts: [3] },
  ];
  for (const c of long) {
    test(c.name, async () => {
      const from = peer.exchanges.length;
      const cutsBefore = proxy.cuts().length;
      proxy.arm('notifications/progress', c.cuts);
      const progress = [];
      const result = await peer.client.callTool(
        { name: 'trigger-long-running-operation', arguments: { duration: c.duration, steps: c.steps } },
        undefined,
        { onprogress: (p) => progress.push(p.progress), timeout: 30000 },
      );
      proxy.arm(null, []);
      assert.deepEqual(proxy.cuts().slice(cutsBefore), c.cuts, 'the proxy cut the stream');
      assert.deepEqual(progress, seq(c.steps), 'every progress event once, in order');
      assert.equal(textOf(result), `Long running operation completed. Duration: ${c.duration} seconds, Steps: ${c.steps}.`);
      const rs = resumes(peer.exchanges.slice(from));
      assert.equal(rs.length, c.cuts.length, 'one resume (GET with Last-Event-ID) per cut');
      await Promise.all(rs.map((r) => r.settled));
      for (const r of rs) assert.equal(r.status, 200);
    });
  }

  test('mcp-inspector-cli calls echo through the relay', async () => {
    const result = await runInspector(relay.url, ['--method', 'tools/call', '--tool-name', 'echo', '--tool-arg', 'message=from inspector']);
    assert.equal(textOf(result), 'Echo: from inspector');
  });
});
