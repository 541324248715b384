// A real browser through mcprelay: headless Chromium (the Debian package,
// driven by puppeteer-core) loads a page served from another loopback
// origin than the relay's. The page bundles the TypeScript SDK client
// (esbuild, at test time), calls stream_progress through the relay and
// shows the progress in the DOM. From an origin in --allowed-origins it
// works (CORS preflight answered, Mcp-Session-Id exposed); from another
// origin the relay refuses the preflight and the browser blocks the call.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import { once } from 'node:events';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import * as esbuild from 'esbuild';
import puppeteer from 'puppeteer-core';

import { interopDir, startRelay } from '../lib/harness.mjs';

const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
const COUNT = 5;

/** Serves the page and its bundle on 127.0.0.1 (a free port): its origin. */
async function servePage(bundle) {
  const html = '<!doctype html><meta charset="utf-8"><title>mcprelay browser test</title>' +
    '<p>session <span id="session"></span></p><ol id="progress"></ol>' +
    '<p id="result"></p><p id="error"></p><script type="module" src="/page.js"></script>';
  const srv = http.createServer((req, res) => {
    if (req.url.startsWith('/page.js')) {
      res.writeHead(200, { 'Content-Type': 'text/javascript' }).end(bundle);
    } else if (req.url === '/' || req.url.startsWith('/?')) {
      res.writeHead(200, { 'Content-Type': 'text/html' }).end(html);
    } else {
      res.writeHead(404).end();
    }
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  return { srv, origin: `http://127.0.0.1:${srv.address().port}` };
}

/** Loads the page of origin in a new tab; resolves with what it shows once it has a result or an error. */
async function run(browser, origin, relayURL) {
  const page = await browser.newPage();
  const console = [];
  page.on('console', (m) => console.push(m.text()));
  try {
    await page.goto(`${origin}/?relay=${encodeURIComponent(relayURL)}&count=${COUNT}`);
    await page.waitForFunction(
      () => document.getElementById('result').textContent || document.getElementById('error').textContent,
      { timeout: 60000 },
    );
    return await page.evaluate(() => ({
      session: document.getElementById('session').textContent,
      progress: [...document.querySelectorAll('#progress li')].map((li) => li.textContent),
      result: document.getElementById('result').textContent,
      error: document.getElementById('error').textContent,
    })).then((shown) => ({ ...shown, console }));
  } finally {
    await page.close();
  }
}

describe('a browser on another origin, through mcprelay', () => {
  let relay;
  let allowed;
  let other;
  let browser;
  before(async () => {
    assert.ok(fs.existsSync(chromium), `${chromium} is missing: apt-get install -y chromium (scripts/test does)`);
    const built = await esbuild.build({
      entryPoints: [path.join(interopDir, 'browser', 'page.mjs')],
      bundle: true, format: 'esm', platform: 'browser', target: 'es2022', write: false, logLevel: 'error',
    });
    const bundle = built.outputFiles[0].text;
    allowed = await servePage(bundle);
    other = await servePage(bundle);
    relay = await startRelay(['--allowed-origins', allowed.origin]);
    browser = await puppeteer.launch({
      executablePath: chromium,
      headless: true,
      // As root (CI) Chromium needs --no-sandbox; /dev/shm may be small in containers.
      args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
    });
  });
  after(async () => {
    await browser?.close();
    await relay?.proc.stop();
    allowed?.srv.close();
    other?.srv.close();
  });

  test('an allowed origin calls stream_progress and shows its progress and result', async () => {
    assert.notEqual(new URL(allowed.origin).port, String(relay.port));
    const shown = await run(browser, allowed.origin, relay.url);
    assert.equal(shown.error, '', `the page failed: ${shown.error}\nconsole: ${shown.console.join('\n')}\nrelay:\n${relay.proc.output()}`);
    assert.match(shown.session, /^[\x21-\x7e]{16,}$/, 'Mcp-Session-Id not readable by the page');
    assert.deepEqual(shown.progress, Array.from({ length: COUNT }, (_, i) => `${i + 1}/${COUNT}`));
    assert.equal(shown.result, `streamed ${COUNT} events`);
  });

  test('an origin not in --allowed-origins is refused', async () => {
    const shown = await run(browser, other.origin, relay.url);
    assert.equal(shown.result, '');
    assert.deepEqual(shown.progress, []);
    assert.match(shown.error, /fetch/i, `want a failed fetch, got: ${shown.error}`);
    assert.ok(shown.console.some((m) => /CORS policy/.test(m)),
      `the browser did not report a CORS refusal:\n${shown.console.join('\n')}`);
  });
});
