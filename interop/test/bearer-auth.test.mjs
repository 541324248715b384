// The TypeScript SDK client (@modelcontextprotocol/sdk 1.32.2) through
// `mcprelay serve --auth-issuer` with a bearer token: a local OAuth issuer
// (an EC P-256 key generated here with node:crypto, RFC 8414 metadata and a
// JWKS served on 127.0.0.1) signs ES256 access tokens; the client passes
// them through an OAuthClientProvider (authProvider), calls a tool, and
// keeps its session across a refreshed token (a new JWT, same subject).
// Another subject presenting the session ID gets 404; no token gets 401
// with the RFC 9728 challenge.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { startRelay, textOf } from '../lib/harness.mjs';

const SIMPLE_TEXT = 'This is a simple text response for testing.';
const SCOPE = 'mcp:tools';

const b64url = (buf) => Buffer.from(buf).toString('base64url');

/** A local OAuth issuer: one signing key, metadata and JWKS on loopback. */
async function startIssuer() {
  const { privateKey, publicKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const kid = 'interop-1';
  const jwk = { ...publicKey.export({ format: 'jwk' }), kid, alg: 'ES256', use: 'sig' };
  const srv = http.createServer((req, res) => {
    const json = (v) => { res.setHeader('Content-Type', 'application/json'); res.end(JSON.stringify(v)); };
    if (req.url === '/.well-known/oauth-authorization-server') return json({ issuer, jwks_uri: `${issuer}/jwks` });
    if (req.url === '/jwks') return json({ keys: [jwk] });
    res.statusCode = 404;
    res.end();
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const issuer = `http://127.0.0.1:${srv.address().port}`;
  let n = 0;
  /** An ES256 access token for sub, for audience aud. */
  const token = (sub, aud) => {
    const now = Math.floor(Date.now() / 1000);
    const header = b64url(JSON.stringify({ alg: 'ES256', typ: 'at+jwt', kid }));
    const payload = b64url(JSON.stringify({
      iss: issuer, sub, aud, scope: SCOPE, iat: now, exp: now + 300, jti: `t${++n}`,
    }));
    const sig = crypto.sign('sha256', Buffer.from(`${header}.${payload}`), { key: privateKey, dsaEncoding: 'ieee-p1363' });
    return `${header}.${payload}.${b64url(sig)}`;
  };
  return { issuer, token, close: () => new Promise((r) => srv.close(r)) };
}

/**
 * The smallest OAuthClientProvider: it holds an access token obtained
 * elsewhere and can be given a new one (a refresh). An authorization flow
 * would call the other methods: they throw, so the test fails loudly.
 */
class TokenProvider {
  constructor(accessToken) { this.accessToken = accessToken; }
  tokens() { return { access_token: this.accessToken, token_type: 'Bearer' }; }
  get redirectUrl() { return 'http://127.0.0.1/unused'; }
  get clientMetadata() { return { redirect_uris: ['http://127.0.0.1/unused'] }; }
  clientInformation() { return undefined; }
  saveTokens() { throw new Error('unexpected token exchange'); }
  redirectToAuthorization() { throw new Error('unexpected authorization flow'); }
  saveCodeVerifier() { throw new Error('unexpected authorization flow'); }
  codeVerifier() { throw new Error('unexpected authorization flow'); }
}

describe('TypeScript SDK client with a bearer token through mcprelay --auth-issuer', () => {
  let issuer;
  let relay;
  let client;
  let transport;
  let provider;
  const sent = []; // Authorization of every request the transport made
  before(async () => {
    issuer = await startIssuer();
    relay = await startRelay(['--auth-issuer', issuer.issuer, '--auth-scopes', SCOPE]);
    provider = new TokenProvider(issuer.token('alice', relay.url));
    const recording = async (input, init = {}) => {
      sent.push(new Headers(init.headers).get('authorization'));
      return fetch(input, init);
    };
    transport = new StreamableHTTPClientTransport(new URL(relay.url), { authProvider: provider, fetch: recording });
    client = new Client({ name: 'mcprelay-interop-auth', version: '0.0.0' });
    await client.connect(transport);
  });
  after(async () => {
    await client?.close();
    await relay?.proc.stop();
    await issuer?.close();
  });

  test('no token: 401 with the protected-resource challenge', async () => {
    const res = await fetch(relay.url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'x', version: '1' } } }),
    });
    assert.equal(res.status, 401);
    const challenge = res.headers.get('www-authenticate') ?? '';
    assert.match(challenge, /^Bearer /);
    const m = challenge.match(/resource_metadata="([^"]+)"/);
    assert.ok(m, `no resource_metadata in ${challenge}`);
    const meta = await (await fetch(m[1])).json();
    assert.equal(meta.resource, relay.url);
    assert.deepEqual(meta.authorization_servers, [issuer.issuer]);
  });

  test('calls a tool with its token', async () => {
    assert.equal(textOf(await client.callTool({ name: 'test_simple_text', arguments: {} })), SIMPLE_TEXT);
    assert.ok(sent.length > 0 && sent.every((a) => a === `Bearer ${provider.accessToken}`), `Authorization sent: ${sent}`);
  });

  test('a refreshed token (new JWT, same subject) keeps the session', async () => {
    const session = transport.sessionId;
    const old = provider.accessToken;
    provider.accessToken = issuer.token('alice', relay.url);
    assert.notEqual(provider.accessToken, old);
    const from = sent.length;
    assert.equal(textOf(await client.callTool({ name: 'test_simple_text', arguments: {} })), SIMPLE_TEXT);
    assert.equal(transport.sessionId, session, 'the session ID changed');
    assert.ok(sent.slice(from).includes(`Bearer ${provider.accessToken}`), 'the refreshed token was not sent');
  });

  test('another subject presenting the session ID gets 404', async () => {
    const res = await fetch(relay.url, {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
        Authorization: `Bearer ${issuer.token('mallory', relay.url)}`,
        'Mcp-Session-Id': transport.sessionId, 'Mcp-Protocol-Version': transport.protocolVersion,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }),
    });
    assert.equal(res.status, 404);
    await res.body?.cancel();
  });
});
