// The page of test/browser.test.mjs, bundled by esbuild for the browser:
// the TypeScript SDK client connects to the relay named by ?relay=URL (on
// another origin than the page), calls stream_progress, and writes each
// progress notification into #progress, the result into #result, or the
// failure into #error.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);

try {
  const client = new Client({ name: 'mcprelay-browser-test', version: '1' });
  const transport = new StreamableHTTPClientTransport(new URL(params.get('relay')));
  await client.connect(transport);
  $('session').textContent = transport.sessionId ?? '';
  const result = await client.callTool(
    { name: 'stream_progress', arguments: { count: Number(params.get('count')), interval_ms: 20 } },
    undefined,
    {
      onprogress: (p) => {
        const li = document.createElement('li');
        li.textContent = `${p.progress}/${p.total}`;
        $('progress').append(li);
      },
    },
  );
  $('result').textContent = result.content.map((c) => c.text).join('');
  await transport.terminateSession();
  await client.close();
} catch (err) {
  $('error').textContent = String(err);
}
