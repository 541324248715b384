package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mcprelay/mcprelay/sse"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// ErrNotInitialized is returned when a session must be re-initialized
// before the SDK has initialized it once.
var ErrNotInitialized = errors.New("client: session never initialized")

// reinitialize replaces the lost session old with a new one, initialized
// with the initialize request the SDK sent. Concurrent callers for the
// same session share one attempt; if old was already replaced it returns
// at once. If re-initialization fails (after Options.MaxRetries retries)
// the connection fails.
func (c *conn) reinitialize(old *session) error {
	c.mu.Lock()
	if c.sess != old {
		c.mu.Unlock()
		return nil
	}
	if r := c.reinit; r != nil {
		c.mu.Unlock()
		select {
		case <-r.done:
			return r.err
		case <-c.ctx.Done():
			return ErrClosed
		}
	}
	r := &reinitRun{done: make(chan struct{})}
	c.reinit = r
	params := c.initParams
	c.mu.Unlock()

	old.cancel() // stop the old session's streams
	c.log.Warn("session lost: re-initializing", logSession, old.id)
	var sess *session
	var version string
	err := ErrNotInitialized
	if params != nil {
		for attempt := 1; ; attempt++ {
			sess, version, err = c.initialize(params)
			if err == nil || attempt > c.opts.MaxRetries || !sleep(c.ctx, c.delay(attempt, 0)) {
				break
			}
			c.log.Info("re-initialization failed; retrying", logAttempt, attempt, logErr, err)
		}
	}
	c.mu.Lock()
	if err == nil {
		c.sess, c.version = sess, version
	}
	c.reinit = nil
	r.err = err
	c.mu.Unlock()
	close(r.done)
	if err != nil {
		c.fail(fmt.Errorf("client: re-initializing the lost session: %w", err))
		return err
	}
	c.log.Info("session re-initialized", logSession, sess.id, "previous", old.id)
	c.startStandalone(sess)
	return nil
}

// initialize sends initialize with params, then notifications/initialized,
// and returns the new session and the negotiated version.
func (c *conn) initialize(params json.RawMessage) (*session, string, error) {
	ctx, cancel := context.WithTimeout(c.ctx, initTimeout)
	defer cancel()
	c.mu.Lock()
	c.seq++
	id, _ := jsonrpc.MakeID("mcprelay-client-init-" + strconv.FormatInt(c.seq, 10))
	c.mu.Unlock()
	body, err := jsonrpc.EncodeMessage(&jsonrpc.Request{ID: id, Method: "initialize", Params: params})
	if err != nil {
		return nil, "", err
	}
	req, err := c.request(ctx, http.MethodPost, nil, "", body)
	if err != nil {
		return nil, "", err
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", readStatusError(resp)
	}
	r, err := readResponse(resp, id)
	if err != nil {
		return nil, "", err
	}
	if r.Error != nil {
		return nil, "", fmt.Errorf("client: initialize: %w", r.Error)
	}
	var res struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil {
		return nil, "", fmt.Errorf("client: initialize result: %w", err)
	}
	sess := c.newSession(resp.Header.Get(headerSessionID))
	body, _ = jsonrpc.EncodeMessage(&jsonrpc.Request{Method: "notifications/initialized", Params: json.RawMessage("{}")})
	req, err = c.request(ctx, http.MethodPost, sess, res.ProtocolVersion, body)
	if err != nil {
		sess.cancel()
		return nil, "", err
	}
	nresp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		sess.cancel()
		return nil, "", err
	}
	nresp.Body.Close()
	if nresp.StatusCode/100 != 2 {
		sess.cancel()
		return nil, "", fmt.Errorf("client: notifications/initialized: HTTP %d", nresp.StatusCode)
	}
	return sess, res.ProtocolVersion, nil
}

// readResponse reads the response with id from a JSON or SSE answer.
func readResponse(resp *http.Response, id jsonrpc.ID) (*jsonrpc.Response, error) {
	want := idKey(id)
	match := func(data []byte) *jsonrpc.Response {
		msg, err := jsonrpc.DecodeMessage(data)
		if err != nil {
			return nil
		}
		if r, ok := msg.(*jsonrpc.Response); ok && idKey(r.ID) == want {
			return r
		}
		return nil
	}
	if mediaType(resp) == "text/event-stream" {
		sc := sse.NewScanner(resp.Body)
		for {
			ev, err := sc.Next()
			if err != nil {
				return nil, fmt.Errorf("client: initialize answer ended without a response: %w", err)
			}
			if (ev.Type == "" || ev.Type == "message") && len(bytes.TrimSpace(ev.Data)) > 0 {
				if r := match(ev.Data); r != nil {
					return r, nil
				}
			}
		}
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody))
	if err != nil {
		return nil, err
	}
	if r := match(data); r != nil {
		return r, nil
	}
	return nil, errors.New("client: initialize answer did not contain the response")
}

// standaloneWait bounds how long startStandalone waits for the first GET's
// answer.
const standaloneWait = time.Second

// startStandalone starts the standalone GET stream of sess, once. It waits
// (at most standaloneWait) until the server has answered the first GET, so
// that the stream is open before the requests the SDK sends next, as the
// server may expect.
func (c *conn) startStandalone(sess *session) {
	sess.standalone.Do(func() {
		opened := make(chan struct{})
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.runStandalone(sess, opened)
		}()
		t := time.NewTimer(standaloneWait)
		defer t.Stop()
		select {
		case <-opened:
		case <-t.C:
		case <-sess.ctx.Done():
		}
	})
}

// runStandalone keeps the standalone GET stream of sess open until the
// session ends, resuming it after each break. It closes opened once the
// first GET is answered.
func (c *conn) runStandalone(sess *session, opened chan struct{}) {
	var openOnce sync.Once
	defer openOnce.Do(func() { close(opened) })
	st := &streamState{}
	attempts := 0
	everOpen := false
	for sess.ctx.Err() == nil {
		cursor := ""
		if st.cursor != "" {
			var why string
			cursor, why = st.resumeCursor(c.SessionID())
			if why != "" {
				c.log.Warn("starting the standalone stream afresh", logSession, sess.id, logCursor, st.cursor, logReason, why)
				st.startFresh()
			}
		}
		resp, err := c.get(sess.ctx, sess, cursor)
		openOnce.Do(func() { close(opened) })
		if err == nil {
			status := resp.StatusCode
			switch {
			case status == http.StatusOK && mediaType(resp) == "text/event-stream":
				everOpen = true
				body := resp.Body
				stop := context.AfterFunc(sess.ctx, func() { body.Close() })
				c.readStream(body, st, sess.id, nil, nil)
				stop()
				if st.progress {
					attempts = 0
				}
			case status == http.StatusNotFound && sess.id != "" && everOpen:
				resp.Body.Close()
				c.reinitialize(sess)
				return
			case status == http.StatusNoContent:
				resp.Body.Close()
				c.log.Info("standalone stream finished; starting afresh", logSession, sess.id)
				st.startFresh()
			case cursor != "" && (status == http.StatusBadRequest || status == http.StatusConflict):
				err := readStatusError(resp)
				c.log.Warn("resume refused; starting the standalone stream afresh", logSession, sess.id, logCursor, cursor, logErr, err)
				st.startFresh()
			case status >= 500 || status == http.StatusTooManyRequests:
				err = readStatusError(resp)
			default:
				// 405 (no standalone stream), or another refusal before
				// the stream ever opened.
				err := readStatusError(resp)
				c.log.Info("no standalone stream", logSession, sess.id, logErr, err)
				return
			}
		}
		if sess.ctx.Err() != nil {
			return
		}
		attempts++
		if attempts > c.opts.MaxRetries {
			c.fail(fmt.Errorf("client: standalone stream: gave up after %d attempts: %v", c.opts.MaxRetries, err))
			return
		}
		if err != nil {
			c.log.Debug("standalone stream failed", logSession, sess.id, logErr, err)
		}
		sleep(sess.ctx, c.delay(attempts, st.retry))
	}
}
