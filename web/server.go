package web

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/gpu-arbiter/arbiter/engine"
)

// SnapshotSource gives the engine's latest snapshot; *engine.Engine is
// one. Snapshot must be safe from any goroutine and never return nil.
type SnapshotSource interface {
	Snapshot() *engine.Snapshot
}

// HistogramSource is implemented by a SnapshotSource that can also give
// each class's latency histogram (*engine.Engine does); /metrics then
// exports a real histogram and SLO request counters beside the
// percentiles of the snapshot.
type HistogramSource interface {
	LatencyHistograms(ctx context.Context, bounds []float64) (map[string]engine.LatencyHistogram, error)
}

// CaptureStats counts what the event capture (the eBPF tracer) saw: events
// read, events dropped because the ring buffer was full, and records that
// did not decode; and what its launch gate did in the kernel: processes
// stopped at a launch, stops not made (the signal failed, or there was no
// room to record the stop), and gates closed by armed requests.
type CaptureStats struct {
	Events, Dropped, DecodeErrors                uint64
	GateStops, GateStopFailures, GateArmedCloses uint64
}

// Options configures a Server.
type Options struct {
	// Snapshots is the engine (required).
	Snapshots SnapshotSource
	// Node describes the machine, for /status and /gpus.
	Node Node
	// Policy serves the policy endpoints; nil: they answer 503.
	Policy PolicyService
	// TokenFile holds the bearer token that mutating requests need; it is
	// created (mode 0600, directory 0700) with a random token when missing
	// (required).
	TokenFile string
	// Capture, when set, reports the event capture's counters for /metrics.
	Capture func() CaptureStats
	// Console, when set, serves every path outside the API, the probes
	// and /metrics (the web console, package web/console).
	Console http.Handler
	// Version is the daemon's version string.
	Version string
	// Logger receives request errors and server events.
	Logger zerolog.Logger
	// Limits; zero fields take their defaults.
	Limits Limits
}

// Limits bound what clients may ask of the server.
type Limits struct {
	// MaxBodyBytes caps a request body (default 1 MiB).
	MaxBodyBytes int64
	// MutationsPerSecond and MutationBurst rate-limit POST requests, all
	// clients together (default 5/s, burst 10).
	MutationsPerSecond float64
	MutationBurst      int
	// SnapshotInterval is the shortest time between two snapshot events
	// of the stream (default 1 s).
	SnapshotInterval time.Duration
	// Heartbeat is the period of the stream's keep-alive comments
	// (default 15 s).
	Heartbeat time.Duration
	// MaxStreams caps concurrent event streams (default 64).
	MaxStreams int
	// StreamBuffer is how many events may wait for one slow stream client
	// before it is dropped (default 16).
	StreamBuffer int
	// WriteTimeout bounds one write to a stream client (default 10 s).
	WriteTimeout time.Duration
	// ReadTimeout bounds reading a request, headers and body (default
	// 30 s).
	ReadTimeout time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxBodyBytes       = 1 << 20
	DefaultMutationsPerSecond = 5
	DefaultMutationBurst      = 10
	DefaultSnapshotInterval   = time.Second
	DefaultHeartbeat          = 15 * time.Second
	DefaultMaxStreams         = 64
	DefaultStreamBuffer       = 16
	DefaultWriteTimeout       = 10 * time.Second
	DefaultReadTimeout        = 30 * time.Second
)

func (l *Limits) withDefaults() Limits {
	o := *l
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MutationsPerSecond <= 0 {
		o.MutationsPerSecond = DefaultMutationsPerSecond
	}
	if o.MutationBurst <= 0 {
		o.MutationBurst = DefaultMutationBurst
	}
	if o.SnapshotInterval <= 0 {
		o.SnapshotInterval = DefaultSnapshotInterval
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.StreamBuffer <= 0 {
		o.StreamBuffer = DefaultStreamBuffer
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	return o
}

// Server is the daemon's HTTP server: API, event stream, probes and
// metrics. One Server may listen on a Unix socket and a TCP address at
// once.
type Server struct {
	opts    Options
	lim     Limits
	log     zerolog.Logger
	token   []byte
	started time.Time
	ready   atomic.Bool
	echo    *echo.Echo
	handler http.Handler
	reg     *prometheus.Registry
	http    *httpMetrics
	rates   *rates
	hub     *hub
	deltas  deltaStream
	limiter *rate.Limiter

	mu      sync.Mutex
	servers []*http.Server
	closed  bool
	done    chan struct{} // closed by Shutdown: streams end
	wg      sync.WaitGroup
}

// New builds a Server: it reads or creates the token file and starts the
// event stream's broadcaster, which Shutdown stops.
func New(opts Options) (*Server, error) {
	if opts.Snapshots == nil {
		return nil, errors.New("web: no snapshot source: pass the engine as Options.Snapshots")
	}
	if opts.TokenFile == "" {
		return nil, errors.New("web: no token file: set Options.TokenFile (for example /var/lib/arbiter/api.token)")
	}
	tok, err := LoadOrCreateToken(opts.TokenFile)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, lim: opts.Limits.withDefaults(), log: opts.Logger, token: tok,
		started: time.Now(), done: make(chan struct{})}
	s.limiter = rate.NewLimiter(rate.Limit(s.lim.MutationsPerSecond), s.lim.MutationBurst)
	s.rates = newRates(opts.Snapshots)
	s.hub = newHub(s.lim.StreamBuffer)
	s.reg = prometheus.NewRegistry()
	if s.http, err = s.registerMetrics(); err != nil {
		return nil, err
	}
	s.echo = s.routes()
	s.handler = secure(crossOrigin(http.HandlerFunc(s.dispatch)))
	s.wg.Add(1)
	go s.broadcast()
	return s, nil
}

// dispatch sends the API, the probes and /metrics to echo and the rest to
// the console.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if s.opts.Console == nil || strings.HasPrefix(p, APIPrefix+"/") || p == APIPrefix || p == "/metrics" || p == "/healthz" || p == "/readyz" {
		// HEAD is GET without the body (load balancers and uptime checks
		// probe with it): the response writer, which knows the request
		// was HEAD, drops what the GET writes. Not for the event stream,
		// which would stream nothing for ever.
		if r.Method == http.MethodHead && p != APIPrefix+"/events" {
			r = r.Clone(r.Context())
			r.Method = http.MethodGet
		}
		s.echo.ServeHTTP(w, r)
		return
	}
	s.opts.Console.ServeHTTP(w, r)
}

// Handler returns the server's whole HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady sets what /readyz answers: 503 until the daemon says it is
// ready (the engine runs and the policy is loaded).
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// TCPOptions says how ServeTCP serves its address; nil serves plain
// HTTP on a loopback address only.
type TCPOptions struct {
	// TLS, when set, serves HTTPS with this certificate and key.
	TLS *KeyPair
	// Plain serves plain HTTP on an address off loopback, which ServeTCP
	// otherwise refuses: reads are open to whoever reaches the address
	// and the bearer token of policy changes crosses the network in
	// clear. Meant for a pod network that only Prometheus and the kubelet
	// reach. It cannot be set with TLS.
	Plain bool
}

// ErrPlainOffLoopback is returned by ServeTCP for plain HTTP on an
// address off loopback without TCPOptions.Plain.
var ErrPlainOffLoopback = errors.New("plain HTTP off loopback would send the API token in clear")

// CheckTCP returns the error ServeTCP would refuse addr with under opts
// before it listens, so that a caller can refuse the address before it
// does anything else.
func CheckTCP(addr string, opts *TCPOptions) error {
	var o TCPOptions
	if opts != nil {
		o = *opts
	}
	if o.TLS != nil && o.Plain {
		return fmt.Errorf("web: serve %s: TLS and plain HTTP both asked for: choose one", addr)
	}
	if o.TLS == nil && !o.Plain && !loopback(addr) {
		return fmt.Errorf("web: serve %s: %w: give a TLS certificate and key, listen on 127.0.0.1 or [::1], or allow plain HTTP there explicitly", addr, ErrPlainOffLoopback)
	}
	return nil
}

// ServeTCP serves on addr until Shutdown: HTTPS with opts.TLS, plain HTTP
// otherwise, which it refuses off loopback unless opts.Plain says so. A
// client that speaks plain HTTP to the HTTPS listener is answered 400,
// "Client sent an HTTP request to an HTTPS server".
func (s *Server) ServeTCP(addr string, opts *TCPOptions) error {
	var o TCPOptions
	if opts != nil {
		o = *opts
	}
	if err := CheckTCP(addr, &o); err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("web: listen on %s: %w", addr, err)
	}
	return s.serve(l, o.TLS, s.tcpHandler(l, o.TLS))
}

// tcpHandler is the handler of a TCP listener: on plain HTTP on a
// loopback address, one that answers only to local Host names
// (localHost).
func (s *Server) tcpHandler(l net.Listener, kp *KeyPair) http.Handler {
	if kp == nil && loopback(l.Addr().String()) {
		return localHost(s.handler)
	}
	return s.handler
}

// ServeTCPListener is ServeTCP on a listener the caller opened on the
// address, so that an address in use or not on this host is refused
// before anything else is done; it refuses what ServeTCP refuses, and
// closes the listener then.
func (s *Server) ServeTCPListener(l net.Listener, opts *TCPOptions) error {
	if err := CheckTCP(l.Addr().String(), opts); err != nil {
		l.Close()
		return err
	}
	var o TCPOptions
	if opts != nil {
		o = *opts
	}
	return s.serve(l, o.TLS, s.tcpHandler(l, o.TLS))
}

// Serve serves plain HTTP on a listener the caller made, until Shutdown.
// It does not look at the listener's address: for TCP prefer ServeTCP,
// which refuses to send the token in clear off loopback.
func (s *Server) Serve(l net.Listener) error { return s.serve(l, nil, s.handler) }

func (s *Server) serve(l net.Listener, kp *KeyPair, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: min(10*time.Second, s.lim.ReadTimeout), ReadTimeout: s.lim.ReadTimeout,
		IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10, ErrorLog: log.New(debugWriter{s.log}, "", 0)}
	if kp != nil {
		hs.TLSConfig = kp.config()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return http.ErrServerClosed
	}
	s.servers = append(s.servers, hs)
	s.mu.Unlock()
	s.log.Info().Str("addr", l.Addr().String()).Bool("tls", kp != nil).Msg("api listening")
	var err error
	if kp != nil {
		err = hs.ServeTLS(l, "", "") // the certificate comes from TLSConfig
	} else {
		err = hs.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("web: serve %s: %w", l.Addr(), err)
}

// Shutdown ends every event stream, stops accepting requests and waits
// for those in flight until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	servers := s.servers
	s.mu.Unlock()
	if first {
		close(s.done)
	}
	var errs []error
	for _, hs := range servers {
		if err := hs.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("web: shut down %s: %w", hs.Addr, err))
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// debugWriter takes net/http's own messages (the TLS handshake errors of
// clients that do not trust the certificate or speak plain HTTP to it)
// into the log at debug level: they are the clients' to report.
type debugWriter struct{ log zerolog.Logger }

func (w debugWriter) Write(p []byte) (int, error) {
	w.log.Debug().Str("from", "net/http").Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// loopback reports whether addr's host is a loopback address or
// "localhost".
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
