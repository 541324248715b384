// Preload (node --import) that keeps a server on the loopback interface.
//
// @modelcontextprotocol/server-everything (streamableHttp mode) calls
// app.listen(PORT) without a host, which binds every interface, and offers no
// flag or environment variable to choose the host. This module makes every
// net.Server.listen that names a port but no host bind 127.0.0.1 instead, and
// prints the address actually bound ("loopback: listening on 127.0.0.1:P")
// so the test can check it.

import net from 'node:net';

const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    if (typeof args[1] !== 'string') args.splice(1, 0, '127.0.0.1');
  } else if (first && typeof first === 'object' && !Array.isArray(first) && first.port !== undefined && !first.host && !first.path) {
    args[0] = { ...first, host: '127.0.0.1' };
  }
  this.once('listening', () => {
    const a = this.address();
    if (a && typeof a === 'object') console.error(`loopback: listening on ${a.address}:${a.port}`);
  });
  return listen.apply(this, args);
};
