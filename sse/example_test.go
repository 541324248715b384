package sse_test

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mcprelay/mcprelay/sse"
)

func ExampleScanner() {
	stream := "id: s1_0\nretry: 3000\ndata:\n\n" + // 2025-11-25 priming event
		": keep-alive\n\n" +
		"id: s1_1\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n" +
		"id: s1_2\ndata: {\"jsonrpc\":" // the connection drops here

	sc := sse.NewScanner(strings.NewReader(stream))
	for {
		ev, err := sc.Next()
		if err != nil {
			fmt.Printf("%v; resume with Last-Event-ID: %s\n", err, sc.LastEventID())
			break
		}
		fmt.Printf("id=%s retry=%v data=%q\n", ev.ID, ev.Retry, ev.Data)
	}
	// Output:
	// id=s1_0 retry=3s data=""
	// id=s1_1 retry=0s data="{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}"
	// unexpected EOF; resume with Last-Event-ID: s1_1
}

func ExampleAppendEvent() {
	var buf []byte
	buf = sse.AppendEvent(buf, sse.Event{ID: "s1_0", Retry: 3 * time.Second, Data: []byte{}})
	buf = sse.AppendComment(buf, "keep-alive")
	buf = sse.AppendEvent(buf, sse.Event{ID: "s1_1", Data: []byte("line one\nline two")})
	os.Stdout.Write(buf)
	// Output:
	// id: s1_0
	// retry: 3000
	// data:
	//
	// : keep-alive
	//
	// id: s1_1
	// data: line one
	// data: line two
}
