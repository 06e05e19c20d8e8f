package web

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gpu-arbiter/arbiter/engine"
)

// maxEventsPerTick caps the decision and preemption events sent per
// snapshot period, each; the snapshot's totals say how many there were.
const maxEventsPerTick = 64

// SnapshotEvent is the data of a "snapshot" event: what GET /status and
// GET /processes would answer at that moment.
type SnapshotEvent struct {
	Status    StatusView    `json:"status"`
	Processes []ProcessItem `json:"processes"`
}

// hub fans events out to the stream clients. Publishing never blocks: a
// client whose queue is full is dropped (it reconnects and starts from a
// fresh snapshot), so a slow client costs the others and the engine
// nothing.
type hub struct {
	buf     int
	mu      sync.Mutex
	subs    map[*subscriber]struct{}
	clients atomic.Int64
	sent    atomic.Uint64 // events written to clients
	slow    atomic.Uint64 // clients dropped for falling behind
}

type subscriber struct {
	ch   chan []byte
	gone chan struct{} // closed when the hub drops it
}

func newHub(buf int) *hub { return &hub{buf: buf, subs: map[*subscriber]struct{}{}} }

// join adds a client unless max are connected.
func (h *hub) join(max int) *subscriber {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= max {
		return nil
	}
	sub := &subscriber{ch: make(chan []byte, h.buf), gone: make(chan struct{})}
	h.subs[sub] = struct{}{}
	h.clients.Store(int64(len(h.subs)))
	return sub
}

// leave removes a client; safe after the hub dropped it.
func (h *hub) leave(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[sub]; ok {
		delete(h.subs, sub)
		close(sub.gone)
	}
	h.clients.Store(int64(len(h.subs)))
}

func (h *hub) empty() bool { return h.clients.Load() == 0 }

// publish queues msg for every client, dropping those that are full.
func (h *hub) publish(msg []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		select {
		case sub.ch <- msg:
		default:
			delete(h.subs, sub)
			close(sub.gone)
			h.slow.Add(1)
		}
	}
	h.clients.Store(int64(len(h.subs)))
}

// broadcast publishes a snapshot event at most every SnapshotInterval
// when the snapshot changed, with the decisions and preemptions recorded
// since the last one, until Shutdown.
func (s *Server) broadcast() {
	defer s.wg.Done()
	t := time.NewTicker(s.lim.SnapshotInterval)
	defer t.Stop()
	last := s.view().snap
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		v := s.view() // also keeps the launch rates' previous snapshot fresh
		if v.snap == last {
			continue
		}
		if s.hub.empty() {
			last = v.snap
			continue
		}
		var buf bytes.Buffer
		newEvents(&buf, "decision", v.snap.Decisions, v.snap.DecisionsTotal-last.DecisionsTotal)
		newEvents(&buf, "preemption", v.snap.Preemptions, v.snap.PreemptionsTotal-last.PreemptionsTotal)
		last = v.snap
		if err := s.snapshotEvent(&buf, v); err != nil {
			s.log.Error().Err(err).Msg("encode snapshot event")
			continue
		}
		s.hub.publish(buf.Bytes())
	}
}

// newEvents writes the n latest of list as events of kind typ, at most
// maxEventsPerTick.
func newEvents(buf *bytes.Buffer, typ string, list []engine.Decision, n uint64) {
	n = min(n, uint64(len(list)), maxEventsPerTick)
	for _, d := range list[len(list)-int(n):] {
		b, err := json.Marshal(d)
		if err != nil {
			continue
		}
		writeEvent(buf, typ, b)
	}
}

func (s *Server) snapshotEvent(buf *bytes.Buffer, v view) error {
	b, err := json.Marshal(SnapshotEvent{Status: s.status(v), Processes: v.processes("", "")})
	if err != nil {
		return err
	}
	writeEvent(buf, "snapshot", b)
	return nil
}

// writeEvent writes one SSE event; JSON has no newline, so data is one
// line.
func writeEvent(buf *bytes.Buffer, typ string, data []byte) {
	buf.WriteString("event: ")
	buf.WriteString(typ)
	buf.WriteString("\ndata: ")
	buf.Write(data)
	buf.WriteString("\n\n")
}

// events serves GET /events: a snapshot event at once, then the hub's
// events and a heartbeat comment, until the client goes, falls behind,
// or the server shuts down.
func (s *Server) events(c echo.Context) error {
	if err := onlyParams(c.QueryParams()); err != nil {
		return err
	}
	sub := s.hub.join(s.lim.MaxStreams)
	if sub == nil {
		return errorf(http.StatusServiceUnavailable, "too many event streams (%d): close one or poll GET %s/status", s.lim.MaxStreams, APIPrefix)
	}
	defer s.hub.leave(sub)
	w := c.Response()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	var first bytes.Buffer
	first.WriteString("retry: 3000\n\n")
	if err := s.snapshotEvent(&first, s.view()); err != nil {
		return nil
	}
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(s.lim.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		if err := rc.Flush(); err != nil {
			return false
		}
		s.hub.sent.Add(1)
		return true
	}
	if !write(first.Bytes()) {
		return nil
	}
	beat := time.NewTicker(s.lim.Heartbeat)
	defer beat.Stop()
	ctx := c.Request().Context()
	for {
		select {
		case msg := <-sub.ch:
			if !write(msg) {
				return nil
			}
		case <-beat.C:
			if !write([]byte(": heartbeat\n\n")) {
				return nil
			}
		case <-sub.gone:
			return nil
		case <-ctx.Done():
			return nil
		case <-s.done:
			return nil
		}
	}
}
