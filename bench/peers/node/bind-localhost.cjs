// Preloaded with `node --require` so that a server that listens on all
// interfaces (app.listen(PORT)) binds 127.0.0.1 instead. Used by
// scripts/probe-results for @modelcontextprotocol/server-everything.
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if ((typeof args[0] === "number" || typeof args[0] === "string") && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
