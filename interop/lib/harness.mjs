// Harness for the interop tests: starts mcprelay, its example server and
// @modelcontextprotocol/server-everything on 127.0.0.1 with free ports, a
// socket-cutting TCP proxy, and TypeScript SDK clients that record every HTTP
// exchange. Every process started here is killed when the test file ends
// (and on SIGINT/SIGTERM); its PID is also written to $INTEROP_PIDDIR so
// scripts/interop can kill it if this process dies first.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

export const interopDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Path of the mcprelay binary (scripts/interop builds it and sets MCPRELAY). */
export const mcprelayBin = process.env.MCPRELAY || path.resolve(interopDir, '..', 'mcprelay');

const children = new Set();

function killAll() {
  for (const c of children) {
    try { c.kill('SIGKILL'); } catch { /* already gone */ }
  }
  children.clear();
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => { killAll(); process.exit(130); });
}

/** A free TCP port on 127.0.0.1 (free when asked; the caller binds it next). */
export async function freePort() {
  const srv = net.createServer();
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  srv.close();
  await once(srv, 'close');
  return port;
}

/** Resolves once something accepts TCP connections on 127.0.0.1:port. */
export async function waitListening(port, child, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child && child.exitCode !== null) {
      throw new Error(`${child.label} exited with ${child.exitCode} before listening:\n${child.output()}`);
    }
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => { s.destroy(); resolve(true); });
      s.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) {
      throw new Error(`nothing listens on 127.0.0.1:${port} after ${timeoutMs} ms${child ? `:\n${child.output()}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Starts a process, keeps its output (shown when something fails) and
 * registers it for cleanup. The returned ChildProcess has label, output()
 * (the last 20 kB of stdout and stderr) and stop(signal = 'SIGTERM'), which
 * signals it and waits for its exit.
 */
export function startProcess(label, cmd, args, opts = {}) {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
  children.add(child);
  if (process.env.INTEROP_PIDDIR && child.pid) {
    fs.writeFileSync(path.join(process.env.INTEROP_PIDDIR, String(child.pid)), label);
  }
  let out = '';
  const keep = (d) => { out = (out + d).slice(-20000); };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  child.label = label;
  child.output = () => out;
  child.on('exit', () => {
    children.delete(child);
    if (process.env.INTEROP_PIDDIR && child.pid) {
      fs.rmSync(path.join(process.env.INTEROP_PIDDIR, String(child.pid)), { force: true });
    }
  });
  child.stop = async (signal = 'SIGTERM') => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill(signal);
    await exited;
  };
  return child;
}

/** Starts `mcprelay serve` on a free port; returns { url, port, proc }. */
export async function startRelay(args = []) {
  const port = await freePort();
  // Each relay gets its own disk store: two relays cannot share one.
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'mcprelay-interop-'));
  const proc = startProcess(`mcprelay serve ${args.join(' ')}`, mcprelayBin,
    ['serve', '--addr', `127.0.0.1:${port}`, '--log-level', 'info', '--data-dir', dataDir, ...args]);
  proc.once('exit', () => fs.rmSync(dataDir, { recursive: true, force: true }));
  await waitListening(port, proc);
  return { url: `http://127.0.0.1:${port}/mcp`, port, proc };
}

/** Starts `mcprelay example-server` on port (a free one if omitted). */
export async function startExampleServer(port) {
  port ??= await freePort();
  const proc = startProcess('mcprelay example-server', mcprelayBin,
    ['example-server', '--addr', `127.0.0.1:${port}`, '--log-level', 'warn']);
  await waitListening(port, proc);
  return { port, proc, url: `http://127.0.0.1:${port}/mcp`, stateless: `http://127.0.0.1:${port}/mcp/stateless` };
}

/**
 * Starts @modelcontextprotocol/server-everything in streamableHttp mode.
 * Its transport calls app.listen(PORT) with no host, which binds every
 * interface, and it has no flag or variable for the host; the preload
 * loopback.mjs makes that listen bind 127.0.0.1 and prints the address.
 */
export async function startEverything() {
  const port = await freePort();
  const main = path.join(interopDir, 'node_modules', '@modelcontextprotocol', 'server-everything', 'dist', 'index.js');
  const proc = startProcess('server-everything streamableHttp', process.execPath,
    ['--import', path.join(interopDir, 'lib', 'loopback.mjs'), main, 'streamableHttp'],
    { env: { ...process.env, PORT: String(port) } });
  await waitListening(port, proc);
  return { port, proc, url: `http://127.0.0.1:${port}/mcp` };
}

/**
 * A TCP proxy on 127.0.0.1 in front of target port that can cut a
 * connection in the middle of an SSE event. After arm(marker, cuts), it
 * counts occurrences of marker in the bytes flowing back to the client
 * (over all connections); when the count reaches one of cuts, it forwards
 * the bytes up to a few past that occurrence (so the event is delivered
 * only in part) and destroys both sides of that connection.
 */
export async function startCutProxy(targetPort) {
  const sockets = new Set();
  let marker = null;
  let cuts = [];
  let seen = 0;
  const cutLog = [];
  const srv = net.createServer((client) => {
    const upstream = net.connect(targetPort, '127.0.0.1');
    sockets.add(client);
    sockets.add(upstream);
    let tail = '';
    const destroy = () => { client.destroy(); upstream.destroy(); };
    client.on('error', destroy);
    upstream.on('error', destroy);
    client.on('close', () => { upstream.destroy(); sockets.delete(client); });
    upstream.on('close', () => { client.destroy(); sockets.delete(upstream); });
    client.pipe(upstream);
    upstream.on('data', (buf) => {
      if (client.destroyed) return;
      if (!marker || cuts.length === 0) { client.write(buf); return; }
      const text = buf.toString('latin1');
      const hay = tail + text;
      let from = 0;
      for (;;) {
        const i = hay.indexOf(marker, from);
        if (i < 0) break;
        from = i + marker.length;
        if (i + marker.length <= tail.length) continue; // counted with the previous chunk
        seen++;
        if (cuts.includes(seen)) {
          cuts = cuts.filter((c) => c !== seen);
          // Forward through the marker and a few bytes more: the event is
          // cut in the middle of its data line.
          const end = Math.max(0, from + 3 - tail.length);
          client.write(buf.subarray(0, end), () => destroy());
          cutLog.push(seen);
          return;
        }
      }
      tail = hay.slice(-marker.length);
      client.write(buf);
    });
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const { port } = srv.address();
  return {
    port,
    url: `http://127.0.0.1:${port}/mcp`,
    arm(m, at) { marker = m; cuts = [...at]; seen = 0; },
    /** The marker counts at which a connection was cut. */
    cuts: () => [...cutLog],
    close() {
      for (const s of sockets) s.destroy();
      srv.close();
    },
  };
}

/**
 * Connects a TypeScript SDK client (StreamableHTTPClientTransport) to url.
 * exchanges records every HTTP request the transport makes (method,
 * Last-Event-ID, status once its response headers came, and settled, a
 * promise of that) and errors every error the client reports.
 */
export async function connectClient(url, transportOpts = {}) {
  const exchanges = [];
  const errors = [];
  const recordingFetch = async (input, init = {}) => {
    const h = new Headers(init.headers);
    const ex = { method: init.method ?? 'GET', lastEventId: h.get('last-event-id'), status: undefined, at: Date.now() };
    exchanges.push(ex);
    const pending = fetch(input, init);
    ex.settled = pending.then((res) => { ex.status = res.status; }, (err) => { ex.status = `failed: ${err}`; });
    return pending;
  };
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: recordingFetch, ...transportOpts });
  const client = new Client({ name: 'mcprelay-interop', version: '0.0.0' });
  client.onerror = (e) => errors.push(e);
  await client.connect(transport);
  return { client, transport, exchanges, errors };
}

/** Resumes the transport made: GETs that carry Last-Event-ID. */
export function resumes(exchanges) {
  return exchanges.filter((e) => e.method === 'GET' && e.lastEventId);
}

/** Text of a tools/call result's single text content. */
export function textOf(result) {
  const texts = result.content.filter((c) => c.type === 'text').map((c) => c.text);
  return texts.join('\n');
}

/** Rejects when p has not settled after ms. */
export function within(p, ms, what) {
  let t;
  const timeout = new Promise((_, reject) => {
    t = setTimeout(() => reject(new Error(`${what}: not settled after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(t));
}

/**
 * Runs mcp-inspector-cli (the bin of @modelcontextprotocol/inspector-cli) in
 * CLI mode against url and returns its parsed JSON output.
 *
 * Its working directory is the package's own build/ directory: the CLI
 * checks fs.existsSync("../package.json") against the working directory but
 * imports that path relative to its module, so from anywhere else it fails
 * with "Cannot find module .../@modelcontextprotocol/package.json".
 */
export async function runInspector(url, args, timeoutMs = 30000) {
  const bin = path.join(interopDir, 'node_modules', '.bin', 'mcp-inspector-cli');
  const cwd = path.join(interopDir, 'node_modules', '@modelcontextprotocol', 'inspector-cli', 'build');
  const proc = startProcess(`mcp-inspector-cli ${args.join(' ')}`, process.execPath,
    [bin, '--cli', url, '--transport', 'http', ...args], { cwd });
  let stdout = '';
  proc.stdout.on('data', (d) => { stdout += d; });
  const [code] = await within(once(proc, 'exit'), timeoutMs, `mcp-inspector-cli ${args.join(' ')}`);
  if (code !== 0) throw new Error(`mcp-inspector-cli ${args.join(' ')} exited with ${code}:\n${proc.output()}`);
  return JSON.parse(stdout);
}
