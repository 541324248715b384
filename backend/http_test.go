package backend_test

import (
	"net/http"
	"testing"

	"github.com/mcprelay/mcprelay/backend"
	"github.com/mcprelay/mcprelay/backend/connectortest"
	"github.com/mcprelay/mcprelay/internal/mcptest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestUpstreamConnector runs the connector suite against the Streamable
// HTTP connector in front of the official Go SDK's handler, in process.
// Losing a session is restarting the backend: the new server knows none.
func TestUpstreamConnector(t *testing.T) {
	connectortest.Run(t, func(t *testing.T) connectortest.Harness {
		be := mcptest.NewRestartable(func() http.Handler {
			return backend.SDKHandler(connectortest.Server(nil), &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
		})
		t.Cleanup(be.Stop)
		return connectortest.Harness{
			Connector: backend.Handler(be),
			Lose:      func(t *testing.T, s backend.Session) { be.Restart() },
		}
	})
}
