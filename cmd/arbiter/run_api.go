package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/internal/preflight"
	"github.com/gpu-arbiter/arbiter/web"
	"github.com/gpu-arbiter/arbiter/web/console"
)

// apiServer is the daemon's HTTP API on its unix socket and TCP address.
type apiServer struct {
	srv  *web.Server
	errs chan error
}

// tokenFile is where the API's bearer token is kept.
func tokenFile(stateDir string) string { return filepath.Join(stateDir, "api-token") }

// serveAPI starts the API; a socket or address that cannot be served is
// an error at start, not later.
func (d *daemon) serveAPI(node *nodeInfo) (*apiServer, error) {
	wn := web.Node{Hostname: node.hostname, DriverVersion: node.driver}
	for _, g := range node.nvml {
		wn.GPUs = append(wn.GPUs, web.NodeGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, MemoryBytes: g.MemoryBytes})
	}
	if node.nvml == nil {
		// Without NVML: the driver's device nodes, by index alone.
		for _, i := range node.devs {
			wn.GPUs = append(wn.GPUs, web.NodeGPU{Index: i})
		}
	}
	if rep, err := preflight.Run(&preflight.Options{Root: "/", AllowUnverifiedDriver: d.cfg.AllowUnverifiedDriver}); err == nil {
		for _, l := range rep.Levels {
			ls := web.LevelSupport{Level: l.Level, Supported: l.Supported}
			if !l.Supported {
				ls.Reason = "failed checks: " + strings.Join(l.BlockedBy, ", ") + " (arbiter doctor says how to fix them)"
			}
			wn.Levels = append(wn.Levels, ls)
		}
	} else {
		d.log.Warn().Err(err).Msg("node checks failed: the API will not say which enforcement levels this node supports")
	}
	ps := newPolicyService(d.policy, func() *engine.Engine { return d.eng }, d.proc, node.policyNode)
	srv, err := web.New(web.Options{
		Snapshots: d.eng, Node: wn, Policy: ps, TokenFile: tokenFile(d.cfg.StateDir), Version: version, Logger: d.log,
		Console: console.Handler(),
		Capture: func() web.CaptureStats {
			st := d.tracer.Stats()
			return web.CaptureStats{Events: st.Events, Dropped: st.Drops, DecodeErrors: st.DecodeErrors,
				GateStops: st.GateSignals, GateStopFailures: st.GateSignalErrors, GateArmedCloses: st.GateArmedCloses}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("HTTP API: %w", err)
	}
	d.log.Info().Str("token_file", tokenFile(d.cfg.StateDir)).Msg("API token for policy changes (POST requests)")
	a := &apiServer{srv: srv, errs: make(chan error, 2)}
	// ServeTCP refuses plain HTTP off loopback (the bearer token would
	// cross the network in clear) unless --listen-plain; both report a
	// refused address or socket at once.
	tcp := &web.TCPOptions{TLS: d.tls, Plain: d.cfg.ListenPlain}
	if tcp.Plain {
		d.log.Warn().Str("listen", d.cfg.Listen).Msg("--listen-plain: serving plain HTTP; policy changes send the API token in clear")
	}
	go a.run(func() error { return listenError(d.cfg.Listen, srv.ServeTCPListener(d.apiLn, tcp)) })
	go a.run(func() error {
		if err := srv.ServeUnix(d.cfg.Socket); err != nil {
			return fmt.Errorf("serve the API socket %s (--socket): %w", d.cfg.Socket, err)
		}
		return nil
	})
	select {
	case err := <-a.errs:
		_ = srv.Shutdown(context.Background())
		return nil, err
	case <-time.After(200 * time.Millisecond):
	}
	return a, nil
}

// listenError says what a refused --listen means and how to fix it.
func listenError(addr string, err error) error {
	switch {
	case errors.Is(err, web.ErrPlainOffLoopback):
		return fmt.Errorf("serve the API on %s (--listen): %w (--tls-cert and --tls-key; or --listen-plain, where only trusted clients reach the address)", addr, err)
	case err != nil:
		return fmt.Errorf("serve the API on %s (--listen): %w", addr, err)
	}
	return nil
}

func (a *apiServer) run(serve func() error) {
	if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		a.errs <- err
	}
}

// ready marks the daemon ready (/readyz).
func (a *apiServer) ready() { a.srv.SetReady(true) }

// stop shuts the API down, giving requests in flight a moment.
func (a *apiServer) stop(log zerolog.Logger) {
	a.srv.SetReady(false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		log.Warn().Err(err).Msg("API shutdown")
	}
}
