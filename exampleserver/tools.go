package exampleserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Texts the conformance suite looks for.
const (
	simpleText           = "This is a simple text response for testing."
	embeddedResourceURI  = "test://embedded-resource"
	embeddedResourceText = "This is an embedded resource content."
	mixedText            = "Multiple content types test:"
	mixedResourceURI     = "test://mixed-content-resource"
	mixedResourceJSON    = `{"test":"data","value":123}`
	errorText            = "This tool intentionally returns an error for testing"
	reconnectionText     = "Reconnection test completed successfully"
)

// Timings of the tools that pace themselves.
const (
	// stepDelay separates the log messages of test_tool_with_logging and the
	// progress notifications of test_tool_with_progress (the suite asks for ~50 ms).
	stepDelay = 50 * time.Millisecond
	// reconnectCloseDelay is how long test_reconnection waits before closing
	// its SSE stream, so that the stream's opening (and priming event) reach
	// the client first.
	reconnectCloseDelay = 100 * time.Millisecond
	// reconnectRetry is the retry hint sent when closing the stream.
	reconnectRetry = 100 * time.Millisecond
	// reconnectFinishDelay is how long test_reconnection waits after closing
	// the stream before returning its result: long enough that a prompt client
	// is already resumed when the result is produced.
	reconnectFinishDelay = 400 * time.Millisecond
)

// stream_progress bounds and defaults.
const (
	streamDefaultCount    = 20
	streamMaxCount        = 100000
	streamDefaultInterval = 100 // ms
	streamMaxInterval     = 60000
)

// jsonSchema202012 is the input schema of json_schema_2020_12_tool; the suite
// checks that $schema, $defs and additionalProperties survive tools/list.
const jsonSchema202012 = `{
	"$schema": "https://json-schema.org/draft/2020-12/schema",
	"type": "object",
	"$defs": {
		"address": {
			"type": "object",
			"properties": {
				"street": {"type": "string"},
				"city": {"type": "string"}
			}
		}
	},
	"properties": {
		"name": {"type": "string"},
		"address": {"$ref": "#/$defs/address"}
	},
	"additionalProperties": false
}`

var streamProgressSchema = fmt.Sprintf(`{
	"type": "object",
	"properties": {
		"count": {"type": "integer", "minimum": 0, "maximum": %d, "default": %d,
			"description": "number of progress notifications (or log lines) to send"},
		"interval_ms": {"type": "integer", "minimum": 0, "maximum": %d, "default": %d,
			"description": "pause between two notifications in milliseconds; 0 sends a burst"}
	},
	"additionalProperties": false
}`, streamMaxCount, streamDefaultCount, streamMaxInterval, streamDefaultInterval)

func addTools(srv *mcp.Server, logger *slog.Logger) {
	text := func(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }
	fixed := func(name, desc string, res *mcp.CallToolResult) {
		mcp.AddTool(srv, &mcp.Tool{Name: name, Description: desc},
			func(context.Context, *mcp.CallToolRequest, any) (*mcp.CallToolResult, any, error) {
				return res, nil, nil
			})
	}

	fixed("test_simple_text", "Returns a simple text response.",
		&mcp.CallToolResult{Content: text(simpleText)})
	fixed("test_image_content", "Returns a 1x1 red PNG image.",
		&mcp.CallToolResult{Content: []mcp.Content{&mcp.ImageContent{Data: redPixelPNG, MIMEType: "image/png"}}})
	fixed("test_audio_content", "Returns a short silent WAV clip.",
		&mcp.CallToolResult{Content: []mcp.Content{&mcp.AudioContent{Data: silentWAV, MIMEType: "audio/wav"}}})
	fixed("test_embedded_resource", "Returns an embedded text resource.",
		&mcp.CallToolResult{Content: []mcp.Content{&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
			URI: embeddedResourceURI, MIMEType: "text/plain", Text: embeddedResourceText,
		}}}})
	fixed("test_multiple_content_types", "Returns text, an image and an embedded JSON resource.",
		&mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: mixedText},
			&mcp.ImageContent{Data: redPixelPNG, MIMEType: "image/png"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{
				URI: mixedResourceURI, MIMEType: "application/json", Text: mixedResourceJSON,
			}},
		}})
	fixed("test_error_handling", "Always returns a tool error (isError: true).",
		&mcp.CallToolResult{IsError: true, Content: text(errorText)})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "test_tool_with_logging",
		Description: "Sends three info log messages 50 ms apart.",
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		for i, msg := range []string{"Tool execution started", "Tool processing data", "Tool execution completed"} {
			if i > 0 {
				if err := sleep(ctx, stepDelay); err != nil {
					return nil, nil, err
				}
			}
			if err := req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Logger: "test_tool_with_logging", Data: msg}); err != nil {
				return nil, nil, err
			}
		}
		return &mcp.CallToolResult{Content: text("Tool with logging executed successfully")}, nil, nil
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "test_tool_with_progress",
		Description: "Reports progress 0, 50 and 100 of 100, 50 ms apart, on the request's progressToken.",
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		token := req.Params.GetProgressToken()
		for i, p := range []float64{0, 50, 100} {
			if i > 0 {
				if err := sleep(ctx, stepDelay); err != nil {
					return nil, nil, err
				}
			}
			if token == nil {
				continue
			}
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token, Progress: p, Total: 100,
			}); err != nil {
				return nil, nil, err
			}
		}
		return &mcp.CallToolResult{Content: text("Tool with progress executed successfully")}, nil, nil
	})

	type samplingArgs struct {
		Prompt string `json:"prompt" jsonschema:"the prompt to send to the LLM"`
	}
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "test_sampling",
		Description: "Asks the client's LLM (sampling/createMessage) and returns its answer.",
	}, func(ctx context.Context, req *mcp.CallToolRequest, in samplingArgs) (*mcp.CallToolResult, any, error) {
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{
			Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: in.Prompt}}},
			MaxTokens: 100,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("sampling: %w", err)
		}
		answer := "(non-text response)"
		if tc, ok := res.Content.(*mcp.TextContent); ok {
			answer = tc.Text
		}
		return &mcp.CallToolResult{Content: text("LLM response: " + answer)}, nil, nil
	})

	type elicitationArgs struct {
		Message string `json:"message" jsonschema:"the message to show the user"`
	}
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "test_elicitation",
		Description: "Asks the user (elicitation/create) for a username and an email address.",
	}, func(ctx context.Context, req *mcp.CallToolRequest, in elicitationArgs) (*mcp.CallToolResult, any, error) {
		return elicit(ctx, req, "User response", in.Message, map[string]any{
			"type": "object",
			"properties": map[string]any{
				"username": map[string]any{"type": "string", "description": "User's response"},
				"email":    map[string]any{"type": "string", "description": "User's email address"},
			},
			"required": []string{"username", "email"},
		})
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "test_elicitation_sep1034_defaults",
		Description: "Elicitation whose schema has defaults for every primitive type (SEP-1034).",
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		return elicit(ctx, req, "Elicitation completed", "Please review and update the form fields with defaults", map[string]any{
			"type": "object",
			"properties": map[string]any{
				"name":     map[string]any{"type": "string", "description": "User name", "default": "John Doe"},
				"age":      map[string]any{"type": "integer", "description": "User age", "default": 30},
				"score":    map[string]any{"type": "number", "description": "User score", "default": 95.5},
				"status":   map[string]any{"type": "string", "description": "User status", "enum": []string{"active", "inactive", "pending"}, "default": "active"},
				"verified": map[string]any{"type": "boolean", "description": "Verification status", "default": true},
			},
		})
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "test_elicitation_sep1330_enums",
		Description: "Elicitation with the five enum schema shapes of SEP-1330.",
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		titled := func(prefix string) []map[string]any {
			return []map[string]any{
				{"const": "value1", "title": "First " + prefix},
				{"const": "value2", "title": "Second " + prefix},
				{"const": "value3", "title": "Third " + prefix},
			}
		}
		options := []string{"option1", "option2", "option3"}
		return elicit(ctx, req, "Elicitation completed", "Please select options from the enum fields", map[string]any{
			"type": "object",
			"properties": map[string]any{
				"untitledSingle": map[string]any{"type": "string", "description": "Select one option", "enum": options},
				"titledSingle":   map[string]any{"type": "string", "description": "Select one option with titles", "oneOf": titled("Option")},
				"legacyEnum": map[string]any{"type": "string", "description": "Select one option (legacy)",
					"enum": []string{"opt1", "opt2", "opt3"}, "enumNames": []string{"Option One", "Option Two", "Option Three"}},
				"untitledMulti": map[string]any{"type": "array", "description": "Select multiple options",
					"minItems": 1, "maxItems": 3, "items": map[string]any{"type": "string", "enum": options}},
				"titledMulti": map[string]any{"type": "array", "description": "Select multiple options with titles",
					"minItems": 1, "maxItems": 3, "items": map[string]any{"anyOf": titled("Choice")}},
			},
		})
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "json_schema_2020_12_tool",
		Description: "Tool with JSON Schema 2020-12 features",
		InputSchema: json.RawMessage(jsonSchema202012),
	}, func(_ context.Context, _ *mcp.CallToolRequest, in json.RawMessage) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: text("JSON Schema 2020-12 tool called with: " + string(in))}, nil, nil
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name: "test_reconnection",
		Description: "Closes its SSE stream mid-call (SEP-1699) and returns the result only later, " +
			"so that it reaches the client after a GET resume with Last-Event-ID.",
	}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		if err := sleep(ctx, reconnectCloseDelay); err != nil {
			return nil, nil, err
		}
		if req.Extra != nil && req.Extra.CloseSSEStream != nil {
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: reconnectRetry})
			logger.DebugContext(ctx, "closed SSE stream", keyTool, "test_reconnection")
		}
		if err := sleep(ctx, reconnectFinishDelay); err != nil {
			return nil, nil, err
		}
		return &mcp.CallToolResult{Content: text(reconnectionText)}, nil, nil
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name: "stream_progress",
		Description: "Sends count progress notifications (or, without a progressToken, info log lines), " +
			"interval_ms apart, then returns \"streamed <count> events\". For resume demos.",
		InputSchema: json.RawMessage(streamProgressSchema),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in streamProgressArgs) (*mcp.CallToolResult, any, error) {
		return streamProgress(ctx, req, in, logger)
	})
}

// elicit sends an elicitation/create request and reports the answer as
// "<label>: action=<action>, content=<json>".
func elicit(ctx context.Context, req *mcp.CallToolRequest, label, message string, schema map[string]any) (*mcp.CallToolResult, any, error) {
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Message: message, RequestedSchema: schema})
	if err != nil {
		return nil, nil, fmt.Errorf("elicitation: %w", err)
	}
	content, err := json.Marshal(res.Content)
	if err != nil {
		return nil, nil, fmt.Errorf("elicitation: encoding content: %w", err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: fmt.Sprintf("%s: action=%s, content=%s", label, res.Action, content),
	}}}, nil, nil
}

// streamProgressArgs are the arguments of stream_progress; nil means "use the default".
type streamProgressArgs struct {
	Count      *int `json:"count,omitempty"`
	IntervalMS *int `json:"interval_ms,omitempty"`
}

func streamProgress(ctx context.Context, req *mcp.CallToolRequest, in streamProgressArgs, logger *slog.Logger) (*mcp.CallToolResult, any, error) {
	count, interval := streamDefaultCount, streamDefaultInterval
	if in.Count != nil {
		count = *in.Count
	}
	if in.IntervalMS != nil {
		interval = *in.IntervalMS
	}
	// The input schema already bounds both; this guards against a schema edit.
	count = min(max(count, 0), streamMaxCount)
	interval = min(max(interval, 0), streamMaxInterval)

	token := req.Params.GetProgressToken()
	sent := 0
	stop := func(err error) (*mcp.CallToolResult, any, error) {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = ctxErr // a send that failed because of cancellation reports the cancellation
		}
		logger.InfoContext(ctx, "stream stopped early", keyTool, "stream_progress", keySent, sent, keyCount, count, keyErr, err)
		return nil, nil, err
	}
	for i := 1; i <= count; i++ {
		if i > 1 && interval > 0 {
			if err := sleep(ctx, time.Duration(interval)*time.Millisecond); err != nil {
				return stop(err)
			}
		}
		if err := ctx.Err(); err != nil {
			return stop(err)
		}
		var err error
		if token != nil {
			err = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token,
				Progress:      float64(i),
				Total:         float64(count),
				Message:       fmt.Sprintf("step %d of %d", i, count),
			})
		} else {
			err = req.Session.Log(ctx, &mcp.LoggingMessageParams{
				Level:  "info",
				Logger: "stream_progress",
				Data:   fmt.Sprintf("step %d of %d", i, count),
			})
		}
		if err != nil {
			return stop(err)
		}
		sent++
	}
	logger.DebugContext(ctx, "stream finished", keyTool, "stream_progress", keySent, sent, keyCount, count)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: fmt.Sprintf("streamed %d events", count),
	}}}, nil, nil
}

// sleep waits for d or until ctx is done, whichever comes first, and then
// reports ctx's error if it is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
