package web

import (
	"bufio"
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
// 1,000 processes, for b.N seconds; reports the process's CPU time per
// second (server and the 50 readers together, from getrusage) and the
// bytes delivered per second.
func BenchmarkStreamFanout(b *testing.B) {
	const clients = 50
	f := newFixture(b, 1000, Limits{SnapshotInterval: 100 * time.Millisecond, MaxStreams: clients})
	ts := httptest.NewServer(f.s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var bytes, events atomic.Int64
	ready := make(chan struct{}, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/events", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			defer resp.Body.Close()
			ready <- struct{}{}
			br := bufio.NewReaderSize(resp.Body, 1<<20)
			for {
				line, err := br.ReadSlice('\n')
				if err == bufio.ErrBufferFull {
					bytes.Add(int64(len(line)))
					continue
				}
				if err != nil {
					return
				}
				bytes.Add(int64(len(line)))
				if len(line) > 6 && string(line[:6]) == "event:" {
					events.Add(1)
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
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				f.eng.src.push(launchEv(uint32(1000 + i%1000)))
			}
		}
	}()
	var before syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	bytes.Store(0)
	events.Store(0)
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
	b.ReportMetric(float64(bytes.Load())/elapsed.Seconds()/1e6, "MB/s")
	b.ReportMetric(float64(events.Load())/elapsed.Seconds()/clients, "events/s/client")
	b.ReportMetric(float64(f.s.hub.slow.Load()), "dropped-clients")
}
