// mcp-inspector-cli (@modelcontextprotocol/inspector-cli 1.0.3, itself a
// TypeScript SDK client) lists and calls tools through `mcprelay serve` in
// front of the built-in example server, with polling on so a longer call
// crosses server-initiated closes.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { runInspector, startRelay, textOf } from '../lib/harness.mjs';

describe('mcp-inspector-cli through mcprelay', () => {
  let relay;
  // Debug logging: the relay logs each resume ("msg=resume ... status=200"),
  // which shows the CLI really resumed after the server-initiated closes.
  before(async () => { relay = await startRelay(['--poll-interval', '200ms', '--log-level', 'debug']); });
  const resumesLogged = () => (relay.proc.output().match(/msg=resume .*status=200/g) ?? []).length;
  after(async () => { await relay?.proc.stop(); });

  test('tools/list', async () => {
    const { tools } = await runInspector(relay.url, ['--method', 'tools/list']);
    const names = tools.map((t) => t.name);
    for (const want of ['test_simple_text', 'stream_progress', 'json_schema_2020_12_tool']) {
      assert.ok(names.includes(want), `tools/list lacks ${want}: ${names}`);
    }
  });

  // Resumes logged: the call's POST stream, closed once after 200 ms (the
  // resuming GET runs to the result), and, if the client opened one, its
  // standalone stream, closed once the same way.
  const calls = [
    { name: 'a simple tool', tool: 'test_simple_text', args: [], want: 'This is a simple text response for testing.', minResumes: 0 },
    { name: 'a tool with arguments across polls', tool: 'stream_progress', args: ['count=6', 'interval_ms=100'], want: 'streamed 6 events', minResumes: 1 },
  ];
  for (const c of calls) {
    test(`tools/call: ${c.name}`, async () => {
      const before = resumesLogged();
      const toolArgs = c.args.length ? ['--tool-arg', ...c.args] : [];
      const result = await runInspector(relay.url, ['--method', 'tools/call', '--tool-name', c.tool, ...toolArgs]);
      assert.notEqual(result.isError, true, JSON.stringify(result));
      assert.equal(textOf(result), c.want);
      const n = resumesLogged() - before;
      assert.ok(n >= c.minResumes, `${n} resumes logged by the relay, want >= ${c.minResumes}`);
    });
  }
});
