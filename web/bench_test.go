package web

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-arbiter/arbiter/trace"
)

// benchLatency runs GET url b.N times over loopback with keep-alive and
// reports the p50 and p99 in ms.
func benchLatency(b *testing.B, url string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lat = append(lat, time.Since(start))
		if resp.StatusCode != 200 {
			b.Fatalf("%s: %d", url, resp.StatusCode)
		}
		b.SetBytes(n)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkAPI: GET /processes and /status with 1,000 processes in a
// real engine, on loopback (budget: p99 ≤ 10 ms).
func BenchmarkAPI(b *testing.B) {
	f := newFixture(b, 1000, Limits{})
	f.eng.waitFor(b, func(s *engineSnapshot) bool { return s.Stats.Requests >= 300 })
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	for _, p := range []string{"/api/v1/processes", "/api/v1/status", "/api/v1/processes/1500", "/api/v1/classes"} {
		b.Run(p, func(b *testing.B) { benchLatency(b, ts.URL+p) })
	}
}

// BenchmarkMetricsScrape: a full /metrics scrape with 1,000 processes.
func BenchmarkMetricsScrape(b *testing.B) {
	f := newFixture(b, 1000, Limits{})
	f.eng.waitFor(b, func(s *engineSnapshot) bool { return s.Stats.Requests >= 300 })
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	benchLatency(b, ts.URL+"/metrics")
}

// BenchmarkStreamFanout: 50 stream clients at 10 snapshots a second with
// 1,000 processes, for b.N seconds, in each form of the stream (full,
// delta, and none: no client) and under two loads: a launch of one process every 10 ms
// ("sparse": about ten processes change per period) and a launch of every
// process every period ("busy": every process changes). It reports the
// process's CPU time per second (server and the 50 readers together, from
// getrusage), the bytes delivered per second, and the mean size of a
// snapshot or delta event after the first.
func BenchmarkStreamFanout(b *testing.B) {
	// "none" has no stream client: the engine's and the server's own
	// cost, which the forms' figures include.
	for _, form := range []string{"none", FormFull, FormDelta} {
		for _, load := range []string{"sparse", "busy"} {
			b.Run(form+"/"+load, func(b *testing.B) { benchFanout(b, form, load == "busy") })
		}
	}
}

func benchFanout(b *testing.B, form string, busy bool) {
	const procs = 1000
	clients := 50
	if form == "none" {
		clients = 0
	}
	f := newFixture(b, procs, Limits{SnapshotInterval: 100 * time.Millisecond, MaxStreams: clients})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var total, events, updates, updateBytes atomic.Int64
	ready := make(chan struct{}, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/events?form="+form, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			defer resp.Body.Close()
			ready <- struct{}{}
			br := bufio.NewReaderSize(resp.Body, 1<<20)
			// update is set while the data of a snapshot or delta event
			// (not the first) is read.
			update, first := false, true
			for {
				line, err := br.ReadSlice('\n')
				if err == bufio.ErrBufferFull {
					total.Add(int64(len(line)))
					if update {
						updateBytes.Add(int64(len(line)))
					}
					continue
				}
				if err != nil {
					return
				}
				total.Add(int64(len(line)))
				switch {
				case len(line) == 1:
					update = false // the blank line that ends an event
				case bytes.HasPrefix(line, []byte("event:")):
					events.Add(1)
					update = bytes.Equal(line, []byte("event: snapshot\n")) || bytes.Equal(line, []byte("event: delta\n"))
					if update && first {
						update, first = false, false
					} else if update {
						updates.Add(1)
					}
				case update:
					updateBytes.Add(int64(len(line)))
				}
			}
		}()
	}
	for range clients {
		<-ready
	}
	// The engine keeps changing, so that every period has a new snapshot.
	stop := make(chan struct{})
	go func() {
		every := 10 * time.Millisecond
		if busy {
			every = 100 * time.Millisecond
		}
		all := make([]trace.Event, procs)
		for i := range all {
			all[i] = launchEv(uint32(1000 + i))
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
			if busy {
				f.eng.src.push(all...)
			} else {
				f.eng.src.push(launchEv(uint32(1000 + i%procs)))
			}
		}
	}()
	var before syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	total.Store(0)
	events.Store(0)
	updates.Store(0)
	updateBytes.Store(0)
	b.ResetTimer()
	start := time.Now()
	time.Sleep(time.Duration(b.N) * time.Second)
	elapsed := time.Since(start)
	b.StopTimer()
	var after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	close(stop)
	cancel()
	wg.Wait()
	cpu := time.Duration(after.Utime.Nano()-before.Utime.Nano()) + time.Duration(after.Stime.Nano()-before.Stime.Nano())
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "cpu-s/s")
	b.ReportMetric(float64(total.Load())/elapsed.Seconds()/1e6, "MB/s")
	if clients > 0 {
		b.ReportMetric(float64(events.Load())/elapsed.Seconds()/float64(clients), "events/s/client")
	}
	if n := updates.Load(); n > 0 {
		b.ReportMetric(float64(updateBytes.Load())/float64(n)/1e3, "KB/update")
	}
	b.ReportMetric(float64(f.s.hub.slow.Load()), "dropped-clients")
}
