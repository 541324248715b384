// The TypeScript SDK client (@modelcontextprotocol/sdk 1.32.2,
// StreamableHTTPClientTransport) through `mcprelay serve` in front of the
// built-in example server: tools, progress, a server-initiated close
// (polling) and a connection cut in the middle of an SSE event.
//
// Tolerances the TS client forces (see README.md):
//   - it resumes only a stream that carried an event ID, waits the server's
//     `retry` (else 1 s, growing) before each resume, and gives up after
//     maxRetries (2) consecutive failed resumes; so the relay must prime
//     every POST stream and answer each resume on the first try;
//   - it marks a request finished only on a *result*; after a JSON-RPC error
//     on a stream that then ends it resumes once more, and the relay answers
//     that resume with 204.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { connectClient, resumes, startCutProxy, startRelay, textOf } from '../lib/harness.mjs';

const SIMPLE_TEXT = 'This is a simple text response for testing.';

/** Calls stream_progress and collects the progress values seen. */
async function streamProgress(client, count, intervalMs) {
  const progress = [];
  const result = await client.callTool(
    { name: 'stream_progress', arguments: { count, interval_ms: intervalMs } },
    undefined,
    { onprogress: (p) => progress.push(p.progress), timeout: 30000 },
  );
  return { progress, text: textOf(result) };
}

const seq = (n) => Array.from({ length: n }, (_, i) => i + 1);

describe('TypeScript SDK client through mcprelay (polling every 200ms)', () => {
  let relay;
  let peer;
  before(async () => {
    relay = await startRelay(['--poll-interval', '200ms']);
    peer = await connectClient(relay.url);
  });
  after(async () => {
    await peer?.client.close();
    await relay?.proc.stop();
  });

  test('negotiates 2025-11-25 and gets a relay session', () => {
    assert.equal(peer.transport.protocolVersion, '2025-11-25');
    assert.match(peer.transport.sessionId ?? '', /^[\x21-\x7e]{16,}$/);
    assert.equal(peer.client.getServerVersion()?.name, 'mcprelay-exampleserver');
  });

  test('lists and calls tools', async () => {
    const { tools } = await peer.client.listTools();
    const names = tools.map((t) => t.name);
    for (const want of ['test_simple_text', 'stream_progress', 'test_error_handling']) {
      assert.ok(names.includes(want), `tools/list lacks ${want}: ${names}`);
    }
    assert.equal(textOf(await peer.client.callTool({ name: 'test_simple_text', arguments: {} })), SIMPLE_TEXT);
    const failed = await peer.client.callTool({ name: 'test_error_handling', arguments: {} });
    assert.equal(failed.isError, true);
  });

  // The relay closes the call's POST stream once, after 200 ms; the GET
  // that resumes it runs to the result (resumed streams are not closed
  // again). The standalone stream was opened, closed and resumed before.
  const cases = [
    { name: 'progress on a short call', count: 5, intervalMs: 10, minResumes: 0 },
    { name: 'progress across a server-initiated close', count: 12, intervalMs: 100, minResumes: 1 },
  ];
  for (const c of cases) {
    test(c.name, async () => {
      const from = peer.exchanges.length;
      const errorsFrom = peer.errors.length;
      const got = await streamProgress(peer.client, c.count, c.intervalMs);
      assert.deepEqual(got.progress, seq(c.count), 'every progress event once, in order');
      assert.equal(got.text, `streamed ${c.count} events`);
      const rs = resumes(peer.exchanges.slice(from));
      assert.ok(rs.length >= c.minResumes, `${rs.length} resumes, want >= ${c.minResumes}`);
      // A resume of the standalone stream (closed by polling too) may still
      // wait for its answer when the call is done.
      await Promise.all(rs.map((r) => r.settled));
      for (const r of rs) assert.ok(r.status === 200 || r.status === 204, `resume answered ${r.status}`);
      assert.deepEqual(peer.errors.slice(errorsFrom).map(String), [], 'a server-initiated close is not an error');
    });
  }
});

describe('TypeScript SDK client through a socket cut mid-event', () => {
  let relay;
  let proxy;
  let peer;
  before(async () => {
    relay = await startRelay();
    proxy = await startCutProxy(relay.port);
    peer = await connectClient(proxy.url);
  });
  after(async () => {
    await peer?.client.close();
    proxy?.close();
    await relay?.proc.stop();
  });

  const cases = [
    { name: 'one cut', count: 6, cuts: [3] },
    { name: 'two cuts, the second on the resumed stream', count: 10, cuts: [2, 6] },
  ];
  for (const c of cases) {
    test(c.name, async () => {
      const from = peer.exchanges.length;
      const errorsFrom = peer.errors.length;
      const before = proxy.cuts().length;
      proxy.arm('notifications/progress', c.cuts);
      const got = await streamProgress(peer.client, c.count, 100);
      proxy.arm(null, []);
      assert.deepEqual(proxy.cuts().slice(before), c.cuts, 'the proxy cut the stream');
      assert.deepEqual(got.progress, seq(c.count), 'every progress event once, in order');
      assert.equal(got.text, `streamed ${c.count} events`);
      const rs = resumes(peer.exchanges.slice(from));
      assert.equal(rs.length, c.cuts.length, 'one resume (GET with Last-Event-ID) per cut');
      await Promise.all(rs.map((r) => r.settled));
      for (const r of rs) assert.equal(r.status, 200);
      const disconnects = peer.errors.slice(errorsFrom).filter((e) => /SSE stream disconnected/.test(String(e)));
      assert.equal(disconnects.length, c.cuts.length, `client errors: ${peer.errors.slice(errorsFrom)}`);
    });
  }

  test('the session still works after the cuts', async () => {
    assert.equal(textOf(await peer.client.callTool({ name: 'test_simple_text', arguments: {} })), SIMPLE_TEXT);
  });
});
