// The TypeScript SDK client's in-flight call is lost to a backend restart:
// `mcprelay example-server` runs as its own process behind
// `mcprelay serve --upstream`, is killed with SIGKILL mid-call and started
// again on the same port. The relay re-creates the backend session; the call
// must fail with the relay's JSON-RPC error (-32001, "mcprelay: request
// lost: ...") within a bound, not hang, and the client's session must keep
// working. The TS client does not re-send in-flight requests and does not
// re-initialize after a 404, so without that error it would wait for its own
// request timeout.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { McpError } from '@modelcontextprotocol/sdk/types.js';

import { connectClient, startExampleServer, startRelay, textOf, within } from '../lib/harness.mjs';

const CODE_REQUEST_LOST = -32001; // relay/message.go CodeRequestLost
const FAIL_BOUND_MS = 10000; // from the kill to the failed call

describe('TypeScript SDK client: in-flight call lost to a backend restart', () => {
  let backend;
  let relay;
  let peer;
  before(async () => {
    backend = await startExampleServer();
    relay = await startRelay(['--upstream', backend.url, '--upstream-stateless', backend.stateless]);
    peer = await connectClient(relay.url);
  });
  after(async () => {
    await peer?.client.close();
    await relay?.proc.stop();
    await backend?.proc.stop();
  });

  // restartAfterMs: how long the backend stays down. At once, the relay's
  // resume of the backend stream meets the new server's 404; later, it
  // meets a refused connection first.
  const cases = [
    { name: 'restarted at once', restartAfterMs: 0 },
    { name: 'restarted after 2s', restartAfterMs: 2000 },
  ];
  for (const c of cases) test(`${c.name}: the call fails with -32001 within the bound and the session survives`, async (t) => {
    const progress = [];
    let firstProgress;
    const started = new Promise((resolve) => { firstProgress = resolve; });
    const call = peer.client.callTool(
      { name: 'stream_progress', arguments: { count: 200, interval_ms: 100 } },
      undefined,
      {
        // Far beyond the bound: a failure must come from the relay, not
        // from the SDK's own timeout (which also uses code -32001).
        timeout: 120000,
        onprogress: (p) => { progress.push(p.progress); firstProgress(); },
      },
    );
    const outcome = call.then((r) => ({ result: r, at: Date.now() }), (err) => ({ err, at: Date.now() }));
    await within(started, 10000, 'first progress event');

    const killedAt = Date.now();
    await backend.proc.stop('SIGKILL');
    const bounded = within(outcome, FAIL_BOUND_MS, 'the in-flight call after the backend was killed');
    bounded.catch(() => {}); // awaited below, after the restart
    await new Promise((r) => setTimeout(r, c.restartAfterMs));
    backend = await startExampleServer(backend.port);

    const { result, err, at } = await bounded;
    const elapsed = at - killedAt;
    assert.equal(result, undefined, `the call succeeded after its backend died: ${JSON.stringify(result)}`);
    assert.ok(err instanceof McpError, `want McpError, got ${err}`);
    assert.equal(err.code, CODE_REQUEST_LOST, String(err));
    assert.match(err.message, /mcprelay: request lost/);
    assert.ok(elapsed < FAIL_BOUND_MS, `failed after ${elapsed} ms`);
    t.diagnostic(`failed ${elapsed} ms after the kill, after ${progress.length} progress events: ${err.message}`);
    assert.deepEqual(progress, Array.from({ length: progress.length }, (_, i) => i + 1), 'progress before the loss: in order, once');

    // The relay re-created the backend session: the same client session
    // keeps working against the restarted server.
    const again = await within(peer.client.callTool({ name: 'test_simple_text', arguments: {} }), 10000, 'a call after the restart');
    assert.equal(textOf(again), 'This is a simple text response for testing.');
    const more = await within(peer.client.callTool(
      { name: 'stream_progress', arguments: { count: 3, interval_ms: 10 } }), 10000, 'a streamed call after the restart');
    assert.equal(textOf(more), 'streamed 3 events');
  });
});
