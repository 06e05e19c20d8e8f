package web

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gpu-arbiter/arbiter/engine"
)

// maxEventsPerTick caps the decision and preemption events sent per
// snapshot period, each; the snapshot's totals say how many there were.
const maxEventsPerTick = 64

// Forms of the event stream (GET /events?form=).
const (
	// FormFull sends a whole snapshot at every change.
	FormFull = "full"
	// FormDelta sends a whole snapshot once, then deltas.
	FormDelta = "delta"
)

// SnapshotEvent is the data of a "snapshot" event: what GET /status and
// GET /processes would answer at that moment. In the delta form it also
// carries the state's sequence number and GET /classes and GET /gpus.
type SnapshotEvent struct {
	Seq       uint64        `json:"seq,omitempty"`
	Status    StatusView    `json:"status"`
	Processes []ProcessItem `json:"processes"`
	Classes   []ClassItem   `json:"classes,omitempty"`
	GPUs      []GPUItem     `json:"gpus,omitempty"`
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
	deltas  atomic.Int64  // clients of the delta form
	sent    atomic.Uint64 // events written to clients
	slow    atomic.Uint64 // clients dropped for falling behind
}

type subscriber struct {
	ch    chan []byte
	gone  chan struct{} // closed when the hub drops it
	delta bool          // the client asked for the delta form
}

func newHub(buf int) *hub { return &hub{buf: buf, subs: map[*subscriber]struct{}{}} }

// join adds a client of the full or delta form unless max are connected.
func (h *hub) join(max int, delta bool) *subscriber {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= max {
		return nil
	}
	sub := &subscriber{ch: make(chan []byte, h.buf), gone: make(chan struct{}), delta: delta}
	h.subs[sub] = struct{}{}
	h.count()
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
	h.count()
}

// count updates the client counters; h.mu is held.
func (h *hub) count() {
	deltas := 0
	for sub := range h.subs {
		if sub.delta {
			deltas++
		}
	}
	h.clients.Store(int64(len(h.subs)))
	h.deltas.Store(int64(deltas))
}

func (h *hub) empty() bool { return h.clients.Load() == 0 }

// publish queues full for every client of the full form and delta for
// every client of the delta form, dropping those that are full.
func (h *hub) publish(full, delta []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		msg := full
		if sub.delta {
			msg = delta
		}
		select {
		case sub.ch <- msg:
		default:
			delete(h.subs, sub)
			close(sub.gone)
			h.slow.Add(1)
		}
	}
	h.count()
}

// broadcast publishes, at most every SnapshotInterval and when the
// snapshot changed, the decisions and preemptions recorded since the last
// time and then a snapshot event (full form) or a delta event (delta
// form), until Shutdown.
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
		var events bytes.Buffer
		newEvents(&events, "decision", v.snap.Decisions, v.snap.DecisionsTotal-last.DecisionsTotal)
		newEvents(&events, "preemption", v.snap.Preemptions, v.snap.PreemptionsTotal-last.PreemptionsTotal)
		last = v.snap
		if err := s.publish(v, events.Bytes()); err != nil {
			s.log.Error().Err(err).Msg("encode stream events")
		}
	}
}

// publish sends events and v to the clients, encoding each form only
// when a client wants it. The delta form's state moves to v under its
// lock, which joining delta clients take too.
func (s *Server) publish(v view, events []byte) error {
	s.deltas.mu.Lock()
	defer s.deltas.mu.Unlock()
	if s.hub.deltas.Load() == 0 {
		s.deltas.base = nil
	}
	if s.hub.empty() {
		return nil
	}
	var full, delta []byte
	if s.hub.clients.Load() > s.hub.deltas.Load() {
		buf := bytes.NewBuffer(slices.Clip(events))
		if err := s.snapshotEvent(buf, v); err != nil {
			return err
		}
		full = buf.Bytes()
	}
	if s.deltas.base != nil {
		s.deltas.seq++
		next, err := s.state(v, s.deltas.seq)
		if err != nil {
			return err
		}
		buf := bytes.NewBuffer(slices.Clip(events))
		if err := s.deltas.base.deltaTo(buf, next); err != nil {
			return err
		}
		s.deltas.base, delta = next, buf.Bytes()
	}
	s.hub.publish(full, delta)
	return nil
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

// joinDelta adds a client of the delta form and writes its first event,
// the state the next delta applies to; nil when the streams are at their
// limit.
func (s *Server) joinDelta(first *bytes.Buffer) (*subscriber, error) {
	s.deltas.mu.Lock()
	defer s.deltas.mu.Unlock()
	if s.deltas.base == nil {
		s.deltas.seq++
		st, err := s.state(s.view(), s.deltas.seq)
		if err != nil {
			return nil, err
		}
		s.deltas.base = st
	}
	ev, err := s.deltas.base.snapshotEvent()
	if err != nil {
		return nil, err
	}
	sub := s.hub.join(s.lim.MaxStreams, true)
	if sub != nil {
		first.Write(ev)
	}
	return sub, nil
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
	q := c.QueryParams()
	if err := onlyParams(q, "form"); err != nil {
		return err
	}
	form := q.Get("form")
	if form != "" && form != FormFull && form != FormDelta {
		return errorf(http.StatusBadRequest, "form %q: want %s (a whole snapshot at every change, the default) or %s (a whole snapshot once, then what changed)", form, FormFull, FormDelta)
	}
	var first bytes.Buffer
	first.WriteString("retry: 3000\n\n")
	var sub *subscriber
	if form == FormDelta {
		var err error
		if sub, err = s.joinDelta(&first); err != nil {
			return err
		}
	} else {
		if err := s.snapshotEvent(&first, s.view()); err != nil {
			return err
		}
		sub = s.hub.join(s.lim.MaxStreams, false)
	}
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
