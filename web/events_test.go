package web

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// sseEvent is one event read from a stream.
type sseEvent struct {
	typ, data string
	comment   bool
}

// readEvents reads events from an open stream into a channel until it
// ends.
func readEvents(body *bufio.Reader) <-chan sseEvent {
	ch := make(chan sseEvent, 256)
	go func() {
		defer close(ch)
		var ev sseEvent
		for {
			line, err := body.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				if ev.typ != "" || ev.comment {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				ev.comment = true
			case strings.HasPrefix(line, "event: "):
				ev.typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return ch
}

// openStream opens the event stream of the server at url; query, if any,
// starts with "?".
func openStream(t *testing.T, ctx context.Context, url, query string) (*http.Response, <-chan sseEvent) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/api/v1/events"+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp, readEvents(bufio.NewReader(resp.Body))
}

// next waits for an event of type typ (or a heartbeat comment for "").
func next(t *testing.T, ch <-chan sseEvent, typ string) sseEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended waiting for %q", typ)
			}
			if typ == "" && ev.comment || typ != "" && ev.typ == typ {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %q event in 10 s", typ)
		}
	}
}

// TestEventStream: a snapshot at once, then snapshots as the engine
// changes, preemption events with their reasons, and heartbeats.
func TestEventStream(t *testing.T) {
	f := newFixture(t, 20, Limits{SnapshotInterval: 50 * time.Millisecond, Heartbeat: 100 * time.Millisecond})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, ch := openStream(t, ctx, ts.URL, "")
	defer resp.Body.Close()

	first := next(t, ch, "snapshot")
	var snap SnapshotEvent
	if err := json.Unmarshal([]byte(first.data), &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Processes) != 20 || snap.Status.Node.Hostname != "node1" || snap.Status.Counts.Processes != 20 {
		t.Errorf("first snapshot: %d processes, status %+v", len(snap.Processes), snap.Status.Counts)
	}
	f.eng.requests(20, 2)
	pre := next(t, ch, "preemption")
	if !strings.Contains(pre.data, `"action":"suspend"`) && !strings.Contains(pre.data, `"action":"resume"`) {
		t.Errorf("preemption event: %s", pre.data)
	}
	next(t, ch, "snapshot")
	next(t, ch, "")
}

// TestEventStreamClientsLeave: clients that vanish are dropped, the
// stream limit holds, a client that stops reading is cut off without
// holding up the others, Shutdown ends every stream, and no goroutine is
// left behind.
func TestEventStreamClientsLeave(t *testing.T) {
	base := runtime.NumGoroutine()
	// Streams hold a few snapshots: a stream's handler scheduled late on a
	// loaded machine is not taken for a client that stopped reading.
	f := newFixture(t, 10, Limits{SnapshotInterval: 10 * time.Millisecond, MaxStreams: 3, StreamBuffer: 8})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()

	var cancels []context.CancelFunc
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		resp, ch := openStream(t, ctx, ts.URL, "")
		defer resp.Body.Close()
		next(t, ch, "snapshot")
	}
	if resp, err := http.Get(ts.URL + "/api/v1/events"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("fourth stream: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	for _, c := range cancels {
		c()
	}
	waitClients(t, f, 0)

	// A client that stops reading: the hub drops it once its queue fills;
	// a reading client keeps getting snapshots meanwhile.
	slow := f.s.hub.join(10, false)
	ctx, cancel := context.WithCancel(context.Background())
	resp, ch := openStream(t, ctx, ts.URL, "")
	for i := range 10 {
		f.eng.src.push(launchEv(uint32(1000 + i)))
		next(t, ch, "snapshot")
		time.Sleep(15 * time.Millisecond)
	}
	select {
	case <-slow.gone:
	default:
		t.Error("a client that never read was not dropped")
	}
	if f.s.hub.slow.Load() == 0 {
		t.Error("slow client not counted")
	}
	// Shutdown ends the reading client's stream.
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := f.s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	for range ch {
	}
	resp.Body.Close()
	cancel()
	ts.Close()
	waitGoroutines(t, base+20) // the engine, the policy watcher and the HTTP client's idle conns remain until cleanup
}

func waitClients(t *testing.T, f *fixture, n int64) {
	t.Helper()
	for i := 0; f.s.hub.clients.Load() != n; i++ {
		if i > 500 {
			t.Fatalf("%d stream clients, want %d", f.s.hub.clients.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitGoroutines(t *testing.T, max int) {
	t.Helper()
	for i := 0; runtime.NumGoroutine() > max; i++ {
		if i > 300 {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), max, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEventStreamOutlivesReadTimeout: a stream lasts longer than the
// server's read timeout, which bounds reading the request only (net/http
// clears the deadline once the request is read; this keeps it so).
func TestEventStreamOutlivesReadTimeout(t *testing.T) {
	f := newFixture(t, 5, Limits{SnapshotInterval: 20 * time.Millisecond, Heartbeat: 50 * time.Millisecond, ReadTimeout: time.Second})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go f.s.Serve(l)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, ch := openStream(t, ctx, "http://"+l.Addr().String(), "")
	defer resp.Body.Close()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		next(t, ch, "")
	}
	if f.s.hub.clients.Load() != 1 {
		t.Errorf("%d stream clients after 3 s, want 1", f.s.hub.clients.Load())
	}
}
