package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestInProcessStreams(t *testing.T) {
	step := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test") != "yes" {
			t.Errorf("header not carried: %q", r.Header.Get("X-Test"))
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "first "+string(body)+"\n")
		w.(http.Flusher).Flush()
		<-step
		io.WriteString(w, "second\n")
	})
	c := &http.Client{Transport: InProcess(h)}
	req, _ := http.NewRequest("POST", "http://x/mcp", strings.NewReader("hello"))
	req.Header.Set("X-Test", "yes")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first hello\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(step) // the second write happens only after the first was read: streaming, not buffered
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "second\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

func TestInProcessCloseCancelsHandler(t *testing.T) {
	done := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		_, err := w.Write([]byte("too late"))
		done <- err
	})
	c := &http.Client{Transport: InProcess(h)}
	resp, err := c.Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("write after the client closed the body succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler context was not cancelled by closing the body")
	}
}

func TestInProcessCancelBeforeHeader(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://x/", nil)
	errc := make(chan error, 1)
	go func() {
		_, err := InProcess(h).RoundTrip(req)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestInProcessEmptyAndPanic(t *testing.T) {
	c := &http.Client{Transport: InProcess(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))}
	resp, err := c.Get("http://x/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("empty handler: %v %v", resp, err)
	}
	resp.Body.Close()
	c = &http.Client{Transport: InProcess(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))}
	resp, err = c.Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Fatalf("panic: status %d", resp.StatusCode)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("panic: body read without error")
	}
}

// TestInProcessFastHandler: a handler that answers and returns at once
// finishes (and cancels its context) about when RoundTrip looks at the
// answer. Regression: RoundTrip then sometimes returned the cancellation
// instead of the response.
func TestInProcessFastHandler(t *testing.T) {
	c := &http.Client{Transport: InProcess(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}))}
	for i := range 500 {
		resp, err := c.Get("http://x/")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
}

// TestInProcessHeaderWaitsForFlush: as with net/http's server, nothing goes
// out before the handler flushes, fills its buffer or returns; a handler
// that returns first hands its whole answer over in memory.
func TestInProcessHeaderWaitsForFlush(t *testing.T) {
	step := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "held\n")
		<-step
		w.Header().Set("X-Late", "ignored") // after WriteHeader: not sent, as with net/http
		w.(http.Flusher).Flush()
		io.WriteString(w, "after\n")
	})
	got := make(chan *http.Response, 1)
	go func() {
		resp, err := InProcess(h).RoundTrip(httptestRequest(t))
		if err != nil {
			t.Error(err)
		}
		got <- resp
	}()
	select {
	case <-got:
		t.Fatal("the response came before the handler flushed")
	case <-time.After(50 * time.Millisecond):
	}
	close(step)
	resp := <-got
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	if inMemory(resp.Body) {
		t.Error("a flushed response is in memory: it streams")
	}
	if resp.Header.Get("X-Late") != "" {
		t.Error("a header set after WriteHeader went out")
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "held\nafter\n" {
		t.Fatalf("body %q, %v", b, err)
	}

	resp, err := InProcess(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"a":`)
		io.WriteString(w, `1}`)
	})).RoundTrip(httptestRequest(t))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !inMemory(resp.Body) || resp.ContentLength != 7 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("a finished answer: in memory %v, length %d, type %q", inMemory(resp.Body), resp.ContentLength, resp.Header.Get("Content-Type"))
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("body %q, %v", b, err)
	}
}

func httptestRequest(t *testing.T) *http.Request {
	req, err := http.NewRequestWithContext(t.Context(), "POST", "http://x/mcp", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// goroutineID is the id of the calling goroutine (from its stack's header).
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	return f[1] // "goroutine N [running]:"
}

// waitParked waits until a worker of p waits for a job. The response
// reaches the caller before its worker is back at the select: a sleep of a
// millisecond was not always enough under -race on a busy machine. Workers
// of other pools (earlier tests', idle for up to workerIdle) do not count:
// the stack names the pool the worker belongs to.
func waitParked(t *testing.T, p *workers) {
	t.Helper()
	buf := make([]byte, 1<<20)
	mine := fmt.Sprintf(").work(%p", p)
	for deadline := time.Now().Add(5 * time.Second); ; {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, mine) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no worker waits for a job 5s after a request")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestInProcessWorkers: handlers run on goroutines kept between requests
// (one after another: the same goroutine, whose stack has grown once), and
// those goroutines end once idle, so an idle relay keeps none.
func TestInProcessWorkers(t *testing.T) {
	seen := map[string]int{}
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[goroutineID()]++
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	before := runtime.NumGoroutine()
	rt := InProcess(h)
	for range 20 {
		resp, err := rt.RoundTrip(httptestRequest(t))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		waitParked(t, rt.(inProcess).w) // the worker is waiting again
	}
	if len(seen) != 1 {
		t.Errorf("20 requests one after another ran on %d goroutines, want 1: %v", len(seen), seen)
	}
	// Concurrent requests get workers of their own.
	block := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			resp, err := InProcess(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block })).RoundTrip(httptestRequest(t))
			if err == nil {
				resp.Body.Close()
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(block)
	wg.Wait()
	// CloseIdleConnections ends the first one's at once; the rest end
	// after workerIdle.
	idle := runtime.NumGoroutine()
	rt.(interface{ CloseIdleConnections() }).CloseIdleConnections()
	for closeBy := time.Now().Add(workerIdle / 2); runtime.NumGoroutine() > idle-1; {
		if time.Now().After(closeBy) {
			t.Fatal("CloseIdleConnections left the idle worker")
		}
		time.Sleep(time.Millisecond)
	}
	deadline := time.Now().Add(10 * workerIdle)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines %v after the last request, %d before", runtime.NumGoroutine(), 10*workerIdle, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
